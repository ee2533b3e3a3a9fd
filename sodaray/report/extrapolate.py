"""The budget question: how the exact rate grows with the step budget, measured and extrapolated.

Per sample, a result row's `steps`, `found` and `exact` give the time to an exact find,
right-censored at the budget where the search ended without one. A search that stopped at another
input with the same outputs (`found`, not `exact`) is never exact at any budget: the fits leave it
out and every extrapolated share is scaled by the share of samples without one.

- Measured (`measured`): the share exact within s steps, with a Wilson 95% interval; no model. A
  search's first s steps do not depend on its budget, so it is a lower bound at any larger one.
- Extrapolated (`extrapolate`), four ways, each with a 95% percentile interval from a bootstrap
  over samples (every fit redone on each resample):
  - `weibull`: S(t) = exp(-(t/scale)^shape), by maximum likelihood with censoring;
  - `loglogistic`: S(t) = 1 / (1 + (t/scale)^shape), the same way;
  - `weibull_cure`: a Weibull for a share `cure_share` of the inputs, never found for the rest
    (a mixture cure model): the share found by t is cure_share * F(t);
  - `loglinear`: the measured share against log(steps), a least-squares line between the first
    find and the budget, continued (clipped to [0, 1]).

What each assumes: `weibull` and `loglogistic`, that every input is found eventually, at a
hazard whose shape within the budget holds beyond it; `weibull_cure`, that a share of inputs is
unfindable (within the budget a slow input and an unfindable one look the same, so its interval
is the widest); `loglinear`, that the rate gains the same per doubling of the budget. Where the
models disagree beyond their intervals, the rows do not decide the answer.

The maximum-likelihood fits are grid searches over (log scale, log shape), refined twice, for
every bootstrap resample at once: no optimiser to stall, every resample fitted the same way. A
fit whose best scale lies at the grid's edge (too few finds to place it) is flagged `at_edge`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sodaray.report.metrics import Proportion, proportion

MODELS = ("weibull", "loglogistic", "weibull_cure", "loglinear")
# The paper's budget for its main results, and the steps an extrapolation is shown at.
PAPER_STEPS = 100_000
TARGETS = (5_000, 10_000, 20_000, 50_000, PAPER_STEPS)
BOOTSTRAP = 1000
LOG_SCALE = (0.0, math.log(1e9))  # scale in steps: 1 to 10^9
LOG_SHAPE = (math.log(0.05), math.log(20.0))
GRID = (96, 64)  # coarse points over (log scale, log shape); two refinements follow
REFINE = 21  # points per axis in each refinement, over +-1 cell of the previous grid


@dataclass(frozen=True)
class Samples:
    """Per sample: the step its search stopped (`steps`), whether that stop was an exact find
    (`exact`), or a find of another input with the same outputs (`other`); the step budget."""

    steps: np.ndarray
    exact: np.ndarray
    other: np.ndarray
    budget: int

    @property
    def n(self) -> int:
        return len(self.steps)

    @classmethod
    def from_rows(cls, steps: Sequence, found: Sequence, exact: Sequence, budget: int) -> Samples:
        """From result rows' `steps`, `found` and `exact` (known true inputs only) and the
        step budget they ran under (`max_steps`)."""
        t = np.asarray(steps, dtype=float)
        hit = np.asarray(exact, dtype=bool)
        other = np.asarray(found, dtype=bool) & ~hit
        if len(t) and (t.min() < 0 or not np.isfinite(t).all()):
            raise ValueError("steps must be finite and non-negative")
        if budget < 1 or (len(t) and t.max() > budget):
            raise ValueError(f"a budget of {budget} steps, but a search took {t.max():.0f}")
        # A stop at step 0 (found before any step: the start was the answer) counts at step 1:
        # the fits' time is positive.
        return cls(np.maximum(t, 1.0), hit, other, int(budget))


@dataclass(frozen=True)
class Estimate:
    """A share at one step budget: the fit on the samples, and a 95% bootstrap interval."""

    value: float
    low: float
    high: float


@dataclass
class BudgetFit:
    """One group's extrapolations."""

    samples: Samples
    # model -> target steps -> estimate; a model absent: it could not be fitted (no finds)
    extrapolated: dict[str, dict[int, Estimate]] = field(default_factory=dict)
    params: dict[str, tuple[float, float]] = field(default_factory=dict)  # (scale, shape)
    cure_share: float | None = None  # weibull_cure: the share of inputs ever found
    at_edge: dict[str, bool] = field(default_factory=dict)
    fitted_at_budget: dict[str, float] = field(default_factory=dict)


