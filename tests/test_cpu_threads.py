"""CPU thread settings (cpu.py): one core left to the pipeline, OMP_NUM_THREADS respected."""

from __future__ import annotations

import torch

from bulkgen import cpu


def test_the_engine_gets_all_cores_but_one(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu, "available_cores", lambda: 2)
    assert cpu.engine_threads() == 1
    monkeypatch.setattr(cpu, "available_cores", lambda: 16)
    assert cpu.engine_threads() == 15
    monkeypatch.setattr(cpu, "available_cores", lambda: 1)
    assert cpu.engine_threads() == 1


def test_omp_num_threads_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu.engine_threads() == 3


def test_use_cpu_threads_sets_torch_and_turns_tokenizer_threads_off(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    before = torch.get_num_threads()
    try:
        assert cpu.use_cpu_threads() == 1
        assert torch.get_num_threads() == 1
        assert cpu.os.environ["TOKENIZERS_PARALLELISM"] == "false"
    finally:
        torch.set_num_threads(before)
