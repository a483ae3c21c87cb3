"""STYLE.md, habit 1: one concept per file; past 300 lines, split it."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bulkgen"


def test_no_module_is_over_300_lines():
    sizes = {p.relative_to(PACKAGE).as_posix(): len(p.read_text().splitlines())
             for p in PACKAGE.rglob("*.py")}  # fmt: skip
    assert {name: n for name, n in sizes.items() if n > 300} == {}