def measured(samples: Samples, budgets: Sequence[int]) -> dict[int, Proportion]:
    """The share exact within s steps, for each s, with its Wilson 95% interval."""
    return {
        int(s): proportion(int((samples.exact & (samples.steps <= s)).sum()), samples.n)
        for s in budgets
    }


def _log_survival(model: str, z: np.ndarray) -> np.ndarray:
    """log S at z = shape * (log t - log scale)."""
    if model == "loglogistic":
        return -np.logaddexp(0.0, z)
    return -np.exp(z)  # Weibull (also the found part of the cure model)


def cdf(model: str, steps: float | np.ndarray, scale, shape) -> np.ndarray:
    """F(steps) of the survival part: the share found within `steps` of the inputs it covers
    (all of them, except for `weibull_cure`, which multiplies by its cure share)."""
    z = np.asarray(shape) * (np.log(steps) - np.log(scale))
    return -np.expm1(_log_survival(model, z))


CHUNK = 1 << 22  # array elements (grid points x samples) computed at once: about 32 MB


def _terms(model: str, s: Samples, z: np.ndarray, ls: np.ndarray) -> np.ndarray:
    """Each sample's log-likelihood term at z (..., n): log f for an exact find, else log S
    (the cure model's censored samples enter through its closed form instead: 0 here)."""
    log_t = np.log(s.steps)
    censored = 0.0 if model == "weibull_cure" else _log_survival(model, z)
    # log f(t) = log(shape / t * e^z * S) (log-logistic: S^2)
    density = ls - log_t + z + (1 + (model == "loglogistic")) * _log_survival(model, z)
    return np.where(s.exact, density, censored)


