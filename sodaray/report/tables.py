"""The paper's tables, built from result rows wherever the rows for them are present (each
builder takes the prepared rows, `rows.prepare`, and returns its tables, or none when the rows it
needs are absent), and written as Markdown, LaTeX (booktabs) and CSV (long form: one line per
cell, with the numbers behind it)."""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from sodaray.errors import shown
from sodaray.report import metrics
from sodaray.report.rows import (
    by_setting,
    dominant_observation,
    fixed_length,
    main_dataset,
    named,
    objective_label,
    standard_rows,
    tuning_rows,
)

DATASET_ORDER = {"random": 0, "nl-ood": 1, "nl-id": 2, "privacy": 3}
# What a table shows in its own columns or rows: never a reason to split it.
OBSERVATION = ("objective", "top_k", "output_tokens")


@dataclass
class Cell:
    """One table cell: its printed text and, for CSV, the numbers behind it."""

    text: str
    value: float | None = None
    low: float | None = None
    high: float | None = None
    se: float | None = None
    n: int | None = None

    @classmethod
    def rate(cls, p: metrics.Proportion) -> Cell:
        return cls(p.percent(), p.value, p.low, p.high, None, p.n)

    @classmethod
    def mean(cls, m: metrics.Mean, *, percent: bool = True) -> Cell:
        return cls(m.percent() if percent else m.plain(), m.value, None, None, m.se, m.n)

    @classmethod
    def count(cls, k: int) -> Cell:
        return cls(str(k), float(k), n=k)


EMPTY = Cell("")


@dataclass
class Table:
    name: str  # file stem
    title: str
    caption: str
    header: list[str]  # the row-label column first
    rows: list[tuple[str, list[Cell]]] = field(default_factory=list)


@dataclass
class Skipped:
    """A table or figure the report did not make, and why."""

    name: str
    reason: str


def main_variants(df: pd.DataFrame) -> list[str]:
    """Each algorithm's unmodified row name, registry order first, then algorithms this
    version does not know (so no result row silently leaves a comparison table)."""
    from sodaray.api import ALGORITHMS

    known = [config.variant_label({}) for config in ALGORITHMS.values()]
    other = sorted(set(df["algorithm"]) - set(ALGORITHMS))
    return [v for v in known + other if v in set(df["variant"])]


def settings(df: pd.DataFrame) -> str:
    """The run's settings for a caption: models, step budgets, samples, seeds."""

    def values(col: str) -> str:
        vals = sorted({v for v in df[col].dropna().tolist()}, key=str)
        return ", ".join(str(v) for v in vals) if vals else "?"

    return (
        f"Model: {values('model')}; max steps: {values('max_steps')}; "
        f"samples: {len(df)}; seed: {values('seed')}."
    )


