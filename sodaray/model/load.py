"""Loading frozen causal LMs (hub id, local folder, GGUF) and the split forward the search uses.

The search never needs full-vocabulary logits at every position: it needs the final hidden states
and then the unembedding only at the observed positions (and, for top-k, only at the observed
vocabulary rows). `LoadedModel` exposes exactly that split, verified once against the model's own
forward so that a model with extra output processing falls back to the plain path.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sodaray.errors import first_line
from sodaray.io.modelfiles import (
    ModelLoadError,
    check_gguf_file,
    check_tokenizer_files,
    check_weight_files,
    damaged_tokenizer_file,
    weight_file_errors,
)
from sodaray.model.attention import install, prepared_mask

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# What makes a row's arithmetic depend on the other rows of a batch, and how a pass avoids it.
# A matmul over few rows takes other BLAS kernels, which round differently, and how few depends
# on the inner dimension: MKL on one thread gives every row the same bits from 3 rows up at an
# inner dimension of 64, 8 at 172, 11 at 256 and 16 from 384 up (measured on this project's
# 2-core VM, AVX-512; on sixteen threads more). MKL's AVX2 kernels on an Intel CPU also round
# the last rows of a product otherwise when the row count leaves a remainder by their block of
# rows: only multiples of 12 rows, from 72 up, gave every row its bits (measured on the same VM
# with MKL_ENABLE_INSTRUCTIONS=AVX2; an AMD EPYC's AVX2 path needed no multiple). And an
# elementwise kernel computes the last (size mod vector width) elements of a tensor in scalar
# code, which rounds transcendental functions (SiLU's exp) differently from its vector code. So
# every pass gets zero rows appended: at least one (the tail falls on it), and enough to reach
# this machine's row rule (`row_rule`: a least count and a multiple, measured over inner
# dimensions from 64 to 4096; wider ones, up to a 151936-token vocabulary, gave the same here);
# their results are dropped. On one thread (a CPU replica's default) a search's arithmetic is
# then bit for bit the same whatever else is in its batch (`tests/test_invert.py`,
# `tests/test_replicas.py`, on the other instruction sets by `tests/test_contract.py`); on more,
# large elementwise ops are split among threads at positions that move with the batch's size.
_ROW_RULES: dict[tuple[str, int], tuple[int, int]] = {}
PROBE_ROWS = 160  # the largest row count a CPU probe looks at
# Inner dimensions probed: the threshold grows with it and then levels off (16 rows from 384 up
# on one thread here); a sample of the widths real models have, a vocabulary's included. Every
# row count is tried at the narrow ones; the wide ones (most of the probe's time) check the rule
# found, multiple by multiple.
PROBE_INNER = (64, 172, 512, 896)
PROBE_WIDE = (2048, 4096)
MAX_MULTIPLE = 32
WIDE_STREAK = 6


def _probe_case(inner: int, rows: int, gen: torch.Generator, device: torch.device):
    w = torch.randn(64, inner, generator=gen).to(device)
    x = torch.randn(rows, inner, generator=gen).to(device)
    g = torch.randn(rows, 64, generator=gen).to(device)
    return w, x, g, x @ w.T, g @ w


def _keeps_bits(rows: int, cases: list) -> bool:
    """Whether a product over the first `rows` rows gives each its bits of the larger one, both
    ways (x @ W.T and g @ W), in every case."""
    return all(
        torch.equal(x[:rows] @ w.T, forward[:rows]) and torch.equal(g[:rows] @ w, backward[:rows])
        for w, x, g, forward, backward in cases
    )


def row_rule(device: torch.device) -> tuple[int, int]:
    """(least, multiple): a matmul on `device` over `least` rows or more, a multiple of
    `multiple`, gives each row the same bits as a larger one does, at every inner dimension
    probed and the current thread count; measured once per process (a tenth of a second on a
    CPU). A GPU is probed for the least count only: cuBLAS picks kernels by the row count, and
    the one-answer contract is a CPU's."""
    key = (device.type, torch.get_num_threads() if device.type == "cpu" else 0)
    if key in _ROW_RULES:
        return _ROW_RULES[key]
    gen = torch.Generator().manual_seed(0)
    cpu = device.type == "cpu"
    most = PROBE_ROWS if cpu else 64
    narrow = [_probe_case(i, 2 * most, gen, device) for i in PROBE_INNER]
    if not cpu:
        narrow += [_probe_case(i, 2 * most, gen, device) for i in PROBE_WIDE]
    good = [_keeps_bits(rows, narrow) for rows in range(most + 1)]
    least, multiple = most + 1, 1
    for step in range(1, MAX_MULTIPLE + 1 if cpu else 2):
        bad = [rows for rows in range(step, most + 1, step) if not good[rows]]
        floor = bad[-1] + step if bad else step
        if floor + 4 * step <= most or not cpu:  # seen to hold over four multiples and more
            least, multiple = floor, step
            break
    if cpu:  # the wide dimensions: raise the floor until WIDE_STREAK multiples in a row hold
        wide = [_probe_case(i, 2 * most, gen, device) for i in PROBE_WIDE]
        rows, streak = least, 0
        while streak < WIDE_STREAK and rows <= most:
            streak = streak + 1 if _keeps_bits(rows, wide) else 0
            least = least if streak else rows + multiple
            rows += multiple
    _ROW_RULES[key] = (least, multiple)
    log.info(
        "matmuls on %s keep each row's bits from %d rows, in multiples of %d", key, least, multiple
    )
    return least, multiple


