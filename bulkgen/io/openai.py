"""OpenAI Batch API files: input lines mapped onto rows, rows written back as output lines.

An input line is `{"custom_id", "method", "url", "body"}`; the body is a chat or completions
request (`messages` or `prompt`, and sampling fields). An output line is what the Batch API
writes: `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`, with
all n samples of a request as the choices of one line, so existing readers of batch results
read bulkgen's too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from bulkgen.row import Row
from bulkgen.text.token_bytes import spelled
from bulkgen.text.utf8_offsets import token_offsets

_URLS = {"/v1/chat/completions": "chat", "/v1/completions": "text"}
# Body fields that map onto per-row sampling parameters, as bulkgen names them.
_SAME = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "n")
_SAME += ("presence_penalty", "frequency_penalty", "repetition_penalty")  # the last as vLLM's
_SAME += ("response_format",)  # structured output, for chat and completions alike
# A token's UTF-8 bytes from its id and its text (text/token_bytes.py's TokenBytes).
TokenBytes = Callable[[int, str], list[int]]


def _changes_the_output(body: dict) -> str | None:
    """A body field bulkgen cannot honour whose answer OpenAI's would differ from ours in kind:
    the prompt echoed before the completion, a suffix to complete up to, a tool call required.
    (Fields that only tune, `logit_bias` or `stream` say, and tools left to the model's choice
    are ignored, as README says.)"""
    if body.get("echo") is True:
        return "echo: true"
    if body.get("suffix"):
        return "suffix"
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        return f"tool_choice {json.dumps(choice)}"
    return None


def is_batch_record(record: object) -> bool:
    return isinstance(record, dict) and "custom_id" in record and "body" in record


def batch_row(record: dict, lineno: int) -> Row:
    """The row for one input line: id = custom_id, messages or prompt, per-row parameters."""
    row = Row(str(record["custom_id"]), None)
    body, url = record["body"], record.get("url")
    if not isinstance(body, dict):
        row.fail(f"line {lineno}: body is not an object")
        return row
    if url is None:
        row.api = "chat" if "messages" in body else "text"
    else:
        row.api = _URLS.get(url) if isinstance(url, str) else None
    if row.api is None:
        row.fail(f"line {lineno}: url {url!r} is not supported; use {' or '.join(_URLS)}")
        return row
    if unsupported := _changes_the_output(body):
        row.fail(f"line {lineno}: {unsupported} is not supported (the answer would not be it)")
        return row
    if row.api == "chat":
        row.messages = body.get("messages")
        if row.messages is None:
            row.fail(f"line {lineno}: a chat request needs body.messages")
    else:
        prompt = body.get("prompt")
        # A one-element array of prompts (a string or a token array) is that prompt.
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        row.prompt = prompt
        if prompt is None:
            row.fail(f"line {lineno}: a completions request needs body.prompt")
    overrides = {name: body[name] for name in _SAME if body.get(name) is not None}
    seed = overrides.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and -(2**63) <= seed < 0:
        overrides["seed"] = seed % 2**63  # OpenAI's seed is an int64; bulkgen's is in [0, 2**63)
    if overrides.get("top_p") == 0:  # OpenAI's range is [0, 1]: 0 keeps the likeliest token
        del overrides["top_p"]
        overrides["top_k"] = 1
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:  # absent or an explicit null: max_tokens (the older name) decides
        max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        overrides["max_tokens"] = max_tokens
    logprobs = body.get("logprobs")
    if row.api == "chat" and logprobs is True:
        overrides["logprobs"] = body.get("top_logprobs") or 0
    elif row.api == "text" and logprobs is not None and logprobs is not False:
        overrides["logprobs"] = logprobs
    row.overrides = overrides or None
    return row


# ---- output ------------------------------------------------------------------------------


def _hex(*parts: object) -> str:
    return hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=12).hexdigest()


def output_line(
    samples: list[Row],
    model: str,
    created: int,
    token_ids: bool = False,
    token_bytes: TokenBytes | None = None,
) -> dict:
    """The Batch API output line of one input row, from all of its samples; token_ids: each
    choice also carries its generated ids (not a Batch API field: readers ignore it);
    token_bytes: each logprob token's own bytes (without it, its text's)."""
    first = samples[0]
    line = {"id": f"batch_req_{_hex('req', first.id)}", "custom_id": first.id}
    failed = next((r for r in samples if r.error is not None), None)
    if failed is not None:
        line["response"] = None
        line["error"] = {"code": "invalid_request", "message": failed.error}
        return line
    chat = first.api != "text"
    token_bytes = token_bytes or _text_bytes
    choices = [_choice(r, chat, token_bytes) for r in sorted(samples, key=lambda r: r.sample)]
    if token_ids:
        for choice, r in zip(choices, sorted(samples, key=lambda r: r.sample), strict=True):
            choice["token_ids"] = r.token_ids
    completion = sum(r.completion_tokens for r in samples)
    body = {
        "id": ("chatcmpl-" if chat else "cmpl-") + _hex("body", first.id),
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": first.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": first.prompt_tokens + completion,
        },
    }
    line["response"] = {"status_code": 200, "request_id": _hex("id", first.id), "body": body}
    line["error"] = None
    return line


def _choice(row: Row, chat: bool, token_bytes: TokenBytes) -> dict:
    choice: dict = {"index": row.sample}
    if chat:
        choice["message"] = {"role": "assistant", "content": row.text}
    else:
        choice["text"] = row.text
    lp = row.token_logprobs
    choice["logprobs"] = _logprobs(row, chat, token_bytes) if lp is not None else None
    choice["finish_reason"] = row.finish_reason
    return choice


def _logprobs(row: Row, chat: bool, token_bytes: TokenBytes) -> dict:
    logprobs = row.token_logprobs.chosen.tolist()
    tokens = row.token_texts or [""] * len(logprobs)
    raws = list(map(token_bytes, row.token_ids, tokens))
    named = row.top_texts is not None
    tops = row.top_dicts() if named else [[] for _ in logprobs]
    if chat:
        content = []
        for token, raw, logprob, top in zip(tokens, raws, logprobs, tops, strict=True):
            alternatives = [
                _token(t["token"], t["logprob"], token_bytes(t["token_id"], t["token"]))
                for t in top
            ]
            content.append({**_token(token, logprob, raw), "top_logprobs": alternatives})
        return {"content": content}
    # Where each token starts in prompt + text, in characters: the index of the character its
    # first byte belongs to, the completion's bytes decoded as the text is (a character split
    # over tokens counts once, a lead byte left dangling is a U+FFFD of its own; special tokens,
    # which the text leaves out, add no character).
    in_text = getattr(token_bytes, "in_text", None)
    shown = [
        bytes(raw) if in_text is None or in_text(i) else b""
        for i, raw in zip(row.token_ids, raws, strict=True)
    ]
    # A decoder that strips the completion's first space (SentencePiece's Strip) leaves it out
    # of text, but the first token's own bytes hold it: it is no character of prompt + text.
    if shown and shown[0][:1] == b" " and not (row.text or "").startswith(" "):
        shown[0] = shown[0][1:]
    offsets = token_offsets(shown, len(row.prompt_text or ""))
    names = list(map(_completion_token, tokens, raws))
    top_logprobs = []
    for name, logprob, top in zip(names, logprobs, tops, strict=True):
        named_top: dict[str, float] = {}
        for t in top:  # most likely first: a name two alternatives share keeps the likelier
            raw = token_bytes(t["token_id"], t["token"])
            named_top.setdefault(_completion_token(t["token"], raw), t["logprob"])
        # The sampled token is always among them, as OpenAI's completions API says ("up to
        # logprobs+1 elements"): with logprobs 0, the sampled token alone.
        named_top.setdefault(name, logprob)
        top_logprobs.append(named_top)
    return {
        "tokens": names,
        "token_logprobs": logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


def _completion_token(text: str, raw: list[int]) -> str:
    """A completions token's name: its text, or, for a piece of a character (its text alone
    U+FFFD), "bytes:" and its bytes as OpenAI names them ("bytes:\\xe2\\x82"), so that the
    pieces are told apart (as top_logprobs keys they collided, and one was lost)."""
    if "\ufffd" in text and bytes(raw) != text.encode():
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    return spelled(text, raw)


def _token(token: str, logprob: float, raw: list[int]) -> dict:
    return {"token": spelled(token, raw), "logprob": logprob, "bytes": raw}


def _text_bytes(token_id: int, text: str) -> list[int]:
    return list(text.encode())


# ---- resume ------------------------------------------------------------------------------


def is_output_line(record: object) -> bool:
    """Whether a parsed line is a Batch API output line rather than a --format jsonl row, which
    always has finish_reason (an output column, so no kept column takes the name) and may keep
    input columns named custom_id and response."""
    return (
        isinstance(record, dict)
        and "custom_id" in record
        and "response" in record
        and "finish_reason" not in record
    )


def is_openai_output(path: Path) -> bool:
    """Whether a .jsonl shard holds Batch API output lines (judged by its first line)."""
    with open(path, "rb") as f:
        first = f.readline()
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return is_output_line(record)


def openai_summary(path: Path) -> pa.Table:
    """id, finish_reason, token counts and sample per choice of each line; sample -1 for an
    error line, which stands for all of its row's samples."""
    ids, reasons, prompt, completion, samples = [], [], [], [], []
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            record = json.loads(line)
            response = record.get("response") or {}
            body = response.get("body") if response.get("status_code") == 200 else None
            if record.get("error") is not None or not body:
                ids.append(record["custom_id"])
                reasons.append("error")
                prompt.append(0)
                completion.append(0)
                samples.append(-1)
                continue
            usage = body.get("usage") or {}
            for i, choice in enumerate(body["choices"]):
                ids.append(record["custom_id"])
                reasons.append(choice.get("finish_reason"))
                prompt.append(usage.get("prompt_tokens", 0) if i == 0 else 0)
                completion.append(usage.get("completion_tokens", 0) if i == 0 else 0)
                samples.append(choice.get("index", i))
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "finish_reason": pa.array(reasons, pa.string()),
            "prompt_tokens": pa.array(prompt, pa.int64()),
            "completion_tokens": pa.array(completion, pa.int64()),
            "sample": pa.array(samples, pa.int64()),
        }
    )
