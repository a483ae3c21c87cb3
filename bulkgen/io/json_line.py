"""Lines of strict JSON for the JSONL shards (--format jsonl and openai)."""

from __future__ import annotations

import json
import math
import re


def json_line(record: dict) -> str:
    """record as one line of strict JSON: a non-finite number (a kept column's NaN, a -inf
    logprob), which JSON cannot spell, is null (json.dumps would write NaN / -Infinity, which
    strict readers refuse); other values it cannot encode are their str(). U+2028, U+2029 and
    U+0085, which str.splitlines() (and some JSONL readers) take for line ends, are escaped: a
    completion holding one split its line in two there."""
    try:
        line = json.dumps(record, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:  # rare: walk the record again, non-finite floats as None
        line = json.dumps(_finite(record), ensure_ascii=False, default=str)
    if _LINE_ENDS.search(line):
        line = _LINE_ENDS.sub(lambda m: f"\\u{ord(m.group()):04x}", line)
    return line


_LINE_ENDS = re.compile("[\u2028\u2029\u0085]")


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
