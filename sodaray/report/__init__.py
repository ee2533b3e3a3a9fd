"""Reports: the paper's tables (Markdown, LaTeX, CSV) and figures (PNG) regenerated from result
rows, wherever the rows for them are present."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sodaray.io.files import read_json, what_is
from sodaray.io.paths import component
from sodaray.io.writes import check_places, make_folder, remove_file, write_file
from sodaray.report import budget, metrics
from sodaray.report.drawing import save
from sodaray.report.figures import FIGURES
from sodaray.report.rows import add_cosine, drop_copies, listed, load_frame, tuning_rows
from sodaray.report.tables import FORMATS, RENDERERS, Skipped, Table, build_tables, to_markdown

log = logging.getLogger(__name__)

INDEX = "README.md"  # the report's index of its tables and figures


@dataclass
class Report:
    tables: list[Table] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: int = 0
    captions: dict[str, str] = field(default_factory=dict)  # each figure's, by file name
    # What a reader must know before any number: atop the index, and among `notes`.
    warnings: list[str] = field(default_factory=list)

    def warn(self, line: str, prefix: str = "") -> None:
        """`line` atop the index and among the notes, and logged after `prefix`."""
        log.warning("%s%s", prefix, line)
        self.warnings.append(line)
        self.notes.append(line)


def build_report(
    paths: str | Path | Iterable[str | Path],
    out: str | Path,
    *,
    formats: Iterable[str] = FORMATS,
    embedding_model: str | None = None,
    figures: bool = True,
    extrapolate: int | None = None,
) -> Report:
    """Regenerate every table and figure the rows under `paths` have data for, into `out`;
    with `extrapolate` (steps), the budget tables and figure too (`sodaray.report.budget`)."""
    formats = list(formats)
    paths = listed(paths)  # read more than once below
    where = ", ".join(map(str, paths))
    if extrapolate is not None:  # checked before the rows are read
        budget.check_target(extrapolate)
    if bad := [f for f in formats if f not in RENDERERS]:
        raise ValueError(f"unknown report format {bad[0]!r}; choose from {', '.join(FORMATS)}")
    df, copies = drop_copies(load_frame(paths))
    if extrapolate is not None:  # checked before anything is written, fitted below
        parts = budget.groups(df, extrapolate, where=where)
    report = Report(rows=len(df))
    if copies is not None:
        report.warn(copies, f"{where}: ")
    df = _with_cosine(df, embedding_model, report)
    out = Path(out)
    make_folder(out, out)  # the folder the user gave; every file in it by the rule for writes
    report.tables, report.skipped = build_tables(df)
    found = [] if extrapolate is None else budget.fitted(parts, extrapolate)
    if found:
        report.tables += budget.budget_tables(found, extrapolate)
    elif extrapolate is not None:
        report.skipped.append(Skipped("budget", "needs SODA rows with known inputs"))
    tables = [
        (out / f"{t.name}.{RENDERERS[fmt][1]}", RENDERERS[fmt][0], t)
        for t in report.tables
        for fmt in formats
    ]
    pictures = [out / f"{name}.png" for name in [*FIGURES, "budget"]] if figures else []
    # Whatever the report may write, checked before any figure is drawn (`writes`).
    check_places(out, [*(path for path, _, _ in tables), *pictures, out / INDEX, out / MANIFEST])
    for path, render, table in tables:
        write_file(out, path, render(table))
        report.files.append(path)
    if figures:  # every figure the rows have data for
        for name, (draw, need) in FIGURES.items():
            _add_figure(report, out, name, draw(df), Skipped(name, need))
        if found:
            plot = budget.budget_figure(found, extrapolate)
            _add_figure(report, out, "budget", plot, Skipped("budget figure", NO_FIND))
    _finish(out, report)
    return report


NO_FIND = "no group has an exact find"


def _add_figure(report: Report, out: Path, name: str, plot, skipped: Skipped) -> None:
    """`plot` saved as `name`.png in `out`, with its caption; None: `skipped` noted."""
    if plot is None:
        report.skipped.append(skipped)
        return
    path = save(plot.figure, out / f"{name}.png")
    report.files.append(path)
    report.captions[path.name] = plot.caption


def _with_cosine(df: pd.DataFrame, embedding_model: str | None, report: Report) -> pd.DataFrame:
    """The rows with their cosine similarities (where a sentence-embedding model is found),
    and the report's notes on what the rows leave out."""
    if (embedder := metrics.load_sentence_embedder(embedding_model)) is None:
        report.notes.append(
            "Cos. Sim. skipped: no local sentence-embedding model (pass --embedding-model PATH "
            f"or put {metrics.DEFAULT_EMBEDDER} in the Hugging Face cache)."
        )
    df = add_cosine(df, embedder)
    tuning = tuning_rows(df)
    if tuning.any():
        studies = ", ".join(sorted(set(df.loc[tuning, "sweep"])))
        report.notes.append(
            f"{int(tuning.sum())} rows from tuning trials ({studies}) are in the jobs table only: "
            "each trial is its own configuration, picked by the study, not samples of one rate."
        )
    return df


