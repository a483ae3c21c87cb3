"""A tuner run over some projections and row counts replaces only those choices of the FP8 GEMM
table (scripts/tune_fp8_mm.py --write-table --merge, fp8_gemm_table.merged_shapes), and
BULKGEN_FP8_GEMM_TABLE points the dispatch at another table for A/B runs of two in one call."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():  # before triton's import: later files' kernels interpret
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from bulkgen.engine.engine_stats import env_overrides  # noqa: E402
from bulkgen.model import fp8_gemm_table  # noqa: E402
from bulkgen.model.fp8_gemm import CANDIDATES  # noqa: E402
from bulkgen.model.fp8_gemm_table import SCALED_MM, TABLE_ENV, gemm_choice, merged_shapes  # noqa: E402

OLD = {
    "4096x4096": [
        {"max_m": 4, "kernel": "m16n64k128s4t"},
        {"max_m": 32, "kernel": SCALED_MM},
        {"max_m": 64, "kernel": "m64n64k128s2"},
    ],
    "6144x4096": [{"max_m": 64, "kernel": "m16n64k128s2t"}],
}


def choices_at(buckets: list[dict], ms) -> list[str | None]:
    """The kernel each M takes from a shape's buckets, as gemm_choice picks (None past them)."""
    return [next((b["kernel"] for b in buckets if m <= b["max_m"]), None) for m in ms]


def test_a_merge_replaces_the_measured_ms_and_keeps_every_other_choice():
    merged = merged_shapes(OLD, {"4096x4096": {16: "m32n64k128s1t"}})
    assert merged["6144x4096"] == OLD["6144x4096"]
    assert merged["4096x4096"] == [
        {"max_m": 4, "kernel": "m16n64k128s4t"},
        {"max_m": 16, "kernel": "m32n64k128s1t"},
        {"max_m": 32, "kernel": SCALED_MM},
        {"max_m": 64, "kernel": "m64n64k128s2"},
    ]
    ms = [1, 4, 5, 16, 17, 32, 33, 64, 65]
    expected = choices_at(OLD["4096x4096"], ms)
    expected[2:4] = ["m32n64k128s1t"] * 2  # 5-16 rows: the new M's bucket
    assert choices_at(merged["4096x4096"], ms) == expected


def test_a_merge_that_agrees_with_the_table_leaves_it_as_it_was():
    assert merged_shapes(OLD, {"4096x4096": {32: SCALED_MM, 64: "m64n64k128s2"}}) == OLD
    assert merged_shapes(OLD, {}) == OLD


def test_a_merge_adds_shapes_and_ms_past_the_table():
    merged = merged_shapes(OLD, {"28672x4096": {32: "m32n64k128s1td"}, "6144x4096": {128: "x"}})
    assert merged["28672x4096"] == [{"max_m": 32, "kernel": "m32n64k128s1td"}]
    assert merged["6144x4096"] == OLD["6144x4096"] + [{"max_m": 128, "kernel": "x"}]


@pytest.fixture
def tuner(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import tune_fp8_mm

    path = tmp_path / "table.json"
    base = {"device": "H", "commit": "abc", "measured": "d", "fast_accum": True, "shapes": OLD}
    path.write_text(json.dumps(base))
    monkeypatch.setattr(tune_fp8_mm, "TABLE_FILE", path)
    monkeypatch.setattr(tune_fp8_mm, "git_commit", lambda: "new1234")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "test GPU")

    def tune_projection(name, n, k, rows, dev):  # made-up seconds: the m32 launch wins at 32
        return {m: {SCALED_MM: 2e-5, "m32n64k128s1t": 1e-5 if m == 32 else 3e-5} for m in rows}

    monkeypatch.setattr(tune_fp8_mm, "tune_projection", tune_projection)
    return tune_fp8_mm, path


def test_the_tuner_merges_one_projections_rows_into_the_table(tuner, monkeypatch):
    tune_fp8_mm, path = tuner
    argv = ["tune_fp8_mm.py", "--write-table", "--merge", "--rows", "16,32", "--proj", "o"]
    monkeypatch.setattr("sys.argv", argv)
    tune_fp8_mm.main()
    written = json.loads(path.read_text())
    assert (written["device"], written["commit"], written["fast_accum"]) == ("H", "abc", True)
    assert written["shapes"]["6144x4096"] == OLD["6144x4096"]  # qkv: not measured
    ms = [1, 4, 5, 16, 17, 32, 33, 64]
    assert choices_at(written["shapes"]["4096x4096"], ms) == [
        "m16n64k128s4t", "m16n64k128s4t", SCALED_MM, SCALED_MM,
        "m32n64k128s1t", "m32n64k128s1t", "m64n64k128s2", "m64n64k128s2",
    ]  # fmt: skip
    [update] = written["updates"]
    assert update["commit"] == "new1234" and update["rows"] == {"4096x4096": [16, 32]}
    assert update["how"].endswith("--merge")


def test_the_tuner_refuses_to_merge_sums_timed_the_other_way(tuner, monkeypatch):
    tune_fp8_mm, path = tuner
    argv = ["tune_fp8_mm.py", "--write-table", "--merge", "--rows", "32", "--exact-sums"]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit, match="fast_accum True"):
        tune_fp8_mm.main()
    assert json.loads(path.read_text())["shapes"] == OLD


@pytest.fixture
def fresh_dispatch():
    fp8_gemm_table.measured_choices.cache_clear()
    gemm_choice.cache_clear()
    yield
    fp8_gemm_table.measured_choices.cache_clear()
    gemm_choice.cache_clear()


def test_the_environment_names_another_table_for_the_dispatch(
    fresh_dispatch, monkeypatch, tmp_path
):
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps({"shapes": {"4096x4096": [{"max_m": 8, "kernel": "m32n64k128s1t"}]}})
    )
    monkeypatch.setenv(TABLE_ENV, str(other))
    assert gemm_choice(4096, 4096, 8) == CANDIDATES["m32n64k128s1t"]
    assert gemm_choice(4096, 4096, 9) is None  # past its buckets: _scaled_mm
    assert env_overrides()[TABLE_ENV] == str(other)  # stats.json records which table ran


def test_a_missing_table_named_by_the_environment_is_an_error(fresh_dispatch, monkeypatch):
    monkeypatch.setenv(TABLE_ENV, "/nonexistent/table.json")
    with pytest.raises(FileNotFoundError, match="BULKGEN_FP8_GEMM_TABLE names /nonexistent"):
        gemm_choice(4096, 4096, 8)
