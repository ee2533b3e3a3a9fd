"""Nothing a Ray actor gets may depend on the driver's working directory or file system.

Local paths are resolved on the driver (`ModelSpec.resolved`, `TuningSpec.resolved`); the
multi-node test starts a real head and a second node from other folders and compares a sweep
and a tuning run there with the same runs on local Ray.
"""

from __future__ import annotations

import os

import pytest
from conftest import STORIES

from sodaray.experiment.spec import MODEL_KEYS, ModelSpec, local_path
from sodaray.runner.spec import load_sweep


def test_resolved_model_carries_absolute_paths_and_keeps_its_id(tmp_path, monkeypatch):
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "p.yaml").write_text("soda: {learning_rate: 0.1}\n")
    monkeypatch.chdir(tmp_path)
    spec = ModelSpec(id="models/m", preset_file="p.yaml").resolved()
    # Loaded from the absolute path, but named as given: job hashes and result rows use `id`.
    assert spec.source == str(tmp_path / "models" / "m") and spec.id == "models/m"
    assert spec.preset_file == str(tmp_path / "p.yaml")
    assert spec.identity() == ModelSpec(id="models/m").identity()
    hub = ModelSpec(id="roneneldan/TinyStories-33M", preset="stories260k").resolved()
    assert hub.source is None and hub.preset == "stories260k"  # no such path: a hub id
    assert local_path("../nowhere/at/all") is None
    assert "source" not in MODEL_KEYS  # set by the driver, never by a file


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_sweep_from_a_relative_path_resolves_on_the_driver(tmp_path, monkeypatch):
    rel = os.path.relpath(STORIES, tmp_path)
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: s\nmodels: [{{id: {rel}}}]\n"
        "datasets: [{name: random, build: {dataset: random, lengths: 1, per_length: 1}}]\n"
        "algorithms: [{name: soda}]\n"
    )
    monkeypatch.chdir(tmp_path)
    job = load_sweep(path).jobs()[0]
    assert job.model.id == rel and job.model.resolved().source == str(STORIES)
