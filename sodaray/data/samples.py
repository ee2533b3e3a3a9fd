"""Drawing a dataset's samples: seeded random ids, sentences of documents visited in a seeded
order, PII records (whole, or prefixes holding PII) and synthetic PII text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from sodaray.data import sources
from sodaray.data.pii import SyntheticPii, record_tokens
from sodaray.data.tokenizer import DatasetError

T = TypeVar("T")
# One sample: (length, document id or None, tokens, PII labels or None).
Sample = tuple[int, int | None, list[int], list[str | None] | None]


def _pick(
    n_docs: int,
    lengths: list[int],
    per_length: int,
    rng: np.random.Generator,
    attempt: Callable[[int, int], T | None],
    on_sample: Callable[[], None],
) -> tuple[list[tuple[int, int, T]], int]:
    """(length, document index, attempt's result) per sample, and how many reused a document.

    Documents are tried in one seeded order; each serves at most one sample until none unused
    fits a length, then seeded passes over all documents reuse them.
    """
    order = [int(i) for i in rng.permutation(n_docs)]
    used = [False] * n_docs
    picked: list[tuple[int, int, T]] = []
    reused = 0
    for length in lengths:
        got = 0
        for i in order:  # unused documents passed over at a shorter length get another try
            if got == per_length:
                break
            if used[i]:
                continue
            result = attempt(i, length)
            if result is not None:
                used[i] = True
                picked.append((length, i, result))
                got += 1
                on_sample()
        while got < per_length:
            found = False
            for i in rng.permutation(n_docs):
                result = attempt(int(i), length)
                if result is None:
                    continue
                found = True
                picked.append((length, int(i), result))
                got, reused = got + 1, reused + 1
                on_sample()
                if got == per_length:
                    break
            if not found:
                raise DatasetError(f"no document in the source gives a sample of {length} tokens")
    return picked, reused


def random_samples(vocab_size: int, lengths: list[int], per_length: int, seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples: list[Sample] = []
    for length in lengths:
        block = rng.integers(0, vocab_size, size=(per_length, length), dtype=np.int64)
        samples += [(length, None, row.tolist(), None) for row in block]
    return samples


def nl_samples(
    tok: Any,
    docs: list[sources.Document],
    lengths: list[int],
    per_length: int,
    rng: np.random.Generator,
    bar,
) -> tuple[list[Sample], int]:
    cache: dict[int, list[list[int]]] = {}

    def attempt(i: int, length: int) -> list[int] | None:
        if i not in cache:
            sentences = sources.split_sentences(docs[i].text)
            ids = tok(sentences, add_special_tokens=False)["input_ids"] if sentences else []
            cache[i] = [list(s) for s in ids]
        fits = [s for s in cache[i] if len(s) >= length]
        if not fits:
            return None
        return fits[int(rng.integers(len(fits)))][:length]

    picked, reused = _pick(len(docs), lengths, per_length, rng, attempt, bar.update)
    return [(length, docs[i].id, tokens, None) for length, i, tokens in picked], reused


def record_samples(
    tok: Any,
    records: list[dict[str, Any]],
    lengths: list[int],
    per_length: int,
    rng: np.random.Generator,
    bar,
) -> tuple[list[Sample], int]:
    cache: dict[int, tuple[list[int], list[str | None]]] = {}

    def attempt(i: int, length: int) -> tuple[list[int], list[str | None]] | None:
        if i not in cache:
            cache[i] = record_tokens(tok, records[i])
        ids, labels = cache[i]
        if len(ids) < length or all(label is None for label in labels[:length]):
            return None
        return ids[:length], labels[:length]

    picked, reused = _pick(len(records), lengths, per_length, rng, attempt, bar.update)
    samples = [(length, int(records[i]["id"]), ids, labels) for length, i, (ids, labels) in picked]
    return samples, reused


def whole_record_samples(
    tok: Any, records: list[dict[str, Any]], lengths: list[int], per_length: int, bar
) -> tuple[list[Sample], dict[int, int]]:
    """The authors' privacy set: records whose whole text is one of `lengths` tokens, the first
    `per_length` of each length in source order (the paper's PII totals count whole records).
    Returns the samples and, per length, how many records were missing."""
    wanted = set(lengths)
    got: dict[int, list[Sample]] = {n: [] for n in lengths}
    for record in records:
        if all(len(got[n]) >= per_length for n in lengths):
            break
        ids, labels = record_tokens(tok, record)
        n = len(ids)
        if n in wanted and len(got[n]) < per_length:
            got[n].append((n, int(record["id"]), ids, labels))
            bar.update()
    short = {n: per_length - len(got[n]) for n in lengths if len(got[n]) < per_length}
    return [s for n in lengths for s in got[n]], short


def synthetic_samples(
    tok: Any, lengths: list[int], per_length: int, seed: int, bar
) -> list[Sample]:
    gen = SyntheticPii(seed)
    samples: list[Sample] = []
    for length in lengths:
        for _ in range(per_length):
            ids, labels = gen.sample(tok, length)
            samples.append((length, None, ids, labels))
            bar.update()
    return samples