def invariant_rows(device: torch.device) -> int:
    """The fewest rows from which a matmul on `device` can give each row its bits of a larger
    one (`row_rule`)."""
    return row_rule(device)[0]


def rows_invariant(rows: int, device: torch.device) -> bool:
    """Whether a matmul over `rows` rows on `device` gives each row its bits of any larger one
    that also keeps the rule (`row_rule`): the test a caller makes before it skips the padding."""
    least, multiple = row_rule(device)
    return rows >= least and rows % multiple == 0


def pad_rows(x: Tensor, rows_per_item: int = 1, items: int = 0) -> Tensor:
    """`x` with zero items appended along dim 0: at least one, and enough for `row_rule`'s rows
    in all (an item of a (B, L, d) batch is L rows). `items`: a static batch size (the
    scheduler's), whose padded size is then the same for any count of items up to it."""
    extra = padding_items(x.shape[0], x.device, rows_per_item, items)
    return torch.cat([x, _zeros((extra, *x.shape[1:]), x.dtype, x.device)])


def padding_items(count: int, device: torch.device, rows_per_item: int = 1, items: int = 0) -> int:
    """How many zero items `pad_rows` appends to `count` items (the one rule, for a caller that
    keeps its own zero rows after its tensor instead)."""
    least, multiple = row_rule(device)
    per = max(rows_per_item, 1)
    total = max(count + 1, -(-least // per), items + 1)
    step = multiple // math.gcd(multiple, per)  # items whose rows make a multiple
    return -(-total // step) * step - count


_ZEROS: dict[tuple[object, ...], Tensor] = {}


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Zeros of this shape: a view of one buffer per row shape, made once and grown when a
    request outgrows it (so its memory is the most padding one shape has needed). A search pads
    the same few shapes every step, and filling fresh zeros was one more operation (a kernel on
    a GPU) each time (issue 41). Only ever read: `torch.cat` copies it."""
    key = (shape[1:], dtype, str(device))
    zeros = _ZEROS.get(key)
    if zeros is None or len(zeros) < shape[0]:
        if zeros is None and len(_ZEROS) >= 32:
            _ZEROS.clear()
        _ZEROS[key] = zeros = torch.zeros(shape, dtype=dtype, device=device)
    return zeros[: shape[0]]


_POSITIONS: dict[tuple[int, str], Tensor] = {}


def prepared_positions(length: int, device: torch.device) -> Tensor:
    """(1, L) position ids 0 .. L-1, made once per length and device: what a transformers model
    makes on every forward when given none (an arange and an add: two operations, kernels on a
    GPU, per forward, twice a step; issue 41). Only ever read."""
    key = (length, str(device))
    positions = _POSITIONS.get(key)
    if positions is None:
        if len(_POSITIONS) > 256:
            _POSITIONS.clear()
        _POSITIONS[key] = positions = torch.arange(length, device=device)[None]
    return positions


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class LoadedModel:
    """A frozen causal LM with its tokenizer and the pieces the search uses."""

    model: nn.Module
    tokenizer: object | None
    name: str
    prefix_ids: list[int] = field(default_factory=list)
    # Set by `__post_init__`: whether base_model + lm_head reproduce the model's logits.
    split_forward: bool = field(default=False, init=False)
    # Set by `__post_init__`: the factor the input-embedding module applies to its rows (Gemma
    # multiplies by sqrt(d) inside it). A relaxed input `p @ embedding_matrix` must be multiplied
    # by it, or the search optimises a different model than the one the match check runs.
    embed_scale: float = field(default=1.0, init=False)
    # Set by `__post_init__`: whether the relaxed pass's attention is width-invariant
    # (`sodaray.model.attention`), so inputs of any length can share a pass bit for bit.
    invariant: bool = field(default=False, init=False)
    # Set by `__post_init__`: whether a forward may take `prepared_mask` and prepared position
    # ids instead of building its own (checked to give the same logits bit for bit).
    static_mask: bool = field(default=False, init=False)
    _bf16: LoadedModel | None = field(default=None, init=False, repr=False)
    # The prefix's ids and embedding rows on a device, made once (keyed by the prefix, which a
    # caller may change): a search reads them every step (issue 41).
    _prefix: dict[tuple[Any, ...], Tensor] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.model.eval()
        self.model.requires_grad_(False)  # frozen: gradients flow to the inputs only
        self.split_forward = self._check_split_forward()
        self.embed_scale = self._measure_embed_scale()
        self.invariant = install(self.model)
        self.static_mask = self._check_static_mask()

    def for_precision(self, precision: str) -> LoadedModel:
        """The model the gradient pass runs on: itself for float32/tf32, or a cached bfloat16
        copy (the hard-match check always uses the model as loaded, so matches stay exact)."""
        if precision in ("float32", "tf32") or self.dtype == torch.bfloat16:
            return self
        if precision != "bfloat16":
            raise ValueError(f"precision must be float32, tf32 or bfloat16, not {precision!r}")
        if self._bf16 is None:
            import copy

            shadow = copy.deepcopy(self.model).to(torch.bfloat16)
            self._bf16 = LoadedModel(
                shadow, self.tokenizer, f"{self.name} (bf16)", list(self.prefix_ids)
            )
        return self._bf16

    # ---- facts -------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.embedding_matrix.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding_matrix.dtype

    @property
    def embedding_matrix(self) -> Tensor:
        """Input embedding rows, (V, d)."""
        return self.model.get_input_embeddings().weight

    @property
    def vocab_size(self) -> int:
        return int(self.embedding_matrix.shape[0])

    @property
    def max_positions(self) -> int | None:
        """The longest sequence (fixed context, input and observed output) the model takes, from
        its config; None when the config does not say (e.g. rotary models without a limit)."""
        config = getattr(self.model, "config", None)
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            value = getattr(config, key, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    @property
    def num_layers(self) -> int | None:
        """Transformer blocks, from the config (the paper's models table); None if unsaid."""
        config = getattr(self.model, "config", None)
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            value = getattr(config, key, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    @property
    def width(self) -> int:
        """The residual-stream width: the input embedding's dimension."""
        return int(self.embedding_matrix.shape[1])

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def default_tolerance(self) -> float:
        """The paper's match tolerance: 1e-4 under 100M parameters, 1e-3 above."""
        return 1e-4 if self.num_parameters < 100_000_000 else 1e-3

    # ---- text ---------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids instead of text")
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, tokens: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(tokens)

    # ---- forward ------------------------------------------------------------------------------
    def embed(self, tokens: Tensor) -> Tensor:
        return self.model.get_input_embeddings()(tokens)

    def prefix_tensor(self, device: torch.device) -> Tensor:
        """The prefix's ids as a (1, p) tensor on `device`, made once (read only)."""
        key = ("ids", tuple(self.prefix_ids), str(device))
        if key not in self._prefix:
            self._prefix[key] = torch.tensor([self.prefix_ids], dtype=torch.long, device=device)
        return self._prefix[key]

    def prefix_embeds(self, batch: int) -> Tensor | None:
        """The prefix's embedding rows, (batch, p, d) (an expanded view: read only)."""
        if not self.prefix_ids:
            return None
        key = ("embeds", tuple(self.prefix_ids), str(self.device))
        if key not in self._prefix:
            with torch.no_grad():  # frozen weights: a constant, not a graph
                self._prefix[key] = self.embed(self.prefix_tensor(self.device)[0])[None]
        return self._prefix[key].expand(batch, -1, -1)

    def hidden(
        self,
        inputs_embeds: Tensor,
        items: int = 0,
        *,
        prepadded: bool = False,
    ) -> Tensor:
        """Final hidden states (B, L, d); full logits (B, L, V) when the split is unavailable.
        `items`: run as a batch of that many (a static shape; see `pad_rows`). `prepadded`: the
        inputs already end with those padding items (`scoring.sequence_embeds(items=...)`,
        `scoring.prepared_sequences`: what they hold is any, no item reads another's), and
        the states come back with their rows too (a caller that reads only its own rows saves
        the padding's copy and the slice, and in a backward the two operations undoing it)."""
        inputs = inputs_embeds
        if not prepadded:
            inputs = pad_rows(inputs_embeds, inputs_embeds.shape[1], items)
        prepared = self._prepared(inputs)
        module = self.model.base_model if self.split_forward else self.model
        out = module(inputs_embeds=inputs, use_cache=False, **prepared)
        states = out.last_hidden_state if self.split_forward else out.logits
        return states if prepadded else states[: inputs_embeds.shape[0]]

    def _prepared(self, inputs: Tensor) -> dict[str, Tensor]:
        """The forward's `attention_mask` and `position_ids` for inputs (B, L, ...) where
        prepared ones stand in for the model's own (`sodaray.model.attention.prepared_mask`, and
        `prepared_positions`: the model's own default, 0 .. L-1 for every row), else nothing.
        Both or neither: that pair is what `_check_static_mask` compared."""
        if not self.static_mask:
            return {}
        dtype = inputs.dtype if inputs.is_floating_point() else self.dtype
        length = inputs.shape[1]
        mask = prepared_mask(self.model, length, dtype, inputs.device)
        if mask is None:
            return {}
        return {"attention_mask": mask, "position_ids": prepared_positions(length, inputs.device)}

    def unembed(self, hidden: Tensor, indices: Tensor | None = None) -> Tensor:
        """Logits from `hidden` (B, P, d): all (B, P, V), or only `indices` (B, P, k)."""
        if not self.split_forward:  # `hidden` already holds logits
            return hidden if indices is None else hidden.gather(-1, indices)
        head = self.model.get_output_embeddings()
        if indices is None or indices.shape[-1] * 4 >= self.vocab_size:
            # One 2-D matmul: a strided 3-D slice would send F.linear down a batched path that
            # materialises the weight per sample (tens of times slower at V = 50K).
            flat = hidden.reshape(-1, hidden.shape[-1])
            if (
                flat.device.type == "cpu"
                and head.weight.dtype == torch.float32
                and rows_invariant(len(flat), flat.device)
            ):
                # Enough rows: each has its bits of any larger product (what the padding is
                # for), and a step neither copies the states nor, in its backward, the logits.
                # CPU only, where that was measured at these shapes (a vocabulary-wide inner
                # dimension in the backward); on a GPU, cuBLAS picks kernels by M too.
                logits = head(flat)
            else:
                logits = head(pad_rows(flat))[: len(flat)]
            logits = logits.view(*hidden.shape[:-1], -1)
            return logits if indices is None else logits.gather(-1, indices)
        # Gathering k unembedding rows per position beats the full product only for small k.
        rows = head.weight[indices]  # (B, P, k, d)
        logits = torch.einsum("bpkd,bpd->bpk", rows, hidden.to(rows.dtype))
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias[indices]
        return logits

    @torch.no_grad()
    def token_logits(self, tokens: Tensor) -> Tensor:
        """Full logits (B, L, V) on token ids, after the prefix (whose rows are dropped)."""
        batch = tokens.shape[0]
        if self.prefix_ids:
            prefix = self.prefix_tensor(tokens.device).expand(batch, -1)
            tokens = torch.cat([prefix, tokens], dim=1)
        padded = pad_rows(tokens, tokens.shape[1])
        logits = self.model(input_ids=padded, use_cache=False, **self._prepared(padded)).logits
        return logits[:batch, len(self.prefix_ids) :]

    @torch.no_grad()
    def canonical_logits(self, tokens: Tensor, last: int) -> Tensor:
        """Float32 logits (C, last, V) at the last `last` positions of equal-length token rows
        (C, L), after the prefix, in the canonical shape: each sequence alone, first in its
        batch (`token_logits` pads it with zero rows).

        Targets are recorded and candidates confirmed through this one computation, so a true
        input meets its target in the same kernels and reproduces it bit for bit: a GPU picks
        its matmul kernels by shape (issue 37: four exact inputs of 181 went unreported on an
        H100), and a CPU on several threads rounds a row by where it falls in its matrix."""
        if not len(tokens):
            return torch.zeros((0, last, self.vocab_size), device=tokens.device)
        return torch.cat([self.token_logits(row[None])[:, -last:].float() for row in tokens])

    def relaxed_embeds(self, mixture_embeds: Tensor) -> Tensor:
        """`p @ embedding_matrix` as the model's own embedding module would have scaled it."""
        return mixture_embeds if self.embed_scale == 1.0 else mixture_embeds * self.embed_scale

    def _measure_embed_scale(self) -> float:
        module = self.model.get_input_embeddings()
        ids = torch.arange(min(8, self.vocab_size), device=self.device)
        with torch.no_grad():
            looked_up = module(ids).float()
            rows = module.weight[ids].float()
        if torch.equal(looked_up, rows):
            return 1.0
        scale = float((looked_up * rows).sum() / (rows * rows).sum().clamp_min(1e-30))
        if not torch.allclose(looked_up, rows * scale, rtol=1e-3, atol=1e-6):
            raise ValueError(
                f"{self.name}: the input-embedding module is not a scaled row lookup; "
                "relaxed inputs cannot reproduce it"
            )
        log.info("%s scales its input embeddings by %.4g", self.name, scale)
        return scale

    def _check_static_mask(self) -> bool:
        """Whether the model gives the same logits, bit for bit, with `prepared_mask` and
        `prepared_positions` as with the mask and positions it makes itself (a model whose code
        reads `attention_mask` or `position_ids` otherwise, or whose attention takes no
        prepared mask, keeps its own)."""
        tokens = torch.arange(min(5, self.vocab_size), device=self.device).unsqueeze(0)
        mask = prepared_mask(self.model, tokens.shape[1], self.dtype, self.device)
        if mask is None:
            return False
        positions = prepared_positions(tokens.shape[1], self.device)
        try:
            with torch.no_grad():
                own = self.model(input_ids=tokens, use_cache=False).logits
                given = self.model(
                    input_ids=tokens, use_cache=False, attention_mask=mask, position_ids=positions
                ).logits
        except Exception as exc:  # a model that takes no 4D mask: it builds its own
            log.debug("prepared mask unavailable: %s", exc)
            return False
        return bool(torch.equal(own, given))

    def _check_split_forward(self) -> bool:
        get_out = getattr(self.model, "get_output_embeddings", None)
        head = get_out() if get_out else None
        base = getattr(self.model, "base_model", None)
        if head is None or base is None or base is self.model:
            return False
        tokens = torch.arange(min(4, self.vocab_size), device=self.device).unsqueeze(0)
        try:
            with torch.no_grad():
                full = self.model(input_ids=tokens, use_cache=False).logits
                split = head(base(input_ids=tokens, use_cache=False).last_hidden_state)
        except Exception as exc:  # an architecture whose base model differs: use the plain path
            log.debug("split forward unavailable: %s", exc)
            return False
        ok = full.shape == split.shape and torch.allclose(full, split, atol=1e-5, rtol=1e-4)
        if not ok:
            log.info("model %s post-processes its logits; using the full forward", self.name)
        return bool(ok)


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve_model_path(
    name_or_path: str, gguf_file: str | None = None, *, error: type[Exception] = ModelLoadError
) -> tuple[str, str | None]:
    """(folder or hub id, GGUF file name): a path ending in `.gguf` is split into the two, and a
    local path that does not exist is an `error` (checked before any slow work)."""
    if name_or_path.endswith(".gguf") and gguf_file is not None:
        raise error(
            f"{name_or_path} is a GGUF file and a GGUF file name ({gguf_file}) is given too: "
            "give the .gguf path alone, or its folder and the file name"
        )
    if name_or_path.endswith(".gguf") and gguf_file is None:
        path = Path(name_or_path)
        name_or_path, gguf_file = str(path.parent), path.name
    looks_local = name_or_path.startswith(("/", "./", "../", "~"))
    if looks_local and not os.path.exists(os.path.expanduser(name_or_path)):
        raise error(f"no such model folder or file: {name_or_path}")
    if gguf_file is None and os.path.isfile(os.path.expanduser(name_or_path)):
        raise error(
            f"{name_or_path} is a file, not a model folder (give the folder that holds "
            "config.json and the weights, or a .gguf file)"
        )
    if gguf_file is not None and os.path.isdir(os.path.expanduser(name_or_path)):
        file = Path(name_or_path).expanduser() / gguf_file
        if not file.is_file():
            raise error(f"GGUF file {gguf_file!r} not found in {name_or_path}")
        check_gguf_file(Path(name_or_path) / gguf_file, error)  # a cut download, said so
    return name_or_path, gguf_file


def load_model(
    name_or_path: str,
    *,
    gguf_file: str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = "float32",
    bos: bool | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load a causal LM by hub id, local folder, or GGUF file, frozen, on `device`.

    `gguf_file` is the file name inside the folder `name_or_path`; a path ending in `.gguf` is
    split into folder and file for you. `bos` prepends the tokenizer's BOS token as fixed context
    before the searched input (default: whatever the tokenizer does for plain text).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name_or_path, gguf_file = resolve_model_path(name_or_path, gguf_file)
    torch_dtype = _resolve_dtype(dtype)
    device = torch.device(device) if device is not None else default_device()
    kwargs: dict = {"trust_remote_code": trust_remote_code}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    else:
        check_weight_files(name_or_path)  # a cut or damaged file named, not only its folder
        check_tokenizer_files(name_or_path)  # a FIFO would block the tokenizer's read
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype, **kwargs)
    except RuntimeError as exc:
        # What transformers raises for weights whose shapes are not the config's (another
        # model's checkpoint beside this config): about the files, so said about them.
        if "mismatched_sizes" not in str(exc) and "size mismatch" not in str(exc):
            raise
        raise ModelLoadError(
            f"cannot load model {_weights_label(name_or_path, gguf_file)}: its tensors' shapes "
            "are not the ones its config.json describes (weights of another model?)"
        ) from exc
    except pickle.UnpicklingError as exc:  # torch.load(weights_only=True) refused the file
        raise ModelLoadError(
            f"cannot load model {name_or_path!r}: its weights are a pickle that holds more than "
            "tensors, which could run code when loaded; refused (convert it to safetensors)"
        ) from exc
    except (OSError, ValueError, KeyError, *weight_file_errors()) as exc:
        raise ModelLoadError(
            f"cannot load model {_load_label(name_or_path, gguf_file, exc)}"
        ) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        damaged = damaged_tokenizer_file(name_or_path)
        if damaged is not None:  # a tokenizer is there but broken: said, not dropped
            raise ModelLoadError(f"cannot load the tokenizer: {damaged}") from exc
        log.warning("no tokenizer for %s (%s); token ids only", name_or_path, exc)
        tokenizer = None
    model.to(device)
    label = f"{name_or_path}/{gguf_file}" if gguf_file else name_or_path
    return wrap_model(model, tokenizer, name=label, bos=bos)


def _weights_label(name_or_path: str, gguf_file: str | None) -> str:
    """The weight files a load read, for its error: the GGUF file, a local folder's weight
    files (named when few), else the model as given."""
    local = Path(name_or_path).expanduser()
    if gguf_file is not None:
        return str(local / gguf_file)
    if local.is_dir():
        files = sorted(f.name for f in local.iterdir() if f.suffix in (".safetensors", ".bin"))
        if 0 < len(files) <= 3:
            return ", ".join(str(local / f) for f in files)
    return repr(name_or_path)


def _load_label(name_or_path: str, gguf_file: str | None, exc: BaseException) -> str:
    """What a failed load names, then why: the GGUF file, a local folder's config.json when
    the config is what was refused (an architecture this transformers does not know), else
    the model as given."""
    why = first_line(exc)
    local = Path(name_or_path).expanduser()
    if gguf_file is not None:
        return f"{local / gguf_file}: {why}"
    if local.is_dir() and "model type" in why and "config.json" not in why:
        return f"{local / 'config.json'}: {why}"
    return f"{name_or_path!r}: {why}"


# (path, size, mtime) of each file -> its content hash: an actor hashes its model once, not
# once per shard.
_FILE_HASHES: dict[tuple[tuple[str, int, int], ...], str] = {}


def model_revision(model: LoadedModel) -> str | None:
    """Which weights `model` is: the hub commit it was loaded from, else `sha256:` and 16 hex
    digits of its local files' contents (a GGUF file, or every file directly in its folder:
    weights, config and tokenizer), else None (a model built in memory). A path alone says
    nothing: the same folder may hold another checkpoint tomorrow."""
    commit = getattr(getattr(model.model, "config", None), "_commit_hash", None)
    if commit:
        return str(commit)
    path = Path(model.name).expanduser()
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(f for f in path.iterdir() if f.is_file() and not f.name.startswith("."))
    else:
        return None
    key = tuple((str(f), (st := f.stat()).st_size, st.st_mtime_ns) for f in files)
    if key not in _FILE_HASHES:
        digest = hashlib.sha256()
        for (_, size, _), f in zip(key, files, strict=True):
            digest.update(f"{f.name}\0{size}\0".encode())  # unambiguous file boundaries
            with f.open("rb") as stream:
                while chunk := stream.read(1 << 22):
                    digest.update(chunk)
        _FILE_HASHES[key] = "sha256:" + digest.hexdigest()[:16]
    return _FILE_HASHES[key]


def wrap_model(
    model: nn.Module,
    tokenizer: object | None = None,
    *,
    name: str = "model",
    bos: bool | None = None,
) -> LoadedModel:
    """Wrap an in-memory `transformers` causal LM (e.g. one built from a config in a test)."""
    prefix: list[int] = []
    bos_id = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    if bos is None and tokenizer is not None and bos_id is not None:
        # Follow the tokenizer: prepend BOS only if it adds one to plain text.
        with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
        bos = bool(with_special) and with_special[0] == bos_id
    if bos:
        if bos_id is None:
            raise ValueError("bos=True but the tokenizer has no BOS token")
        prefix = [int(bos_id)]
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, prefix_ids=prefix)
