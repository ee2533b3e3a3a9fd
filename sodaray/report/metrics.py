"""The paper's metrics over result rows (pandas DataFrames in the result schema).

Exact with Wilson 95% intervals; Partial (tokens right at their positions) with standard error;
PII recovery; cosine similarity of recovered and true text under a local sentence-embedding
model; false discovery (output matched, input differs); predicted vs true length; solved fraction
by step and by token position.
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

Z95 = 1.959963984540054  # two-sided 95% normal quantile


@dataclass(frozen=True)
class Proportion:
    """k successes of n with a Wilson 95% interval."""

    k: int
    n: int
    low: float
    high: float

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else math.nan

    def percent(self) -> str:
        """As the paper prints it: `79.5 (78.7–80.3)`."""
        if not self.n:
            return "–"
        return f"{100 * self.value:.1f} ({100 * self.low:.1f}–{100 * self.high:.1f})"


@dataclass(frozen=True)
class Mean:
    """A sample mean with its standard error."""

    value: float
    se: float
    n: int

    def percent(self) -> str:
        return "–" if not self.n else f"{100 * self.value:.1f} ± {100 * self.se:.1f}"

    def plain(self) -> str:
        return "–" if not self.n else f"{self.value:.3f} ± {self.se:.3f}"


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (Wilson 1927)."""
    if n <= 0:
        return (math.nan, math.nan)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At k = 0 (k = n) the bound is 0 (1) exactly, not the formula's rounding of it.
    low = 0.0 if k == 0 else max(0.0, centre - half)
    return (low, 1.0 if k == n else min(1.0, centre + half))


def proportion(k: int, n: int) -> Proportion:
    return Proportion(int(k), int(n), *wilson_interval(int(k), int(n)))


def mean_se(values: Sequence[float] | np.ndarray) -> Mean:
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return Mean(math.nan, math.nan, 0)
    se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0
    return Mean(float(x.mean()), se, len(x))


