"""A sweep's results folder is a clean Parquet dataset: pandas, pyarrow, DuckDB and Hugging Face
`datasets` each read it as exactly the result rows (issue 19), and the rows say which dataset,
shard, host, time and model weights they came from."""

from __future__ import annotations

import hashlib
import shutil
import socket
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import STORIES

from sodaray.cli import main
from sodaray.data.store import read_dataset
from sodaray.model.load import load_model, model_revision
from sodaray.results import RESULT_SCHEMA, SCHEMA_VERSION, read_results
from sodaray.runner import load_sweep, run_sweep, sweep_status

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")


def write_sweep(tmp_path: Path) -> Path:
    spec = {
        "name": "clean",
        "models": [{"id": str(STORIES), "num_cpus": 1, "replicas": 1}],
        "datasets": [
            {
                "name": "random",
                "build": {"dataset": "random", "lengths": "1-2", "per_length": 2, "seed": 3},
            }
        ],
        # A grid: its job names used to hold `temperature=0.05`, a hive key to every reader.
        "algorithms": [{"name": "soda", "grid": {"temperature": [0.05, 0.1]}}],
        "objectives": [{"kind": "logits"}],
        "max_steps": 3,
        "shard_size": 2,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def sweep_out(tmp_path_factory, local_ray):
    """A finished two-job, four-shard sweep: (results folder, sweep, start time)."""
    tmp = tmp_path_factory.mktemp("readers")
    sweep = load_sweep(write_sweep(tmp))
    started = datetime.now(timezone.utc)
    run = run_sweep(sweep, tmp / "out")
    assert len(run.done) == 4 and not run.failed
    return tmp / "out", sweep, started


def keys(table: pa.Table) -> list[tuple[str, int, int]]:
    return sorted(
        zip(
            table["job"].to_pylist(),
            table["shard"].to_pylist(),
            table["sample_id"].to_pylist(),
            strict=True,
        )
    )


def read_pandas(out: Path) -> pa.Table:
    import pandas as pd

    return pa.Table.from_pandas(pd.read_parquet(out), preserve_index=False)


def read_pyarrow(out: Path) -> pa.Table:
    import pyarrow.dataset as ds

    return ds.dataset(out, format="parquet").to_table()


def read_pyarrow_hive(out: Path) -> pa.Table:
    import pyarrow.dataset as ds

    return ds.dataset(out, format="parquet", partitioning="hive").to_table()


def read_duckdb(out: Path) -> pa.Table:
    duckdb = pytest.importorskip("duckdb")  # in the dev extra: skipped only outside it
    # Its default: hive partitions detected from `key=value` folder names.
    return duckdb.sql(f"SELECT * FROM read_parquet('{out}/**/*.parquet')").to_arrow_table()


def read_hf_datasets(out: Path) -> pa.Table:
    import datasets

    cache = out.parent / "hf-cache"  # never the user's cache, and no hub
    loaded = datasets.load_dataset("parquet", data_dir=str(out), split="train", cache_dir=cache)
    return loaded.data.table


@pytest.mark.parametrize(
    "reader",
    [read_pandas, read_pyarrow, read_pyarrow_hive, read_duckdb, read_hf_datasets],
    ids=["pandas", "pyarrow.dataset", "pyarrow.dataset-hive", "duckdb", "datasets"],
)
def test_each_reader_returns_exactly_the_result_rows(sweep_out, reader):
    out, sweep, _ = sweep_out
    expected = read_results(out)
    assert len(expected) == 8  # 2 jobs x 4 samples
    table = reader(out)
    # The result schema's columns, no more (no hive key from a folder name), no fewer.
    assert table.column_names == RESULT_SCHEMA.names
    assert keys(table) == keys(expected)
    assert sorted(table["job"].unique().to_pylist()) == sorted(j.name for j in sweep.jobs())


def test_the_folder_holds_only_result_files_outside_its_hidden_meta_folder(sweep_out):
    out, sweep, _ = sweep_out
    files = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    visible = [p for p in files if ".sodaray" not in p.parts]
    assert len(visible) == 4 and all(p.match("clean/*/shard-*.parquet") for p in visible)
    assert not any("=" in part for p in files for part in p.parts)
    for p in visible:  # each one is result rows in this version's schema
        assert pq.read_schema(out / p).metadata[b"sodaray.results.version"] == b"3"
    meta = out / "clean" / ".sodaray"
    assert sorted(p.name for p in (meta / "jobs").iterdir()) == sorted(j.name for j in sweep.jobs())
    assert [p.suffix for p in (meta / "datasets").iterdir()] == [".pq"]
    (status,) = {(s.done, s.pending, s.samples_done) for s in sweep_status(out)}
    assert status == (2, 0, 4)


def test_rows_carry_dataset_shard_host_time_and_model_revision(sweep_out):
    out, _, started = sweep_out
    table = read_results(out)
    (dataset_file,) = (out / "clean" / ".sodaray" / "datasets").iterdir()
    dataset = read_dataset(dataset_file)
    tokens = dict(zip(dataset["sample_id"].to_pylist(), dataset["tokens"].to_pylist(), strict=True))
    rows = table.to_pylist()
    assert SCHEMA_VERSION == 3 and {r["schema_version"] for r in rows} == {3}
    expected_hash = dataset.schema.metadata[b"sodaray.dataset.hash"].decode()
    assert {r["dataset_hash"] for r in rows} == {expected_hash}
    assert {r["dataset_seed"] for r in rows} == {3}
    assert all(tokens[r["sample_id"]] == r["true_tokens"] for r in rows)  # that dataset's rows
    assert {r["host"] for r in rows} == {socket.gethostname()}
    now = datetime.now(timezone.utc)
    assert all(started <= r["finished_at"] <= now for r in rows)
    revision = model_revision(load_model(str(STORIES)))
    assert revision.startswith("sha256:") and {r["model_revision"] for r in rows} == {revision}
    for shard_file in out.rglob("shard-*.parquet"):
        shard = pq.read_table(shard_file).to_pylist()
        index = int(shard_file.stem.removeprefix("shard-"))
        assert {r["shard"] for r in shard} == {index}
        assert len({r["finished_at"] for r in shard}) == 1  # written when the shard finished


def test_model_revision_follows_the_files_not_the_path(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(STORIES, copy)
    for p in copy.iterdir():
        p.chmod(0o644)  # the shared copy is read-only
    original = model_revision(load_model(str(STORIES)))
    assert model_revision(load_model(str(copy))) == original  # same files elsewhere: same
    digest = hashlib.sha256()
    for f in sorted(STORIES.iterdir()):
        digest.update(f"{f.name}\0{f.stat().st_size}\0".encode() + f.read_bytes())
    assert original == "sha256:" + digest.hexdigest()[:16]
    with (copy / "generation_config.json").open("a") as f:
        f.write("\n")
    assert model_revision(load_model(str(copy))) != original  # same path, other files


def test_schema_2_files_read_back_beside_new_ones_with_the_new_columns_null(sweep_out, tmp_path):
    out, _, _ = sweep_out
    shard_file = next(out.rglob("shard-*.parquet"))
    new = pq.read_table(shard_file)
    added = ["dataset_hash", "dataset_seed", "shard", "host", "finished_at", "model_revision"]
    old = new.drop_columns(added).replace_schema_metadata({b"sodaray.results.version": b"2"})
    # Another job's rows (the same rows twice would be refused: `check_unique`).
    jobs = pa.array([f"{j}-v2" for j in old["job"].to_pylist()], pa.string())
    old = old.set_column(old.schema.get_field_index("job"), "job", jobs)
    version = pa.array([2] * len(old), pa.int16())
    old = old.set_column(old.schema.get_field_index("schema_version"), "schema_version", version)
    pq.write_table(old, tmp_path / "old.parquet")
    back = read_results([tmp_path / "old.parquet", shard_file])
    assert back.schema.equals(RESULT_SCHEMA, check_metadata=False)
    assert back["schema_version"].to_pylist() == [2] * len(old) + [3] * len(new)
    for name in added:
        assert back[name].to_pylist()[: len(old)] == [None] * len(old)
        assert back[name].null_count < len(back)  # the new file's values are kept
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "rep"), "--no-figures"]) == 0
