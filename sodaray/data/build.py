"""Building the paper's evaluation datasets as token sequences of a model's tokenizer.

`random` draws ids with `numpy.random.default_rng(seed)`; `nl-id`/`nl-ood` take the first L
tokens of a sentence of documents visited in a seeded order, a document serving one sample until
the source runs out (then reused, counted as `documents_reused`); `privacy` takes ai4privacy
records (whole, or prefixes holding PII) or synthetic Faker text. Seed 1 is the test set, seed 0
the validation set that tuning uses. Lengths are built in increasing order; samples are numbered
in that order. The full rules: docs/datasets.md.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import numpy as np
import pyarrow as pa

from sodaray.config.capacity import check_memory, dataset_bytes
from sodaray.data import sources
from sodaray.data.pii import SyntheticPii, record_tokens
from sodaray.data.store import COLUMNS, RANDOM_SOURCE, make_table
from sodaray.data.tokenizer import DatasetError, TokenizerInfo, check_model_path, load_tokenizer
from sodaray.io.files import regular_file

log = logging.getLogger(__name__)

DATASETS = ("random", "nl-id", "nl-ood", "privacy")
DEFAULT_LENGTHS = {"random": "1-10", "nl-id": "1-10", "nl-ood": "1-10", "privacy": "15-24"}
DEFAULT_PER_LENGTH = {"random": 1000, "nl-id": 1000, "nl-ood": 1000, "privacy": 500}
TEST_SEED, VALIDATION_SEED = 1, 0

# Longer than any model's context; a bound before a range becomes a list.
MAX_LENGTH = 1 << 20


def parse_lengths(spec: str | int | Sequence[int]) -> list[int]:
    """Lengths from "A-B", "N", "1,3,5" or integers: sorted, distinct, each at least 1."""
    if isinstance(spec, str):
        from sodaray.config.validation import parse_int_list

        # One rule for number lists (`--tokens` too): "1 2" is not 12, "1,,3" not [1, 3].
        text = spec.strip()
        ranged = "," not in text and "-" in text[1:]
        try:
            parts = text.split("-", 1) if ranged else [text]
            values = [n for part in parts for n in parse_int_list(part, "lengths")]
        except ValueError:
            raise DatasetError(
                f"lengths take A-B, N or a comma list such as 1,3,5, not {spec!r}"
            ) from None
        if ranged:
            first, last = values
            if last < first:
                raise DatasetError(f"lengths {spec!r}: the range ends before it starts")
            if last > MAX_LENGTH:  # before building a list that size
                raise DatasetError(f"lengths {spec!r}: at most {MAX_LENGTH} tokens")
            values = list(range(first, last + 1))
    else:
        values = [spec] if isinstance(spec, int) else [int(v) for v in spec]
    if not values:
        raise DatasetError(f"no lengths in {spec!r}")
    if min(values) < 1:
        raise DatasetError(f"lengths must be at least 1, not {spec!r}")
    if max(values) > MAX_LENGTH:
        raise DatasetError(f"lengths {spec!r}: at most {MAX_LENGTH} tokens")
    return sorted(set(values))


def _load_source(
    name: str, source: str | None, total: int
) -> tuple[list[sources.Document] | None, list[dict[str, Any]] | None, dict[str, Any]]:
    """Documents (nl), PII records (privacy from hub or file), or neither, with a description
    for the metadata."""
    if name == "random":
        return None, None, {"source": RANDOM_SOURCE}
    hub = sources.HUB_SOURCES[name]
    # Enough documents that passing over short ones rarely forces reuse, without streaming a
    # whole corpus.
    limit = 4 * total + 1000
    if name in ("nl-id", "nl-ood"):
        if source == "hf":
            docs = sources.read_hub_documents(hub, limit)
            desc = f"hf:{hub.repo}[{hub.split}].{hub.field}"
        else:
            docs = sources.read_local_documents(source)
            desc = f"file:{source}"
        return docs, None, {"source": desc, "documents": len(docs)}
    info: dict[str, Any] = {}
    if source == "hf":
        try:
            records = sources.read_hub_rows(hub, limit, english_only=True)
            desc = f"hf:{hub.repo}[{hub.split}] (English)"
            return None, records, {"source": desc, "documents": len(records)}
        except sources.HubUnreachable as exc:
            why = "cannot reach the Hugging Face hub for %s (%s); falling back to synthetic PII "
            log.warning(why + "text, as with --source synthetic", hub.repo, exc.reason)
            info["fallback"] = "synthetic"
    elif source != "synthetic":
        records = sources.read_local_pii_records(source)
        return None, records, {"source": f"file:{source}", "documents": len(records)}
    info["source"] = f"synthetic (faker {version('faker')}, en_US)"
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
    the dataset cache key say which vocabulary and which records the samples came from."""
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
    for key, owner, options in (("vocab", "random", VOCABS), ("records", "privacy", RECORDS)):
        if kind == owner:
            value = build.get(key, options[0])
            if value not in options:
                raise BuildSpecError(key, f"{' or '.join(options)}, not {value!r}")
            build = {**build, key: value}
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