def _known(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose true input is known (exact is defined)."""
    return df[df["exact"].notna()]


def exact_rate(df: pd.DataFrame) -> Proportion:
    known = _known(df)
    return proportion(int(known["exact"].astype(bool).sum()), len(known))


def token_matches(df: pd.DataFrame) -> list[np.ndarray]:
    """Per row whose true input is known, per true position: is the recovered token there the
    same? (a shorter recovery misses)"""
    rows = df[df["true_tokens"].notna()]
    out = []
    for true_tokens, recovered in zip(rows["true_tokens"], rows["tokens"], strict=True):
        true = np.asarray(true_tokens)
        rec = np.asarray([] if recovered is None else recovered)
        hits = np.zeros(len(true), dtype=bool)
        m = min(len(true), len(rec))
        hits[:m] = true[:m] == rec[:m]
        out.append(hits)
    return out


def partial_scores(df: pd.DataFrame) -> np.ndarray:
    """Fraction of each sample's true tokens recovered at their positions."""
    return np.array([h.mean() if len(h) else np.nan for h in token_matches(df)], dtype=float)


def partial(df: pd.DataFrame) -> Mean:
    return mean_se(partial_scores(df))


def _pii_samples(df: pd.DataFrame):
    """(per-token hits, PII labels) of each sample whose true input and labels are known."""
    rows = df[df["true_tokens"].notna() & df["pii_labels"].notna()]
    return zip(token_matches(rows), rows["pii_labels"], strict=True)


def pii_partial(df: pd.DataFrame) -> Mean:
    """Partial over PII-labelled tokens only (samples without any PII token are skipped)."""
    scores = []
    for hits, labels in _pii_samples(df):
        mask = np.array([lab is not None for lab in labels], dtype=bool)
        if mask.any():
            scores.append(hits[mask].mean())
    return mean_se(scores)


NO_PII = "None"  # the row of tokens without a PII label


def pii_by_label(df: pd.DataFrame, *, with_none: bool = False) -> dict[str, tuple[int, int]]:
    """label -> (tokens recovered, tokens in total), as in the paper's appendix table;
    `with_none` adds the tokens without a label under `NO_PII`."""
    right: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for hits, labels in _pii_samples(df):
        for lab, hit in zip(labels, hits, strict=True):
            if lab is None and not with_none:
                continue
            key = NO_PII if lab is None else lab
            total[key] += 1
            right[key] += int(hit)
    return {lab: (right[lab], total[lab]) for lab in sorted(total)}


def false_discovery(df: pd.DataFrame) -> Proportion:
    """Among found samples with a known input: the fraction whose input differs."""
    found = _known(df)
    found = found[found["found"].astype(bool)]
    return proportion(int((~found["exact"].astype(bool)).sum()), len(found))


UNSOLVED = "unsolved"  # length-confusion column of samples no tried length solved


def length_confusion(df: pd.DataFrame) -> pd.DataFrame:
    """Counts of true length (rows) by predicted length (columns). A sample never solved has
    no predicted length: it counts under `UNSOLVED`, not at the last length tried."""
    known = df[df["length"].notna()]
    found = known["found"].fillna(False).astype(bool)
    predicted = [
        int(p) if f and pd.notna(p) else UNSOLVED
        for p, f in zip(known["predicted_length"], found, strict=True)
    ]
    counts = pd.crosstab(
        known["length"].astype(int).to_numpy(), pd.Series(predicted, dtype=object).to_numpy()
    )
    numeric = sorted(c for c in counts.columns if c != UNSOLVED)
    columns = numeric + ([UNSOLVED] if UNSOLVED in counts.columns else [])
    return counts[columns].rename_axis(index="true length", columns="predicted length")


def solved_by_step(
    df: pd.DataFrame, steps: Sequence[int] | None = None, column: str = "exact"
) -> pd.Series:
    """Fraction of samples solved exactly (`column="found"`: found, of every sample) within s
    steps, for each s in `steps` (default: 50 points up to the largest step budget)."""
    known = _known(df) if column == "exact" else df
    if steps is None:
        top = int(max(known["max_steps"].max() or 0, known["steps"].max() or 0, 1))
        steps = np.unique(np.linspace(0, top, 51).astype(int))
    solved = known[column].astype(bool).to_numpy()
    taken = known["steps"].to_numpy()
    n = max(len(known), 1)
    return pd.Series(
        [float((solved & (taken <= s)).sum() / n) for s in steps], index=list(steps), name=column
    )


def solved_by_position(df: pd.DataFrame) -> pd.Series:
    """Fraction of samples whose token at position i is recovered, per position."""
    hits = token_matches(df)
    at = [[int(h[i]) for h in hits if len(h) > i] for i in range(max(map(len, hits), default=0))]
    return pd.Series({i + 1: sum(x) / len(x) for i, x in enumerate(at)}, name="recovered")


def solved_by_position_by_length(df: pd.DataFrame) -> pd.DataFrame:
    """`solved_by_position` per true input length, as the paper's figure: rows are positions
    (1-based), columns lengths; a position past a length is NaN."""
    known = df[df["true_tokens"].notna() & df["length"].notna()]
    columns = {
        int(n): solved_by_position(rows)
        for n, rows in sorted(known.groupby(known["length"].astype(int)))
    }
    return pd.DataFrame(columns).rename_axis(index="position", columns="length")


DEFAULT_EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2"


class SentenceEmbedder:
    """Mean-pooled, normalised sentence embeddings from a local `transformers` encoder (the
    paper used an API model; any sentence-transformers checkpoint folder works here)."""

    def __init__(self, name_or_path: str) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
        self.model = AutoModel.from_pretrained(name_or_path, local_files_only=True)
        self.model.eval()

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        import torch

        out = []
        with torch.no_grad():
            for i in range(0, len(texts), batch_size):
                batch = self.tokenizer(
                    list(texts[i : i + batch_size]),
                    padding=True,
                    truncation=True,
                    max_length=256,
                    return_tensors="pt",
                )
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.concatenate(out) if out else np.zeros((0, 1))


def load_sentence_embedder(name_or_path: str | None = None) -> SentenceEmbedder | None:
    """The embedder named (or $SODARAY_EMBEDDING_MODEL, or all-MiniLM-L6-v2 from the local
    Hugging Face cache); None, with a logged note, when none can be loaded offline."""
    name = name_or_path or os.environ.get("SODARAY_EMBEDDING_MODEL") or DEFAULT_EMBEDDER
    try:
        return SentenceEmbedder(name)
    except (OSError, ValueError, ImportError) as exc:
        if name_or_path:  # asked for explicitly: that is an error, not a note
            raise ValueError(f"cannot load sentence-embedding model {name!r}: {exc}") from exc
        log.info("no local sentence-embedding model (%s): cosine similarity skipped", name)
        return None


def cosine_similarities(
    embedder: SentenceEmbedder, true_texts: Sequence[str], texts: Sequence[str]
) -> np.ndarray:
    """Cosine similarity of each recovered text with its true text."""
    a = embedder.encode([t or "" for t in true_texts])
    b = embedder.encode([t or "" for t in texts])
    return (a * b).sum(-1) if len(a) else np.zeros(0)
