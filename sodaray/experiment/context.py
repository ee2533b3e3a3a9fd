"""Whether a model entry's inputs fit its context, decided on the driver from the model's files
(its `config.json`, and its tokenizer only where one BOS decides), without loading weights.

Checked before any actor starts, a too-long input is one line and exit code 2, not a failure
per shard. A hub id (no local config) or a GGUF file is left to the replica's own check
(`sodaray.config.capacity.check_context`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sodaray.config.capacity import check_positions
from sodaray.errors import first_line
from sodaray.experiment.spec import ModelSpec
from sodaray.io.files import read_json_object, what_is

# The config fields that bound a sequence, as `LoadedModel.max_positions` reads them.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def _config_count(model: ModelSpec, keys: tuple[str, ...], text_first: bool) -> int | None:
    """The first positive whole number under `keys` in `model`'s local `config.json` (read by
    the bounded JSON rule; none for a hub id or a GGUF file), its own section and a multimodal
    wrapper's `text_config` (first when `text_first`); None if none."""
    location = model.location  # where the model is loaded from (a hub id names no folder here)
    path = Path(location) / "config.json"
    config: dict[str, Any] = {}
    if not (model.gguf_file or location.endswith(".gguf")) and what_is(path) == "a regular file":
        config = read_json_object(path, "model config")
    sections = [config, config.get("text_config")]
    for section in reversed(sections) if text_first else sections:
        for key in keys if isinstance(section, dict) else ():
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def config_vocab(model: ModelSpec) -> int | None:
    """The vocabulary `model` has, from its local config; None when none says."""
    return _config_count(model, ("vocab_size",), text_first=True)


def _tokenizer_adds_bos(model: ModelSpec) -> int:
    """1 if the model's tokenizer puts a BOS before plain text, as `models.wrap_model` decides
    for `bos: null` (the default); only called where that one position decides."""
    from sodaray.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(
        model.location, gguf_file=model.gguf_file, trust_remote_code=model.trust_remote_code
    ).tokenizer
    bos_id = getattr(tokenizer, "bos_token_id", None)
    ids = [] if bos_id is None else tokenizer("a", add_special_tokens=True)["input_ids"]
    return int(bool(ids) and ids[0] == bos_id)


def check_fits(
    model: ModelSpec, longest: int, output_tokens: int, error: type[Exception], prefix: str
) -> None:
    """Refuse an input of `longest` tokens with `output_tokens` observed that cannot fit
    `model`'s context, where its config says the context: `error`, one line "{prefix}: {why}"
    (a config that cannot be read, too)."""
    try:
        limit = _config_count(model, CONTEXT_KEYS, text_first=False)
        if limit is None:
            return
        fixed = 1 if model.bos else 0
        if model.bos is None and longest + output_tokens == limit:  # a BOS: one too many
            fixed = _tokenizer_adds_bos(model)
        check_positions(limit, fixed, longest, output_tokens, f"{model.label}'s")
    except ValueError as exc:
        raise error(f"{prefix}: {first_line(exc)}") from exc
