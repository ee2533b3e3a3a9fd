"""Result rows for a report: read with their derived columns and configurations, each sweep
result once, and selected and split as the tables and figures show them."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sodaray.data.store import RANDOM_SOURCE
from sodaray.io.files import parse_json, read_json
from sodaray.report import metrics
from sodaray.results import JOB_FILE, META_DIR, listed, model_label, read_results

# The objective's settings that are part of a row's configuration (`row_config`).
OBJECTIVE_SETTINGS = (
    *("objective", "top_k", "space", "output_tokens", "loss", "fluency_weight", "text_loss"),
    *("fluency_form", "confirm"),
)


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
    # Each folder once: the jobs of one sweep given as several paths share their parent.
    bases = {b.resolve() for r in listed(paths) for b in (r, r.parent) if b.is_dir()}
    patterns = (f"{META_DIR}/jobs/*/{JOB_FILE}", f"*/{META_DIR}/jobs/*/{JOB_FILE}")
    files = {path for base in bases for pattern in patterns for path in base.glob(pattern)}
    out: dict[str, dict] = {}
    for path in sorted(files):
        try:  # a regular file, size-limited: anything may lie in a results folder
            info = read_json(path, "job file")
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and isinstance(info.get("config"), dict):
            out[str(info.get("job"))] = info["config"]
    return out


def objective_label(kind: str, top_k: float | None) -> str:
    if kind == "text":
        return "text only"
    return "all logits" if top_k is None or pd.isna(top_k) else f"top-{int(top_k)} logits"


def variant_label(algorithm: str, params: str | None) -> str:
    """A row's name, as its algorithm names it (an unknown algorithm: its own name)."""
    from sodaray.api import ALGORITHMS

    if algorithm not in ALGORITHMS:
        return algorithm
    return ALGORITHMS[algorithm].variant_label(row_params(params))


def row_params(params: str | None) -> dict[str, Any]:
    """A row's `params` column (JSON of its algorithm's parameters), read back: result files
    come from anywhere, so it is bounded as any JSON read and must hold an object."""
    if not params:
        return {}
    value = parse_json(params, "a result row's params")
    if not isinstance(value, dict):
        raise ValueError(f"a result row's params: a JSON object, not {type(value).__name__}")
    return value


def row_config(params: str | None, objective: dict[str, Any]) -> dict[str, Any]:
    """One row's configuration: its algorithm parameters and objective settings. Settings that
    did not apply (a logits row's text loss, fluency form with fluency off, a v1 file's space)
    are left out rather than compared as None; top-k None means every logit and is kept."""
    config = row_params(params)
    for key, value in objective.items():
        if isinstance(value, float) and math.isnan(value):  # a null from pandas
            value = None
        value = value.item() if hasattr(value, "item") else value
        if value is None and key != "top_k":
            continue
        if key == "fluency_weight":
            value = float(value)
        config[f"objective.{key}" if key in config else key] = value
    return config


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """Derived columns the tables group by."""
    df = df.copy()
    df["objective_label"] = [
        objective_label(k, t) for k, t in zip(df["objective"], df["top_k"], strict=True)
    ]
    df["fluency"] = df["fluency_weight"].fillna(0) > 0
    # Files from before the model_name column: label by the id's last part.
    missing = df["model_name"].isna() | (df["model_name"] == "")
    df.loc[missing, "model_name"] = [model_label(m) for m in df.loc[missing, "model"]]
    df["variant"] = [
        variant_label(a, p) for a, p in zip(df["algorithm"], df["params"], strict=True)
    ]
    objectives = df[list(OBJECTIVE_SETTINGS)].to_dict("records")
    df["config"] = [row_config(p, o) for p, o in zip(df["params"], objectives, strict=True)]
    return df


