"""The tokenizer and vocabulary size of a model, without loading its weights: the config gives
`vocab_size`, and a folder with only a tokenizer falls back to the tokenizer's length."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sodaray.errors import first_line

log = logging.getLogger(__name__)


class DatasetError(ValueError):
    """A dataset cannot be built or read (bad arguments, missing source, unreadable file)."""


@dataclass(frozen=True)
class TokenizerInfo:
    """A loaded tokenizer with the model's vocabulary size."""

    tokenizer: Any
    vocab_size: int


def check_model_path(name_or_path: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """(folder or hub id, GGUF file name): a path ending in `.gguf` is split into the two, and a
    local path that does not exist is an error (checked before any slow work)."""
    import os

    from sodaray.io.files import check_model_files
    from sodaray.model.load import resolve_model_path

    name_or_path, gguf_file = resolve_model_path(name_or_path, gguf_file, error=DatasetError)
    # A FIFO or a device is said to be one (a tokenizer-only folder is enough here).
    check_model_files(os.path.expanduser(name_or_path), gguf_file, DatasetError, contents=False)
    return name_or_path, gguf_file


def load_tokenizer(
    name_or_path: str, *, gguf_file: str | None = None, trust_remote_code: bool = False
) -> TokenizerInfo:
    """Tokenizer and vocabulary size for a hub id, local folder or GGUF file (no weights); as in
    `sodaray.load_model`, a path ending in `.gguf` is split into folder and file."""
    from transformers import AutoConfig, AutoTokenizer

    name_or_path, gguf_file = check_model_path(name_or_path, gguf_file)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    kwargs.update({"gguf_file": gguf_file} if gguf_file is not None else {})
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        from sodaray.io.modelfiles import damaged_tokenizer_file

        damaged = damaged_tokenizer_file(name_or_path)  # "PATH: why", naming the file
        why = f": {damaged}" if damaged else f" for {name_or_path!r}: {first_line(exc)}"
        raise DatasetError(f"cannot load a tokenizer{why}") from exc
    vocab_size = None
    try:
        vocab_size = getattr(AutoConfig.from_pretrained(name_or_path, **kwargs), "vocab_size", None)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.debug("no model config for %s: %s", name_or_path, exc)
    if not vocab_size:
        # A tokenizer-only folder: the model's embedding matrix is at least this large.
        vocab_size = len(tokenizer)
        log.info("no config vocab_size for %s; using the tokenizer's %d", name_or_path, vocab_size)
    return TokenizerInfo(tokenizer=tokenizer, vocab_size=int(vocab_size))
