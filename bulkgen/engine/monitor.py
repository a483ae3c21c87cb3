"""How close a run came to the hardware: NVML GPU busy and decode bandwidth efficiency.

GPU busy is NVML's utilisation sampled every 50 ms in a background thread (nothing on the step
path), over every sample (gpu_busy_pct) and from NVML's first busy sample to its last
(gpu_busy_run_pct): NVML reports the busy share of its own last sample period, so it reads 0 for
a few samples after the first step. With each utilisation sample go the SM clock, the board's
power draw and NVML's clock-event reasons; over the busy samples, stats give the median clock
against the GPU's maximum, the median power, and the share of busy samples the power cap (or a
thermal limit) held the clock down: a long run's steps can be slower than the same steps timed
alone because the GPU runs at a lower clock, not because of anything the engine does. Decode
efficiency counts the bytes each decode step must
read (weights once, plus the live KV of its sequences) over the host time between decode
launches, against a device-to-device copy's bandwidth measured once at startup: in the async
loop the host is paced by the device, so that time is the device's.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

import torch

from bulkgen.engine.step_series import Series


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


# NVML's clock-event reason bits (nvmlClocksEventReasons): the software power cap and the
# thermal slowdowns, software and hardware.
POWER_CAP = 0x4
THERMAL = 0x20 | 0x40


class GpuMonitor:
    def __init__(self, device: torch.device, weight_bytes: int, kv_bytes_per_token: int) -> None:
        self.weight_bytes, self.kv_bytes_per_token = weight_bytes, kv_bytes_per_token
        self.copy_bandwidth = measure_copy_bandwidth(device)
        self.decode_bytes = 0.0
        self.decode_s = 0.0
        self._last_decode: float | None = None
        self._start_counts()
        self._max_clock: int | None = None
        self._failed: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml_handle = self._nvml(device)

    def _start_counts(self) -> None:
        """NVML's samples, counted as they come (a run of hours takes 72,000 an hour: none is
        kept but in the bounded clock and power series, step_series.py)."""
        self._num_samples, self._util_sum = 0, 0
        self._before_busy: tuple[int, int] | None = None  # (samples, util sum) before 1st busy
        self._through_busy = (0, 0)  # (samples, util sum) through the last busy sample
        # With each busy sample: the SM clock (MHz), the board's power (W), whether the
        # clock-event reasons held the power cap or a thermal limit; where NVML can say (a query
        # that fails once is not asked again).
        self._clock_mhz, self._power_w = Series(), Series()
        self._reason_samples, self._capped, self._thermal = 0, 0, 0

    def _add(self, util: int, clock: int | None, power: float | None, reasons: int | None) -> None:
        """One NVML sample: utilisation (%), then what went with it (None: NVML cannot say)."""
        if util > 0 and self._before_busy is None:
            self._before_busy = (self._num_samples, self._util_sum)
        self._num_samples += 1
        self._util_sum += util
        if util <= 0:
            return
        self._through_busy = (self._num_samples, self._util_sum)
        if clock is not None:
            self._clock_mhz.append(clock)
        if power is not None:
            self._power_w.append(power)
        if reasons is not None:
            self._reason_samples += 1
            self._capped += bool(reasons & POWER_CAP)
            self._thermal += bool(reasons & THERMAL)

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

    def _query(self, name: str, *args):
        """pynvml.<name>(handle, *args), or None once it has failed (an old driver, a vGPU)."""
        if name in self._failed:
            return None
        import pynvml

        try:
            return getattr(pynvml, name)(self._nvml_handle, *args)
        except Exception:
            self._failed.add(name)
            return None

    def _reasons(self) -> int | None:
        """The clock-event reasons (older nvidia-ml-py releases name them throttle reasons)."""
        reasons = self._query("nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None:
            reasons = self._query("nvmlDeviceGetCurrentClocksThrottleReasons")
        return reasons

    def _sample(self) -> None:
        import pynvml

        self._max_clock = self._query("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM)
        while True:  # one sample at least, however short the job
            util = pynvml.nvmlDeviceGetUtilizationRates(self._nvml_handle).gpu
            power = self._query("nvmlDeviceGetPowerUsage")  # milliwatts
            self._add(
                util,
                self._query("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM),
                None if power is None else power / 1e3,
                self._reasons(),
            )
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
        if self._num_samples:
            out["gpu_busy_pct"] = round(self._util_sum / self._num_samples, 1)
            if self._before_busy is not None:  # NVML trails the GPU by its own sample period:
                # read from its first busy sample to its last
                (n0, sum0), (n1, sum1) = self._before_busy, self._through_busy
                if n1 > n0:  # (read while the sampler runs: its first busy sample half added)
                    out["gpu_busy_run_pct"] = round((sum1 - sum0) / (n1 - n0), 1)
            out.update(self._clock_stats())
        if self.decode_s > 0:
            achieved = self.decode_bytes / self.decode_s
            out["decode_bandwidth_gbs"] = round(achieved / 1e9, 1)
            out["decode_bandwidth_efficiency"] = round(achieved / self.copy_bandwidth, 3)
        return out

    def _clock_stats(self) -> dict:
        """Clock, power and limits over the samples NVML saw busy."""
        out = {}
        if clocks := list(self._clock_mhz):  # (read while the sampler runs: a copy)
            out["gpu_sm_clock_mhz_median"] = round(statistics.median(clocks))
            if self._max_clock:
                out["gpu_sm_clock_mhz_max"] = self._max_clock
        if powers := list(self._power_w):
            out["gpu_power_w_median"] = round(statistics.median(powers), 1)
        if reasons := self._reason_samples:
            out["gpu_power_capped_pct"] = round(100 * self._capped / reasons, 1)
            out["gpu_thermal_pct"] = round(100 * self._thermal / reasons, 1)
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
