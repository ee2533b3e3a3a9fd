"""Progress of long commands (`sweep run`, `tune`, `invert`), on stderr. On a terminal, tqdm bars
that move with the sample-steps the searches take (streamed from inside a sweep's shards and a
study's trials about once a second); elsewhere (a log, CI) plain lines: one per finished piece
and, every `PLAIN_SECONDS`, one per piece still running that moved. The README's "Progress
lines" section says what each number means."""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

from tqdm import tqdm

from sodaray.costs.flops import format_duration

PLAIN_SECONDS = 60.0  # a log gets a line per running piece at most this often
WINDOW_SECONDS = 10.0  # the batch occupancy "now" is over this much of the recent past
RATE_SECONDS = 30.0  # rates (and so the time left) are over this much of the recent past
# Rates are our own, over the recent past, so the replicas' start-up (which takes no steps)
# does not drag them down for minutes.
STEPS_FORMAT = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} sample-steps [{elapsed}{postfix}]"
)
TRIALS_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total_fmt} trials [{elapsed}{postfix}]"


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


class Recent:
    """Running totals as they were over the last `seconds`: how much each grew in that time."""

    def __init__(self, seconds: float, *start: float) -> None:
        self.seconds = seconds
        self.marks: deque[tuple[float, tuple[float, ...]]] = deque()
        if start:
            self.marks.append((time.monotonic(), start))

    def add(self, *totals: float) -> tuple[float, tuple[float, ...]]:
        """Record `totals` now; returns the seconds and the growth of each since the oldest
        mark in the window (0 seconds: nothing earlier to compare with)."""
        now = time.monotonic()
        self.marks.append((now, totals))
        while len(self.marks) > 2 and self.marks[1][0] <= now - self.seconds:
            self.marks.popleft()
        then, before = self.marks[0]
        return now - then, tuple(a - b for a, b in zip(totals, before, strict=True))


def pace(recent: Recent, done: float, most: float) -> tuple[float | None, str]:
    """The rate of `done` over the recent past and the time the rest of `most` takes at it
    ('at most 5 min left': an upper bound while the rate holds, since found samples stop early
    and `most` counts them at their whole budget); None and '? left' before it is measured."""
    seconds, (grown,) = recent.add(done)
    if seconds <= 0 or grown <= 0:
        return None, "? left"
    rate = grown / seconds
    return rate, f"at most {format_duration((most - done) / rate)} left"


def steps_pace(recent: Recent, done: int, most: int) -> str:
    """'1.23k sample-steps/s, at most 5 min left' (the rate in tqdm's short form, as on bars)."""
    rate, left = pace(recent, done, most)
    if rate is None:
        return "? sample-steps/s"
    return f"{tqdm.format_sizeof(rate)} sample-steps/s, {left}"


def steps_bar(total: int, desc: str, position: int | None = None) -> Any:
    """A tqdm bar counting sample-steps (k, M, G suffixes) out of `total` on stderr."""
    return tqdm(
        total=total,
        desc=desc,
        unit_scale=total >= 10_000,  # 1.23M/20.0M; below, the counts themselves
        bar_format=STEPS_FORMAT,
        position=position,
        file=sys.stderr,
    )


def move_bar(bar: Any, n: float, total: float) -> None:
    bar.total = total
    bar.update(n - bar.n)


def occupancy(recent: Recent, run: Any) -> str:
    """A sweep's batch occupancy: the share of the batch slots that held a search, over the steps
    reported in the last `WINDOW_SECONDS` (`recent`: `Recent(WINDOW_SECONDS, 0, 0)`) and over
    all, from `run`'s totals `slot_steps` (searches stepped) and `capacity_steps` (slots)."""
    _, (slots, capacity) = recent.add(run.slot_steps, run.capacity_steps)
    if not run.capacity_steps:
        return "batch occupancy: no step yet (the replicas load their model first)"
    whole = percent(run.slot_steps, run.capacity_steps)
    window = f"the last {WINDOW_SECONDS:.0f} s"
    if not capacity:
        return f"batch occupancy: no step in {window}, {whole} overall"
    return f"batch occupancy {percent(slots, capacity)} in {window}, {whole} overall"


