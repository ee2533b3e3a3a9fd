"""Building the paper's evaluation datasets as token sequences of a model's tokenizer.

- `random`: tokens drawn uniformly from [0, len(tokenizer)) (or the config's padded
  vocab_size with vocab="model") with `numpy.random.default_rng(seed)`,
  length by length (default 1-10, 1000 per length). The paper's convention: seed 1 is the test
  set, seed 0 the validation set that tuning uses, so tuning never sees test samples.
- `nl-id` (TinyStories validation stories) and `nl-ood` (Reddit comments): documents are visited
  in a seeded random order; a sample takes the next document, splits its first 1000 characters
  into sentences (`sources.split_sentences`), picks at random one sentence of at least L tokens
  (tokenized without special tokens or BOS) and keeps its first L tokens. A document without
  such a sentence is passed over and stays unused; no document serves two samples while unused
  ones remain, and when a source runs out documents are reused, with a warning and the count in
  the metadata (`documents_reused`).
- `privacy`: ai4privacy records (English rows of the hub's train split, or a local JSONL copy)
  whose whole text is L tokens, the first 500 of each length in source order, as the authors
  built it (the paper's PII totals describe whole records); `records="prefix"` takes instead
  the first L tokens of records chosen as above and holding at least one PII token. Synthetic
  Faker text (`pii.SyntheticPii`) with `--source synthetic` or when the hub cannot be reached
  (labelled in the metadata and the report). Default lengths 15-24, 500 per length.

Lengths are built in increasing order; samples are numbered in that order.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from sodaray.data import sources
from sodaray.data.pii import SyntheticPii, record_tokens
from sodaray.data.store import COLUMNS, RANDOM_SOURCE, make_table
from sodaray.data.tokenizer import (
    DatasetError,
    TokenizerInfo,
    check_model_path,
    load_tokenizer,
)
from sodaray.io.files import regular_file

log = logging.getLogger(__name__)

DATASETS = ("random", "nl-id", "nl-ood", "privacy")
DEFAULT_LENGTHS = {"random": (1, 10), "nl-id": (1, 10), "nl-ood": (1, 10), "privacy": (15, 24)}
DEFAULT_PER_LENGTH = {"random": 1000, "nl-id": 1000, "nl-ood": 1000, "privacy": 500}
TEST_SEED, VALIDATION_SEED = 1, 0

T = TypeVar("T")
# One sample: (length, document id or None, tokens, PII labels or None).
Sample = tuple[int, int | None, list[int], list[str | None] | None]


# Longer than any model's context; a bound before a range becomes a list.
MAX_LENGTH = 1 << 20


def parse_lengths(spec: str | int | Sequence[int]) -> list[int]:
    """Lengths from "A-B", "N", "1,3,5" or integers: sorted, distinct, each at least 1."""
    if isinstance(spec, str):
        from sodaray.config.validation import parse_int_list

        # One rule for number lists (`--tokens` too): "1 2" is not 12, "1,,3" not [1, 3].
        text = spec.strip()
        try:
            if "," in text:
                values = parse_int_list(text, "lengths")
            elif "-" in text[1:]:
                first, last = (parse_int_list(t, "lengths")[0] for t in text.split("-", 1))
                if last < first:
                    values = None
                elif last > MAX_LENGTH:  # before building a list that size
                    raise DatasetError(f"lengths {spec!r}: at most {MAX_LENGTH} tokens")
                else:
                    values = list(range(first, last + 1))
            else:
                values = parse_int_list(text, "lengths")
        except DatasetError:
            raise
        except ValueError:
            raise DatasetError(
                f"lengths take A-B, N or a comma list such as 1,3,5, not {spec!r}"
            ) from None
        if values is None:
            raise DatasetError(f"lengths {spec!r}: the range ends before it starts")
    elif isinstance(spec, int):
        values = [spec]
    else:
        values = [int(v) for v in spec]
    if not values:
        raise DatasetError(f"no lengths in {spec!r}")
    if min(values) < 1:
        raise DatasetError(f"lengths must be at least 1, not {spec!r}")
    if max(values) > MAX_LENGTH:
        raise DatasetError(f"lengths {spec!r}: at most {MAX_LENGTH} tokens")
    return sorted(set(values))


def _resolve_source(name: str, source: str | None) -> str | None:
    if name == "random":
        if source is not None:
            raise DatasetError("the random dataset has no source: leave out --source")
        return None
    if source in (None, "hf"):
        return "hf"
    if source == "synthetic":
        if name != "privacy":
            raise DatasetError(f"--source synthetic is for the privacy dataset, not {name}")
        return source
    regular_file(source, "source file", DatasetError)  # a directory or FIFO: say which
    return source


def _bar(total: int, desc: str, progress: bool | None):
    from tqdm import tqdm

    enabled = sys.stderr.isatty() if progress is None else progress
    return tqdm(total=total, desc=desc, unit="sample", file=sys.stderr, disable=not enabled)


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


def _random_samples(
    vocab_size: int, lengths: list[int], per_length: int, seed: int
) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples: list[Sample] = []
    for length in lengths:
        block = rng.integers(0, vocab_size, size=(per_length, length), dtype=np.int64)
        samples += [(length, None, row.tolist(), None) for row in block]
    return samples


def _nl_samples(
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


def _record_samples(
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


def _whole_record_samples(
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


def _synthetic_samples(
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


def _hub_limit(total: int) -> int:
    # Enough documents that passing over short ones rarely forces reuse, without streaming a
    # whole corpus.
    return 4 * total + 1000


def _load_source(
    name: str, source: str | None, total: int
) -> tuple[list[sources.Document] | None, list[dict[str, Any]] | None, dict[str, Any]]:
    """Documents (nl), PII records (privacy from hub or file), or neither, with a description
    for the metadata."""
    if name == "random":
        return None, None, {"source": RANDOM_SOURCE}
    hub = sources.HUB_SOURCES[name]
    if name in ("nl-id", "nl-ood"):
        if source == "hf":
            docs = sources.read_hub_documents(hub, _hub_limit(total))
            desc = f"hf:{hub.repo}[{hub.split}].{hub.field}"
        else:
            docs = sources.read_local_documents(source)
            desc = f"file:{source}"
        return docs, None, {"source": desc, "documents": len(docs)}
    info: dict[str, Any] = {}
    if source == "hf":
        try:
            records = sources.read_hub_rows(hub, _hub_limit(total), english_only=True)
            desc = f"hf:{hub.repo}[{hub.split}] (English)"
            return None, records, {"source": desc, "documents": len(records)}
        except sources.HubUnreachable as exc:
            log.warning(
                "cannot reach the Hugging Face hub for %s (%s); falling back to synthetic PII "
                "text, as with --source synthetic",
                hub.repo,
                exc.reason,
            )
            info["fallback"] = "synthetic"
    elif source != "synthetic":
        records = sources.read_local_pii_records(source)
        return None, records, {"source": f"file:{source}", "documents": len(records)}
    info["source"] = f"synthetic (faker {_faker_version()}, en_US)"
    return None, None, info


RECORDS = ("whole", "prefix")  # privacy samples: whole records or prefixes of longer ones
VOCABS = ("tokenizer", "model")  # random ids over len(tokenizer) or the config's vocab_size
BUILD_KEYS = {"dataset", "lengths", "per_length", "seed", "source", "vocab", "records"}


class BuildSpecError(DatasetError):
    """A bad field of a build spec; `key` names it."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def check_build_spec(build: dict[str, Any], name: str) -> dict[str, Any]:
    """A build spec as a sweep or tuning file gives it (`dataset` defaults to the entry's
    `name`), checked, with the options that decide its rows written out, so the job hash and
    the dataset cache key say which vocabulary and which records the samples came from (files
    from before these options drew ids from the padded vocab_size and took whole records)."""
    kind = build.get("dataset", name)
    if kind not in DATASETS:
        raise BuildSpecError("dataset", f"unknown dataset {kind!r} (choose {', '.join(DATASETS)})")
    # Fields only one kind of dataset reads: refused by name where another would ignore them
    # (and, in the job hash, make a job of its own that runs the same samples).
    if "vocab" in build and kind != "random":
        raise BuildSpecError(
            "vocab", f"is for the random dataset (ids drawn at random), not {kind}"
        )
    if "records" in build and kind != "privacy":
        raise BuildSpecError("records", f"is for the privacy dataset, not {kind}")
    source = build.get("source")
    if source is not None and kind == "random":
        raise BuildSpecError("source", "the random dataset has no source: leave it out")
    if source == "synthetic" and kind != "privacy":
        raise BuildSpecError("source", f"synthetic is for the privacy dataset, not {kind}")
    if source == "synthetic" and "records" in build:
        raise BuildSpecError(
            "records", "synthetic text has no records to take whole or in part: leave it out"
        )
    if kind == "random":
        vocab = build.get("vocab", "tokenizer")
        if vocab not in VOCABS:
            raise BuildSpecError("vocab", f"{' or '.join(VOCABS)}, not {vocab!r}")
        build = {**build, "vocab": vocab}
    if kind == "privacy":
        records = build.get("records", "whole")
        if records not in ("whole", "prefix"):
            raise BuildSpecError("records", f"whole or prefix, not {records!r}")
        build = {**build, "records": records}
    if "lengths" in build:
        try:
            parse_lengths(str(build["lengths"]))
        except ValueError as exc:
            raise BuildSpecError("lengths", str(exc)) from exc
    for key, least in (("per_length", 1), ("seed", 0)):
        value = build.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            what = "positive" if least else "non-negative"
            raise BuildSpecError(key, f"a {what} integer, not {value!r}")
    return build


