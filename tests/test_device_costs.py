"""Issue 41, costs measured, not assumed: the H100 defaults against the measurements they came
from, the fit, costs files, `sweep plan` pricing a GPU entry without a GPU, the gpu suite of
bench_invert.py in its CPU form, and a sweep run held against its plan.

The built-in H100 constants (`sodaray.costs.devices.H100`) are benchmarks/bench_invert.py's
`fit_costs` over issue 41's rows
not held out. Their errors (predicted / measured - 1), as the tests below check them:
- float32, fit on: neo n=10 B=1 -5.2%, B=8 +5.9%, B=1000 -7.0%; Qwen n=3 B=64 -2.2%,
  B=1000 +7.3%. Held out: neo n=3 B=64 +4.1%, neo n=10 B=64 -5.8%, B=256 +0.4%;
  Qwen n=3 B=256 -3.5%, Qwen n=10 B=64 -9.6%.
- bfloat16, fit on: neo n=10 B=256 +5.7%, B=1000 -13.3%; Qwen n=3 B=64 -7.2%, B=1000 +11.2%.
  Held out: Qwen n=3 B=256 -7.3%.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import STORIES

from sodaray.cli import main
from sodaray.cli.sweep import _plan_line
from sodaray.costs.devices import (
    H100,
    H200,
    DeviceCosts,
    PrecisionCosts,
    costs_to_data,
    load_costs,
    step_cost,
    waves,
)
from sodaray.costs.flops import KNOWN_SHAPES, ModelShape, model_shape

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_invert import MeasuredStep, built_in_steps, fit_costs  # noqa: E402

H100_STEPS, H200_STEPS = built_in_steps("h100"), built_in_steps("h200")
NEO = KNOWN_SHAPES["roneneldan/TinyStories-33M"]
QWEN = KNOWN_SHAPES["Qwen/Qwen2.5-0.5B"]
# Tolerances on |predicted / measured - 1|: (fit rows, held-out rows) per precision.
TOLERANCE = {"float32": (0.08, 0.10), "bfloat16": (0.14, 0.08)}


def assert_the_fit_of(costs: DeviceCosts, steps) -> None:
    """`costs` are `fit_costs` over the rows of `steps` not held out, written to three figures."""
    fitted = fit_costs([s for s in steps if not s.held_out])
    assert set(fitted) == set(costs.precisions) == {"float32", "bfloat16"}
    for name, built_in in costs.precisions.items():
        for key in ("pass_seconds", "layer_seconds", "flops_per_second"):
            assert getattr(built_in, key) == pytest.approx(
                getattr(fitted[name], key), rel=2e-3, abs=1e-9
            )


def test_the_h100_constants_are_the_fit_of_issue_41s_rows():
    assert_the_fit_of(H100, H100_STEPS)


@pytest.mark.parametrize("step", H100_STEPS, ids=lambda s: f"{s.label} {s.precision}")
def test_the_h100_costs_reproduce_the_fit_rows_and_predict_the_held_out_ones(step):
    fit_tolerance, held_out_tolerance = TOLERANCE[step.precision]
    error = step.predicted_ms(H100) / step.ms - 1
    assert abs(error) <= (held_out_tolerance if step.held_out else fit_tolerance), error


def test_the_h100_floors_are_the_issues_launch_bound_steps():
    """Small batches are launch-bound: a 4-layer pass about 15 ms, a 24-layer one about 74."""
    c = H100.at("float32")
    assert 1000 * c.floor(NEO.layers) == pytest.approx(15.2, abs=0.1)
    assert 1000 * c.floor(QWEN.layers) == pytest.approx(74.0, abs=0.1)
    assert H100.at("tf32") == c and "tf32" not in H100.precisions  # priced as float32
    # Per sample position (n=10, one output, BOS: the step's FLOPs per position): neo about
    # 10 us, Qwen about 72 us.
    for shape, us in ((NEO, 9.8), (QWEN, 71.8)):
        per_position = shape.step_flops(10, 1, True) / 11 / c.flops_per_second
        assert 1e6 * per_position == pytest.approx(us, abs=0.1)


# The H200 rows (RESULTS.md, "Issue 41 on an H200"): (fit rows, held-out rows) per precision.
# The held-out errors are large (neo B=64 float32 +34%, Qwen B=256 float32 -30%): on that host
# a 24-layer pass is host-bound and noisy (Qwen B=64 took 118 ms in one run and 160 in the
# next), and one rate per precision cannot serve both neo's and Qwen's largest batches.
H200_TOLERANCE = {"float32": (0.05, 0.35), "bfloat16": (0.10, 0.03)}


def test_the_h200_constants_are_the_fit_of_its_measured_rows():
    assert_the_fit_of(H200, H200_STEPS)
    assert load_costs("h200") is H200
    # A pass's floor there: about 16 ms for 4 layers and 98 ms for 24 (all of it per layer).
    assert 1000 * H200.at("float32").floor(NEO.layers) == pytest.approx(16.4, abs=0.1)
    assert 1000 * H200.at("float32").floor(QWEN.layers) == pytest.approx(98.2, abs=0.1)


@pytest.mark.parametrize("step", H200_STEPS, ids=lambda s: f"{s.label} {s.precision}")
def test_the_h200_costs_reproduce_their_fit_rows_and_bound_the_held_out_ones(step):
    fit_tolerance, held_out_tolerance = H200_TOLERANCE[step.precision]
    error = step.predicted_ms(H200) / step.ms - 1
    assert abs(error) <= (held_out_tolerance if step.held_out else fit_tolerance), error


def synthetic(costs: PrecisionCosts, shape: ModelShape, batch: int, n: int = 5) -> MeasuredStep:
    step = MeasuredStep(f"{shape.layers}:{batch}", shape, n, batch, "float32", 1.0)
    seconds = costs.floor(shape.layers) + step.flops / costs.flops_per_second
    return MeasuredStep(step.label, shape, n, batch, "float32", 1000 * seconds)


def test_the_fit_recovers_the_constants_that_made_the_steps():
    truth = PrecisionCosts(0.004, 0.003, 2e13)
    steps = [synthetic(truth, s, b) for s in (NEO, QWEN) for b in (1, 64, 1000)]
    (name, got), *_ = fit_costs(steps).items()
    assert name == "float32"
    assert got.pass_seconds == pytest.approx(truth.pass_seconds, rel=1e-6)
    assert got.layer_seconds == pytest.approx(truth.layer_seconds, rel=1e-6)
    assert got.flops_per_second == pytest.approx(truth.flops_per_second, rel=1e-6)
    # One depth cannot tell the per-layer floor from the rest: it is then all per layer.
    one_depth = fit_costs([synthetic(truth, NEO, b) for b in (1, 64, 1000)])["float32"]
    assert one_depth.pass_seconds == 0
    assert one_depth.floor(NEO.layers) == pytest.approx(truth.floor(NEO.layers), rel=1e-6)
    # A floor that would go negative is left out, not kept below zero.
    clipped = fit_costs([synthetic(PrecisionCosts(0, 0, 1e12), NEO, b) for b in (1, 8)])
    assert clipped["float32"].pass_seconds >= 0 and clipped["float32"].layer_seconds >= 0


def test_a_step_of_mixed_lengths_costs_the_cheaper_of_one_padded_pass_and_a_pass_per_length():
    dear = DeviceCosts("d", "gpu", {"float32": PrecisionCosts(100.0, 0.0, 1.0)}, "test")
    cheap = DeviceCosts("d", "gpu", {"float32": PrecisionCosts(1.0, 0.0, 1.0)}, "test")

    def flops(n: int) -> float:
        return float(n)

    # Floors dear: one pass padded to length 10 (100 + 4 x 10) beats two (200 + 2 + 20).
    one = step_cost(dear, "float32", 2, {1: 2, 10: 2}, flops)
    assert (one.passes, one.floor_seconds, one.work_seconds) == (1, 100.0, 40.0)
    # Padding dear: 100 short samples padded to 10 (1 + 1010) cost more than a second pass.
    two = step_cost(cheap, "float32", 2, {1: 100, 10: 1}, flops)
    assert (two.passes, two.seconds) == (2, 2 + 100 + 10)
    # Lengths that may not share a pass (mix_lengths: false) take a pass each.
    apart = step_cost(dear, "float32", 2, {1: 2, 10: 2}, flops, mix=False)
    assert (apart.passes, apart.seconds) == (2, 222.0)
    gcg = step_cost(dear, "float32", 2, {3: 1}, flops, passes_per_group=2)
    assert (gcg.passes, gcg.seconds) == (2, 203.0)


@pytest.mark.parametrize(
    "shares,size",
    [
        ({1: 4, 2: 3, 3: 10}, 4),
        ({1: 2.5, 2: 2.5}, 16),
        ({5: 1e6}, 3),
        ({1: 1000, 2: 1000, 3: 7}, 300),
        ({2: 0.5}, 1000),
    ],
)
def test_waves_take_every_sample_once_in_length_order_a_batch_at_a_time(shares, size):
    out = waves(shares, size)
    taken: dict[int, float] = {}
    last = 0
    for wave, repeats in out:
        assert repeats >= 1 and 0 < sum(wave.values()) <= size + 1e-9
        assert min(wave) >= last  # the order sweeps submit: by length
        last = max(wave)
        for n, k in wave.items():
            taken[n] = taken.get(n, 0.0) + k * repeats
    assert taken == pytest.approx(shares)
    assert sum(r for _, r in out) == math.ceil(sum(shares.values()) / size - 1e-9)
    assert len(out) <= 2 * len(shares) + 1  # a million waves are priced as a few


def test_a_costs_file_round_trips(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**costs_to_data(H100), "measured": {"rows": [{"case": "x"}]}}))
    assert load_costs(str(path)) == H100
    assert load_costs("h100") is H100


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 1e9, True, "35 s", None])
def test_a_costs_files_start_up_is_seconds_or_a_one_line_error(tmp_path, bad):
    data = costs_to_data(H100)
    assert data["startup_seconds"] == 35.0
    del data["startup_seconds"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_costs(str(path)).startup_seconds == 0.0  # not measured: not counted
    data["startup_seconds"] = bad
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="startup_seconds must be a number of seconds") as err:
        load_costs(str(path))
    assert "\n" not in str(err.value)


TWO_JOBS_SWEEP = """name: startup
models: [{{id: "{model}", num_gpus: 1}}]
datasets: [{{name: random, build: {{dataset: random, lengths: "2", per_length: 3, seed: 0}}}}]
algorithms: [{{name: soda, params: {{max_batch_size: 8}}}}]
objectives: [{{kind: logits}}, {{kind: logits, top_k: 5}}]
max_steps: 50
"""


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
@pytest.mark.parametrize("device", ["h100", "h200"])
def test_a_plan_counts_a_models_start_up_once_in_its_wall(tmp_path, capsys, device):
    """Two jobs of one model: its replicas start once, so the first job carries the costs'
    start-up and the wall is the jobs' search plus that."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(TWO_JOBS_SWEEP.format(model=STORIES))
    argv = ["sweep", "plan", str(sweep), "--no-calibrate", "--costs", device]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    startup = load_costs(device).startup_seconds
    assert [j["startup_seconds"] for j in plan["jobs"]] == [startup, 0.0]
    search = sum(j["wall_seconds"] for j in plan["jobs"])
    assert plan["total"]["wall_seconds"] == pytest.approx(search + startup)
    assert plan["total"]["startup_seconds"] == startup
    assert main(argv) == 0
    assert f"{startup:.0f} s of start-up counted, once per model" in capsys.readouterr().out


