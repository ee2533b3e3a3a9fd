"""`sodaray sweep plan`: counts for every shipped sweep, the runner's own sample selection, a
real calibration on stories260K, and quick looks in their own results folder."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from conftest import STORIES, real_models_missing

from sodaray.cli import main
from sodaray.experiment.data import select_rows
from sodaray.runner.plan import calibrate, job_cost, select_counts
from sodaray.runner.spec import load_sweep

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"


@pytest.mark.parametrize("path", sorted(SWEEPS.glob("*.yaml")), ids=lambda p: p.stem)
def test_plan_works_on_every_shipped_sweep(path, capsys):
    if real_models_missing(path):
        pytest.skip("the real models are not assembled (../shared/models/fetch-real-models.sh)")
    assert main(["sweep", "plan", str(path), "--no-calibrate"]) == 0
    out = capsys.readouterr().out
    jobs = load_sweep(path).jobs()
    assert f"{len(jobs)} jobs" in out
    total = sum(job_cost(j).sample_steps for j in jobs)
    assert f"at most {total:,} sample-steps" in out


def test_models_table_is_shown_as_the_long_job_it_is(capsys):
    assert main(["sweep", "plan", str(SWEEPS / "models.yaml"), "--rate", "5000"]) == 0
    out = capsys.readouterr().out
    # 5 models x 10 lengths x 1,000 inputs x 100,000 steps
    assert "at most 5,000,000,000 sample-steps" in out
    assert "277.78 GPU-hours" in out  # 5e9 / 5000 per second / 3600


def test_the_inverter_counts_one_step_per_sample():
    """The learned inverter answers in one pass: its jobs' max_steps is not work to plan for."""
    jobs = {j.algorithm: j for j in load_sweep(SWEEPS / "privacy.yaml").jobs()}
    inverter, soda = job_cost(jobs["inverter"]), job_cost(jobs["soda"])
    assert inverter.sample_steps == inverter.samples == 5000
    assert soda.sample_steps == soda.samples * jobs["soda"].search.max_steps


@pytest.mark.parametrize(("per_length", "limit"), [(None, None), (3, None), (None, 5), (2, 4)])
def test_counts_match_the_runners_selection(per_length, limit):
    lengths = [1] * 4 + [2] * 3 + [3] * 1
    table = pa.table({"sample_id": list(range(len(lengths))), "length": lengths})
    rows = select_rows(table, per_length, limit)
    expected: dict[int, int] = {}
    for n in rows["length"]:
        expected[n] = expected.get(n, 0) + 1
    counts = select_counts({1: 4, 2: 3, 3: 1}, per_length, limit)
    assert {n: k for n, k in counts.items() if k} == expected


def test_quick_look_has_its_own_name_and_capped_budget():
    sweep = load_sweep(SWEEPS / "algorithms.yaml").quick(50)
    assert sweep.name == "algorithms-quick"
    jobs = sweep.jobs(limit=3)
    assert {j.search.max_steps for j in jobs} == {50}  # GCG's 700 capped too
    assert all(j.sweep == "algorithms-quick" for j in jobs)
    assert all(job_cost(j).samples == 3 for j in jobs)


def test_bad_rate_is_a_one_line_error(capsys):
    assert main(["sweep", "plan", str(SWEEPS / "models.yaml"), "--rate", "0"]) == 2
    assert "--rate" in capsys.readouterr().err


def test_calibration_measures_a_rate_on_stories260k():
    if not STORIES.is_dir():
        pytest.skip("stories260K not present")
    job = load_sweep(SWEEPS / "quickstart.yaml").quick(20).jobs(limit=3)[0]
    from sodaray.runner.plan import load_for_plan

    rate = calibrate(job, job_cost(job), load_for_plan(job), steps=5)
    assert 0 < rate < float("inf")


def test_the_cost_model_counts_a_step_from_the_models_shape():
    """Qwen2.5-0.5B's blocks hold 0.36B parameters (its model card: 0.49B with 0.13B of
    embeddings); a step's FLOPs follow the documented formula term by term."""
    from sodaray.cost import KNOWN_SHAPES, ModelShape

    assert round(KNOWN_SHAPES["Qwen/Qwen2.5-0.5B"].block_params / 1e6) == 358
    shape = ModelShape(layers=2, width=4, vocab=10, mlp=8, gated=False, attention=4, kv=4)
    assert shape.block_params == 2 * (4 * 16 + 2 * 32)
    tokens = 3 + 1 + 1  # input, one output, BOS
    forward = 2 * 256 * tokens + 4 * 2 * tokens**2 * 4 + 2 * 4 * 10 * 4
    assert shape.step_flops(3, 1, bos=True) == 3 * forward + 30 * 3 * 10


def test_plan_json_parses_and_prices_jobs_on_the_stated_device(capsys):
    import json

    args = ["sweep", "plan", str(SWEEPS / "models.yaml"), "--rate", "5000", "--json"]
    assert main([*args, "--device", "a100", "--efficiency", "0.5"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["device"], plan["efficiency"], len(plan["jobs"])) == ("a100", 0.5, 5)
    for job in plan["jobs"]:
        assert job["device_hours"] == pytest.approx(job["flops"] / (19.5e12 * 0.5) / 3600)
    assert plan["total"]["device_hours"] == pytest.approx(
        sum(j["device_hours"] for j in plan["jobs"])
    )
    assert main(["sweep", "plan", str(SWEEPS / "models.yaml"), "--device", "tpu"]) == 2
    assert "--device must be one of h100" in capsys.readouterr().err
