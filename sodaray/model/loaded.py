"""The loaded model as the searches use it: a frozen causal LM with its tokenizer, the split forward
(final hidden states, then the unembedding only where observed, verified once against the model's
own forward), its bfloat16 view for the gradient pass, and `wrap_model` for one built in memory."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from sodaray.model.attention import install, prepared_mask
from sodaray.model.padding import pad_rows, prepared_positions, rows_invariant

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A frozen causal LM with its tokenizer and the pieces the search uses."""

    model: nn.Module
    tokenizer: object | None
    name: str
    prefix_ids: list[int] = field(default_factory=list)
    # Set by `__post_init__`: whether base_model + lm_head reproduce the model's logits; the
    # factor the input-embedding module applies to its rows (Gemma: sqrt(d)), which a relaxed
    # input `p @ embedding_matrix` needs too; whether the relaxed pass's attention is
    # width-invariant (`sodaray.model.attention`); whether a forward may take `prepared_mask`
    # and prepared position ids (checked to give the same logits bit for bit).
    split_forward: bool = field(default=False, init=False)
    embed_scale: float = field(default=1.0, init=False)
    invariant: bool = field(default=False, init=False)
    static_mask: bool = field(default=False, init=False)
    _bf16: LoadedModel | None = field(default=None, init=False, repr=False)
    # The prefix's ids and embedding rows per device, keyed by the prefix (a caller may change it).
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
            shadow = copy.deepcopy(self.model).to(torch.bfloat16)
            name = f"{self.name} (bf16)"
            self._bf16 = LoadedModel(shadow, self.tokenizer, name, list(self.prefix_ids))
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
        keys = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
        return self._config_count(keys)

    @property
    def num_layers(self) -> int | None:
        """Transformer blocks, from the config (the paper's models table); None if unsaid."""
        return self._config_count(("num_hidden_layers", "n_layer", "num_layers"))

    def _config_count(self, keys: tuple[str, ...]) -> int | None:
        """The first of the config's `keys` that holds a positive integer."""
        config = getattr(self.model, "config", None)
        values = (getattr(config, key, None) for key in keys)
        return next((v for v in values if isinstance(v, int) and v > 0), None)

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
        return None if self.tokenizer is None else self.tokenizer.decode(tokens)

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

    def hidden(self, inputs_embeds: Tensor, items: int = 0, *, prepadded: bool = False) -> Tensor:
        """Final hidden states (B, L, d); full logits (B, L, V) when the split is unavailable.
        `items`: run as a batch of that many (a static shape; see `pad_rows`). `prepadded`: the
        inputs already end with those padding items (`scoring.sequence_embeds(items=...)`;
        no item reads another's), and the states come back with their rows too (saving the
        padding's copy and the slice, and in a backward the two operations undoing it)."""
        inputs = inputs_embeds
        if not prepadded:
            inputs = pad_rows(inputs_embeds, inputs_embeds.shape[1], items)
        module = self.model.base_model if self.split_forward else self.model
        out = module(inputs_embeds=inputs, use_cache=False, **self._prepared(inputs))
        states = out.last_hidden_state if self.split_forward else out.logits
        return states if prepadded else states[: inputs_embeds.shape[0]]

    def _prepared(self, inputs: Tensor) -> dict[str, Tensor]:
        """The forward's prepared `attention_mask` and `position_ids` for inputs (B, L, ...)
        where they stand in for the model's own, else nothing: both or neither, the pair that
        `_check_static_mask` compared."""
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
            # Enough rows keep each row's bits without padding (no copy of the states or, in
            # the backward, the logits). CPU only, where that was measured at these shapes; on
            # a GPU, cuBLAS picks kernels by M too.
            cpu = flat.device.type == "cpu" and head.weight.dtype == torch.float32
            if cpu and rows_invariant(len(flat), flat.device):
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
        (C, L), after the prefix, each sequence alone, first in its batch: targets are recorded
        and candidates confirmed through this one computation, so a true input meets its
        target in the same kernels (picked by shape) and reproduces it bit for bit."""
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
        prepared = dict(attention_mask=mask, position_ids=positions)
        try:
            with torch.no_grad():
                own = self.model(input_ids=tokens, use_cache=False).logits
                given = self.model(input_ids=tokens, use_cache=False, **prepared).logits
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


def wrap_model(
    model: nn.Module,
    tokenizer: object | None = None,
    *,
    name: str = "model",
    bos: bool | None = None,
) -> LoadedModel:
    """Wrap an in-memory `transformers` causal LM (e.g. one built from a config in a test)."""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos is None and bos_id is not None:
        # Follow the tokenizer: prepend BOS only if it adds one to plain text.
        with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
        bos = bool(with_special) and with_special[0] == bos_id
    if bos and bos_id is None:
        raise ValueError("bos=True but the tokenizer has no BOS token")
    prefix = [int(bos_id)] if bos else []
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, prefix_ids=prefix)
