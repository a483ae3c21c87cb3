"""What one complete shard holds, for a resume: each row's id, finish_reason, token counts and
sample, read from a Parquet, JSONL or OpenAI Batch output shard (io/job.py's scan).

A JSONL shard is read by pyarrow.json in blocks of 1 MiB; an object that straddles two block
boundaries (a line of about 2 MiB or more: a long kept column or prompt) fails that read, so the
shard is read again with blocks longer than its longest line. A damaged shard fails both reads.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from bulkgen.io.openai import is_openai_output, openai_summary

SUMMARY_COLUMNS = ["id", "finish_reason", "prompt_tokens", "completion_tokens"]
_JSONL_SCHEMA = pa.schema(
    [("id", pa.string()), ("finish_reason", pa.string())]
    + [(c, pa.int64()) for c in SUMMARY_COLUMNS[2:]]
    + [("sample", pa.int64())]
)
_MAX_BLOCK = 2**31 - 1  # pyarrow's block_size is an int32


def read_summary(path: Path) -> pa.Table:
    """The summary columns of a shard, and sample where the shard has it; raises what its
    reader raises (OSError, ValueError, pa.ArrowException) for a damaged shard."""
    if path.suffix == ".parquet":
        # One open of the file, read as it is: pq.read_table (a dataset) costs three times as
        # much a small shard, most of a resume's scan of a job of thousands of shards.
        with pq.ParquetFile(path) as shard:
            extra = ["sample"] if "sample" in shard.schema_arrow.names else []
            return shard.read(columns=SUMMARY_COLUMNS + extra)
    if is_openai_output(path):
        return openai_summary(path)
    return read_jsonl_summary(path)


def read_jsonl_summary(path: Path) -> pa.Table:
    options = pajson.ParseOptions(explicit_schema=_JSONL_SCHEMA, unexpected_field_behavior="ignore")
    try:
        return pajson.read_json(path, parse_options=options)
    except pa.ArrowInvalid:
        block = min(longest_line(path) + 1, _MAX_BLOCK)
        if block <= pajson.ReadOptions().block_size:
            raise  # not a long line: the shard is damaged
    read_options = pajson.ReadOptions(block_size=block)
    return pajson.read_json(path, read_options=read_options, parse_options=options)


def longest_line(path: Path) -> int:
    """The length in bytes of the file's longest line, its newline included."""
    longest = 0
    with open(path, "rb") as f:
        for line in f:
            longest = max(longest, len(line))
    return longest