# What one result is: a sweep's search of one sample of one dataset, by one algorithm and
# configuration, on one model's weights. Rows of two jobs that agree on all of it are copies (a
# job folder copied, a model path spelled two ways): counting both would narrow every interval.
RESULT_KEY = (
    *("weights", "dataset", "dataset_hash", "sample_id", "algorithm", "params", "seed"),
    *("max_steps", *OBJECTIVE_SETTINGS, "length_mode", "assumed_length", "bos"),
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
                tried[0] if mode == "assumed" and tried is not None and len(tried) else None
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


# Sweep names of tuning trials (`sodaray tune` writes `tune:NAME`).
TUNING_PREFIX = "tune:"


def tuning_rows(df: pd.DataFrame) -> pd.Series:
    """Rows of `sodaray tune` trials: each trial is its own configuration, picked on the
    validation set by the study, so they stay out of the paper tables and figures (the jobs
    table lists every trial)."""
    return df["sweep"].fillna("").astype(str).str.startswith(TUNING_PREFIX)


# Rows of different configurations (a sweep's temperature grid, a model run with two presets)
# are never pooled into one cell: a Wilson interval over them would treat them as samples of one
# rate. Seeds are not a configuration: a sweep's seeds pool (the caption lists them).
_MISSING = "?"  # a key an older file's rows do not record


def _order(value: Any) -> tuple:
    # None first, then numbers in numeric order, then the rest (booleans too) as strings.
    if value is None:
        return (0, 0.0, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (1, float(value), "")
    return (2, 0.0, str(value))


def by_setting(rows: pd.DataFrame, exclude: tuple[str, ...] = ()) -> list[tuple[str, pd.DataFrame]]:
    """`rows` split by the `config` values that differ among them (keys in `exclude` aside: what
    the table shows itself), each part labelled with them (`temperature=0.5`); one part labelled
    "" when they share one configuration. A key only some rows record splits them only where the
    recorded values differ."""
    if rows.empty or "config" not in rows:
        return [("", rows)]
    configs = [{k: v for k, v in c.items() if k not in exclude} for c in rows["config"]]
    seen: dict[str, set[str]] = {}
    for c in configs:
        for k, v in c.items():
            seen.setdefault(k, set()).add(json.dumps(v, sort_keys=True, default=str))
    if not (varying := sorted(k for k, vals in seen.items() if len(vals) > 1)):
        return [("", rows)]
    keys = [tuple(c.get(k, _MISSING) for k in varying) for c in configs]
    groups: dict[str, list[int]] = {}
    labels: dict[str, tuple] = {}
    for i, key in enumerate(keys):
        label = ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in zip(varying, key, strict=True)
        )
        groups.setdefault(label, []).append(i)
        labels[label] = key
    ordered = sorted(groups, key=lambda lab: [_order(v) for v in labels[lab]])
    return [(lab, rows.iloc[groups[lab]]) for lab in ordered]


def named(label: str, setting: str) -> str:
    """A row label with its configuration, when the table splits it."""
    return f"{label} ({setting})" if setting else label


def fixed_length(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["length_mode"].fillna("fixed") == "fixed"]


# Two rows are one result when these agree: the same search (model, settings, seed) of the
# same drawn input.
SAME_SEARCH = (
    *("model_name", "bos", "config_hash", "algorithm", "params", "objective", "top_k"),
    *("output_tokens", "seed", "max_steps", "dataset_seed", "length", "sample_id", "true_tokens"),
)


def main_dataset(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of one dataset: every dataset the random builder made (`random`, the paper's main
    tables, a sweep's `random-short` for the jobs that run only the short lengths, one set per
    length), else the most common one other than privacy. Random draws depend only on the seed
    and length, so two such datasets can hold the same inputs: a search that ran on both counts
    once, as its `random` row when it has one."""
    names = df["dataset"].fillna("")
    pooled = names == "random"
    if "dataset_source" in df:
        pooled |= df["dataset_source"].fillna("").eq(RANDOM_SOURCE)
    if pooled.any():
        rows = df[pooled]
        if rows["dataset"].nunique() == 1:
            return rows
        rows = rows.iloc[np.argsort(rows["dataset"].ne("random").to_numpy(), kind="stable")]
        key = pd.DataFrame({c: rows[c].map(str) for c in SAME_SEARCH if c in rows})
        return rows[~key.duplicated().to_numpy()].sort_index()
    others = names[names != "privacy"]
    return df[names == others.value_counts().index[0]] if len(others) else df.iloc[:0]


def dominant_observation(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the most common observation setting (objective, top-k, output tokens), so a
    table that varies something else never mixes objectives."""
    if df.empty:
        return df
    top_k = df["top_k"].fillna(-1).astype(int).astype(str)
    keys = df["objective"].astype(str) + "|" + top_k + "|" + df["output_tokens"].astype(str)
    return df[keys == keys.value_counts().index[0]]


def standard_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The main dataset, fluency off, fixed lengths, the most common observation setting."""
    return dominant_observation(main_dataset(fixed_length(df[~df["fluency"]])))
