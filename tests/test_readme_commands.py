"""The README's and docs/ pages' commands, run as written.

Every ```bash, ```sh, ```shell or ```python fence in README.md and docs/*.md either runs here
or says in its info string why it cannot: ```bash no-run (expensive, a cluster, a GPU, the
network, a placeholder path). A page's runnable fences run in order, from a sandbox that stands
for the repository root: a folder of links to the root's entries, beside a link to the
workspace's `shared`, so `sweeps/quickstart.yaml` and `../shared/...` resolve as they do from
the root, while what the commands write (`results/`, `report/`, `data/`) stays in the sandbox.
The venv's bin comes first on PATH, as after `source .venv/bin/activate`.

A no-run fence is still checked as far as it can be without running it: each `sodaray ...`
command parses with sodaray's own parser (options, choices, KEY=VALUE overrides), each
`python benchmarks/X.py` names a script that exists, each `make TARGET ...` is accepted by
`make -n`, and a python fence compiles.

The README is the front door: at most 200 lines, linking every docs/ page, and every local link
in it and the docs resolves.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SHARED, STORIES

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = {"bash", "sh", "shell"}
LANGUAGES = SHELLS | {"python"}
NO_RUN = "no-run"
# What the commands write, and never a link into the real root: a run writes into the sandbox.
OUTPUTS = {"results", "report", "data", "tuning-runs", "inverters", "mlflow.db", "mlartifacts"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^`]*)$")
# Each runnable fence's limit: the README's sweep starts a local Ray (slow on a loaded machine).
FENCE_TIMEOUT_S = 600


@dataclass(frozen=True)
class Fence:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    runs: bool
    text: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def fences(page: Path) -> list[Fence]:
    """The fenced blocks of a markdown page, indented ones (inside list items) included."""
    found: list[Fence] = []
    lines = page.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent = len(opening["indent"])
        words = opening["info"].split()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        assert j < len(lines), f"{page.relative_to(ROOT)}:{i + 1}: fence never closed"
        language = words[0] if words else ""
        found.append(Fence(page, i + 1, language, NO_RUN not in words[1:], "\n".join(body)))
        i = j + 1
    return found


def commands(shell_text: str) -> list[list[str]]:
    """A shell fence's simple commands as argument lists: continuations joined, comments
    dropped, split at `&&`, `||`, `;` and `|`."""
    joined = shell_text.replace("\\\n", " ")
    out: list[list[str]] = []
    for line in joined.split("\n"):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        for token in lexer:
            if token in {"&&", "||", ";", "|", "&"}:
                if current:
                    out.append(current)
                current = []
            else:
                current.append(token)
        if current:
            out.append(current)
    return out


def parse_sodaray(argv: list[str]) -> None:
    """Parse as `sodaray.cli.main` does (KEY=VALUE overrides may follow options), running
    nothing; argparse's own error exits through SystemExit."""
    from sodaray.cli import build_parser

    args, rest = build_parser().parse_known_args(argv)
    # As `main`: what argparse leaves over must be KEY=VALUE overrides of a command that takes them.
    extra = [a for a in rest if not (hasattr(args, "overrides") and not a.startswith("-"))]
    assert not extra, f"unrecognized arguments: {extra}"


