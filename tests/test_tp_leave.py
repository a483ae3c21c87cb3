"""Leaving a tensor-parallel group at the end of a run never hangs the finished job
(tp_membership.leave_group): NCCL's teardown waits for its peers, and a peer that is gone would
otherwise hold rank 0 there forever."""

from __future__ import annotations

import threading
import time

import torch

from bulkgen.engine import tp_membership


def test_a_teardown_that_hangs_is_left_to_the_exit(monkeypatch, capsys):
    never = threading.Event()
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "destroy_process_group", never.wait)
    started = time.monotonic()
    assert tp_membership.leave_group(timeout_s=0.3) is False
    assert time.monotonic() - started < 2
    assert "did not close within" in capsys.readouterr().err
    never.set()  # let the daemon thread end


def test_a_teardown_in_time_leaves_the_group(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: calls.append(1))
    assert tp_membership.leave_group(timeout_s=5) is True and calls == [1]
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    assert tp_membership.leave_group() is True and calls == [1]  # no group: nothing to leave
