"""Evaluation datasets for inversion: random tokens, natural language (ID/OOD) and PII text.

`build_dataset` makes a table of token sequences for one model's tokenizer, `write_dataset`
stores it as Parquet (schema in `sodaray.data.store`), `read_dataset` loads and checks it.
"""

from sodaray.data.build import DATASETS, build_dataset, parse_lengths
from sodaray.data.store import read_dataset, write_dataset
from sodaray.data.tokenizer import DatasetError

__all__ = [
    "DATASETS",
    "DatasetError",
    "build_dataset",
    "parse_lengths",
    "read_dataset",
    "write_dataset",
]