def check_without_running(argv: list[str], where: str, sandbox: Path) -> None:
    program = Path(argv[0]).name
    if program == "sodaray":
        try:
            parse_sodaray(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"{where}: `{shlex.join(argv)}` does not parse (exit {exc.code})")
    elif program in {"python", "python3"} and len(argv) > 1 and argv[1].endswith(".py"):
        assert (sandbox / argv[1]).is_file(), f"{where}: no script {argv[1]}"
    elif program == "make":
        done = subprocess.run(
            ["make", "-n", *argv[1:]], cwd=sandbox, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"{where}: make -n {argv[1:]}: {done.stderr.strip()}"


def sandbox_for(tmp_path: Path) -> Path:
    """A stand-in for the repository root (links to its entries) beside a link to `shared`."""
    workspace = tmp_path / "workspace"
    root = workspace / "sodaray"
    root.mkdir(parents=True)
    (workspace / "shared").symlink_to(SHARED, target_is_directory=True)
    for entry in ROOT.iterdir():
        if entry.name not in OUTPUTS and entry.name != ".git":
            (root / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return root


def run_fence(fence: Fence, sandbox: Path, env: dict[str, str]) -> float:
    began = time.monotonic()
    if fence.language == "python":
        script = sandbox / f"fence-{fence.page.stem}-{fence.line}.py"
        script.write_text(fence.text, encoding="utf-8")
        argv = [sys.executable, script.name]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", fence.text]
    done = subprocess.run(
        argv, cwd=sandbox, env=env, capture_output=True, text=True, timeout=FENCE_TIMEOUT_S
    )
    assert done.returncode == 0, (
        f"{fence.where()}: exit {done.returncode}\n{fence.text}\n--- stderr:\n"
        f"{done.stderr[-3000:]}"
    )
    return time.monotonic() - began


def test_every_command_fence_is_found_and_says_whether_it_runs() -> None:
    """The extraction sees the README's fences, and each shell or python fence either runs or
    is marked no-run; an unknown word after the language is a typo, not a mark."""
    found = [f for page in PAGES for f in fences(page)]
    readme = [f for f in found if f.page.name == "README.md" and f.language in LANGUAGES]
    assert sum(f.runs for f in readme) >= 4 and any(not f.runs for f in readme)
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").split("\n"), 1):
            opening = FENCE.match(line)
            words = opening["info"].split() if opening else []
            assert not words[1:] or words[1:] == [NO_RUN], (
                f"{page.relative_to(ROOT)}:{number}: fence info {opening['info']!r}: "
                f"only `{NO_RUN}` may follow the language"
            )


def test_fence_extraction() -> None:
    page = ROOT / "README.md"
    sample = fences(page)
    assert sample[0].language == "bash" and not sample[0].runs
    assert commands("a --x 1 \\\n  --y 2  # c\ncd d && b e | f; g") == [
        ["a", "--x", "1", "--y", "2"], ["cd", "d"], ["b", "e"], ["f"], ["g"],
    ]
    with pytest.raises(SystemExit):
        parse_sodaray(["invert", "--no-such-option"])
    with pytest.raises(AssertionError):
        parse_sodaray(["invert", "--model", "m", "stray"])
    parse_sodaray(["sweep", "run", "f.yaml", "--out", "o", "max_steps=5"])


@pytest.mark.skipif(not STORIES.is_dir(), reason="../shared/models/stories260K absent")
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_commands_run_as_written(page: Path, tmp_path: Path) -> None:
    sandbox = sandbox_for(tmp_path)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("RAY_ADDRESS", None)  # a sweep here starts its own local Ray, as on a fresh machine
    env["HF_HUB_OFFLINE"] = "1"  # a fence that reached the network would fail, not hang
    # One thread per process: on a loaded machine torch's default (every core, spinning) made
    # a 100-step search take minutes; the commands' results do not depend on it here.
    env.setdefault("OMP_NUM_THREADS", "1")
    ran: list[str] = []
    for fence in fences(page):
        if fence.language not in LANGUAGES:
            continue
        if fence.language == "python":
            compile(fence.text, fence.where(), "exec")
        else:
            for argv in commands(fence.text):
                check_without_running(argv, fence.where(), sandbox)
        if fence.runs:
            seconds = run_fence(fence, sandbox, env)
            ran.append(f"{fence.where()} {seconds:.0f} s")
    print("\n".join(ran))


def test_the_quickstart_takes_a_model_of_ones_own(tmp_path: Path) -> None:
    """What the README tells a user without ../shared: `make quickstart MODEL=...` hands the
    model to the sweep as `--model`, and the quickstart sweep plans on any model folder."""
    sandbox = sandbox_for(tmp_path)
    done = subprocess.run(
        ["make", "-n", "quickstart", "MODEL=my-org/my-model"],
        cwd=sandbox, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "sweep run sweeps/quickstart.yaml --model 'my-org/my-model' --out results" in done.stdout
    if not STORIES.is_dir():
        pytest.skip("../shared/models/stories260K absent")
    own = tmp_path / "my model"  # a folder of one's own, anywhere, with a space in its path
    own.symlink_to(STORIES, target_is_directory=True)
    plan = subprocess.run(
        [sys.executable, "-m", "sodaray", "sweep", "plan", "sweeps/quickstart.yaml",
         "--model", str(own), "--no-calibrate"],
        cwd=sandbox, capture_output=True, text=True, timeout=300,
    )
    assert plan.returncode == 0, plan.stderr
    assert "sweep quickstart: 2 jobs" in plan.stdout, plan.stdout
    assert plan.stdout.count("my-model_random_soda-temperature") == 2, plan.stdout


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.split("\n")) <= 200
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "docs/ has no pages"
    for page in pages:
        assert f"](docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"
    for needed in ("make quickstart", "make test", "../shared", "report/README.md"):
        assert needed in readme
    for command in ("sodaray invert", "sodaray sweep", "sodaray tune", "sodaray report"):
        assert re.search(rf"^{command}\b", readme, re.M), f"no example of `{command}`"


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_local_links_resolve(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for match in LINK.finditer(text):
        target = match["target"]
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve()
        assert resolved.exists(), f"{page.relative_to(ROOT)}: link {target} names nothing"
        if anchor and resolved.suffix == ".md":
            headings = {
                re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", resolved.read_text(encoding="utf-8"), re.M)
            }
            assert anchor in headings, f"{page.relative_to(ROOT)}: no heading #{anchor}"


def test_the_docs_name_every_result_column() -> None:
    from sodaray.results import RESULT_SCHEMA

    schema_page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    missing = [name for name in RESULT_SCHEMA.names if name not in schema_page]
    assert not missing, f"docs/results.md does not describe {missing}"