def _samples(p: Any) -> str:
    return f"{p.finished}/{p.samples} samples finished, {p.found} found"


class SweepProgress:
    """`sweep run`'s progress. On a terminal: a status line (the batch occupancy) over a bar per
    job in sample-steps, with its samples finished and found. Elsewhere: a line per finished
    shard, and a line per running job every `PLAIN_SECONDS`."""

    def __init__(self, sweep: str) -> None:
        self.sweep = sweep
        self.run: Any = None
        self.bars: dict[str, Any] = {}
        self.status: Any = None
        self.rates: dict[str, Recent] = {}  # per job: its sample-steps over RATE_SECONDS
        self.printed: dict[str, float] = {}  # per job: when its last line was printed
        self.started = time.monotonic()  # set again by `start`
        self.occupied = Recent(WINDOW_SECONDS, 0, 0)  # from the start: no steps yet

    def start(self, run: Any, bars: bool) -> None:
        """`run`: the `SweepRun` whose `progress` (per job) and step totals the lines show."""
        self.run, self.started = run, time.monotonic()
        self.occupied = Recent(WINDOW_SECONDS, 0, 0)  # from the start: no steps yet
        if not bars:
            return
        self.status = tqdm(total=0, bar_format="{desc}", position=0, file=sys.stderr)
        self._status()
        width = max(len(job) for job in run.progress)
        for i, (job, p) in enumerate(run.progress.items(), start=1):
            self.bars[job] = steps_bar(p.most, f"{job:<{width}}", position=i)
            self.bars[job].set_postfix_str(_samples(p))

    def job(self, p: Any) -> None:
        """A job's counts changed (`runner.run.JobProgress`)."""
        recent = self.rates.setdefault(p.job, Recent(RATE_SECONDS))
        done = p.finished == p.samples
        speed = "done" if done else steps_pace(recent, p.sample_steps, p.most)
        bar = self.bars.get(p.job)
        if bar is not None:
            move_bar(bar, p.sample_steps, p.most)
            bar.set_postfix_str(f"{speed}, {_samples(p)}")
            self._status()
            return
        now = time.monotonic()  # a log: a line per running job at most every PLAIN_SECONDS
        if done or now - self.printed.get(p.job, self.started) < PLAIN_SECONDS:
            return
        self.printed[p.job] = now
        print(
            f"  {p.job}: {p.sample_steps:,} of at most {p.most:,} sample-steps "
            f"({percent(p.sample_steps, p.most)}), {speed}; {_samples(p)}; "
            f"{occupancy(self.occupied, self.run)}",
            file=sys.stderr,
        )

    def _status(self) -> None:
        self.status.set_description_str(f"{self.sweep}: {occupancy(self.occupied, self.run)}")

    def shard(self, done: Any) -> None:
        """A shard's rows were written (`runner.run.ShardDone`): a log gets a line."""
        if not self.bars:
            print(
                f"  {done.job} shard {done.shard}: {done.samples} samples, {done.found} found, "
                f"{done.exact} exact ({done.seconds:.1f}s)",
                file=sys.stderr,
            )

    def close(self) -> None:
        for bar in [*self.bars.values(), self.status]:
            if bar is not None:
                bar.close()


