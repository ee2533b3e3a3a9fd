"""Evaluation datasets for inversion: random tokens, natural language (ID/OOD) and PII text.

`build_dataset` makes a table of token sequences for one model's tokenizer, `write_dataset`
stores it as Parquet (schema in `sodaray.data.store`), `read_dataset` loads and checks it.
"""

from sodaray.data.build import (
    DATASETS,
    DEFAULT_LENGTHS,
    DEFAULT_PER_LENGTH,
    TEST_SEED,
    VALIDATION_SEED,
    build_dataset,
    parse_lengths,
)
from sodaray.data.pii import PII_LABELS, Span, SyntheticPii, label_tokens
from sodaray.data.sources import HubUnreachable, split_sentences
from sodaray.data.store import (
    SCHEMA,
    content_hash,
    dataset_hash,
    dataset_metadata,
    read_dataset,
    write_dataset,
)
from sodaray.data.tokenizer import DatasetError, TokenizerInfo, load_tokenizer

__all__ = [
    "DATASETS",
    "DEFAULT_LENGTHS",
    "DEFAULT_PER_LENGTH",
    "PII_LABELS",
    "SCHEMA",
    "TEST_SEED",
    "VALIDATION_SEED",
    "DatasetError",
    "HubUnreachable",
    "Span",
    "SyntheticPii",
    "TokenizerInfo",
    "build_dataset",
    "content_hash",
    "dataset_hash",
    "dataset_metadata",
    "label_tokens",
    "load_tokenizer",
    "parse_lengths",
    "read_dataset",
    "split_sentences",
    "write_dataset",
]
