"""`datasets` is a core dependency, yet nothing imports it eagerly (the GPU machine lacks it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_datasets_is_a_core_dependency():
    text = (REPO / "pyproject.toml").read_text()  # tomllib is Python 3.11+; we support 3.10
    core = text.split("\ndependencies = [", 1)[1].split("\n]", 1)[0]
    assert '"datasets>=' in core


def test_no_bulkgen_module_imports_datasets_when_loaded():
    modules = ["bulkgen.cli", "bulkgen.pipeline", "bulkgen.parallel_local", "bulkgen.score",
               "bulkgen.io.reader", "bulkgen.io.inputs", "bulkgen.llm"]  # fmt: skip
    code = f"import sys; import {', '.join(modules)}; print('datasets' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": ""}, timeout=120)  # fmt: skip
    assert done.stdout.strip() == "False", done.stderr