def _finish(out: Path, report: Report) -> None:
    """An earlier report's files this one did not write again removed, files no report wrote
    named, the index written and the manifest listing this report's files."""
    written = {f.name: _digest(f) for f in report.files}
    _remove_earlier(out, written)
    if line := _others(out, written):
        report.warn(line)
    index = out / INDEX
    write_file(out, index, _index(report))
    report.files.append(index)
    _write_manifest(out, {**written, INDEX: _digest(index)})


# Beside a report, hidden (readers and `ls` pass it over): the files it wrote with their SHA-256,
# so that a later report into the same folder removes those it does not write again and nothing
# else (not a file the user put there, nor one of ours the user has changed since).
MANIFEST = ".sodaray-report.json"
LEFTOVER_SUFFIXES = {".md", ".tex", ".csv", ".png"}  # what a report writes


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    except OSError:
        return None


def _earlier_files(out: Path) -> dict[str, str | None]:
    """The files an earlier report into `out` wrote, by name."""
    path = out / MANIFEST
    if what_is(path) is None:
        return {}
    try:
        files = read_json(path, "report's file list")["files"]
        if not isinstance(files, dict):
            raise TypeError("not a mapping")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("%s: not a report's file list (%s); nothing in %s removed", path, exc, out)
        return {}
    out_files: dict[str, str | None] = {}
    for name, sha in files.items():
        try:  # a plain name in `out` (a list edited to name `../x` names nothing)
            component(name)
        except ValueError:
            continue
        if isinstance(sha, str) or sha is None:
            out_files[name] = sha
    return out_files


def _write_manifest(out: Path, files: dict[str, str | None]) -> None:
    info = {"written_by": "sodaray report", "files": dict(sorted(files.items()))}
    write_file(out, out / MANIFEST, json.dumps(info, indent=1) + "\n")


def _remove_earlier(out: Path, written: dict[str, str | None]) -> None:
    """The files an earlier report into `out` wrote and this one did not (`written`: name ->
    SHA-256), removed where unchanged since. The manifest first lists both reports' files: a
    report stopped while removing still lists what it has not removed, for the next one."""
    earlier = _earlier_files(out)
    _write_manifest(out, {**earlier, **written, INDEX: None})
    for name, sha in earlier.items():
        if name in written or name == INDEX:
            continue
        path = out / name
        if what_is(path) != "a regular file" or _digest(path) != sha:
            log.warning("%s: left in place: changed since an earlier report wrote it", path)
            continue
        remove_file(out, path)
        log.info("removed %s: an earlier report's, not written by this one", path)


def _others(out: Path, written: dict[str, str | None]) -> str | None:
    """A line naming what is left in `out` that a report could have written and this one did
    not (an older sodaray's report, files the user put or changed there): named, never removed.
    None: nothing is."""
    names = sorted(
        f.name
        for f in out.iterdir()
        if f.suffix in LEFTOVER_SUFFIXES
        and f.name not in {*written, INDEX}
        and what_is(f) == "a regular file"
    )
    if not names:
        return None
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    files = "file" if len(names) == 1 else "files"
    return f"{len(names)} {files} in {out} not from this report: {shown}"


def _index(report: Report) -> str:
    lines = [f"# sodaray report ({report.rows} result rows)", ""]
    lines += [f"> **Warning:** {w}\n" for w in report.warnings]
    lines += [to_markdown(t) for t in report.tables]
    if figures := [f for f in report.files if f.suffix == ".png"]:
        lines += ["## Figures", ""]
        for f in figures:
            lines += [f"![{f.stem}]({f.name})", ""]
            if f.name in report.captions:
                lines += [f"*{report.captions[f.name]}*", ""]
    notes = [note for note in report.notes if note not in report.warnings]
    if report.skipped or notes:
        lines += ["## Not generated", ""]
        lines += [f"- {s.name}: {s.reason}" for s in report.skipped]
        lines += [f"- {note}" for note in notes]
        lines.append("")
    return "\n".join(lines)


__all__ = ["Report", "build_report"]
