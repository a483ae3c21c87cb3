"""Done: what a job's complete shards hold (io/job.py's scan), as a resume and stats use it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc


@dataclass
class Done:
    """What complete shards already hold."""

    ids: set[str] = field(default_factory=set)
    # Bit masks of the samples done (bit k: sample k) of ids that have another one than sample 0
    # alone; -1 for an OpenAI error line, which stands for all its row's samples.
    samples: dict[str, int] = field(default_factory=dict)
    rows: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    shards: list[str] = field(default_factory=list)
    next_index: int = 0

    def mask(self, row_id: str) -> int:
        """Which samples of the row complete shards hold, as a bit mask."""
        return self.samples.get(row_id, 1 if row_id in self.ids else 0)

    def add(self, table: pa.Table) -> None:
        """Count in a shard's summary (io/shard_summary.py): its rows, errors and tokens."""
        self.rows += table.num_rows
        self.errors += table.column("finish_reason").to_pylist().count("error")
        self.prompt_tokens += pc.sum(table.column("prompt_tokens")).as_py() or 0
        self.completion_tokens += pc.sum(table.column("completion_tokens")).as_py() or 0