class TrialProgress:
    """`sodaray tune`'s progress. On a terminal: a bar of trials, each running one counted as the
    share of its most sample-steps taken and named, with the last finished trial's state and
    value. Elsewhere: a line per finished trial, and one of the running trials every
    `PLAIN_SECONDS`."""

    SHOWN = 4  # running trials named on the bar; the rest as "+N"

    def __init__(self, name: str, total: int, bars: bool | None = None) -> None:
        self.bar = None
        self.running: dict[int, Any] = {}  # trial number -> its latest UnitProgress
        self.finished = 0
        self.last = ""
        self.printed = time.monotonic()
        self.recent = Recent(RATE_SECONDS)  # trials done, running ones in part
        if sys.stderr.isatty() if bars is None else bars:
            self.bar = tqdm(total=total, desc=name, bar_format=TRIALS_FORMAT, file=sys.stderr)

    def progress(self, number: int, counts: Any) -> None:
        """A running trial's counts (`experiment.work.UnitProgress`)."""
        self.running[number] = counts
        if self.bar is not None:
            self._show()
        elif time.monotonic() - self.printed >= PLAIN_SECONDS:
            self.printed = time.monotonic()
            line = ", ".join(
                f"trial {n} {percent(c.sample_steps, c.most)} ({c.sample_steps:,} of at most "
                f"{c.most:,} sample-steps, {c.finished} samples finished)"
                for n, c in sorted(self.running.items())
            )
            print(f"  running: {line}", file=sys.stderr)

    def trial(self, outcome: Any) -> None:
        """A trial ended (`tuner.run.TrialOutcome`)."""
        self.running.pop(outcome.number, None)
        self.finished += 1
        value = "-" if outcome.value is None else f"{outcome.value:.4f}"
        self.last = f"#{outcome.number} {outcome.state} {value}"
        if self.bar is not None:
            self._show()
            return
        print(
            f"  trial {outcome.number}: {outcome.state}, value {value} ({outcome.seconds:.0f}s)",
            file=sys.stderr,
        )

    def _show(self) -> None:
        running = sorted(self.running.items())
        done = self.finished + sum(c.sample_steps / c.most if c.most else 1.0 for _, c in running)
        move_bar(self.bar, done, self.bar.total)
        names = [f"#{n} {percent(c.sample_steps, c.most)}" for n, c in running[: self.SHOWN]]
        if len(running) > self.SHOWN:
            names.append(f"+{len(running) - self.SHOWN}")
        parts = [pace(self.recent, done, self.bar.total)[1]]
        parts += [f"running {' '.join(names)}"] if names else []
        parts += [f"last {self.last}"] if self.last else []
        self.bar.set_postfix_str(", ".join(parts))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class InvertProgress:
    """`sodaray invert`'s bar on a terminal: the sample-steps every target's search has taken
    out of the most they can take (`per_target` each: each unfinished target at its whole budget
    at every length it may try), with the targets finished and found. An algorithm without
    steps (the learned inverter) counts targets."""

    def __init__(self, targets: int, per_target: int, stepwise: bool) -> None:
        self.targets, self.per_target, self.stepwise = targets, per_target, stepwise
        self.finished = self.found = 0
        self.recent = Recent(RATE_SECONDS, 0)
        if stepwise:
            self.bar = steps_bar(targets * per_target, "inverting")
        else:
            self.bar = tqdm(total=targets, desc="inverting", unit="target", file=sys.stderr)
        self.bar.set_postfix_str(self._counts())

    def _counts(self) -> str:
        counts = f"{self.finished}/{self.targets} targets finished, {self.found} found"
        if not self.stepwise:
            return counts
        return f"{steps_pace(self.recent, self.bar.n, self.bar.total)}, {counts}"

    def step(self, active: int) -> None:
        """An engine step advanced `active` searches (the `on_batch` hook). The postfix is
        set without a redraw: tqdm redraws at most ten times a second as the count moves."""
        if self.stepwise:
            self.bar.set_postfix_str(self._counts(), refresh=False)
            self.bar.update(active)

    def result(self, result: Any) -> None:
        """A target finished: its unused budget leaves the total."""
        self.finished += 1
        self.found += bool(result.found)
        if self.stepwise:
            move_bar(self.bar, self.bar.n, self.bar.total - (self.per_target - result.steps))
        else:
            self.bar.update(1)
        self.bar.set_postfix_str(self._counts())

    def write(self, line: str) -> None:
        """A result line on stdout, above the bar."""
        self.bar.write(line, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()
