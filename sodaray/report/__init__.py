"""Reports: the paper's tables (Markdown, LaTeX, CSV) and figures (PNG) regenerated from result
rows, wherever the rows for them are present."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sodaray import metrics
from sodaray.files import read_json
from sodaray.report.render import FORMATS, RENDERERS
from sodaray.report.tables import Skipped, Table, build_tables, prepare, tuning_rows
from sodaray.results import JOB_FILE, META_DIR, read_results
from sodaray.writes import check_places, make_folder, write_file

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


def load_frame(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """Result rows under `paths` as a DataFrame with the report's derived columns, and `bos`
    (whether a BOS came before the input) from the settings of the sweep jobs that wrote them
    (None where no job's settings say: `invert` rows, or the model's default)."""
    frame = prepare(read_results(paths).to_pandas())
    models = {job: config.get("model") or {} for job, config in job_settings(paths).items()}
    frame["bos"] = [models.get(job, {}).get("bos") for job in frame["job"]]
    return frame


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
    if extrapolate is not None:  # checked before the rows are read
        from sodaray.report.budget import check_target

        check_target(extrapolate)
    bad = [f for f in formats if f not in RENDERERS]
    if bad:
        raise ValueError(f"unknown report format {bad[0]!r}; choose from {', '.join(FORMATS)}")
    df = load_frame(paths)
    if extrapolate is not None:  # before anything is written
        from sodaray.report.budget import check_above_budget

        check_above_budget(df, extrapolate)
    report = Report(rows=len(df))
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

        found = groups(df, extrapolate)
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
    check_places(out, [*(path for path, _, _ in tables), *pictures, out / INDEX])
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
    write_file(out, index, _index(report))
    report.files.append(index)
    return report


def _index(report: Report) -> str:
    from sodaray.report.render import to_markdown

    lines = [f"# sodaray report ({report.rows} result rows)", ""]
    lines += [to_markdown(t) for t in report.tables]
    figures = [f for f in report.files if f.suffix == ".png"]
    if figures:
        lines += ["## Figures", ""]
        for f in figures:
            lines += [f"![{f.stem}]({f.name})", ""]
            if f.name in report.captions:
                lines += [f"*{report.captions[f.name]}*", ""]
    if report.skipped or report.notes:
        lines += ["## Not generated", ""]
        lines += [f"- {s.name}: {s.reason}" for s in report.skipped]
        lines += [f"- {note}" for note in report.notes]
        lines.append("")
    return "\n".join(lines)


__all__ = ["Report", "build_report", "load_frame"]
