"""stats.json: what a run reports (rows, tokens, time, settings), merged with its engine's own
figures (GPU busy, host time per step and the like)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bulkgen.io.job import Done
from bulkgen.preflight import bulkgen_version
from bulkgen.progress import Counts
from bulkgen.run_config import RunConfig


def job_record(
    config: RunConfig,
    model_dir: Path,
    before: Done,
    run: Counts,
    shards: int,
    wall: float,
    load_time: float,
) -> dict:
    """What every stats.json says of a job (one process or data-parallel): before, what complete
    shards held when it started; run, what this run wrote; shards, the complete shards now."""
    return {
        "rows": before.rows + run.rows,
        "errors": before.errors + run.errors,
        "prompt_tokens": before.prompt_tokens + run.prompt_tokens,
        "completion_tokens": before.completion_tokens + run.completion_tokens,
        "shards": shards,
        "this_run": {
            "rows": run.rows,
            "errors": run.errors,
            "prompt_tokens": run.prompt_tokens,
            "completion_tokens": run.completion_tokens,
            "resumed_after_rows": before.rows,
        },
        "wall_time_s": round(wall, 3),
        "load_time_s": round(load_time, 3),
        "generated_tokens_per_s": round(run.completion_tokens / max(wall, 1e-9), 1),
        "model": config.model,
        "model_path": str(model_dir),
        "sampling": config.job_settings()["sampling"],
        "format": config.format,
        "bulkgen_version": bulkgen_version(),
    }


def run_stats(
    config: RunConfig,
    model_dir: Path,
    done: Done,
    run: Counts,
    new_shards: int,
    row_faults: int,
    load_time: float,
    engine_stats: dict,
    added: Done | None = None,
) -> dict:
    """done: what complete shards held before this run; run: this run's progress counts; added:
    what the shards this run wrote hold (JobDir.counted), whose counts replace the progress's
    where given (as a resume and a data-parallel run count)."""
    shards, elapsed = len(done.shards) + new_shards, run.elapsed
    if added is not None:
        run = replace(Counts.between(Done(), added), started=run.started, inputs=run.inputs)
    stats = job_record(config, model_dir, done, run, shards, elapsed, load_time)
    # Rows whose stage raised (a bug to report), written as error records.
    stats["row_faults"] = row_faults
    if config.n > 1:
        stats["this_run"]["input_rows"] = run.inputs
    if engine_stats.get("device") == "cpu":
        import torch

        stats["torch_threads"] = torch.get_num_threads()  # see cpu.py
    # Engine-side figures (GPU busy and the like) join in, without replacing ours.
    return {**{k: v for k, v in engine_stats.items() if k not in stats}, **stats}
