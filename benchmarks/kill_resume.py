"""What a driver killed mid-sweep loses, and whether its resumed run writes an uninterrupted run's
rows: `sodaray sweep run` of a sweep file into a reference folder, then again into a second
folder killed (SIGKILL of its process group, Ray included) after `--kill-after` seconds, then
resumed. Prints one line per phase and the comparison:

    python benchmarks/kill_resume.py SWEEP.yaml --kill-after 40 [--keep-every 30]

"Redone without kept rows" is what a resume would search again if only whole shards were kept
(the steps of the kept searches); the resumed run's sample-steps are what it searched.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sodaray.results import read_results

COLUMNS = ("tokens", "found", "exact", "steps", "final_loss")


def run(sweep: Path, out: Path, extra: list[str], kill_after: float | None = None) -> float:
    """`sweep run` into `out`; killed after `kill_after` seconds when given. Its wall."""
    cmd = [sys.executable, "-m", "sodaray", "sweep", "run", str(sweep), "--out", str(out), "--json"]
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*cmd, *extra], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        proc.wait(timeout=kill_after)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    else:
        if kill_after is not None:
            raise SystemExit(f"the run ended within {kill_after} s: kill it sooner")
        if proc.returncode != 0:
            raise SystemExit(f"sweep run failed: {proc.stderr.read().decode()[-2000:]}")
    return time.perf_counter() - started


def rows(folder: Path) -> dict[tuple[str, int], tuple]:
    table = read_results(folder)
    columns = [table[c].to_pylist() for c in ("job", "sample_id", *COLUMNS)]
    return {(j, s): tuple(rest) for j, s, *rest in zip(*columns, strict=True)}


def kept_tables(folder: Path) -> list[pa.Table]:
    return [pq.read_table(p) for p in sorted(folder.glob("*/.sodaray/jobs/*/shard-*.kept.pq"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--kill-after", type=float, required=True, metavar="SECONDS")
    parser.add_argument("--keep-every", type=float, default=30.0, metavar="SECONDS")
    parser.add_argument("--work", type=Path, help="folder for the two results (default: a temp)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="kill-resume-"))
    keep = ["--keep-every", str(args.keep_every)]
    wall = run(args.sweep, work / "reference", keep)
    reference = rows(work / "reference")
    print(f"uninterrupted: {len(reference)} rows in {wall:.1f} s", flush=True)
    run(args.sweep, work / "killed", keep, kill_after=args.kill_after)
    shards = sorted((work / "killed").glob("*/*/shard-*.parquet"))
    done = sum(pq.read_metadata(p).num_rows for p in shards)
    before = set(rows(work / "killed")) if shards else set()
    kept = kept_tables(work / "killed")
    for t in kept:
        before |= set(zip(t["job"].to_pylist(), t["sample_id"].to_pylist(), strict=True))
    kept_rows = sum(len(t) for t in kept)
    kept_steps = sum(int(pc.sum(t["steps"]).as_py() or 0) for t in kept)
    print(
        f"killed after {args.kill_after:.0f} s: {len(shards)} shards ({done} rows) written, "
        f"{kept_rows} searches of unfinished shards kept ({kept_steps:,} sample-steps: redone "
        "without kept rows)",
        flush=True,
    )
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "sodaray", "sweep", "run", str(args.sweep), "--out"]
    out = subprocess.run(
        [*cmd, str(work / "killed"), "--json", *keep], capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - started
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    resumed = rows(work / "killed")
    ran = [v for k, v in resumed.items() if k not in before]
    steps = sum(v[COLUMNS.index("steps")] for v in ran)
    same = resumed == reference
    differ = sum(resumed.get(k) != v for k, v in reference.items())
    print(
        f"resumed: {summary['samples_kept']} kept samples taken up, {len(ran)} searched "
        f"({steps:,} sample-steps), {summary['shards_run']} shards written in {wall:.1f} s; "
        "rows as uninterrupted: "
        f"{'yes' if same else f'NO ({differ} of {len(reference)} differ)'}",
        flush=True,
    )


if __name__ == "__main__":
    main()