@dataclass(frozen=True)
class _Request:
    """What `build_dataset` was asked for; `checked()` fills in the defaults."""

    name: str
    lengths: Any
    per_length: int | None
    seed: int
    source: str | None
    vocab: str
    records: str

    def checked(self) -> _Request:
        """The request with one-line `DatasetError`s for bad values, defaults filled in."""
        name, vocab, records, lengths = self.name, self.vocab, self.records, self.lengths
        if name not in DATASETS:
            raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
        if vocab not in VOCABS:
            raise DatasetError(f"vocab must be {' or '.join(VOCABS)}, not {vocab!r}")
        if records not in RECORDS:
            raise DatasetError(f"records must be {' or '.join(RECORDS)}, not {records!r}")
        length_list = parse_lengths(DEFAULT_LENGTHS[name] if lengths is None else lengths)
        per_length = DEFAULT_PER_LENGTH[name] if self.per_length is None else int(self.per_length)
        if per_length < 1:
            raise DatasetError(f"per_length must be at least 1, not {per_length}")
        if int(self.seed) < 0:
            raise DatasetError(f"seed must be non-negative, not {self.seed}")
        source = self.source
        if name == "random" and source is not None:
            raise DatasetError("the random dataset has no source: leave out --source")
        if source == "synthetic" and name != "privacy":
            raise DatasetError(f"--source synthetic is for the privacy dataset, not {name}")
        if name != "random" and source not in (None, "hf", "synthetic"):
            regular_file(source, "source file", DatasetError)  # a directory or FIFO: say which
        source = None if name == "random" else source or "hf"
        if source == "synthetic" and records != "whole":
            raise DatasetError("records is for records from the hub or a file, not synthetic text")
        return _Request(name, length_list, per_length, int(self.seed), source, vocab, records)


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
    """Build dataset `name` for `model`'s tokenizer (hub id, folder or .gguf; weights unused):
    the table `write_dataset` stores. `source`: None or "hf" (the hub), "synthetic" (privacy
    only) or a local file path; `tokenizer` skips loading when at hand. `vocab` (random only):
    ids drawn from `len(tokenizer)` ("tokenizer", the authors' choice: ids text can produce) or
    the config's padded `vocab_size` ("model"). `records` (privacy from the hub or a file):
    "whole" records of each length (the authors' set) or "prefix", the first tokens of longer
    ones."""
    req = _Request(name, lengths, per_length, seed, source, vocab, records).checked()
    if tokenizer is None:
        check_model_path(model, gguf_file)
    total = len(req.lengths) * req.per_length
    check_memory(dataset_bytes(req.lengths, req.per_length), f"{total} samples (rows)")
    # The source first: an unreachable hub fails before a (possibly slow) tokenizer load.
    loaded = _load_source(name, req.source, total)
    tok_info = tokenizer or load_tokenizer(model, gguf_file=gguf_file)
    from tqdm import tqdm

    enabled = sys.stderr.isatty() if progress is None else progress
    desc = f"building {name}"
    with tqdm(total=total, desc=desc, unit="sample", file=sys.stderr, disable=not enabled) as bar:
        samples = _draw(req, tok_info, loaded, bar)
    _, pii_records, info = loaded
    if reused := info["documents_reused"]:
        why = "%s has too few usable documents for a fresh one per sample: %d of %d samples "
        why += "reuse a document (documents_reused in the dataset metadata)"
        log.warning(why, req.source, reused, total)
    args = dict(model=model, gguf_file=gguf_file, dataset=name, lengths=req.lengths)
    args.update(per_length=req.per_length, seed=req.seed, source=req.source)
    if name == "random":
        args["vocab"] = vocab
    if pii_records is not None:
        args["records"] = records
    rows = _columns(samples, name, model, tok_info.tokenizer, tok_info.vocab_size)
    return make_table(rows, args, info)


# One sample: (length, document id or None, tokens, PII labels or None).
Sample = tuple[int, int | None, list[int], list[str | None] | None]
Labelled = tuple[list[int], list[str | None] | None]


def _pick(
    doc_ids: list[int],
    lengths: list[int],
    per_length: int,
    rng: np.random.Generator,
    attempt: Callable[[int, int], Labelled | None],
    bar: Any,
) -> tuple[list[Sample], int]:
    """A sample per `attempt(document index, length)` that gives one, and how many reused a
    document. Documents are tried in one seeded order; each serves at most one sample until
    none unused fits a length, then seeded passes over all documents reuse them."""
    order = [int(i) for i in rng.permutation(len(doc_ids))]
    used = [False] * len(doc_ids)
    picked: list[Sample] = []
    reused = 0

    def take(i: int, length: int) -> bool:
        result = attempt(i, length)
        if result is not None:
            picked.append((length, doc_ids[i], *result))
            bar.update()
        return result is not None

    for length in lengths:
        got = 0
        for i in order:  # unused documents passed over at a shorter length get another try
            if got == per_length:
                break
            if not used[i] and take(i, length):
                used[i], got = True, got + 1
        while got < per_length:
            found = False
            for i in rng.permutation(len(doc_ids)):
                if take(int(i), length):
                    found, got, reused = True, got + 1, reused + 1
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


