"""How bulkgen score decides that a text answers a reference (score.py's module docstring has the
rules): numbers compared as numbers, other references as normalised phrases."""

from __future__ import annotations

import json
import re
import unicodedata
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
).split()
_WORD_NUMBER = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b")
# A run of number words ("twenty-one", "one hundred"): a number this reader cannot spell out.
_WORD_RUN = re.compile(
    r"\b(?:"
    + "|".join(_NUMBER_WORDS)
    + r")(?:[\s-]+(?:"
    + "|".join(_NUMBER_WORDS)
    + r"|hundred|thousand|million|billion)\b)*"
)
# A reference written as a float prints ("1e-05", "1e+16"; a number column's values).
_EXPONENT = re.compile(r"[-+]?\d+(?:\.\d+)?[eE][-+]?\d+")
# "Answer:", "The answer is", "the final answer to this question is": what follows is the answer.
_ANSWER_MARK = re.compile(r"\banswer\b[^\n.:\d]{0,40}?(?:\bis\b|:)", re.I)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_PUNCTUATION = re.compile(r"[^\w\s]")


def normalize(text: str, articles: bool = False) -> str:
    """Unicode's compatibility composition (NFKC: "e" + a combining accent is "é", as a
    precomposed "é" is; a full-width "Ｐａｒｉｓ" is "Paris"), lower case, no punctuation, single
    spaces, and no articles unless `articles` (a reference that is an article alone, multiple
    choice's "A", keeps it)."""
    text = _PUNCTUATION.sub(" ", unicodedata.normalize("NFKC", text).lower())
    return " ".join((text if articles else _ARTICLES.sub(" ", text)).split())


def as_number(text: str) -> str | None:
    """The canonical form of a text that is one number ("1,000.50" -> "1000.5", ".5" -> "0.5",
    "1e-05" -> "0.00001"), else None."""
    text = text.strip()
    if text[:1] == "." or text[:2] in ("-.", "+."):
        text = text.replace(".", "0.", 1)
    if not _NUMBER.fullmatch(text) and not _EXPONENT.fullmatch(text):
        return None
    try:
        value = Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None
    return format(value.normalize(), "f") if value else "0"


def _after_mark(text: str) -> str:
    marks = list(_ANSWER_MARK.finditer(text))
    return text[marks[-1].end() :] if marks else text


def extract_number(text: str) -> str | None:
    """The first number after an "answer is" mark, else the last number of the text."""
    after = _after_mark(text)
    if after is not text and (numbers := _NUMBER.findall(after)):
        return as_number(numbers[0])
    numbers = _NUMBER.findall(text)
    if numbers:
        return as_number(numbers[-1])
    runs = _WORD_RUN.findall(text.lower())
    if not runs or not _WORD_NUMBER.fullmatch(runs[-1]):
        return None  # none, or a compound ("twenty-one", "one hundred") read as no number
    return str(_NUMBER_WORDS.index(runs[-1]))


def extract_phrase(text: str, clauses: int = 1, articles: bool = False) -> str:
    """The text's first clauses (of its first non-empty line, after an "answer is" mark; of
    the next non-empty line where the mark ends its line: "Answer:\nParis")."""
    lines = [line for line in text.splitlines() if line.strip()] or [""]
    after = _after_mark(lines[0])
    if after is not lines[0] and not any(c.isalnum() for c in after) and len(lines) > 1:
        after = lines[1]
    return normalize(" ".join(_clauses(after)[:clauses]), articles)


def _clauses(text: str) -> list[str]:
    return re.split(r"(?<=[.!?;,])\s", text.strip())


def references(value) -> list[str]:
    """A reference's accepted alternatives: a list's items, or a text's "|"-separated parts; a
    list kept as JSON text (a JSONL eval set's list column) is that list; a float, as a
    decimal."""
    if value is None:
        return []
    if isinstance(value, float):
        return [format(Decimal(repr(value)), "f")]
    if isinstance(value, str) and value.startswith("["):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and parsed and all(isinstance(v, str) for v in parsed):
            value = parsed
    if isinstance(value, list | tuple):
        return [str(v) for v in value if v is not None]
    return [part for part in str(value).split("|") if part.strip()]


def is_correct(text: str | None, reference) -> bool:
    """Whether the answer extracted from text matches one of the reference's alternatives."""
    if text is None:
        return False
    for ref in references(reference):
        number = as_number(ref)
        if number is not None:
            if extract_number(text) == number:
                return True
            continue
        # as many clauses as the reference has: "Paris, France" is two, "St. Louis" too
        want, articles = normalize(ref), False
        if not want:  # an article alone: multiple choice's "A" or "An"
            want, articles = normalize(ref, articles=True), True
        got = extract_phrase(text, len(_clauses(ref)), articles)
        if want and (got == want or got.endswith(" " + want)):
            return True
    return False
