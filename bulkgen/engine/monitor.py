"""How close a run came to the hardware: NVML GPU busy and decode bandwidth efficiency.

GPU busy is NVML's utilisation sampled every 50 ms in a background thread (nothing on the step
path), over every sample (gpu_busy_pct) and from NVML's first busy sample to its last
(gpu_busy_run_pct): NVML reports the busy share of its own last sample period, so it reads 0 for
a few samples after the first step. Decode efficiency counts the bytes each decode step must
read (weights once, plus the live KV of its sequences) over the host time between decode
launches, against a device-to-device copy's bandwidth measured once at startup: in the async
loop the host is paced by the device, so that time is the device's.
"""

from __future__ import annotations

import os
import threading
import time

import torch


def measure_copy_bandwidth(device: torch.device, nbytes: int = 256 << 20) -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read and written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    bandwidth = 2 * nbytes / sorted(times)[len(times) // 2]
    del src, dst
    torch.cuda.empty_cache()  # give the buffers back before the KV cache is sized
    return bandwidth


class GpuMonitor:
    def __init__(self, device: torch.device, weight_bytes: int, kv_bytes_per_token: int) -> None:
        self.weight_bytes, self.kv_bytes_per_token = weight_bytes, kv_bytes_per_token
        self.copy_bandwidth = measure_copy_bandwidth(device)
        self.decode_bytes = 0.0
        self.decode_s = 0.0
        self._last_decode: float | None = None
        self._samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml_handle = self._nvml(device)

    @staticmethod
    def _nvml(device: torch.device):
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no NVML (or no nvidia-ml-py): busy is simply not reported
            return None
        # NVML numbers the GPUs as the machine does, whatever CUDA_VISIBLE_DEVICES says (a
        # data-parallel worker sees its GPU as cuda:0): find ours by its UUID.
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            return pynvml.nvmlDeviceGetHandleByUUID(
                uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            )
        except Exception:
            if os.environ.get("CUDA_VISIBLE_DEVICES"):
                return None  # an index would be another GPU's
            return pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)

    def _sample(self) -> None:
        import pynvml

        while True:  # one sample at least, however short the job
            self._samples.append(pynvml.nvmlDeviceGetUtilizationRates(self._nvml_handle).gpu)
            if self._stop.wait(0.05):
                return

    def step(self, decode_only: bool, context_tokens: int) -> None:
        """Called as each step is launched."""
        if self._thread is None and self._nvml_handle is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True, name="gpu-monitor")
            self._thread.start()
        now = time.perf_counter()
        if self._last_decode is not None:
            self.decode_s += now - self._last_decode
        if decode_only:
            self.decode_bytes += self.weight_bytes + context_tokens * self.kv_bytes_per_token
            self._last_decode = now
        else:
            self._last_decode = None

    def stop(self) -> None:
        self._stop.set()

    @property
    def stats(self) -> dict:
        out = {"copy_bandwidth_gbs": round(self.copy_bandwidth / 1e9, 1)}
        if self._samples:
            out["gpu_busy_pct"] = round(sum(self._samples) / len(self._samples), 1)
            busy = [i for i, util in enumerate(self._samples) if util > 0]
            if busy:  # NVML trails the GPU by its own sample period: read from its first busy one
                run = self._samples[busy[0] : busy[-1] + 1]
                out["gpu_busy_run_pct"] = round(sum(run) / len(run), 1)
        if self.decode_s > 0:
            achieved = self.decode_bytes / self.decode_s
            out["decode_bandwidth_gbs"] = round(achieved / 1e9, 1)
            out["decode_bandwidth_efficiency"] = round(achieved / self.copy_bandwidth, 3)
        return out


def step_time_stats(**samples: list[float]) -> dict:
    """Median and p99 milliseconds of each named list of per-step seconds (the engine's host
    time per step, and the mask filling of constrained steps, part of it): host_ms_per_step_*."""
    stats = {}
    for name, seconds in samples.items():
        times = sorted(seconds)
        for label, q in (("median", 0.5), ("p99", 0.99)):
            if times:
                ms = 1e3 * times[min(len(times) - 1, int(q * len(times)))]
                stats[f"{name}_ms_per_step_{label}"] = round(ms, 3)
    return stats
