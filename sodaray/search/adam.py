"""The one Adam step SODA and embedding search share: per-slot state, updated in place."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def adam_step(
    param: Tensor,
    grad: Tensor,
    m: Tensor,
    v: Tensor,
    *,
    learning_rate: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: Tensor | None = None,
) -> None:
    """One Adam step on a batch of slots (leading dimension B), in place.

    `step` (B,) float32 is each slot's step count since its moments were last zeroed: given, the
    moments are bias-corrected per slot (standard Adam: m / (1 - beta1^t)); None skips the
    correction (SODA's default). `grad` is consumed: its memory is reused for the denominator.
    """
    m.mul_(beta1).add_(grad, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    if step is None:
        denom = torch.sqrt(v, out=grad).add_(eps)
        param.addcdiv_(m, denom, value=-learning_rate)
        return
    per_slot = (-1,) + (1,) * (param.dim() - 1)
    m_hat = m / (1 - beta1**step).view(per_slot)
    denom = torch.div(v, (1 - beta2**step).view(per_slot), out=grad).sqrt_().add_(eps)
    param.addcdiv_(m_hat, denom, value=-learning_rate)
