"""Sweep the decode kernel's launch (tile, warps, stages, 8-bit V conversion) at the 8B shape.

    PYTHONPATH=. python scripts/tune_decode.py --kv-cache-dtype fp8 [--write-table]
    PYTHONPATH=. python scripts/tune_decode.py --kv-cache-dtype int8 [--write-table]

One JSON line per launch: its median time at each (batch, context), and the geometric mean over
them; then a summary line with the best launch for each batch size (by the geometric mean over
its contexts), the current ones and the bf16 kernel's time at the same shapes (an fp8 cache reads
half the bytes, so its ideal is half the bf16 time). Splits are the engine's own choice for each
tile size (num_kv_splits) in that sweep; then each chosen launch is timed at 1-16 splits over the
shapes it serves, a "splits_for" line each, and keeps a count that beat the heuristic's (the
entry's "splits"). --write-table stores the per-batch launches for the cache kind in
bulkgen/model/attention/decode_tilings.json, which the engine reads (decode_launch; an int8
cache, timed in the value layout the engine gives it, takes fp8's launches until it has its own).

    python scripts/tune_decode.py --from-log tune.txt --write-table

chooses from the lines of an earlier sweep instead (no GPU: the table from a device run's log;
split counts are then left to the heuristic).

Each time is a launch's as a step runs it (bench_attention.steps_us): LAUNCHES_PER_GRAPH
launches back to back in one CUDA graph, cycling over copies of the shape's cache that together
outgrow the L2 (STREAM_BYTES), no L2 clear. Until 2026-12-01 each was one launch replayed after
do_bench's L2 clear, which read 6-11 us more at 32 rows than a step's (bench_decode_layers.py)
and so favoured launches with less to do at the start over those with more parallelism.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math

import torch
from bench_attention import DTYPE, HEAD_DIM, NUM_KV_HEADS, paged_inputs, steps_us
from bench_commit import git_commit

from bulkgen.model.attention.decode_tiling import (
    TILINGS_FILE,
    DecodeLaunch,
    decode_launch,
    fp8_v_slots_inner,
    launch_for_batch,
)
from bulkgen.model.attention.kv_fp8 import resolve_kv_dtype
from bulkgen.model.attention.kv_layout import block_size_for, to_slots_inner, values_slots_inner
from bulkgen.model.attention.triton_decode import paged_decode

SHAPES = [(batch, context) for batch in (32, 256, 512) for context in (1024, 2048)]
LAUNCHES_PER_GRAPH = 16  # launches a timed graph replays (steps_us)
STREAM_BYTES = 256 * 2**20  # K/V bytes a graph cycles through: five times the H200's L2
# At 00df254 (no v_in_registers yet) 8 warps lost everywhere and stages 4 equalled the default;
# v_in_registers changes the registers a thread needs (scripts/kernel_resources.py), so both
# warp counts stay in; it matters for fp8 only. 24 fp8 launches, about 2 minutes on the H200.
BLOCK_NS, WARPS, STAGES, V_IN_REGISTERS = (64, 128, 256), (4, 8), (None, 2), (False, True)
# Split counts timed for each table entry's launch once the launches are chosen (sweep_splits).
SPLITS = (1, 2, 4, 8, 16)
# An fp8 cache's value layouts (kv_layout.py): the engine allocates the faster one, each timed at
# its own block size (16 tokens in rows, 64 slots inner: kv_layout.SLOTS_INNER_BLOCK_SIZE).
# 48 launches in all, about 3 minutes on the H200.
LAYOUTS = ("rows", "slots_inner")
# Launches with each tile's block ids loaded ahead (DecodeLaunch.prefetch_blocks), in the layout
# the engine allocates (an 8-bit cache's values slots inner, a 16-bit one's rows: --kv-cache-dtype
# auto tunes the model dtype's launches, stored under "auto"): compiled for sm_90 they keep 2 (3
# stages) or 4 (4 stages) groups of copies in flight where the others wait for every copy each
# tile (compile_check_attention.py's "copy waits"). 12 launches more, stages 2 left out.
PREFETCH_STAGES = (3, 4)


def time_launch(inputs: dict, launch: DecodeLaunch) -> list[float] | None:
    """Median ms at each shape (steps_us over its copies), or None when the compiler refuses the
    launch."""
    times = []
    for copies in inputs.values():
        calls = []
        for q, k, v, meta, (k_scale, v_scale) in itertools.islice(
            itertools.cycle(copies), LAUNCHES_PER_GRAPH
        ):
            args = (q, k, v, meta.seq_lens, meta.block_tables, HEAD_DIM**-0.5)
            scales = dict(k_scale=k_scale, v_scale=v_scale)  # an int8 cache's scale tensors
            calls.append(functools.partial(paged_decode, *args, launch=launch, **scales))
        try:
            times.append(steps_us(calls) / 1e3)
        except Exception as e:  # e.g. out of shared memory: not a candidate
            print(json.dumps({"skip": launch._asdict(), "error": repr(e)[:200]}), flush=True)
            return None
    return times


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def per_batch_best(results: list[tuple[DecodeLaunch, list[float]]]) -> list[dict]:
    """The table's entries: for each tuned batch size the launch with the smallest geometric mean
    over that batch's contexts, neighbours with the same launch merged, the last for any batch."""
    entries: list[dict] = []
    for batch in sorted({b for b, _ in SHAPES}):
        columns = [i for i, (b, _) in enumerate(SHAPES) if b == batch]
        launch = min(results, key=lambda r: geomean([r[1][i] for i in columns]))[0]
        if entries and entries[-1]["launch"] == launch:
            entries[-1]["max_batch"] = batch
        else:
            entries.append({"max_batch": batch, "launch": launch})
    entries[-1]["max_batch"] = None
    return [{"max_batch": e["max_batch"], **e["launch"]._asdict()} for e in entries]