def by_model(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(row-label prefix, rows) per model; no prefix when there is only one model."""
    groups = list(df.groupby("model_name", sort=True))
    return [(f"{m} / " if len(groups) > 1 else "", g) for m, g in groups]


def _describe_objective(df: pd.DataFrame) -> str:
    row = df.iloc[0]
    return f"{objective_label(row['objective'], row['top_k'])}, {int(row['output_tokens'])} output"


def table_model(df: pd.DataFrame) -> list[Table]:
    """Exact by input length per model (paper Table "model")."""
    base = standard_rows(df[df["variant"] == "SODA"])
    base = base[base["length"].notna()]
    if base.empty:
        return []
    lengths = sorted(int(n) for n in base["length"].unique())
    models = base.groupby("model_name")["model_parameters"].max().sort_values(kind="stable").index
    table = Table(
        "model",
        "Exact inversion (%) by input length",
        f"SODA, {_describe_objective(base)} position(s). Columns: input length in tokens. "
        f"{settings(base)} Wilson 95% intervals (n, the samples behind each cell, in the CSV); "
        "layers, width and vocabulary from each model's config (blank in files from before "
        "these columns).",
        ["Model", "Layers", "Width", "Vocab"] + [f"length {n}" for n in lengths] + ["All"],
    )
    for model in models:
        rows_m = base[base["model_name"] == model]
        shape = [_size_cell(rows_m, c) for c in ("model_layers", "model_width", "vocab_size")]
        for setting, rows in by_setting(rows_m):
            cells = [Cell.rate(metrics.exact_rate(rows[rows["length"] == n])) for n in lengths]
            table.rows.append(
                (named(model, setting), shape + cells + [Cell.rate(metrics.exact_rate(rows))])
            )
    return [table]


def _size_cell(rows: pd.DataFrame, column: str) -> Cell:
    """A model's size fact (one value per model), blank when the rows do not carry it."""
    values = rows[column].dropna() if column in rows else pd.Series([], dtype=float)
    if values.empty:
        return EMPTY
    value = int(values.iloc[0])
    return Cell(f"{value:,}", float(value))


def table_tradeoff(df: pd.DataFrame, fdr: bool = False) -> list[Table]:
    """Exact by top-k logits x output tokens, with a text-only row, per model (paper Table
    "tradeoff"); `fdr`: its false-discovery counterpart."""
    stat = metrics.false_discovery if fdr else metrics.exact_rate
    base = main_dataset(fixed_length(df[(df["variant"] == "SODA") & ~df["fluency"]]))
    tables = []
    for model, rows in base.groupby("model_name", sort=True):
        if rows[["objective_label", "output_tokens"]].drop_duplicates().shape[0] < 2:
            continue
        outs = sorted(int(m) for m in rows["output_tokens"].unique())
        labels = sorted(
            rows["objective_label"].unique(),
            key=lambda s: (
                s == "text only",
                s != "all logits",
                int(s.split("-")[1].split()[0]) if s.startswith("top-") else 0,
            ),
        )
        what = "False discovery (%): output matched, input differs" if fdr else "Exact (%)"
        table = Table(
            "tradeoff_fdr" if fdr else "tradeoff",
            f"{what}, by output information ({model})",
            f"SODA; rows: what was observed; columns: observed output positions. "
            f"{settings(rows)} Wilson 95% intervals.",
            ["Observed"] + [f"{m} output" for m in outs],
        )
        for lab in labels:
            for setting, sel in by_setting(rows[rows["objective_label"] == lab], OBSERVATION):
                parts = [sel[sel["output_tokens"] == m] for m in outs]
                cells = [EMPTY if part.empty else Cell.rate(stat(part)) for part in parts]
                table.rows.append((named(lab, setting), cells))
        tables.append(table)
    return tables


COS_SKIPPED = "; cosine similarity skipped (no local sentence-embedding model)."


def _has_cos(rows: pd.DataFrame) -> bool:
    """Whether the rows carry cosine similarities (a sentence-embedding model was available)."""
    return "cos_sim" in rows and rows["cos_sim"].notna().any()


def _quality_cells(rows: pd.DataFrame, with_cos: bool) -> list[Cell]:
    cells = [Cell.rate(metrics.exact_rate(rows)), Cell.mean(metrics.partial(rows))]
    if with_cos:
        cells.append(Cell.mean(metrics.mean_se(rows["cos_sim"]), percent=False))
    return cells


def table_fluency(df: pd.DataFrame) -> list[Table]:
    """Random / NL-OOD / NL-ID x fluency on/off: Exact, Partial, Cos. Sim. (Table "fluency")."""
    base = fixed_length(df[(df["variant"] == "SODA") & (df["dataset"] != "privacy")])
    base = dominant_observation(base)
    if base[["dataset", "fluency"]].drop_duplicates().shape[0] < 2:
        return []
    with_cos = _has_cos(base)
    cos = "; cosine similarity of recovered and true text ± standard error."
    table = Table(
        "fluency",
        "Natural-language inputs and the fluency penalty",
        f"SODA, {_describe_objective(base)} position(s). {settings(base)} Exact with Wilson 95% "
        "intervals; Partial ± standard error" + (cos if with_cos else COS_SKIPPED),
        ["Dataset", "Fluency", "Exact", "Partial"] + (["Cos. Sim."] if with_cos else []),
    )
    for prefix, rows_m in by_model(base):
        for ds in sorted(set(rows_m["dataset"]), key=lambda v: (DATASET_ORDER.get(v, 4), v)):
            rows_d = rows_m[rows_m["dataset"] == ds]
            # One row per fluency weight: a weight grid is several configurations.
            for weight in sorted(rows_d["fluency_weight"].fillna(0).unique()):
                rows_w = rows_d[rows_d["fluency_weight"].fillna(0) == weight]
                label = f"{weight:g}" if weight > 0 else "off"
                for setting, rows in by_setting(rows_w, ("fluency_weight",)):
                    cells = [Cell(label)] + _quality_cells(rows, with_cos)
                    table.rows.append((named(prefix + ds, setting), cells))
    return [table]


def table_tweaks(df: pd.DataFrame) -> list[Table]:
    """SODA ablations, embedding search last (paper Table "tweaks")."""
    base = standard_rows(df[df["algorithm"].isin(["soda", "embedding"])])
    variants = list(base["variant"].unique())
    if len(variants) < 2:
        return []
    soda = sorted(v for v in variants if v.startswith("SODA ")) + (
        ["SODA"] if "SODA" in variants else []
    )
    order = soda + [v for v in variants if not v.startswith("SODA")]
    table = Table(
        "tweaks",
        "SODA ablations",
        f"{_describe_objective(base)} position(s). {settings(base)} Exact with Wilson 95% "
        "intervals; Partial ± standard error.",
        ["Variant", "Exact", "Partial"],
    )
    for prefix, rows in by_model(base):
        for v in order:
            for setting, sel in by_setting(rows[rows["variant"] == v]):
                if len(sel):
                    table.rows.append((named(prefix + v, setting), _quality_cells(sel, False)))
    return [table]


def table_algo(df: pd.DataFrame) -> list[Table]:
    """Algorithm comparison, logits vs text (paper Table "algo")."""
    base = main_dataset(fixed_length(df[~df["fluency"]]))
    variants = main_variants(base)
    base = base[base["variant"].isin(variants)]
    if base["algorithm"].nunique() < 2:
        return []
    kinds = [k for k in ("logits", "text") if k in set(base["objective"])]
    with_cos = _has_cos(base)
    measures = ["Exact", "Partial"] + (["Cos. Sim."] if with_cos else [])
    table = Table(
        "algo",
        "Inversion by algorithm: Exact, Partial and Cos. Sim.",
        f"{settings(base)} Exact with Wilson 95% intervals; Partial ± standard error"
        + ("; cosine similarity ± standard error." if with_cos else COS_SKIPPED),
        ["Algorithm"]
        + [f"{'Logits' if k == 'logits' else 'Text'} {m}" for k in kinds for m in measures],
    )
    for prefix, rows_m in by_model(base):
        for v in variants:
            rows_v = rows_m[rows_m["variant"] == v]
            if rows_v.empty:
                continue
            for setting, rows in by_setting(rows_v, OBSERVATION):
                cells: list[Cell] = []
                for k in kinds:
                    # Within an objective kind, the most common observation setting.
                    sel = dominant_observation(rows[rows["objective"] == k])
                    cells += _quality_cells(sel, with_cos) if len(sel) else [EMPTY] * len(measures)
                table.rows.append((named(prefix + v, setting), cells))
    return [table]


def privacy_source_note(rows: pd.DataFrame) -> str:
    """A caption's warning when privacy rows come from the synthetic offline fallback: its
    records are Faker text, not ai4privacy's, so its totals and labels are not the paper's."""
    if "dataset_source" not in rows.columns:
        return ""
    sources = rows["dataset_source"].dropna().astype(str)
    if not (synthetic := int(sources.str.startswith("synthetic").sum())):
        return ""
    share = "" if synthetic == len(rows) else f" ({synthetic} of {len(rows)} rows)"
    return (
        f"SYNTHETIC PII{share}: Faker records built offline, not the paper's ai4privacy "
        "records, so these numbers are not comparable with the paper's table. "
    )


def table_privacy(df: pd.DataFrame) -> list[Table]:
    """Privacy: Exact, Partial, Cos. Sim., PII; and tokens recovered by PII label."""
    base = df[(df["dataset"] == "privacy") & df["pii_labels"].notna()]
    if base.empty:
        return []
    with_cos = _has_cos(base)
    source = privacy_source_note(base)
    main = Table(
        "privacy",
        "Recovering inputs with personal information",
        f"{source}{settings(base)} Exact with Wilson 95% intervals; Partial, PII (partial over "
        "PII-labelled tokens) ± standard error"
        + (", cosine similarity ± standard error." if with_cos else COS_SKIPPED),
        ["Model / algorithm", "Exact", "Partial"] + (["Cos. Sim."] if with_cos else []) + ["PII"],
    )
    # A row (and a column of the labels' table) per model, algorithm and configuration, as the
    # paper's: pooling them would count every token once per algorithm.
    several_models = base["model_name"].nunique() > 1
    names, counts = [], []
    for (model, variant), rows_v in base.groupby(["model_name", "variant"], sort=True):
        for setting, rows in by_setting(rows_v):
            cells = _quality_cells(rows, with_cos) + [Cell.mean(metrics.pii_partial(rows))]
            main.rows.append((named(f"{model} / {variant}", setting), cells))
            names.append(named(f"{model} / {variant}" if several_models else str(variant), setting))
            counts.append(metrics.pii_by_label(rows, with_none=True))
    # Tokens without a PII label are the None row.
    labels = sorted({lab for c in counts for lab in c if lab != metrics.NO_PII}) + [metrics.NO_PII]
    by_label = Table(
        "privacy_labels",
        "PII tokens recovered (%) by label",
        f"{source}{settings(base)} Share of the label's tokens recovered in place, with Wilson 95% "
        "intervals; None: tokens without personal information.",
        ["Label", "Tokens"] + names,
    )
    for label in labels:
        right_total = [c.get(label, (0, 0)) for c in counts]
        cells = [Cell.rate(metrics.proportion(k, n)) if n else EMPTY for k, n in right_total]
        by_label.rows.append((label, [Cell.count(max(n for _, n in right_total)), *cells]))
    return [main, by_label]


def table_length(df: pd.DataFrame) -> list[Table]:
    """The paper's length table: every assumed length searched on every true length, the share
    of samples found per (true, assumed) pair; and for `length: auto` searches, predicted vs
    true length, where a sample never solved has no predicted length."""
    tables = []
    assumed = df[(df["length_mode"] == "assumed") & df["length"].notna()]
    if not assumed.empty:
        tried = sorted(int(n) for n in assumed["predicted_length"].dropna().unique())
        table = Table(
            "length",
            "Found (%) by true and assumed input length",
            "Each assumed length searched on every sample independently; found: the output "
            f"reproduced. {settings(assumed)} Wilson 95% intervals.",
            ["True length"] + [f"assumed {n}" for n in tried],
        )
        for setting, part in by_setting(assumed):
            for true in sorted(int(n) for n in part["length"].unique()):
                rows = part[part["length"] == true]
                found = [rows.loc[rows["predicted_length"] == n, "found"] for n in tried]
                cells = [
                    Cell.rate(metrics.proportion(f.astype(bool).sum(), len(f))) if len(f) else EMPTY
                    for f in found
                ]
                table.rows.append((named(str(true), setting), cells))
        tables.append(table)
    auto = df[(df["length_mode"] == "auto") & df["length"].notna()]
    if not auto.empty:
        parts = [(s, metrics.length_confusion(part)) for s, part in by_setting(auto)]
        predicted = sorted({c for _, counts in parts for c in counts.columns} - {metrics.UNSOLVED})
        table = Table(
            "length_auto",
            "Predicted vs true input length (length auto)",
            "Lengths searched shortest first, the first that reproduces the output is the "
            f"prediction; counts of samples, '{metrics.UNSOLVED}': never solved. "
            f"{settings(auto)}",
            ["True length"] + [f"pred {c}" for c in predicted] + [metrics.UNSOLVED] + ["Correct"],
        )
        for setting, counts in parts:
            for n, row in counts.iterrows():
                right = int(row.get(n, 0)) if n in predicted else 0
                cells = [Cell.count(int(row.get(c, 0))) for c in [*predicted, metrics.UNSOLVED]]
                cells.append(Cell.rate(metrics.proportion(right, int(row.sum()))))
                table.rows.append((named(str(n), setting), cells))
        tables.append(table)
    return tables


def table_jobs(df: pd.DataFrame) -> list[Table]:
    """Every sweep job (or tuning trial) with its exact, partial and false-discovery rates:
    the table for a user's own study, whatever it varies."""
    base = df[df["job"].fillna("") != ""]
    if base.empty:
        return []
    table = Table(
        "jobs",
        "Results by job",
        f"{settings(base)} Exact and false discovery with Wilson 95% intervals; Partial ± "
        "standard error.",
        ["Sweep / job", "Samples", "Exact", "Partial", "False discovery"],
    )
    for (sweep, job), rows in base.groupby(["sweep", "job"], sort=True):
        cells = [Cell.count(len(rows)), Cell.rate(metrics.exact_rate(rows))]
        cells += [Cell.mean(metrics.partial(rows)), Cell.rate(metrics.false_discovery(rows))]
        table.rows.append((f"{sweep} / {job}", cells))
    return [table]


TWO_OBSERVATIONS = "needs SODA rows with at least two observation settings"
TABLES: dict[str, tuple[Callable[[pd.DataFrame], list[Table]], str]] = {
    "model": (table_model, "needs SODA rows with known lengths"),
    "tradeoff": (table_tradeoff, TWO_OBSERVATIONS),
    "tradeoff_fdr": (functools.partial(table_tradeoff, fdr=True), TWO_OBSERVATIONS),
    "fluency": (table_fluency, "needs SODA rows from two datasets or fluency settings"),
    "tweaks": (table_tweaks, "needs at least two SODA variants or SODA and embedding search"),
    "algo": (table_algo, "needs rows from at least two algorithms"),
    "privacy": (table_privacy, "needs rows on the privacy dataset"),
    "length": (table_length, "needs rows searched at assumed lengths or with length auto"),
    "jobs": (table_jobs, "needs rows from sweeps or tuning trials"),
}


def build_tables(df: pd.DataFrame) -> tuple[list[Table], list[Skipped]]:
    tables: list[Table] = []
    skipped: list[Skipped] = []
    paper = df[~tuning_rows(df)]
    for name, (build, need) in TABLES.items():
        if made := build(df if name == "jobs" else paper):
            tables += made
        else:
            skipped.append(Skipped(name, need))
    return tables, skipped


FORMATS = ("md", "latex", "csv")


def md_cell(text: str) -> str:
    """A table cell's text as Markdown data: control characters escaped (`shown`: a line
    break in a model's or dataset's name split the table's row) and `|` as `\\|`."""
    return shown(text).replace("|", "\\|")


def _texts(table: Table) -> list[list[str]]:
    """The header's texts, then each row's: its label, then its cells'."""
    return [table.header] + [[label] + [c.text for c in cells] for label, cells in table.rows]


def to_markdown(table: Table) -> str:
    header, *rows = ["| " + " | ".join(map(md_cell, texts)) + " |" for texts in _texts(table)]
    lines = [f"### {shown(table.title)}", "", header, "|" + "---|" * len(table.header), *rows]
    return "\n".join([*lines, "", f"*{shown(table.caption)}*", ""])


# LaTeX's special characters: seven escaped with a backslash, the rest spelled out.
_LATEX_SPECIAL = {ch: "\\" + ch for ch in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
    "±": r"$\pm$",
    "–": "--",
    "−": "$-$",
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in shown(text))


def to_latex(table: Table) -> str:
    cols = "l" + "r" * (len(table.header) - 1)
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{latex_escape(table.title)}. {latex_escape(table.caption)}}}",
        rf"\label{{tab:{table.name}}}",
        rf"\begin{{tabular}}{{{cols}}}",
        r"\toprule",
    ]
    header, *rows = [" & ".join(map(latex_escape, texts)) + r" \\" for texts in _texts(table)]
    lines += [header, r"\midrule", *rows, r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def to_csv(table: Table) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["table", "row", "column", "text", "value", "low", "high", "se", "n"])
    for label, cells in table.rows:
        for column, cell in zip(table.header[1:], cells, strict=True):
            numbers = (cell.value, cell.low, cell.high, cell.se, cell.n)
            writer.writerow(
                [table.name, label, column, cell.text, *("" if x is None else x for x in numbers)]
            )
    return buf.getvalue()


RENDERERS = {"md": (to_markdown, "md"), "latex": (to_latex, "tex"), "csv": (to_csv, "csv")}
