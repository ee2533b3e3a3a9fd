"""Sweep files: validation before any work starts, job expansion, the shipped sweeps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import STORIES, stand_in
from test_runner import write_sweep

from sodaray.cli import main
from sodaray.runner import load_sweep

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")


BAD_SWEEPS = [
    ({"colour": "red"}, "colour: unknown field"),
    ({"models": [{"id": "./no/such/model"}]}, "models[0].id: no such model"),
    ({"models": [{"id": str(STORIES), "gpus": 1}]}, "models[0].gpus: unknown field"),
    ({"algorithms": [{"name": "sgd"}]}, "algorithms[0].name: unknown algorithm"),
    (
        {"algorithms": [{"name": "soda", "params": {"lr": 1}}]},
        "algorithms[0]: unknown soda parameter 'lr'",
    ),
    ({"algorithms": [{"name": "soda", "params": {"decay": 2.0}}]}, "algorithms[0]: decay"),
    ({"max_steps": 0}, "max_steps: must be at least 1, not 0"),
    ({"steps": 10}, "steps: renamed: use `max_steps`"),
    ({"shard_size": 0}, "shard_size: must be at least 1, not 0"),
    ({"samples_per_length": -2}, "samples_per_length: must be at least 1, not -2"),
    ({"models": [{"id": str(STORIES), "replicas": 0}]}, "models[0].replicas: must be at least 1"),
    ({"models": [{"id": str(STORIES), "num_cpus": 0}]}, "models[0].num_cpus: must be above 0"),
    ({"models": [{"id": str(STORIES), "num_gpus": -1}]}, "models[0].num_gpus: must be at least 0"),
    (
        {"models": [{"id": str(STORIES), "dtype": "float16"}]},
        "models[0].dtype: must be one of float32, bfloat16, not 'float16'",
    ),
    (
        {"models": [{"id": str(STORIES), "executor": "cudagraph"}]},
        "models[0].executor: must be one of eager, graph, not 'cudagraph'",
    ),
    (
        {"models": [{"id": str(STORIES), "executor": "../graph"}]},
        "models[0].executor: must be one of eager, graph, not '../graph'",
    ),
    (
        {"models": [{"id": str(STORIES), "executor": ["graph"]}]},
        "models[0].executor: must be one of eager, graph, not ['graph']",
    ),
    (
        {"models": [{"id": str(STORIES), "executor": 1}]},
        "models[0].executor: must be one of eager, graph, not 1",
    ),
    (
        {"algorithms": [{"name": "soda", "max_steps": 0}]},
        "algorithms[0].max_steps: must be at least 1, not 0",
    ),
    ({"objectives": [{"kind": "logits", "top_k": 0}]}, "objectives[0]: top_k"),
    (
        {"datasets": [{"name": "random", "path": "missing.parquet"}]},
        "datasets[0].path: no such dataset",
    ),
    (
        {"datasets": [{"name": "x", "build": {"dataset": "poems"}}]},
        "datasets[0].build.dataset: unknown dataset",
    ),
    ({"datasets": [{"name": "random", "build": {"lengths": "5-2"}}]}, "datasets[0].build.lengths"),
]


@pytest.mark.parametrize("override, message", BAD_SWEEPS)
def test_invalid_sweeps_fail_before_ray_starts(tmp_path, capsys, override, message):
    import ray

    path = write_sweep(tmp_path, **override)
    code = main(["sweep", "run", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert str(path) in err and message in err, err
    assert not ray.is_initialized()


def test_a_model_entry_names_its_executor_in_the_job_hash_unless_the_default(tmp_path):
    """`executor: eager` reaches the replica's engine (a captured step may round otherwise on
    a GPU, so an eager run is a job of its own), `graph` is the entry left unset: the same job
    folder as before the field existed. `--model` keeps the entry's executor. On a CPU both
    run each pass at its own shape (nothing is captured there)."""
    from sodaray.experiment.replica import ReplicaWorker

    names, specs = {}, {}
    for executor in (None, "eager", "graph"):
        extra = {} if executor is None else {"executor": executor}
        models = [{"id": str(STORIES), **extra}]
        folder = tmp_path / str(executor)
        folder.mkdir()
        sweep = load_sweep(write_sweep(folder, models=models))
        names[executor] = {j.name for j in sweep.jobs()}
        specs[executor] = sweep.jobs()[0].model
    assert names[None] == names["graph"] and names["eager"].isdisjoint(names["graph"])
    assert specs["eager"].executor == "eager"
    assert specs["eager"].with_id(str(STORIES)).executor == "eager"
    worker = ReplicaWorker(specs["eager"], 1)
    try:
        assert worker.engine.executor.name == "eager" and worker.engine.policy == "exact"
    finally:
        worker.stop()


def test_limit_and_model_override_change_the_job_folder(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path))
    full = {j.name for j in sweep.jobs()}
    limited = {j.name for j in sweep.jobs(limit=3)}
    assert full.isdisjoint(limited)
    other = sweep.jobs(model=str(STORIES) + "/")
    assert {j.model.id for j in other} == {str(STORIES) + "/"}


def test_shipped_sweeps_are_valid():
    root = Path(__file__).resolve().parents[1] / "sweeps"
    names = sorted(p.name for p in root.glob("*.yaml"))
    assert "quickstart.yaml" in names
    cwd = os.getcwd()
    os.chdir(root.parent)  # the README's commands run from the repository root
    try:
        for path in sorted(root.glob("*.yaml")):
            sweep = load_sweep(path, model=stand_in(path))
            assert sweep.jobs(), path
    finally:
        os.chdir(cwd)


def test_status_of_missing_folder_is_one_line(tmp_path, capsys):
    code = main(["sweep", "status", str(tmp_path / "nothing")])
    assert code == 2 and "no such results folder" in capsys.readouterr().err


def test_algorithm_entry_steps_override_the_sweep_budget(tmp_path):
    path = write_sweep(
        tmp_path,
        algorithms=[
            {"name": "soda"},
            {"name": "gcg", "max_steps": 7, "params": {"tokens_per_position": 4}},
        ],
    )
    jobs = load_sweep(path).jobs()
    assert sorted((j.algorithm, j.search.max_steps) for j in jobs) == [("gcg", 7), ("soda", 20)]
    assert jobs[0].config_hash != jobs[1].config_hash
    bad = write_sweep(tmp_path, algorithms=[{"name": "soda", "max_steps": 0}])
    with pytest.raises(ValueError, match=r"algorithms\[0\]\.max_steps"):
        load_sweep(bad)


def test_unreachable_cluster_is_one_line(tmp_path, capsys):
    path = write_sweep(tmp_path, max_steps=1)
    code = main(
        ["sweep", "run", str(path), "--out", str(tmp_path / "out"), "--address", "127.0.0.1:9"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "cannot reach a Ray cluster at 127.0.0.1:9" in err, err


def test_model_override_applies_before_the_file_model_is_checked(tmp_path, capsys):
    # The README's `ray job submit` line: the file's relative model path does not exist in the
    # job's folder, and --model must be enough to run it anyway.
    path = write_sweep(tmp_path, models=[{"id": "./not/here", "num_cpus": 1}])
    with pytest.raises(ValueError, match="no such model"):
        load_sweep(path)
    sweep = load_sweep(path, model=str(STORIES))
    assert {j.model.id for j in sweep.jobs()} == {str(STORIES)}
    code = main(["sweep", "run", str(path), "--model", "./neither/here", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--model (for models[0]).id: no such model folder or file: ./neither/here" in err, err
