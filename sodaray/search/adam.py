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
    """One Adam step on a batch of rows, in place; `grad` is consumed (it holds the squared
    gradient, then the denominator). Each hyperparameter is a float or a tensor broadcast
    against `param` (a (T, 1) column: each row its own); a tensor beta is float64, so 1 - beta
    rounds to float32 as from a float. `correction`: (1 - beta1^t, 1 - beta2^t) per row, t the
    steps since its moments were last zeroed (None: uncorrected, SODA's default).
    `one_minus_beta1|2`, where given, are 1 - beta as `_one_minus` makes them, for `beta1|2`."""
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
