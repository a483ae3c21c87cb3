"""The engine's host time per step, for stats.json: what a step costs the host thread besides
its wait for the device, whole and split by the step's kind (decode only: a graph replay; with
prefill: an eager forward) and by phase (scheduling; building the inputs and launching;
applying the previous step's ids and collecting finished requests), so that a slow step says
where its time went."""

from __future__ import annotations

import array

from bulkgen.engine.monitor import step_time_stats

PHASES = ("schedule", "launch", "update")


class HostTimes:
    def __init__(self) -> None:
        self.total = array.array("d")
        self.kind = {"decode": array.array("d"), "mixed": array.array("d")}
        self.phase = {name: array.array("d") for name in PHASES}
        self.mixed_launch = array.array("d")  # the launch phase of steps with prefill

    def record(self, decode_only: bool, phases: tuple[float, float, float]) -> None:
        """One step's seconds in each of PHASES (the wait for the device already taken out)."""
        total = sum(phases)
        self.total.append(total)
        self.kind["decode" if decode_only else "mixed"].append(total)
        for name, seconds in zip(PHASES, phases, strict=True):
            self.phase[name].append(seconds)
        if not decode_only:
            self.mixed_launch.append(phases[1])

    @property
    def stats(self) -> dict:
        """host_ms_per_step_*, host_{decode,mixed}_ms_per_step_*, host_{phase}_ms_per_step_*,
        host_mixed_launch_ms_per_step_*."""
        return step_time_stats(
            host=self.total,
            host_mixed_launch=self.mixed_launch,
            **{f"host_{kind}": seconds for kind, seconds in self.kind.items()},
            **{f"host_{name}": seconds for name, seconds in self.phase.items()},
        )
