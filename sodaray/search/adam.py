"""The one Adam step SODA and embedding search share: per-slot (or per-row) state, in place."""

from __future__ import annotations

import torch
from torch import Tensor

Hyper = float | Tensor  # one value for every row, or a column broadcast over each row


@torch.no_grad()
def adam_step(
    param: Tensor,
    grad: Tensor,
    m: Tensor,
    v: Tensor,
    *,
    learning_rate: Hyper,
    beta1: Hyper = 0.0,
    beta2: Hyper = 0.0,
    eps: Hyper,
    correction: tuple[Tensor, Tensor] | None = None,
    one_minus_beta1: Tensor | None = None,
    one_minus_beta2: Tensor | None = None,
) -> None:
    """One Adam step on a batch of rows, in place.

    Each hyperparameter is a float, or a tensor broadcast against `param` (a (T, 1) column gives
    every row its own value: searches of different configs share one batch); a tensor `beta1` or
    `beta2` is float64, so that 1 - beta rounds to float32 as it does from a float. `correction` is
    (1 - beta1^t, 1 - beta2^t) per row, t the steps since its moments were last zeroed: given,
    the moments are bias-corrected (standard Adam: m / (1 - beta1^t)); None skips the correction
    (SODA's default; a row whose factors are 1 is uncorrected too). `grad` is consumed: its
    memory holds the squared gradient and then the denominator. `one_minus_beta1|2`, where
    given, are 1 - beta already as `_one_minus` makes them (a batch computes them once, not
    every step) and stand for `beta1|2`.
    """
    weight1 = _one_minus(beta1) if one_minus_beta1 is None else one_minus_beta1
    weight2 = _one_minus(beta2) if one_minus_beta2 is None else one_minus_beta2
    m.lerp_(grad, weight1)  # beta1 m + (1 - beta1) g, one pass
    v.lerp_(grad.mul_(grad), weight2)
    denom = torch.sqrt(v, out=grad)
    step = learning_rate
    if correction is not None:
        first, second = correction
        denom.div_(second.sqrt())  # sqrt(v / (1 - beta2^t))
        step = learning_rate / first
    denom.add_(eps)
    if isinstance(step, Tensor):
        param.addcmul_(torch.div(m, denom, out=denom), step, value=-1.0)
    else:
        param.addcdiv_(m, denom, value=-step)


def _one_minus(beta: Hyper) -> Hyper:
    if isinstance(beta, Tensor):
        if beta.dtype != torch.float64:
            raise TypeError("a beta column is float64 (1 - beta is then rounded once)")
        return (1.0 - beta).float()
    return 1.0 - beta