def test_a_run_is_held_against_its_plan_with_the_start_up_once_per_model():
    """`check_run`: the plan's wall is each job's search, scaled to the samples the run ran,
    plus each model's start-up once; the search alone is held against the search."""
    from types import SimpleNamespace

    from sodaray.runner.plan import check_run

    def row(job: str, model: str, startup: float) -> dict:
        return {
            "job": job, "model": model, "samples": 10, "device_seconds": 100.0,
            "wall_seconds": 100.0, "priced_by": "h200", "replicas": 1, "batch_steps": None,
            "rate": 1.0, "sample_steps": 100, "startup_seconds": startup,
        }  # fmt: skip

    plan = {"jobs": [row("a", "m", 20.0), row("b", "m", 0.0), row("c", "n", 5.0)]}
    progress = {job: SimpleNamespace(samples=5) for job in "abc"}
    run = SimpleNamespace(
        progress=progress, done=[], model_batch_steps={}, searching_seconds=150.0, seconds=200.0
    )
    check = check_run(plan, run)
    assert check["planned_search_seconds"] == pytest.approx(150.0)  # half of each job's 100 s
    assert check["planned_startup_seconds"] == pytest.approx(25.0)  # m once, n once
    assert check["planned_seconds"] == pytest.approx(175.0)
    assert check["wall_over_planned"] == pytest.approx(200.0 / 175.0)
    assert check["searching_over_planned"] == pytest.approx(1.0)


