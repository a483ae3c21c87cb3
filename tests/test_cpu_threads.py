"""CPU thread settings (cpu.py): every core on a quiet machine, all but one on a busy one, shared
by a tensor-parallel group's ranks; OMP_NUM_THREADS and OMP_WAIT_POLICY respected."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from bulkgen import cpu


@pytest.fixture
def undecided(monkeypatch):
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "BULKGEN_CPU_QUIET"):
        monkeypatch.setenv(name, "")  # so that monkeypatch restores what the test sets
        monkeypatch.delenv(name)


def machine(monkeypatch, cores: int, others_busy: float | None) -> None:
    monkeypatch.setattr(cpu, "available_cores", lambda: cores)
    monkeypatch.setattr(cpu, "others_busy_cores", lambda: others_busy)


def test_a_busy_machine_leaves_one_core_to_the_pipeline(undecided, monkeypatch):
    machine(monkeypatch, 2, others_busy=1.2)
    assert cpu.engine_threads() == 1
    machine(monkeypatch, 16, others_busy=3.0)
    assert cpu.engine_threads() == 15
    machine(monkeypatch, 1, others_busy=0.9)
    assert cpu.engine_threads() == 1


def test_a_quiet_machine_gives_the_engine_every_core(undecided, monkeypatch):
    machine(monkeypatch, 2, others_busy=0.1)
    assert cpu.engine_threads() == 2
    machine(monkeypatch, 2, others_busy=None)  # cannot tell: counts as busy
    assert cpu.engine_threads() == 1


def test_a_tensor_parallel_group_shares_the_cores(undecided, monkeypatch):
    machine(monkeypatch, 2, others_busy=0.0)
    assert cpu.engine_threads(share=2) == 1
    machine(monkeypatch, 16, others_busy=0.0)
    assert cpu.engine_threads(share=4) == 4


def test_omp_num_threads_wins(undecided, monkeypatch):
    machine(monkeypatch, 2, others_busy=0.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu.engine_threads() == 3


def test_the_decision_is_made_once_and_passed_on(undecided, monkeypatch):
    machine(monkeypatch, 2, others_busy=1.5)
    cpu.before_torch()
    assert os.environ["BULKGEN_CPU_QUIET"] == "0" and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    machine(monkeypatch, 2, others_busy=0.0)  # quiet later: the run keeps its first decision
    assert cpu.engine_threads() == 1

    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.delenv("BULKGEN_CPU_QUIET")
    cpu.before_torch()
    assert os.environ["BULKGEN_CPU_QUIET"] == "1" and "OMP_WAIT_POLICY" not in os.environ
    assert cpu.engine_threads() == 2


def test_a_set_wait_policy_is_kept(undecided, monkeypatch):
    machine(monkeypatch, 2, others_busy=1.5)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    cpu.before_torch()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat (Linux)")
def test_other_processes_busy_cores_are_measured(undecided):
    idle = cpu.others_busy_cores()
    assert idle is not None and 0 <= idle <= cpu.available_cores()
    spin = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    try:
        assert cpu.others_busy_cores(window_s=0.5) > 0.6  # one process spinning on one core
    finally:
        busy.kill()
        busy.wait()


def test_use_cpu_threads_sets_torch_and_turns_tokenizer_threads_off(undecided, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    before = torch.get_num_threads()
    try:
        assert cpu.use_cpu_threads() == 1
        assert torch.get_num_threads() == 1
        assert cpu.os.environ["TOKENIZERS_PARALLELISM"] == "false"
    finally:
        torch.set_num_threads(before)
