"""Issue 53: nothing sodaray writes goes through a link, over a device or a FIFO, or outside the
folder it was given (`sodaray.io.writes`).

Two tables. `ESCAPES`: the issue's cases, each with the line it must now end in. The fuzzer: a
table generated for each command that writes. The command runs once into a scratch folder, and
every file and folder it left there (plus the ones it writes and removes again within a run:
locks, kept rows) is a place; at each place, one at a time, goes each hazard: a link to a file
outside, a link to a folder outside, a character device, a FIFO, a folder (at a file's place)
and a read-only file. The command then runs again and must exit 0, or 2 with one line on stderr
and no traceback; nothing outside its folder may change, no device or FIFO may be replaced or
removed (one set aside stays), and nothing may block (a FIFO opened for reading would).

Cheap by design: a resumed sweep's cases start from the scratch run's finished folder with its
shard's rows also kept (`.kept.pq`), so even a shard set aside is written again without a
search; the other commands start from an empty folder, and check every file they will write
before their work (`writes.check_places`), so a refused case costs no search or training. A
read-only file is a regular file to replace (root ignores the mode, and a rename never asks
it), so each command's read-only files go in at every file place at once, in one run that must
succeed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import STORIES, cli_outcome

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

MODEL = str(STORIES)
SWEEP = (
    f'name: s\nmodels: [{{id: "{MODEL}", num_cpus: 1}}]\n'
    'datasets: [{name: random, build: {dataset: random, lengths: "1", per_length: 2}}]\n'
    "algorithms: [{name: soda}]\nmax_steps: 3\n"
)
TUNE = (
    f'name: t\nmodel: {{id: "{MODEL}"}}\n'
    'data: {build: {dataset: random, lengths: "1", per_length: 2, seed: 0}}\n'
    "space: {learning_rate: {low: 0.01, high: 0.1}}\nmax_steps: 3\ntrials: 1\n"
)
CASE_SECONDS = 60  # a case still running after this blocked (on a FIFO): it fails


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]  # {in}: the inputs' folder, {o}: the output folder, {rows}: results
    resume: bool = False  # cases start from the scratch run's folder, else from an empty one
    transient: tuple[str, ...] = ()  # places a run writes and removes again (globs under {o})
    ray: bool = False  # its scratch run needs Ray


COMMANDS = {
    "sweep-run": Command(
        ("sweep", "run", "{in}/s.yaml", "--out", "{o}"),
        resume=True,
        transient=("s/.sodaray/jobs/*/job.lock", "s/.sodaray/jobs/*/shard-00000.kept.pq"),
        ray=True,
    ),
    "tune": Command(
        ("tune", "{in}/t.yaml", "--out", "{o}"), transient=("t/study.journal.lock",), ray=True
    ),
    "report": Command(("report", "{rows}", "--out", "{o}", "--format", "md,csv")),
    "invert": Command(
        ("invert", "--model", MODEL, "--tokens", "172", "--max-steps", "3", "--out", "{o}/r.pq")
    ),
    "data-build": Command(
        ("data", "build", "--model", MODEL, "--dataset", "random", "--lengths", "1")
        + ("--per-length", "2", "--out", "{o}/d.parquet")
    ),
    "train-inverter": Command(
        ("train-inverter", "--model", MODEL, "--out", "{o}", "--shape", "tiny", "--lengths", "1")
        + ("--per-length", "4", "--epochs", "1", "--batch-size", "4", "--warmup-steps", "1")
        + ("--output-tokens", "2", "--threads", "1", "--json")
    ),
}
HAZARDS = ("link-file", "link-dir", "chardev", "fifo", "dir", "read-only")


@dataclass(frozen=True)
class Scratch:
    """A command's scratch run: its inputs, its output folder, and the places it writes
    (relative to the output folder: folders end in `/`)."""

    inputs: Path
    out: Path
    places: tuple[str, ...]


_SCRATCH: dict[str, Scratch] = {}


def argv_for(name: str, inputs: Path, out: Path, request) -> list[str]:
    rows = str(scratch(name="sweep-run", request=request).out / "s") if name == "report" else ""
    fill = {"{in}": str(inputs), "{o}": str(out), "{rows}": rows}
    argv = []
    for arg in COMMANDS[name].argv:
        for key, value in fill.items():
            arg = arg.replace(key, value)
        argv.append(arg)
    return argv


def scratch(name: str, request) -> Scratch:
    """The command's scratch run (once per session): what it wrote is the table's places."""
    if name in _SCRATCH:
        return _SCRATCH[name]
    command = COMMANDS[name]
    if command.ray:
        request.getfixturevalue("local_ray")
    root = request.getfixturevalue("tmp_path_factory").mktemp(f"scratch-{name}")
    inputs, out = root / "in", root / "o"
    inputs.mkdir()
    (inputs / "s.yaml").write_text(SWEEP)
    (inputs / "t.yaml").write_text(TUNE)
    capsys = request.getfixturevalue("capsys")
    code, err, _ = cli_outcome(argv_for(name, inputs, out, request), capsys, CASE_SECONDS)
    assert code == 0, err
    if name == "sweep-run":  # its shard's rows also kept, as a run stopped before the rename
        (shard,) = out.glob("s/*/shard-00000.parquet")
        (meta,) = out.glob("s/.sodaray/jobs/*")
        shutil.copy(shard, meta / "shard-00000.kept.pq")
    places = {_relative(p, out) for p in out.rglob("*")}
    for pattern in command.transient:
        parent, _, leaf = pattern.rpartition("/")
        places |= {_relative(p, out) + leaf for p in out.glob(parent)}
    _SCRATCH[name] = Scratch(inputs, out, tuple(sorted(places)))
    return _SCRATCH[name]


def _relative(path: Path, out: Path) -> str:
    rel = path.relative_to(out).as_posix()
    return rel + "/" if path.is_dir() and not path.is_symlink() else rel


def cases(places: tuple[str, ...], hazard: str) -> list[tuple[str, ...]]:
    """The runs for one hazard: one place each, except read-only files, all in one run (a
    folder's place, or a lock's, gets a read-only file in a run of its own: it is refused,
    or broken as a stale lock)."""
    own = [p for p in places if p.endswith("/") or Path(p).match("*.lock")]
    files = [p for p in places if p not in own]
    if hazard == "dir":
        return [(p,) for p in places if not p.endswith("/")]
    if hazard == "read-only":
        return [(p,) for p in own] + [tuple(files)]
    return [(p,) for p in places]


def case_count(places: tuple[str, ...], hazard: str) -> int:
    return sum(len(run) for run in cases(places, hazard))


def place(hazard: str, path: Path, outside: Path, original: Path) -> None:
    """Put `hazard` at `path` (whatever was there removed, its folders made)."""
    if path.is_symlink() or path.is_file() or path.exists() and not path.is_dir():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if hazard == "link-file":
        path.symlink_to(outside / "target.txt")
    elif hazard == "link-dir":
        path.symlink_to(outside / "dir")
    elif hazard == "chardev":
        try:
            os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 3))  # /dev/null's numbers
        except PermissionError:
            pytest.skip("os.mknod needs root (CAP_MKNOD) here: the character-device rows")
    elif hazard == "fifo":
        os.mkfifo(path)
    elif hazard == "dir":
        path.mkdir()
        (path / "keep.txt").write_text("a folder where a file goes\n")
    else:  # read-only: the file the scratch run wrote (a folder's place: a file)
        if original.is_file():
            shutil.copyfile(original, path)
        else:
            path.write_text("a file where a folder goes\n")
        path.chmod(0o444)


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every name under `folder` (links not followed): its kind, and a file's size, hash and
    modification time."""
    seen: dict[str, tuple] = {}
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            path = Path(top, name)
            info = path.lstat()
            digest = ""
            if stat.S_ISREG(info.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            key = path.relative_to(folder).as_posix()
            seen[key] = (stat.S_IFMT(info.st_mode), info.st_size, digest, info.st_mtime_ns)
    return seen


def specials(folder: Path) -> int:
    """Character devices and FIFOs under `folder` (links not followed)."""
    kinds = [v[0] for v in snapshot(folder).values()]
    return sum(k in (stat.S_IFCHR, stat.S_IFIFO) for k in kinds)


def run_case(
    name: str, hazard: str, where: tuple[str, ...], work: Path, request, capsys
) -> tuple[int, str, list[str]]:
    """One run of the table: its exit code, stderr, and what went wrong (nothing: [])."""
    source = scratch(name, request)
    out, outside = work / "o", work / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "target.txt").write_text("outside: must not change\n")
    (outside / "dir" / "inner.txt").write_text("outside: must not change either\n")
    if COMMANDS[name].resume:
        shutil.copytree(source.out, out, symlinks=True)
    else:
        out.mkdir()
    for rel in where:
        place(hazard, out / rel.rstrip("/"), outside, source.out / rel.rstrip("/"))
    before, nodes = snapshot(outside), specials(work)
    code, err, problems = cli_outcome(
        argv_for(name, source.inputs, out, request), capsys, CASE_SECONDS
    )
    if hazard == "read-only" and len(where) > 1 and code != 0:
        problems.append(f"read-only files must be replaced: {err.strip()!r}")
    if snapshot(outside) != before:
        problems.append("a file outside the output folder changed")
    if specials(work) != nodes:
        problems.append("a device or FIFO was replaced or removed")
    return code, err, problems


