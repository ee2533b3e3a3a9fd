"""Progress of long commands on the terminal: a bar per sweep job, a bar of trials. On a
terminal, tqdm bars on stderr; elsewhere (a log, CI) one plain line per finished piece."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from typing import Any


def mean_occupancy(done: list[Any]) -> float | None:
    """Slot-steps over capacity-steps of finished pieces (None: none measured)."""
    capacity = sum(d.capacity_steps for d in done)
    return sum(d.slot_steps for d in done) / capacity if capacity else None


class SweepProgress:
    """`sweep run`'s progress: on a terminal one bar per job (samples done / total, found so
    far, sample-steps/s) under a line with the batch occupancy; otherwise one line per shard.
    Bars move when a shard's file is written: streamed shards finish one by one."""

    def __init__(self, sweep: str) -> None:
        self.sweep = sweep
        self.bars: dict[str, Any] = {}
        self.status: Any = None
        self.found: dict[str, int] = defaultdict(int)
        self.sample_steps: dict[str, int] = defaultdict(int)
        self.done: list[Any] = []
        self.started = time.perf_counter()

    def start(self, job_samples: dict[str, int], bars: bool) -> None:
        self.started = time.perf_counter()
        if not bars:
            return
        from tqdm import tqdm

        self.status = tqdm(total=0, bar_format="{desc}", position=0, file=sys.stderr)
        self.status.set_description_str(f"{self.sweep}: batch occupancy -")
        width = max(len(job) for job in job_samples)
        for i, (job, total) in enumerate(job_samples.items(), start=1):
            self.bars[job] = tqdm(
                total=total, unit="sample", desc=f"{job:<{width}}", position=i, file=sys.stderr
            )

    def shard(self, done) -> None:
        self.done.append(done)
        self.found[done.job] += done.found
        self.sample_steps[done.job] += done.sample_steps
        rate = self.sample_steps[done.job] / max(time.perf_counter() - self.started, 1e-9)
        window = mean_occupancy([done])
        mean = mean_occupancy(self.done)
        now = "-" if window is None else f"{100 * window:.0f}%"
        overall = "-" if mean is None else f"{100 * mean:.0f}%"
        bar = self.bars.get(done.job)
        if bar is None:
            print(
                f"  {done.job} shard {done.shard}: {done.samples} samples, {done.found} found, "
                f"{done.exact} exact ({done.seconds:.1f}s; batch occupancy {now}, "
                f"mean {overall})",
                file=sys.stderr,
            )
            return
        bar.update(done.samples)
        bar.set_postfix_str(f"found {self.found[done.job]}, {rate:,.0f} sample-steps/s")
        self.status.set_description_str(
            f"{self.sweep}: batch occupancy {now} (since the last shard), mean {overall}"
        )

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        if self.status is not None:
            self.status.close()


class TrialProgress:
    """`sodaray tune`'s progress: a bar of trials, each finished one's state and value."""

    def __init__(self, name: str, total: int) -> None:
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="trial", desc=name, file=sys.stderr)

    def trial(self, outcome: Any) -> None:
        value = "-" if outcome.value is None else f"{outcome.value:.4f}"
        if self.bar is None:
            print(
                f"  trial {outcome.number}: {outcome.state} {value} ({outcome.seconds:.0f}s)",
                file=sys.stderr,
            )
            return
        self.bar.update(1)
        self.bar.set_postfix(last=f"#{outcome.number} {outcome.state} {value}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