def build_dataset(
    model: str,
    name: str,
    lengths: str | Sequence[int] | None = None,
    per_length: int | None = None,
    seed: int = TEST_SEED,
    source: str | None = None,
    *,
    gguf_file: str | None = None,
    tokenizer: TokenizerInfo | None = None,
    progress: bool | None = None,
    vocab: str = "tokenizer",
    records: str = "whole",
) -> pa.Table:
    """Build dataset `name` for `model`'s tokenizer (hub id, folder or .gguf; weights unused).

    `source`: None or "hf" (the hub), "synthetic" (privacy only) or a local file path.
    `tokenizer` skips loading when already at hand. `vocab` (random only): ids drawn from
    `len(tokenizer)` ("tokenizer", the authors' choice: ids text can produce) or from the
    config's padded `vocab_size` ("model": e.g. 151,936 vs 151,665 for Qwen, ids no text ever
    produces). `records` (privacy from the hub or a file): "whole", records whose whole text
    has the length (the authors' set), or "prefix", the first tokens of longer records.
    Returns the table `write_dataset` stores.
    """
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if vocab not in VOCABS:
        raise DatasetError(f"vocab must be {' or '.join(VOCABS)}, not {vocab!r}")
    if records not in RECORDS:
        raise DatasetError(f"records must be {' or '.join(RECORDS)}, not {records!r}")
    if lengths is None:
        first, last = DEFAULT_LENGTHS[name]
        lengths = list(range(first, last + 1))
    length_list = parse_lengths(lengths)
    per_length = DEFAULT_PER_LENGTH[name] if per_length is None else int(per_length)
    if per_length < 1:
        raise DatasetError(f"per_length must be at least 1, not {per_length}")
    if int(seed) < 0:
        raise DatasetError(f"seed must be non-negative, not {seed}")
    source = _resolve_source(name, source)
    if source == "synthetic" and records != "whole":
        raise DatasetError("records is for records from the hub or a file, not synthetic text")
    if tokenizer is None:
        check_model_path(model, gguf_file)
    total = len(length_list) * per_length
    from sodaray.config.validation import check_memory, dataset_bytes

    check_memory(dataset_bytes(length_list, per_length), f"{total} samples (rows)")
    # The source first: an unreachable hub fails before a (possibly slow) tokenizer load.
    docs, pii_records, info = _load_source(name, source, total)
    info_tok = tokenizer or load_tokenizer(model, gguf_file=gguf_file)
    tok, vocab_size = info_tok.tokenizer, info_tok.vocab_size
    rng = np.random.default_rng(int(seed))
    info["documents_reused"] = 0
    with _bar(total, f"building {name}", progress) as bar:
        if name == "random":
            draw = vocab_size if vocab == "model" else min(len(tok), vocab_size)
            samples = _random_samples(draw, length_list, per_length, int(seed))
            info["random_vocab"] = f"{vocab}: [0, {draw})"
            bar.update(total)
        elif docs is not None:
            samples, info["documents_reused"] = _nl_samples(
                tok, docs, length_list, per_length, rng, bar
            )
        elif pii_records is not None and records == "whole":
            samples, short = _whole_record_samples(tok, pii_records, length_list, per_length, bar)
            if not samples:
                raise DatasetError(f"{source}: no record is {length_list} tokens long as a whole")
            info["records"] = "whole records of each length, first in source order"
            if short:
                info["records_missing"] = {str(n): k for n, k in short.items()}
                log.warning(
                    "%s has too few whole records of some lengths (missing per length: %s)",
                    source,
                    short,
                )
        elif pii_records is not None:
            samples, info["documents_reused"] = _record_samples(
                tok, pii_records, length_list, per_length, rng, bar
            )
            info["records"] = "prefixes of records"
        else:
            samples = _synthetic_samples(tok, length_list, per_length, int(seed), bar)
    if info["documents_reused"]:
        log.warning(
            "%s has too few usable documents for a fresh one per sample: %d of %d samples "
            "reuse a document (documents_reused in the dataset metadata)",
            source,
            info["documents_reused"],
            total,
        )
    args = {
        "model": model,
        "gguf_file": gguf_file,
        "dataset": name,
        "lengths": length_list,
        "per_length": per_length,
        "seed": int(seed),
        "source": source,
        **({"vocab": vocab} if name == "random" else {}),
        **({"records": records} if pii_records is not None else {}),
    }
    return make_table(_columns(samples, name, model, tok, vocab_size), args, info)


def _faker_version() -> str:
    from importlib.metadata import version

    return version("faker")


def _columns(
    samples: list[Sample], name: str, model: str, tok: Any, vocab_size: int
) -> dict[str, list]:
    rows: dict[str, list] = {c: [] for c in COLUMNS}
    texts = tok.batch_decode([tokens for _, _, tokens, _ in samples])
    for sample_id, ((length, doc, tokens, labels), text) in enumerate(
        zip(samples, texts, strict=True)
    ):
        bad = [t for t in tokens if not 0 <= t < vocab_size]
        if bad:
            raise DatasetError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
        if len(tokens) != length or (labels is not None and len(labels) != length):
            raise AssertionError(f"sample {sample_id} is not {length} tokens long")
        rows["sample_id"].append(sample_id)
        rows["dataset"].append(name)
        rows["tokenizer"].append(model)
        rows["vocab_size"].append(vocab_size)
        rows["length"].append(length)
        rows["tokens"].append(tokens)
        rows["text"].append(text)
        rows["pii_labels"].append(labels)
        rows["document_id"].append(doc)
    return rows