def shapes(dtype, slots_inner: bool = False) -> dict:
    """Decode inputs at each of SHAPES, with the layout's own block size (block_size_for): as
    many copies as outgrow the L2 together (STREAM_BYTES), one at least."""
    inputs, block_size = {}, block_size_for(slots_inner)
    for s in SHAPES:
        kv_bytes = 2 * s[0] * s[1] * NUM_KV_HEADS * HEAD_DIM * dtype.itemsize
        inputs[s] = []
        for _ in range(-(-STREAM_BYTES // kv_bytes)):
            q, k, v, meta, scales = paged_inputs([s[1]] * s[0], [1] * s[0], True, dtype, block_size)
            inputs[s].append((q, k, to_slots_inner(v) if slots_inner else v, meta, scales))
    return inputs


def entry_of(entries: list[dict], batch: int) -> int:
    """Which table entry serves `batch` rows (launch_for_batch's choice, by index)."""
    return next(
        j for j, e in enumerate(entries) if e["max_batch"] is None or batch <= e["max_batch"]
    )


def with_best_splits(entries: list[dict], split_times: list[dict]) -> list[dict]:
    """split_times[j]: {split count, or None for num_kv_splits' choice: [ms at the shapes entry j
    serves]}; each entry takes the count with the smallest geometric mean (None when the
    heuristic's own is as fast: the table then says nothing)."""
    out = []
    for entry, times in zip(entries, split_times, strict=True):
        best = min(times, key=lambda n: (geomean(times[n]), n is not None))
        out.append({**entry, "splits": best})
    return out


def sweep_splits(kv_dtype: torch.dtype, layout: str, entries: list[dict]) -> list[dict]:
    """Each entry's launch timed at SPLITS (and num_kv_splits' choice) over the shapes it serves,
    a line each; the entries with their fastest split counts."""
    inputs = shapes(kv_dtype, layout == "slots_inner")
    split_times = []
    for j, entry in enumerate(entries):
        served = {s: inputs[s] for s in SHAPES if entry_of(entries, s[0]) == j}
        launch = launch_for_batch({k: v for k, v in entry.items() if k != "max_batch"}, None)
        times = {None: time_launch(served, launch)}
        for n in SPLITS:
            if (t := time_launch(served, launch._replace(splits=n))) is not None:
                times[n] = t
        row = {"splits_for": entry["max_batch"], "launch": launch._asdict()}
        print(
            json.dumps({**row, "ms": {str(n): [round(x, 4) for x in t] for n, t in times.items()}})
        )
        split_times.append(times)
    return with_best_splits(entries, split_times)


def sweep(
    fp8: bool, kv_dtype: torch.dtype, layouts: tuple[str, ...] = LAYOUTS
) -> tuple[list[float], dict[str, list]]:
    """(bf16 kernel's times, {value layout: [(launch, times)]}) measured now, each launch printed
    as it ends. An fp8 cache is timed with its values in each of `layouts` (kv_layout.py's)."""
    bf16_times = time_launch(shapes(DTYPE), decode_launch(HEAD_DIM, fp8=False))
    results, own = {}, engine_layout(kv_dtype)
    for layout in layouts if fp8 else (own,):
        torch.cuda.empty_cache()
        inputs = shapes(kv_dtype, layout == "slots_inner")
        results[layout] = []
        eight_bit = kv_dtype != DTYPE  # fp8 or int8: where V becomes fp16 matters
        launches = [
            DecodeLaunch(block_n, warps, stages, v_in_registers)
            for block_n, warps, stages, v_in_registers in itertools.product(
                BLOCK_NS, WARPS, STAGES, V_IN_REGISTERS if eight_bit else (False,)
            )
        ]
        if layout == own:
            launches += [
                DecodeLaunch(block_n, warps, stages, prefetch_blocks=True)
                for block_n, warps, stages in itertools.product(BLOCK_NS, WARPS, PREFETCH_STAGES)
            ]
        for launch in launches:
            times = time_launch(inputs, launch)
            if times is None:
                continue
            results[layout].append((launch, times))
            row = {"layout": layout, "launch": launch._asdict()}
            row["geomean_ms"] = round(geomean(times), 4)
            print(json.dumps({**row, "ms": dict(zip(map(str, SHAPES), times, strict=True))}))
        del inputs
    return bf16_times, results


def engine_layout(kv_dtype: torch.dtype) -> str:
    """The value layout the engine allocates for a cache of this dtype (kv_layout's
    values_slots_inner: an int8 cache's follows fp8's measured one, 16-bit caches' rows)."""
    return "slots_inner" if values_slots_inner(kv_dtype, fp8_v_slots_inner()) else "rows"


def best_layout(results: dict[str, list]) -> str:
    """The value layout whose per-batch best launches have the smallest geometric mean."""

    def score(layout: str) -> float:
        entries, by_launch = per_batch_best(results[layout]), dict(results[layout])
        chosen = [launch_for_batch(entries, b) for b, _ in SHAPES]
        return geomean([by_launch[c][i] for i, c in enumerate(chosen)])

    return min(results, key=score)


def from_log(path: str) -> tuple[list[float] | None, dict[str, list]]:
    """The launches' lines (by layout; rows if a line names none) and the bf16 times, if a
    summary holds them, of an earlier sweep."""
    results, bf16_times = {}, None
    for line in open(path):
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if "launch" in row:
            times = [row["ms"][str(s)] for s in SHAPES]
            layout = results.setdefault(row.get("layout", "rows"), [])
            layout.append((DecodeLaunch(**row["launch"]), times))
        elif "bf16_ms" in row:
            bf16_times = row["bf16_ms"]
    return bf16_times, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv-cache-dtype", default="fp8", help="fp8, int8 (tuned ones) or auto")
    ap.add_argument("--write-table", action="store_true", help="store the best launches")
    ap.add_argument("--from-log", help="choose from an earlier sweep's lines (no GPU)")
    ap.add_argument(
        "--layouts",
        default=",".join(LAYOUTS),
        help="an fp8 cache's value layouts to time (slots_inner alone: half the launches; rows "
        "lost at 08ed75e and 49fbb99)",
    )
    args = ap.parse_args()
    layouts = tuple(args.layouts.split(","))
    assert set(layouts) <= set(LAYOUTS), f"layouts are {LAYOUTS}"
    fp8 = args.kv_cache_dtype == "fp8"
    if args.from_log:
        bf16_times, results = from_log(args.from_log)
        device = f"the sweep in {args.from_log}"
    else:
        bf16_times, results = sweep(fp8, resolve_kv_dtype(args.kv_cache_dtype, DTYPE), layouts)
        device = torch.cuda.get_device_name()
    layout = best_layout(results)
    table_entries = per_batch_best(results[layout])
    chosen = [launch_for_batch(table_entries, b) for b, _ in SHAPES]
    by_launch = dict(results[layout])
    times = [by_launch[launch][i] for i, launch in enumerate(chosen)]
    if not args.from_log:  # an earlier log's split lines are not read back: the heuristic's
        kv_dtype = resolve_kv_dtype(args.kv_cache_dtype, DTYPE)
        table_entries = sweep_splits(kv_dtype, layout, table_entries)
    kind = args.kv_cache_dtype
    # The sweep's launches leave splits to the heuristic: the current ones are compared so.
    current = [
        decode_launch(HEAD_DIM, kind != "auto", b, kind)._replace(splits=None) for b, _ in SHAPES
    ]
    current_layout = engine_layout(resolve_kv_dtype(kind, DTYPE))
    now = dict(results.get(current_layout, []))
    summary = {
        "summary": "decode_launch",
        "kv_cache_dtype": args.kv_cache_dtype,
        "layout": layout,
        "best": table_entries,
        "best_ms": [round(t, 4) for t in times],
        "current_layout": current_layout,
        "current": [launch._asdict() for launch in current],
        "current_ms": [round(now[c][i], 4) if c in now else None for i, c in enumerate(current)],
        "bf16_ms": bf16_times and [round(t, 4) for t in bf16_times],
        "best_vs_bf16": bf16_times
        and [round(t / b, 3) for t, b in zip(times, bf16_times, strict=True)],
        "shapes": [list(s) for s in SHAPES],
        "git_commit": git_commit(),
    }
    print(json.dumps(summary), flush=True)
    if args.write_table:
        table = json.loads(TILINGS_FILE.read_text()) if TILINGS_FILE.exists() else {}
        table.setdefault("launches", {}).setdefault(args.kv_cache_dtype, {})[str(HEAD_DIM)] = (
            table_entries
        )
        if fp8:
            table["fp8_v_layout"] = layout
        # Each kind says where its launches were measured (the table's one "measured" line
        # described fp8's launches alone, and would go stale beside a 16-bit kind's).
        table.pop("measured", None)
        by = f"{device}, scripts/tune_decode.py --kv-cache-dtype {args.kv_cache_dtype} at "
        table.setdefault("measured_by_kind", {})[args.kv_cache_dtype] = by + summary["git_commit"]
        TILINGS_FILE.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