@pytest.mark.parametrize("hazard", HAZARDS)
@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_command_writes_through_a_link_or_over_a_device(name, hazard, tmp_path, request, capsys):
    places = scratch(name, request).places
    assert places, f"{name} wrote nothing in its scratch run"
    failed = []
    for k, where in enumerate(cases(places, hazard)):
        *_, problems = run_case(name, hazard, where, tmp_path / f"case{k}", request, capsys)
        if problems:
            failed.append(f"{hazard} at {', '.join(where)}: {problems}")
    assert failed == []


def test_the_table_covers_every_place_each_command_writes(request):
    """The places each scratch run found: what the table runs against (a command whose
    listing shrank would quietly test less)."""
    counts = {name: len(scratch(name, request).places) for name in COMMANDS}
    assert counts["sweep-run"] >= 10 and counts["tune"] >= 10 and counts["train-inverter"] >= 13
    assert all(n >= 1 for n in counts.values()), counts
    by = {n: sum(case_count(scratch(n, request).places, h) for h in HAZARDS) for n in COMMANDS}
    total = sum(by.values())
    print(f"write fuzzer: {total} cases over {sum(counts.values())} places: {by}")  # with -s
    assert total >= 200


# ---- the issue's escape cases -------------------------------------------------------------------
# (id, command, place under --out (a glob), hazard, the line it ends in)
LINKED = "is a symbolic link; sodaray does not write through links"
ESCAPES = [
    ("sweep-job-json-linked-outside", "sweep-run", "s/.sodaray/jobs/*/job.json", "link-file"),
    ("report-readme-linked-outside", "report", "README.md", "link-file"),
    ("tune-best-preset-linked-outside", "tune", "t/best_preset.yaml", "link-file"),
    ("invert-out-a-character-device", "invert", "r.pq", "chardev"),
]
MESSAGES = {
    "link-file": LINKED,
    "chardev": "is a character device; sodaray replaces only regular files",
}