def _loglik(model: str, s: Samples, weights: np.ndarray, mu: np.ndarray, ls: np.ndarray):
    """Log-likelihood of each weighted resample (weights (B, n)) at grid points: (G,) shared by
    every resample, or (B, G) one grid each -> (B, G); computed in chunks of `CHUNK`."""
    log_t = np.log(s.steps)
    if mu.ndim == 1:  # one grid for every resample: a matrix product over samples
        out = np.empty((len(weights), len(mu)))
        step = max(1, CHUNK // max(s.n, 1))
        for a in range(0, len(mu), step):
            m, k = mu[a : a + step, None], ls[a : a + step, None]
            z = np.exp(k) * (log_t[None, :] - m)  # (g, n)
            out[:, a : a + step] = weights @ _terms(model, s, z, k).T
        mu, ls = mu[None, :], ls[None, :]
    else:
        out = np.empty(mu.shape)
        step = max(1, CHUNK // max(s.n * mu.shape[1], 1))
        for b in range(0, len(mu), step):
            m, k = mu[b : b + step, :, None], ls[b : b + step, :, None]
            z = np.exp(k) * (log_t[None, None, :] - m)  # (b, G, n)
            terms = _terms(model, s, z, k)
            out[b : b + step] = np.einsum("bgn,bn->bg", terms, weights[b : b + step])
    if model == "weibull_cure":
        share, found_by_budget = _cure_share(s, weights, mu, ls)
        d = (weights @ s.exact.astype(float))[:, None]
        rest = weights.sum(axis=1)[:, None] - d
        with np.errstate(divide="ignore", invalid="ignore"):
            out += np.where(d > 0, d * np.log(share), 0.0)
            out += np.where(rest > 0, rest * np.log1p(-share * found_by_budget), 0.0)
    return out


def _cure_share(s: Samples, weights: np.ndarray, mu: np.ndarray, ls: np.ndarray):
    """The cure model's share of findable inputs at each grid point, in closed form (every
    sample not found ran to the budget): min(1, d / (n F(budget))); and F(budget)."""
    found_by_budget = cdf("weibull", float(s.budget), np.exp(mu), np.exp(ls))
    d = (weights @ s.exact.astype(float))[:, None]
    n = weights.sum(axis=1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.minimum(1.0, np.where(found_by_budget > 0, d / (n * found_by_budget), 1.0))
    return np.nan_to_num(share), found_by_budget


def fit(model: str, s: Samples, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Maximum-likelihood (log scale, log shape) for each weighted resample, (B,) each."""
    mu_axis = np.linspace(*LOG_SCALE, GRID[0])
    ls_axis = np.linspace(*LOG_SHAPE, GRID[1])
    mu, ls = (a.ravel() for a in np.meshgrid(mu_axis, ls_axis, indexing="ij"))
    best = np.argmax(_loglik(model, s, weights, mu, ls), axis=1)
    mu_best, ls_best = mu[best], ls[best]
    steps = np.array([mu_axis[1] - mu_axis[0], ls_axis[1] - ls_axis[0]])
    offsets = np.linspace(-1.0, 1.0, REFINE)
    du, dv = (a.ravel() for a in np.meshgrid(offsets, offsets, indexing="ij"))
    for _ in range(2):
        mus = np.clip(mu_best[:, None] + du[None, :] * steps[0], *LOG_SCALE)
        lss = np.clip(ls_best[:, None] + dv[None, :] * steps[1], *LOG_SHAPE)
        best = np.argmax(_loglik(model, s, weights, mus, lss), axis=1)
        rows = np.arange(len(best))
        mu_best, ls_best = mus[rows, best], lss[rows, best]
        steps = steps * 2 / (REFINE - 1)
    return mu_best, ls_best


def _loglinear(s: Samples, weights: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """The measured share against log(steps), least squares between the first find and the
    budget, at each target: (B, T), clipped to [0, 1]. A resample with no finds: 0."""
    first = s.steps[s.exact].min() if s.exact.any() else float(s.budget)
    grid = np.exp(np.linspace(math.log(first), math.log(max(s.budget, first + 1)), 16))
    hit = s.exact[None, :] & (s.steps[None, :] <= grid[:, None])  # (P, n)
    shares = (weights @ hit.T) / weights.sum(axis=1, keepdims=True)  # (B, P)
    x = np.log(grid) - np.log(grid).mean()
    slope = (shares * x).sum(axis=1) / (x * x).sum()
    level = shares.mean(axis=1)
    at = np.log(np.asarray(targets, dtype=float)) - np.log(grid).mean()
    return np.clip(level[:, None] + slope[:, None] * at[None, :], 0.0, 1.0)


def extrapolate(
    samples: Samples,
    targets: Sequence[int] = TARGETS,
    *,
    boot: int = BOOTSTRAP,
    seed: int = 0,
) -> BudgetFit:
    """Each model's share exact at `targets` steps, with 95% bootstrap intervals (`boot`
    resamples of the samples, drawn with `seed`: the same rows give the same intervals)."""
    out = BudgetFit(samples)
    if samples.n == 0 or not samples.exact.any():
        return out  # no find: nothing to place a curve on
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(samples.n, np.full(samples.n, 1 / samples.n), boot)
    weights = np.vstack([np.ones(samples.n), counts]).astype(float)  # row 0: the samples
    targets = [int(t) for t in targets]
    at = np.asarray(targets, dtype=float)[None, :]
    # Searches that stopped at another input are never exact: the fits cover the rest, each
    # not found having run the whole budget.
    keep = ~samples.other
    steps = np.where(samples.exact[keep], samples.steps[keep], float(samples.budget))
    fitted = Samples(steps, samples.exact[keep], samples.other[keep], samples.budget)
    covered = (weights[:, keep].sum(axis=1) / samples.n)[:, None]
    for model in ("weibull", "loglogistic", "weibull_cure"):
        mu, ls = fit(model, fitted, weights[:, keep])
        scale, shape = np.exp(mu)[:, None], np.exp(ls)[:, None]
        share = covered * cdf(model, at, scale, shape)
        budget = covered[0, 0] * cdf(model, float(samples.budget), scale[0, 0], shape[0, 0])
        if model == "weibull_cure":
            cure, _ = _cure_share(fitted, weights[:, keep], mu[:, None], ls[:, None])
            share, budget = share * cure, budget * cure[0, 0]
            out.cure_share = float(cure[0, 0])
        out.extrapolated[model] = _estimates(share, targets)
        out.params[model] = (float(scale[0, 0]), float(shape[0, 0]))
        out.at_edge[model] = bool(mu[0] >= LOG_SCALE[1] - 1e-9)
        out.fitted_at_budget[model] = float(budget)
    # The line, too, stops at the share that can still be exact.
    line = np.minimum(_loglinear(samples, weights, targets), covered)
    out.extrapolated["loglinear"] = _estimates(line, targets)
    return out


def _estimates(values: np.ndarray, targets: list[int]) -> dict[int, Estimate]:
    """Row 0 is the fit on the samples, the rest the resamples: (value, 2.5%, 97.5%)."""
    boot = values[1:]
    low, high = np.percentile(boot, [2.5, 97.5], axis=0)
    return {
        t: Estimate(float(values[0, j]), float(low[j]), float(high[j]))
        for j, t in enumerate(targets)
    }
