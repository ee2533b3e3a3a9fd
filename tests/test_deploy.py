"""cluster.yaml against the Ray cluster launcher's own schema, and what it syncs to nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_cluster_yaml_is_valid_and_never_syncs_results():
    jsonschema = pytest.importorskip("jsonschema")
    import ray

    schema_path = Path(ray.__file__).parent / "autoscaler" / "ray-schema.json"
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    jsonschema.validate(config, json.loads(schema_path.read_text()))
    assert config["rsync_filter"] == [".gitignore"]
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    for folder in ("results/", "/tuning-runs/", "/data/", ".venv/"):
        assert folder in ignored, folder