@pytest.mark.parametrize("name,where,hazard", [e[1:] for e in ESCAPES], ids=[e[0] for e in ESCAPES])
def test_the_issues_escapes_end_in_one_line_and_change_nothing_outside(
    name, where, hazard, tmp_path, request, capsys
):
    (match,) = [p for p in scratch(name, request).places if Path(p).match(where)]
    code, err, problems = run_case(name, hazard, (match,), tmp_path, request, capsys)
    assert problems == []
    assert code == 2 and f"{Path(match).name} {MESSAGES[hazard]}" in err, err


# ---- the rule itself, where no command reaches -------------------------------------------------
def test_the_rule_refuses_names_outside_and_links_anywhere_below_the_given_folder(tmp_path):
    from sodaray.io.paths import PathEscape
    from sodaray.io.writes import UnsafeWrite, move_file, remove_file, touch_file, write_file

    base, elsewhere = tmp_path / "o", tmp_path / "elsewhere"
    (base / "a").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "f").write_text("kept\n")
    for escape in (base / ".." / "elsewhere" / "f", elsewhere / "f", Path("/") / "f"):
        with pytest.raises(PathEscape, match="would be written outside"):
            write_file(base, escape, "x")
    # A link below the folder is refused even where it points back inside it.
    (base / "back").symlink_to(base / "a")
    with pytest.raises(UnsafeWrite, match="back is a symbolic link"):
        write_file(base, base / "back" / "f", "x")
    with pytest.raises(UnsafeWrite, match="back is a symbolic link"):
        remove_file(base, base / "back" / "f")
    (base / "dev").symlink_to(elsewhere / "f")
    with pytest.raises(UnsafeWrite, match="dev is a symbolic link"):
        move_file(base, base / "a", base / "dev")
    before = (elsewhere / "f").stat().st_mtime_ns
    time_before = os.stat(base / "dev", follow_symlinks=False).st_mtime_ns
    touch_file(base, base / "dev")  # a link's target is never touched, nor the link
    assert (elsewhere / "f").stat().st_mtime_ns == before
    assert os.stat(base / "dev", follow_symlinks=False).st_mtime_ns == time_before
    assert (elsewhere / "f").read_text() == "kept\n" and sorted(os.listdir(elsewhere)) == ["f"]
    # The folder the user gave may itself be a link they chose.
    (tmp_path / "chosen").symlink_to(elsewhere)
    assert write_file(tmp_path / "chosen", tmp_path / "chosen" / "new" / "g", b"y")
    assert (elsewhere / "new" / "g").read_bytes() == b"y"


def test_an_exclusive_write_never_replaces_what_is_there(tmp_path):
    from sodaray.io.writes import write_file

    assert write_file(tmp_path, tmp_path / "lock", "first", exclusive=True)
    assert not write_file(tmp_path, tmp_path / "lock", "second", exclusive=True)
    os.mkfifo(tmp_path / "fifo")  # never opened: it would block
    assert not write_file(tmp_path, tmp_path / "fifo", "x", exclusive=True)
    assert (tmp_path / "lock").read_text() == "first"
    assert sorted(os.listdir(tmp_path)) == ["fifo", "lock"]  # no temporary file left
