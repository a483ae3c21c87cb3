"""The engine's host time per step, for stats.json: what a step costs the host thread besides
its wait for the device, whole and split by the step's kind (decode only: a graph replay; with
prefill: an eager forward) and by phase (scheduling; building the inputs and launching;
applying the previous step's ids and collecting finished requests), so that a slow step says
where its time went. The launch phase is also timed on the engine thread's CPU clock
(host_{decode,mixed}_launch_cpu_*): what the wall clock has beyond it is time the thread did not
run, waiting for the interpreter (another stage holding it) or blocked in a driver call that
sleeps; a driver that spins counts as CPU. Each series in bounded memory (step_series.py)."""

from __future__ import annotations

from bulkgen.engine.monitor import step_time_stats
from bulkgen.engine.step_series import Series

PHASES = ("schedule", "launch", "update")


class HostTimes:
    def __init__(self) -> None:
        self.total = Series()
        self.kind = {"decode": Series(), "mixed": Series()}
        self.phase = {name: Series() for name in PHASES}
        # The launch phase by kind, on the wall clock and on the engine thread's CPU clock.
        self.launch = {"decode": Series(), "mixed": Series()}
        self.launch_cpu = {"decode": Series(), "mixed": Series()}

    def record(
        self, decode_only: bool, phases: tuple[float, float, float], launch_cpu: float
    ) -> None:
        """One step's seconds in each of PHASES (the wait for the device already taken out), and
        the engine thread's CPU seconds in the launch phase."""
        total = sum(phases)
        self.total.append(total)
        kind = "decode" if decode_only else "mixed"
        self.kind[kind].append(total)
        for name, seconds in zip(PHASES, phases, strict=True):
            self.phase[name].append(seconds)
        self.launch[kind].append(phases[1])
        self.launch_cpu[kind].append(launch_cpu)

    @property
    def stats(self) -> dict:
        """host_ms_per_step_* (and _max, with host_max_step its step's index from 0: one slow
        step among thousands is past the p99, and a run's first step may be it),
        host_{decode,mixed}_ms_per_step_*, host_{phase}_ms_per_step_*,
        host_{decode,mixed}_launch_ms_per_step_* and host_{decode,mixed}_launch_cpu_*."""
        slowest = {}
        if self.total.count:
            slowest = {"host_ms_per_step_max": round(1e3 * self.total.max, 3)}
            slowest["host_max_step"] = self.total.max_index
        return slowest | step_time_stats(
            host=self.total,
            **{f"host_{kind}_launch": seconds for kind, seconds in self.launch.items()},
            **{f"host_{kind}_launch_cpu": s for kind, s in self.launch_cpu.items()},
            **{f"host_{kind}": seconds for kind, seconds in self.kind.items()},
            **{f"host_{name}": seconds for name, seconds in self.phase.items()},
        )
