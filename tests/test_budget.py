"""Issue 38: the budget question as tooling. Exact against the step budget from the rows'
`steps`, `found` and `exact` (measured, Wilson intervals), extrapolated by four fits with
bootstrap intervals; each fit recovers a known distribution from censored synthetic rows, and
`sodaray report --extrapolate` writes the tables and figure for a real run."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import STORIES

from sodaray.cli import main
from sodaray.report import extrapolate as bud
from sodaray.report.metrics import proportion

BUDGET = 2000


def draw(kind: str, scale: float, shape: float, n: int, seed: int, findable: float = 1.0):
    """Steps to a find for n synthetic searches, censored at BUDGET (exact finds only)."""
    rng = np.random.default_rng(seed)
    u = rng.random(n)
    if kind == "loglogistic":
        t = scale * (u / (1 - u)) ** (1 / shape)
    else:
        t = scale * (-np.log(u)) ** (1 / shape)
    t = np.ceil(t)
    t[rng.random(n) >= findable] = np.inf  # never found, at any budget
    found = t <= BUDGET
    return bud.Samples.from_rows(np.minimum(t, BUDGET), found, found, BUDGET)


@pytest.mark.parametrize(
    "kind,scale,shape,findable",
    [
        ("weibull", 5000.0, 0.6, 1.0),  # slow: 39% found by the budget, 99.8% by 100,000
        ("loglogistic", 3000.0, 1.2, 1.0),
        ("weibull_cure", 800.0, 0.8, 0.6),  # 40% never found
    ],
)
def test_each_fit_recovers_the_distribution_it_assumes(kind, scale, shape, findable):
    samples = draw(kind, scale, shape, 400, seed=1, findable=findable)
    fit = bud.extrapolate(samples, bud.TARGETS, boot=40, seed=0)
    got_scale, got_shape = fit.params[kind]
    assert got_shape == pytest.approx(shape, rel=0.15)
    assert got_scale == pytest.approx(scale, rel=0.3)
    if kind == "weibull_cure":
        assert fit.cure_share == pytest.approx(findable, abs=0.15)
    base = "weibull" if kind == "weibull_cure" else kind
    for target, estimate in fit.extrapolated[kind].items():
        truth = findable * float(bud.cdf(base, target, scale, shape))
        assert estimate.low - 0.02 <= truth <= estimate.high + 0.02, (target, truth, estimate)
    assert not fit.at_edge[kind]


def test_measured_is_the_share_exact_within_each_budget():
    # exact at 10 and 50; one search stopped at another input at 30; one never found
    samples = bud.Samples.from_rows([10, 50, 30, 400], [1, 1, 1, 0], [1, 1, 0, 0], 400)
    got = bud.measured(samples, [9, 10, 49, 50, 400])
    assert [p.k for p in got.values()] == [0, 1, 1, 2, 2]
    assert got[400] == proportion(2, 4)  # the Wilson interval of 2 of 4
    with pytest.raises(ValueError, match="budget of 100 steps, but a search took 400"):
        bud.Samples.from_rows([400], [0], [0], 100)


def test_a_search_that_stopped_at_another_input_is_never_exact():
    """Half the searches stopped at an input with the same outputs: at any budget, no fit
    gives more than the other half."""
    exact = draw("weibull", 300.0, 1.0, 40, seed=2)
    steps = np.concatenate([exact.steps, np.full(40, 100.0)])
    hit = np.concatenate([exact.exact, np.zeros(40, bool)])
    samples = bud.Samples.from_rows(steps, np.ones(80, bool), hit, BUDGET)
    fit = bud.extrapolate(samples, [bud.PAPER_STEPS], boot=20)
    assert int(fit.samples.other.sum()) == 40
    for model in bud.MODELS:
        assert fit.extrapolated[model][bud.PAPER_STEPS].value <= 0.5 + 1e-9, model


def test_few_samples_leave_the_far_budget_uncertain():
    """16 samples, as a real-model cell: the bootstrap intervals of the fit that lets inputs
    go unfound, and of the line in log(steps), widen the further past the budget they reach."""
    samples = draw("weibull", 5000.0, 0.6, 16, seed=3)
    assert 0 < samples.exact.sum() < 16
    fit = bud.extrapolate(samples, bud.TARGETS, boot=200)
    for model in ("weibull_cure", "loglinear"):
        widths = [e.high - e.low for e in fit.extrapolated[model].values()]
        assert widths[-1] > widths[0] and widths[-1] > 0.4, (model, widths)
    nothing = bud.Samples.from_rows([BUDGET] * 5, [0] * 5, [0] * 5, BUDGET)
    empty = bud.extrapolate(nothing)
    assert empty.extrapolated == {} and bud.measured(nothing, [BUDGET])[BUDGET].k == 0


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_report_extrapolates_a_real_run(tmp_path, capsys, one_thread):
    rows = tmp_path / "rows.parquet"
    tokens = [str(t) for t in (172, 17, 250, 311)]  # the first three found by step 150
    argv = ["invert", "--model", str(STORIES), "--preset", "tinystories-33m"]
    argv += [x for t in tokens for x in ("--tokens", t)]
    assert main([*argv, "--max-steps", "300", "--out", str(rows)]) == 0
    table = pq.read_table(rows).to_pandas()
    out = tmp_path / "rep"
    argv = ["report", str(rows), "--out", str(out), "--extrapolate", "100000", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert {"budget", "budget_extrapolated"} <= set(report["tables"])
    assert (out / "budget.png").is_file() and "budget.png" in report["captions"]
    measured = (out / "budget.csv").read_text().splitlines()
    last = [line for line in measured if ",1 of it," in line]
    assert len(last) == 1  # one group: stories260K, length 1
    exact = int(table["exact"].sum())
    assert f",{exact / len(table)}," in last[0]  # the rows' own exact rate at the budget
    assert exact >= 1  # something to fit: 172 is found within about 60 steps
    text = (out / "budget_extrapolated.md").read_text()
    assert "100,000" in text and "Weibull with a never-found share" in text
    assert "budget" in (out / "README.md").read_text()