GPU_SWEEP = """name: gpuplan
models: [{{id: "{model}", num_gpus: 1}}]
datasets: [{{name: random, build: {{dataset: random, lengths: "2", per_length: 3, seed: 0}}}}]
algorithms: [{{name: soda, params: {{max_batch_size: 8}}}}]
objectives: [{{kind: logits, output_tokens: 1}}]
max_steps: 50
"""


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_sweep_plan_prices_a_gpu_entry_in_gpu_hours_without_a_gpu(tmp_path, capsys):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(GPU_SWEEP.format(model=STORIES))
    assert main(["sweep", "plan", str(sweep), "--no-calibrate"]) == 0
    out = capsys.readouterr().out
    assert "GPU jobs priced by h100 costs: H100 80GB HBM3 figures" in out
    assert re.search(r"estimate: [0-9.,]+ GPU-hours", out), out
    assert main(["sweep", "plan", str(sweep), "--no-calibrate", "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    # One wave of 3 samples of length 2, 50 steps, one pass a step (BOS counted: bos unset).
    shape = model_shape(str(STORIES))
    rates = H100.at("float32")
    expected = 50 * (
        rates.floor(shape.layers) + 3 * shape.step_flops(2, 1, True) / rates.flops_per_second
    )
    assert job["priced_by"] == "h100" and job["kind"] == "gpu"
    assert job["device_seconds"] == pytest.approx(expected)
    assert (job["batch_steps"], job["passes"]) == (50, 50)


STUDY_AS_SWEEP = """name: studyplan
models: [{{id: "{model}", num_gpus: 1}}]
datasets: [{{name: v, build: {{dataset: random, lengths: "1-5", per_length: 60, seed: 0}}}}]
algorithms: [{{name: soda, params: {{max_batch_size: 100}}}}]
objectives: [{{kind: logits}}]
max_steps: 600
"""


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_tune_dry_run_prices_a_study_as_sweep_plan_prices_the_same_samples(tmp_path, capsys):
    """One cost model: 3 trials of 20 validation samples a length on one GPU worker are the
    work of a sweep job of 60 samples a length on one GPU replica, and cost the same."""
    tuning = ROOT / "tuning" / "stories260k.yaml"
    args = ["tune", str(tuning), "trials=3", "model.num_gpus=1", "--dry-run", "--out"]
    assert main([*args, str(tmp_path / "t")]) == 0
    out, err = capsys.readouterr()
    study = json.loads(out)["estimate"]
    sweep = tmp_path / "s.yaml"
    sweep.write_text(STUDY_AS_SWEEP.format(model=STORIES))
    assert main(["sweep", "plan", str(sweep), "--no-calibrate", "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert study["priced_by"] == job["priced_by"] == "h100" and study["kind"] == "gpu"
    assert study["sample_steps"] == job["sample_steps"] == 3 * 100 * 600
    for key in ("flops", "device_seconds", "wall_seconds", "floor_seconds", "batch_steps"):
        assert study[key] == pytest.approx(job[key]), key
    assert study["gpu_hours"] == pytest.approx(job["device_seconds"] / 3600)
    assert "GPU trials priced by h100 costs: H100 80GB HBM3 figures" in err
    assert re.search(r"estimate: [0-9.,]+ GPU-hours", err), err


@pytest.fixture(scope="module")
def gpu_suite_on_cpu(tmp_path_factory):
    """bench_invert.py's gpu suite in its CPU form on one tiny case, with Ray and Optuna made
    unimportable (the GPU machines have neither): its stdout and its costs file."""
    if not STORIES.is_dir():
        pytest.skip("stories260K not present")
    out = tmp_path_factory.mktemp("costs") / "cpu-costs.yaml"
    argv = [
        "bench_invert.py",
        "--suite",
        "gpu",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--steps",
        "2",
        "--case",
        "stories:3:4",
        "--out",
        str(out),
    ]
    code = (
        "import runpy, sys; sys.modules['ray'] = None; sys.modules['optuna'] = None; "
        f"sys.argv = {argv!r}; runpy.run_path({str(ROOT / 'benchmarks/bench_invert.py')!r}, "
        "run_name='__main__')"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, out


LINE = re.compile(
    r"stories:3:4 (?P<precision>\w+) +(?P<ms>[0-9.]+) ms/step +(?P<rate>[0-9,.]+) "
    r"sample-steps/s +(?P<ops>[0-9]+) cpu-ops/step +- copies/step +busy +(?P<busy>[0-9.]+)% +"
    r"(?P<tflops>[0-9.e+-]+) TFLOP/s +(?P<peak>[0-9.]+)% of bf16 peak"
)


def test_the_gpu_suite_runs_on_cpu_and_writes_a_costs_file(gpu_suite_on_cpu):
    stdout, out = gpu_suite_on_cpu
    assert re.search(r"policy=exact measured bf16 matrix peak [0-9.,]+ TFLOP/s", stdout), stdout
    rows = {m["precision"]: m for m in LINE.finditer(stdout)}
    assert set(rows) == {"float32", "bfloat16"}, stdout
    for m in rows.values():
        assert float(m["ms"]) > 0 and int(m["ops"]) > 0 and 0 < float(m["busy"]) <= 100
        assert float(m["tflops"]) > 0 and float(m["peak"]) > 0
    assert "# ratios stories:3:4: speed vs float32: bfloat16 x" in stdout
    assert "# costs fit, predicted/measured - 1: stories:3:4 float32" in stdout
    costs = load_costs(str(out))  # read back as `sweep plan --costs` reads it
    assert (costs.device, costs.kind) == ("cpu", "cpu")
    assert set(costs.precisions) == {"float32", "bfloat16"}
    assert all(c.flops_per_second > 0 for c in costs.precisions.values())
    measured = yaml.safe_load(out.read_text())["measured"]
    assert [r["precision"] for r in measured["rows"]] == ["float32", "bfloat16"]
    assert all(r["kernels_per_step"] > 0 for r in measured["rows"])
    assert measured["bf16_matrix_peak_flops"] > 0


RUN_SWEEP = """name: planwall
models: [{{id: "{model}", num_cpus: 1}}]
datasets: [{{name: random, build: {{dataset: random, lengths: "1-2", per_length: 2, seed: 0}}}}]
algorithms: [{{name: soda, params: {{max_batch_size: 4}}}}]
max_steps: 5
shard_size: 2
"""


def finite_positive(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_a_sweep_run_is_held_against_its_plan(tmp_path, capsys, gpu_suite_on_cpu, local_ray):
    _, costs = gpu_suite_on_cpu
    sweep = tmp_path / "s.yaml"
    sweep.write_text(RUN_SWEEP.format(model=STORIES))
    argv = ["sweep", "run", str(sweep), "--costs", str(costs), "--out", str(tmp_path / "o")]
    assert main([*argv, "--json"]) == 0
    check = json.loads(capsys.readouterr().out)["plan"]
    assert check["priced_by"] == ["cpu"] and check["unpriced_jobs"] == []
    for key in (
        "planned_seconds",
        "as_run_seconds",
        "searching_seconds",
        "wall_over_planned",
        "searching_over_planned",
        "searching_over_as_run",
    ):
        assert finite_positive(check[key]), (key, check)
    assert check["searching_seconds"] <= check["wall_seconds"]
    # The line `sweep run` prints after its status table (one run is enough: the same check).
    found = re.search(r"searching/plan ([0-9.]+), wall/plan ([0-9.]+)", _plan_line(check))
    assert found and float(found[1]) > 0 and float(found[2]) > 0