def whole_record_samples(
    tok: Any, records: list[dict[str, Any]], lengths: list[int], per_length: int, bar
) -> tuple[list[Sample], dict[int, int]]:
    """The authors' privacy set: records whose whole text is one of `lengths` tokens, the first
    `per_length` of each length in source order (the paper's PII totals count whole records).
    Returns the samples and, per length, how many records were missing."""
    got: dict[int, list[Sample]] = {n: [] for n in lengths}
    for record in records:
        if all(len(got[n]) >= per_length for n in lengths):
            break
        ids, labels = record_tokens(tok, record)
        n = len(ids)
        if n in got and len(got[n]) < per_length:
            got[n].append((n, int(record["id"]), ids, labels))
            bar.update()
    short = {n: per_length - len(got[n]) for n in lengths if len(got[n]) < per_length}
    return [s for n in lengths for s in got[n]], short


def _draw(req: _Request, tok_info: TokenizerInfo, loaded: tuple, bar: Any) -> list[Sample]:
    """The request's samples from its source (`_load_source`'s), noted in the source's info:
    seeded random ids, sentences of documents visited in a seeded order, PII records (whole,
    or prefixes holding PII) or synthetic PII text."""
    (docs, pii_records, info), tok = loaded, tok_info.tokenizer
    lengths, per_length, rng = req.lengths, req.per_length, np.random.default_rng(req.seed)
    info["documents_reused"] = 0
    if req.name == "random":
        draw = tok_info.vocab_size if req.vocab == "model" else min(len(tok), tok_info.vocab_size)
        samples = random_samples(draw, lengths, per_length, req.seed)
        info["random_vocab"] = f"{req.vocab}: [0, {draw})"
        bar.update(len(lengths) * per_length)
        return samples
    if docs is not None:

        @functools.cache
        def sentences(i: int) -> list[list[int]]:
            texts = sources.split_sentences(docs[i].text)
            ids = tok(texts, add_special_tokens=False)["input_ids"] if texts else []
            return [list(s) for s in ids]

        def sentence(i: int, length: int) -> Labelled | None:
            fits = [s for s in sentences(i) if len(s) >= length]
            return (fits[int(rng.integers(len(fits)))][:length], None) if fits else None

        ids = [d.id for d in docs]
        samples, info["documents_reused"] = _pick(ids, lengths, per_length, rng, sentence, bar)
        return samples
    if pii_records is None:
        gen, samples = SyntheticPii(req.seed), []
        for length in lengths:
            for _ in range(per_length):
                samples.append((length, None, *gen.sample(tok, length)))
                bar.update()
        return samples
    if req.records == "prefix":
        tokens = functools.cache(lambda i: record_tokens(tok, pii_records[i]))

        def prefix(i: int, length: int) -> Labelled | None:
            ids, labels = tokens(i)
            if len(ids) < length or all(label is None for label in labels[:length]):
                return None
            return ids[:length], labels[:length]

        ids = [int(r["id"]) for r in pii_records]
        samples, info["documents_reused"] = _pick(ids, lengths, per_length, rng, prefix, bar)
        info["records"] = "prefixes of records"
        return samples
    samples, short = whole_record_samples(tok, pii_records, lengths, per_length, bar)
    if not samples:
        raise DatasetError(f"{req.source}: no record is {lengths} tokens long as a whole")
    info["records"] = "whole records of each length, first in source order"
    if short:
        info["records_missing"] = {str(n): k for n, k in short.items()}
        why = "%s has too few whole records of some lengths (missing per length: %s)"
        log.warning(why, req.source, short)
    return samples


def _columns(
    samples: list[Sample], name: str, model: str, tok: Any, vocab_size: int
) -> dict[str, list]:
    rows = []
    texts = tok.batch_decode([tokens for _, _, tokens, _ in samples])
    pairs = zip(samples, texts, strict=True)
    for sample_id, ((length, doc, tokens, labels), text) in enumerate(pairs):
        bad = [t for t in tokens if not 0 <= t < vocab_size]
        if bad:
            raise DatasetError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
        if len(tokens) != length or (labels is not None and len(labels) != length):
            raise AssertionError(f"sample {sample_id} is not {length} tokens long")
        rows.append((sample_id, name, model, vocab_size, length, tokens, text, labels, doc))
    return dict(zip(COLUMNS, map(list, zip(*rows, strict=True)), strict=True))
