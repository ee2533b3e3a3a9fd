"""Reports: the paper's tables (Markdown, LaTeX, CSV) and figures (PNG) regenerated from result
rows, wherever the rows for them are present."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sodaray.io.files import read_json, what_is
from sodaray.io.paths import component
from sodaray.io.writes import check_places, make_folder, remove_file, write_file
from sodaray.report import metrics
from sodaray.report.render import FORMATS, RENDERERS
from sodaray.report.tables import Skipped, Table, build_tables, prepare, tuning_rows
from sodaray.results import JOB_FILE, META_DIR, read_results

log = logging.getLogger(__name__)

INDEX = "README.md"  # the report's index of its tables and figures


@dataclass
class Report:
    tables: list[Table] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: int = 0
    # Each figure's caption by file name: what its lines, bars and bands are, and each panel's n.
    captions: dict[str, str] = field(default_factory=dict)
    # What a reader must know before any number (copies of results counted once): atop the
    # index, and among `notes`.
    warnings: list[str] = field(default_factory=list)


def load_frame(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """Result rows under `paths` as a DataFrame with the report's derived columns, and `bos`
    (whether a BOS came before the input) from the settings of the sweep jobs that wrote them
    (None where no job's settings say: `invert` rows, or the model's default)."""
    frame = prepare(read_results(paths).to_pandas())
    models = {job: config.get("model") or {} for job, config in job_settings(paths).items()}
    frame["bos"] = [models.get(job, {}).get("bos") for job in frame["job"]]
    return frame


# What one result is: a sweep's search of one sample of one dataset, by one algorithm and
# configuration, on one model's weights. Rows of two jobs that agree on all of it are copies
# (one sweep run twice into one folder under two job names: a model path spelled two ways by
# an older sodaray, a job folder copied), and counting both would narrow every interval.
RESULT_KEY = (
    "weights",
    "dataset",
    "dataset_hash",
    "sample_id",
    "algorithm",
    "params",
    "seed",
    "max_steps",
    "objective",
    "top_k",
    "space",
    "confirm",
    "output_tokens",
    "loss",
    "fluency_weight",
    "text_loss",
    "fluency_form",
    "length_mode",
    "assumed_length",
    "bos",
)


def drop_copies(df: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """`df` with each sweep result once (`RESULT_KEY`; the earliest finished row kept), and a
    line saying how many rows repeated others and in which jobs (None: none did). Rows outside
    sweeps (`invert`) and tuning trials are left as they are: an `invert` call numbers its own
    samples, and each trial is its own configuration."""
    swept = df["job"].fillna("").astype(str).ne("") & ~tuning_rows(df)
    if not swept.any():
        return df, None
    rows = df.loc[swept]
    # The weights by their content where the rows record it, else the path as one spelling.
    model = rows["model"].map(lambda m: os.path.normpath(m) if isinstance(m, str) and m else m)
    key = pd.DataFrame(
        {
            "weights": rows["model_revision"].where(rows["model_revision"].notna(), model),
            "assumed_length": [
                (tried[0] if tried is not None and len(tried) else None)
                if mode == "assumed"
                else None
                for mode, tried in zip(rows["length_mode"], rows["lengths_tried"], strict=True)
            ],
            **{c: rows[c] for c in RESULT_KEY if c in rows.columns},
        },
        index=rows.index,
    )
    text = key[list(RESULT_KEY)].astype(str)
    order = pd.DataFrame(
        {"at": rows["finished_at"].astype(str), "job": rows["job"].astype(str)}, index=rows.index
    ).sort_values(["at", "job"], kind="stable")
    copies = text.loc[order.index].duplicated(keep="first")
    copies = copies[copies]
    if copies.empty:
        return df, None
    jobs = sorted(set(df.loc[copies.index, "job"]))
    shown = ", ".join(jobs[:3]) + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else "")
    line = (
        f"{len(copies)} result rows repeat others (the same model weights, dataset, sample, "
        f"algorithm and configuration in another job: {shown}); each result is counted once"
    )
    return df.drop(index=copies.index), line


def job_settings(paths: str | Path | Iterable[str | Path]) -> dict[str, dict]:
    """Each sweep job's settings by job name, from the `job.json` files beside its rows (in
    the folders given, their parents, or the sweeps inside them); unreadable ones skipped."""
    roots = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    # Each folder once: the jobs of one sweep given as several paths share their parent.
    bases = {b.resolve() for r in roots for b in (r, r.parent) if b.is_dir()}
    files = {
        path
        for base in bases
        for pattern in (f"{META_DIR}/jobs/*/{JOB_FILE}", f"*/{META_DIR}/jobs/*/{JOB_FILE}")
        for path in base.glob(pattern)
    }
    out: dict[str, dict] = {}
    for path in sorted(files):
        try:  # a regular file, size-limited: anything may lie in a results folder
            info = read_json(path, "job file")
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and isinstance(info.get("config"), dict):
            out[str(info.get("job"))] = info["config"]
    return out


def add_cosine(df: pd.DataFrame, embedder: metrics.SentenceEmbedder | None) -> pd.DataFrame:
    """A `cos_sim` column (recovered vs true text) where both texts are known."""
    df = df.copy()
    df["cos_sim"] = np.nan
    if embedder is None:
        return df
    has = df["true_text"].notna() & df["text"].notna()
    if has.any():
        df.loc[has, "cos_sim"] = metrics.cosine_similarities(
            embedder, df.loc[has, "true_text"].tolist(), df.loc[has, "text"].tolist()
        )
    return df


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
    paths = _listed(paths)  # read more than once below
    where = ", ".join(map(str, paths))
    if extrapolate is not None:  # checked before the rows are read
        from sodaray.report.budget import check_target

        check_target(extrapolate)
    bad = [f for f in formats if f not in RENDERERS]
    if bad:
        raise ValueError(f"unknown report format {bad[0]!r}; choose from {', '.join(FORMATS)}")
    df, copies = drop_copies(load_frame(paths))
    if extrapolate is not None:  # before anything is written
        from sodaray.report.budget import check_above_budget

        check_above_budget(df, extrapolate, where)
    report = Report(rows=len(df))
    if copies is not None:
        log.warning("%s: %s", ", ".join(map(str, paths)), copies)
        report.warnings.append(copies)
        report.notes.append(copies)
    embedder = metrics.load_sentence_embedder(embedding_model)
    if embedder is None:
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
    out = Path(out)
    make_folder(out, out)  # the folder the user gave; every file in it by the rule for writes
    report.tables, report.skipped = build_tables(df)
    found = []
    if extrapolate is not None:
        from sodaray.report.budget import budget_tables, groups

        found = groups(df, extrapolate, where=where)
        made = budget_tables(found, extrapolate)
        report.tables += made
        if not made:
            report.skipped.append(Skipped("budget", "needs SODA rows with known inputs"))
    tables = [
        (out / f"{t.name}.{RENDERERS[fmt][1]}", RENDERERS[fmt][0], t)
        for t in report.tables
        for fmt in formats
    ]
    from sodaray.report.figures import FIGURES

    pictures = [out / f"{name}.png" for name in [*FIGURES, "budget"]] if figures else []
    # Whatever the report may write, checked before any figure is drawn (`writes`).
    check_places(out, [*(path for path, _, _ in tables), *pictures, out / INDEX, out / MANIFEST])
    for path, render, table in tables:
        write_file(out, path, render(table))
        report.files.append(path)
    if figures:
        from sodaray.report.figures import build_figures

        made, captions, skipped = build_figures(df, out)
        report.files += made
        report.captions.update(captions)
        report.skipped += skipped
        if found:
            from sodaray.report.budget import budget_figure
            from sodaray.report.figures import _save

            plot = budget_figure(found, extrapolate)
            if plot is None:
                report.skipped.append(Skipped("budget figure", "no group has an exact find"))
            else:
                path = _save(plot.figure, out / "budget.png")
                report.files.append(path)
                report.captions[path.name] = plot.caption
    index = out / INDEX
    earlier = _earlier_files(out) or {}
    written = {f.name: _digest(f) for f in report.files}
    # The list first holds both reports' files: a report stopped while removing still lists
    # what it has not removed, for the next one to remove.
    _write_manifest(out, {**earlier, **written, INDEX: None})
    for name, digest in earlier.items():
        if name in written or name == INDEX:
            continue
        path = out / name
        if what_is(path) != "a regular file" or _digest(path) != digest:
            log.warning("%s: left in place: changed since an earlier report wrote it", path)
            continue
        remove_file(out, path)
        log.info("removed %s: an earlier report's, not written by this one", path)
    # What is left that a report could have written (an older sodaray's report, files the
    # user put or changed there) is named, never removed.
    others = sorted(
        f.name
        for f in out.iterdir()
        if f.suffix in LEFTOVER_SUFFIXES
        and f.name not in written
        and f.name != INDEX
        and what_is(f) == "a regular file"
    )
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        files = "file" if len(others) == 1 else "files"
        line = f"{len(others)} {files} in {out} not from this report: {shown}"
        log.warning("%s", line)
        report.warnings.append(line)
        report.notes.append(line)
    write_file(out, index, _index(report))
    report.files.append(index)
    _write_manifest(out, {**written, INDEX: _digest(index)})
    return report


# Beside a report, hidden (readers and `ls` pass it over): the files it wrote and their
# SHA-256, so that a later report into the same folder removes those it does not write again
# (a table that has no rows now) and nothing else: not a file the user put there, nor one of
# ours the user has changed since.
MANIFEST = ".sodaray-report.json"
LEFTOVER_SUFFIXES = {".md", ".tex", ".csv", ".png"}  # what a report writes


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    except OSError:
        return None


def _earlier_files(out: Path) -> dict[str, str | None] | None:
    """The files an earlier report into `out` wrote, by name (None: no report listed any)."""
    path = out / MANIFEST
    if what_is(path) is None:
        return None
    try:
        info = read_json(path, "report's file list")
        files = info["files"]
        if not isinstance(files, dict):
            raise TypeError("not a mapping")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("%s: not a report's file list (%s); nothing in %s removed", path, exc, out)
        return None
    out_files: dict[str, str | None] = {}
    for name, digest in files.items():
        try:  # a plain name in `out` (a list edited to name `../x` names nothing)
            component(name)
        except ValueError:
            continue
        if isinstance(digest, str) or digest is None:
            out_files[name] = digest
    return out_files


def _write_manifest(out: Path, files: dict[str, str | None]) -> None:
    info = {"written_by": "sodaray report", "files": dict(sorted(files.items()))}
    write_file(out, out / MANIFEST, json.dumps(info, indent=1) + "\n")


def _listed(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    return [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]


def _index(report: Report) -> str:
    from sodaray.report.render import to_markdown

    lines = [f"# sodaray report ({report.rows} result rows)", ""]
    lines += [f"> **Warning:** {w}\n" for w in report.warnings]
    lines += [to_markdown(t) for t in report.tables]
    figures = [f for f in report.files if f.suffix == ".png"]
    if figures:
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


__all__ = ["Report", "build_report", "load_frame"]
