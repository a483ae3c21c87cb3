"""A job with nothing to generate: an empty input, or one whose rows are all in complete shards.

It says so and ends (exit status 0) before the model is loaded: a nightly job rerun after it
finished, or fed an empty file, should cost seconds, not a model load.
"""

from __future__ import annotations

import json
from pathlib import Path

from bulkgen.io.job import STATS_FILE, JobDir, write_json_atomic
from bulkgen.io.reader import Reader
from bulkgen.progress import COUNT_FIELDS
from bulkgen.run_config import RunConfig
from bulkgen.samples import Resume


def nothing_left(config: RunConfig, job: JobDir, reader: Reader) -> str | None:
    """Why there is nothing to generate, or None if there may be something."""
    total = reader.count()
    if total == 0:
        return "the input has no rows"
    if config.overwrite or total is None or reader.has_batch_files():
        return None  # batch files' rows may each ask for their own n
    done = job.scan()
    if done.rows < total * config.n:
        return None
    resume = Resume(done, config.n)
    if any(resume(batch) for batch in reader.batches()):  # one read: the job looks complete
        return None
    return f"all {total} input rows are in complete shards already"


def idle_stats(config: RunConfig, job: JobDir, reason: str, inputs: dict | None = None) -> dict:
    """The stats of a run that generated nothing: the folder's own (stats.json, kept as it is)
    with an empty this_run; a new folder gets a stats.json of zeros. inputs: the fingerprints of
    the inputs, checked already (an allowed change becomes what the next rerun compares)."""
    path = Path(config.out) / STATS_FILE
    job.lock()
    try:
        if inputs is not None:
            job.update(inputs)
        return _idle_stats(config, job, path, reason)
    finally:
        job.unlock()


def _idle_stats(config: RunConfig, job: JobDir, path: Path, reason: str) -> dict:
    try:
        stats = json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        stats = None
    # The shards are the truth: a run killed after its last shard but before its stats.json left
    # an older run's stats.json (or none) behind.
    done = job.scan()
    counts = {k: getattr(done, k) for k in COUNT_FIELDS} | {"shards": len(done.shards)}
    if stats is None:
        stats = {**counts, "wall_time_s": 0.0, "generated_tokens_per_s": 0.0, "model": config.model}
        write_json_atomic(path, stats)
    elif any(stats.get(k) != v for k, v in counts.items()):
        stats = {**stats, **counts}
        write_json_atomic(path, stats)
    zero = dict.fromkeys(COUNT_FIELDS, 0)
    return {**stats, "this_run": {**zero, "resumed_after_rows": stats["rows"]},
            "wall_time_s": 0.0, "generated_tokens_per_s": 0.0, "nothing_left": reason}  # fmt: skip
