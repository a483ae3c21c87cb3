"""stats.json: what a run reports (rows, tokens, time, settings), merged with its engine's own
figures (GPU busy, host time per step and the like)."""

from __future__ import annotations

from pathlib import Path

from bulkgen.io.job import Done
from bulkgen.preflight import bulkgen_version
from bulkgen.progress import Counts
from bulkgen.run_config import RunConfig


def run_stats(
    config: RunConfig,
    model_dir: Path,
    done: Done,
    run: Counts,
    new_shards: int,
    row_faults: int,
    load_time: float,
    engine_stats: dict,
) -> dict:
    """done: what complete shards held before this run; run: this run's progress counts."""
    wall = run.elapsed
    stats = {
        "rows": done.rows + run.rows,
        "errors": done.errors + run.errors,
        "prompt_tokens": done.prompt_tokens + run.prompt_tokens,
        "completion_tokens": done.completion_tokens + run.completion_tokens,
        "shards": len(done.shards) + new_shards,
        # Rows whose stage raised (a bug to report), written as error records.
        "row_faults": row_faults,
        "this_run": {
            "rows": run.rows,
            "errors": run.errors,
            "prompt_tokens": run.prompt_tokens,
            "completion_tokens": run.completion_tokens,
            "resumed_after_rows": done.rows,
            **({"input_rows": run.inputs} if config.n > 1 else {}),
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
    if engine_stats.get("device") == "cpu":
        import torch

        stats["torch_threads"] = torch.get_num_threads()  # see cpu.py
    # Engine-side figures (GPU busy and the like) join in, without replacing ours.
    return {**{k: v for k, v in engine_stats.items() if k not in stats}, **stats}
