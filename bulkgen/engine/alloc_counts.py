"""The CUDA caching allocator's work during a run, for stats.json. A step whose tensors find no
cached block makes the allocator ask the driver (cudaMalloc); when the device has no memory left
it frees its cached blocks and retries, which synchronizes the device: the host then waits for
every launched step, and the GPU idles while the step is launched after. Counted from the end of
the engine's start (warm-up and graph capture excluded), so a run that allocates in steady state
shows it (None on the CPU)."""

from __future__ import annotations

import torch

# stats.json name: the allocator's memory_stats() counter.
COUNTERS = {
    "alloc_retries": "num_alloc_retries",  # cache freed and allocation retried (a device sync)
    "alloc_syncs": "num_sync_all_streams",  # the allocator synchronized every stream
    "device_mallocs": "num_device_alloc",  # blocks asked of the driver
    "device_frees": "num_device_free",  # blocks given back to it
}


class AllocatorCounts:
    def __init__(self, device: torch.device) -> None:
        self.device = device if device.type == "cuda" else None
        self.start = self._read()

    def _read(self) -> dict[str, int | None]:
        if self.device is None:
            return dict.fromkeys(COUNTERS)
        stats = torch.cuda.memory_stats(self.device)
        return {name: stats.get(key) for name, key in COUNTERS.items()}

    @property
    def stats(self) -> dict[str, int | None]:
        """Each counter's growth since the engine started (None where it is not kept)."""
        now = self._read()
        return {
            name: None if now[name] is None or self.start[name] is None else now[name] - value
            for name, value in self.start.items()
        }
