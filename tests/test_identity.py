"""One identity per thing: a model, dataset, preset, build source or sweep file is the same
thing however its path is written (a trailing `/`, `./`, `//`, `x/..`, relative or absolute, a
link to it), so a resume spelled otherwise runs nothing and adds no job folder; an input the
run cannot read is refused; `report` counts each result once and says when a folder holds
copies; no name puts rows where readers do not look; a report folder reused holds only the
later report's files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import STORIES

from sodaray.cli import main
from sodaray.results import read_results
from sodaray.runner import load_sweep

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

BUILD = {"name": "random", "build": {"dataset": "random", "lengths": "1", "per_length": 3}}


def sweep_spec(model: str, **extra) -> dict:
    return {
        "name": "idn",
        "models": [{"id": model, "num_cpus": 1}],
        "datasets": [BUILD],
        "algorithms": [{"name": "soda"}],
        "max_steps": 3,
        "shard_size": 2,
        **extra,
    }


def write(path: Path, spec: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec))
    return path


def job_folders(out: Path) -> list[str]:
    root = out / "idn"
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


# ---- 1. the same model however its path is written ----------------------------------------
def spellings(tmp_path: Path) -> dict[str, str]:
    """Ways to write stories260K's path in a sweep file in `tmp_path/s`."""
    link = tmp_path / "link"
    if not link.exists():
        link.symlink_to(STORIES, target_is_directory=True)
    rel = os.path.relpath(STORIES, tmp_path / "s")
    return {
        "trailing slash": f"{STORIES}/",
        "two slashes": str(STORIES).replace("/models/", "//models/"),
        "dot": f"{STORIES}/.",
        "dot-dot": f"{STORIES.parent}/../{STORIES.parent.name}/{STORIES.name}",
        "dot-slash relative": f"./{rel}/",
        "relative": rel,
    }


@pytest.mark.parametrize(
    "spelling", ["trailing slash", "two slashes", "dot", "dot-dot", "dot-slash relative"]
)
def test_a_path_spelled_otherwise_hashes_as_the_plain_one(tmp_path, spelling):
    """Lexical spellings need nothing on disk to agree: the job hash (and so the job folder)
    is the plain spelling's, which is today's hash for it."""
    written = spellings(tmp_path)
    first = written["relative"] if "relative" in spelling else str(STORIES)
    plain = load_sweep(write(tmp_path / "s" / "a.yaml", sweep_spec(first))).jobs()
    other = written[spelling]
    again = load_sweep(write(tmp_path / "s" / "b.yaml", sweep_spec(other))).jobs()
    assert [j.name for j in again] == [j.name for j in plain]
    assert [j.config_hash for j in again] == [j.config_hash for j in plain]


def run_json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, local_ray):
    """A finished sweep (one job, 3 samples in 2 shards, real Ray): its results folder, which
    tests copy before they change anything."""
    tmp = tmp_path_factory.mktemp("identity")
    out = tmp / "out"
    path = write(tmp / "s" / "sweep.yaml", sweep_spec(str(STORIES)))
    assert main(["sweep", "run", str(path), "--out", str(out)]) == 0
    assert len(read_results(out)) == 3
    return out


def copy_of(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(finished, out, symlinks=True)
    return out


def test_a_resume_with_the_model_path_spelled_otherwise_runs_nothing(tmp_path, capsys, finished):
    """`sweep run S --out O` done; the same sweep with the model path written `$M/` (tab
    completion), through `--model M/`, relative to the sweep file, or through a link to the
    folder, runs no shard and adds no job folder: the rows stay one set."""
    out = copy_of(finished, tmp_path)
    folders = job_folders(out)
    assert len(folders) == 1
    meta = sorted(p.name for p in (out / "idn" / ".sodaray" / "jobs").iterdir())
    first = write(tmp_path / "s" / "sweep.yaml", sweep_spec(str(STORIES)))
    written = spellings(tmp_path)

    def sweep_file(name: str, model: str) -> str:
        return str(write(tmp_path / "s" / name, sweep_spec(model)))

    resumes = {
        "as written": ["sweep", "run", str(first)],
        "trailing slash": ["sweep", "run", sweep_file("slash.yaml", f"{STORIES}/")],
        "--model M/": ["sweep", "run", str(first), "--model", f"{STORIES}/"],
        "relative": ["sweep", "run", sweep_file("rel.yaml", written["relative"])],
        "a link": ["sweep", "run", sweep_file("link.yaml", str(tmp_path / "link"))],
        "a link, relative, slash": ["sweep", "run", sweep_file("l2.yaml", "../link/")],
    }
    for how, argv in resumes.items():
        again = run_json(capsys, [*argv, "--out", str(out)])
        assert again["shards_run"] == 0 and again["failed"] == [], how
        assert job_folders(out) == folders, how
        assert sorted(p.name for p in (out / "idn" / ".sodaray" / "jobs").iterdir()) == meta, how
    assert len(read_results(out)) == 3
    # Another setting is another job: the check above can fail.
    other = write(tmp_path / "s" / "other.yaml", sweep_spec(f"{STORIES}/", max_steps=4))
    assert run_json(capsys, ["sweep", "run", str(other), "--out", str(out)])["shards_run"] == 2
    assert len(job_folders(out)) == 2


# ---- 3. a results folder holding copies is counted once ------------------------------------
def duplicate_job(out: Path) -> None:
    """What an older sodaray left after a resume spelled `$M/`: the same searches again under
    a second job folder, its rows naming that job, its hash and the path as spelled."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (job,) = job_folders(out)
    twin = job.rsplit("-", 1)[0] + "-0badc0de"
    (out / "idn" / twin).mkdir()
    for shard in sorted((out / "idn" / job).glob("*.parquet")):
        table = pq.read_table(shard)
        for name, value in (("job", twin), ("config_hash", "0badc0de" * 8)):
            column = pa.array([value] * len(table), pa.string())
            table = table.set_column(table.schema.get_field_index(name), name, column)
        model = pa.array([m + "/" for m in table["model"].to_pylist()], pa.string())
        table = table.set_column(table.schema.get_field_index("model"), "model", model)
        pq.write_table(
            table.replace_schema_metadata(pq.read_schema(shard).metadata),
            out / "idn" / twin / shard.name,
        )


@pytest.mark.parametrize("copied", [False, True])
def test_report_counts_each_result_once_and_says_when_a_folder_holds_copies(
    tmp_path, capsys, caplog, finished, copied
):
    out = copy_of(finished, tmp_path)
    if copied:
        duplicate_job(out)
        assert len(read_results(out)) == 6
    capsys.readouterr()
    rep = tmp_path / "rep"
    assert main(["report", str(out), "--out", str(rep), "--json", "--no-figures"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["rows"] == 3
    index = (rep / "README.md").read_text()
    assert index.startswith("# sodaray report (3 result rows)")
    # The CLI's log handler writes these to stderr (`WARNING sodaray.report: ...`).
    warned = [r.getMessage() for r in caplog.records if "repeat others" in r.getMessage()]
    if copied:
        assert len(warned) == 1 and "3 result rows repeat others" in warned[0]
        assert str(out) in warned[0]
        assert "**Warning:** 3 result rows repeat others" in index
        assert any("repeat others" in n for n in report["notes"])
    else:
        assert warned == [] and "Warning" not in index


# ---- 1c. the same study however its paths are written ---------------------------------------
def tuning_spec(model: str, data: dict, **extra) -> dict:
    return {
        "name": "tiny",
        "model": {"id": model, "num_cpus": 1, **extra},
        "data": data,
        "algorithm": "soda",
        "space": {"learning_rate": {"type": "float", "low": 0.03, "high": 0.3, "log": True}},
        "max_steps": 20,
        "trials": 2,
    }


@pytest.mark.parametrize(
    "field, plain, other",
    [
        ("model", "M", "M/"),
        ("model", "M", "M/."),
        ("model", "M", "M//"),
        ("data path", "d.parquet", "./d.parquet"),
        ("data path", "d.parquet", "sub/../d.parquet"),
        ("build source", "src.txt", "./src.txt"),
        ("preset file", "p.yaml", "./sub/../p.yaml"),
        ("preset file", "p.yaml", "copy.yaml"),  # a preset by what it holds, not where
    ],
)
def test_a_study_is_the_same_study_however_its_paths_are_written(tmp_path, field, plain, other):
    from sodaray.data.build import build_dataset
    from sodaray.data.store import write_dataset
    from sodaray.tuner.spec import load_tuning
    from sodaray.tuner.study import spec_hash

    (tmp_path / "sub").mkdir()
    write_dataset(build_dataset(str(STORIES), "random", "1", 2, 0), tmp_path / "d.parquet")
    (tmp_path / "src.txt").write_text("Once upon a time there was a cat.\nIt sat.\n")
    for name in ("p.yaml", "copy.yaml"):
        (tmp_path / name).write_text(yaml.safe_dump({"params": {"learning_rate": 0.1}}))

    def study(value: str) -> str:
        model, data, extra = str(STORIES), {"name": "d", "path": "d.parquet"}, {}
        if field == "model":
            model = value.replace("M", str(STORIES))
        elif field == "data path":
            data = {"name": "d", "path": value}
        elif field == "build source":
            build = {"dataset": "nl-id", "lengths": "1", "per_length": 1, "source": value}
            data = {"name": "d", "build": build}
        else:
            extra = {"preset_file": value}
        path = write(tmp_path / "t.yaml", tuning_spec(model, data, **extra))
        return spec_hash(load_tuning(path))

    assert study(other) == study(plain)


@pytest.mark.parametrize("spelling", ["relative", "link"])
def test_a_study_opened_with_its_model_written_otherwise_is_the_same_study(tmp_path, spelling):
    """Relative against absolute, or through a link, differ as written (the hash keeps the
    spelling portable) but lead to one place: the study opens, as its own, not refused."""
    import optuna

    from sodaray.tuner.spec import load_tuning
    from sodaray.tuner.study import open_study, spec_hash

    link = tmp_path / "model-link"
    link.symlink_to(STORIES, target_is_directory=True)
    other = os.path.relpath(STORIES, tmp_path) if spelling == "relative" else str(link)
    data = {"name": "r", "build": {"dataset": "random", "lengths": "1", "per_length": 2}}
    url = f"sqlite:///{tmp_path / 'study.db'}"

    def opened(model: str):
        spec = load_tuning(write(tmp_path / "t.yaml", tuning_spec(model, data)))
        study, _ = open_study(spec, url, "s", optuna.storages.RDBStorage(url))
        return spec, study

    first, study = opened(str(STORIES))
    second, again = opened(other)
    assert spec_hash(first) != spec_hash(second)  # written otherwise
    assert again._study_id == study._study_id  # and yet the one study
    copy = shutil.copytree(STORIES, tmp_path / "copy")  # the same files in another place
    spec = load_tuning(write(tmp_path / "t.yaml", tuning_spec(str(copy), data)))
    with pytest.raises(ValueError, match="made by another tuning file"):
        open_study(spec, url, "s", optuna.storages.RDBStorage(url))  # another place: refused


@pytest.mark.parametrize("length", ["fixed", 2, [1, 2]])
def test_max_length_makes_another_job_only_where_a_length_search_reads_it(tmp_path, length):
    def hashes(**extra) -> list[str]:
        path = write(tmp_path / "s.yaml", sweep_spec(str(STORIES), **extra))
        return [j.config_hash for j in load_sweep(path).jobs()]

    assert hashes(length=length, max_length=3) == hashes(length=length)
    assert hashes(length="auto", max_length=3) != hashes(length="auto")


# ---- 4. no name puts rows where readers do not look -----------------------------------------
@pytest.mark.parametrize(
    "command, name",
    [("sweep", "_x"), ("sweep", ".x"), ("sweep", "_"), ("tune", "_study"), ("tune", ".study")],
)
def test_a_name_readers_take_for_hidden_is_refused_in_one_line(tmp_path, capsys, command, name):
    if command == "sweep":
        path = write(tmp_path / "s.yaml", {**sweep_spec(str(STORIES)), "name": name})
        argv = ["sweep", "run", str(path), "--out", str(tmp_path / "out")]
    else:
        data = {"name": "d", "build": {"dataset": "random", "lengths": "1", "per_length": 1}}
        path = write(tmp_path / "t.yaml", {**tuning_spec(str(STORIES), data), "name": name})
        argv = ["tune", str(path), "--out", str(tmp_path / "out")]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert str(path) in err and "name: must not start with '.' or '_'" in err, err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_labels_that_start_hidden_still_put_every_row_where_readers_look(tmp_path, local_ray):
    """A model named `_tiny`, a model folder reached as `.m`, a dataset `_d` and an algorithm
    label `_a` make job folders that pyarrow's dataset discovery, pandas and DuckDB read (none
    starts with `.` or `_`): every row comes back from each reader."""
    import duckdb
    import pandas as pd
    import pyarrow.dataset as ds

    (tmp_path / ".m").symlink_to(STORIES, target_is_directory=True)
    spec = sweep_spec(str(STORIES))
    spec["models"] = [
        {"id": str(STORIES), "name": "_tiny", "num_cpus": 1},
        {"id": str(tmp_path / ".m"), "bos": True, "num_cpus": 1},
    ]
    spec["datasets"] = [{**BUILD, "name": "_d"}]
    spec["algorithms"] = [{"name": "soda", "label": "_a"}]
    out = tmp_path / "out"
    assert main(["sweep", "run", str(write(tmp_path / "s.yaml", spec)), "--out", str(out)]) == 0
    folders = job_folders(out)
    assert len(folders) == 2
    assert not any(f.startswith((".", "_")) for f in folders), folders
    rows = len(read_results(out))
    assert rows == 6
    assert ds.dataset(out, format="parquet").count_rows() == rows
    assert len(pd.read_parquet(out)) == rows
    glob = str(out / "**" / "*.parquet")
    assert duckdb.sql(f"select count(*) from read_parquet('{glob}')").fetchall() == [(rows,)]


# ---- 5. a report folder reused holds only the later report's files -------------------------
def test_a_report_folder_reused_holds_only_the_later_reports_files(tmp_path, capsys, finished):
    out, rep = copy_of(finished, tmp_path), tmp_path / "rep"

    def report(formats: str) -> dict:
        argv = ["report", str(out), "--out", str(rep), "--no-figures", "--format", formats]
        return run_json(capsys, argv)

    first = report("md,csv,latex")
    made = {Path(f).name for f in first["files"]}
    assert {".md", ".csv", ".tex"} <= {Path(f).suffix for f in made}
    # The user's own files, and one of the report's that the user has edited since.
    (rep / "notes.txt").write_text("mine\n")
    (rep / "mine.csv").write_text("a,b\n")
    edited = sorted(f for f in made if f.endswith(".tex"))[0]
    (rep / edited).write_text("% my edit\n")
    second = report("md")
    now = {Path(f).name for f in second["files"]}
    assert all(f.endswith(".md") for f in now)
    visible = {p.name for p in rep.iterdir() if not p.name.startswith(".")}
    assert visible == now | {"notes.txt", "mine.csv", edited}
    assert (rep / edited).read_text() == "% my edit\n"
    listed = json.loads((rep / ".sodaray-report.json").read_text())["files"]
    assert set(listed) == now
    # What is left that a report could have written is marked, atop the index.
    line = f"2 files in {rep} not from this report: {', '.join(sorted(['mine.csv', edited]))}"
    assert line in (rep / "README.md").read_text()
    assert line in second["notes"]


def test_a_report_folder_marks_files_it_did_not_write_and_keeps_them(
    tmp_path, capsys, caplog, finished
):
    out, rep = copy_of(finished, tmp_path), tmp_path / "rep"
    rep.mkdir()
    (rep / "table_old.csv").write_text("x\n1\n")  # an older report's, or the user's: kept
    argv = ["report", str(out), "--out", str(rep), "--no-figures", "--format", "md"]
    assert main([*argv, "--json"]) == 0
    assert (rep / "table_old.csv").read_text() == "x\n1\n"
    line = f"1 file in {rep} not from this report: table_old.csv"
    assert line in (rep / "README.md").read_text()
    assert any(line in r.getMessage() for r in caplog.records)
    # Marked by every report into the folder while it is there, and never removed.
    caplog.clear()
    assert main([*argv, "--json"]) == 0
    assert any(line in r.getMessage() for r in caplog.records)
    assert line in (rep / "README.md").read_text()
    assert (rep / "table_old.csv").exists()


# ---- 2. an input the run cannot read is refused --------------------------------------------
@pytest.mark.parametrize(
    "build, field",
    [
        ({"dataset": "nl-id", "vocab": "model", "source": "src.txt"}, "vocab"),
        ({"dataset": "nl-id", "vocab": "tokenizer", "source": "src.txt"}, "vocab"),
        ({"dataset": "random", "records": "prefix"}, "records"),
        ({"dataset": "nl-ood", "records": "whole", "source": "src.txt"}, "records"),
        ({"dataset": "random", "source": "src.txt"}, "source"),
        ({"dataset": "random", "source": "hf"}, "source"),
        ({"dataset": "nl-id", "source": "synthetic"}, "source"),
        ({"dataset": "privacy", "source": "synthetic", "records": "prefix"}, "records"),
    ],
)
def test_a_build_field_its_dataset_kind_does_not_read_is_refused(tmp_path, capsys, build, field):
    (tmp_path / "src.txt").write_text("Once upon a time there was a cat.\n")
    spec = sweep_spec(str(STORIES))
    spec["datasets"] = [{"name": "d", "build": {"lengths": "1", "per_length": 1, **build}}]
    path = write(tmp_path / "s.yaml", spec)
    code = main(["sweep", "run", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{path}: datasets[0].build.{field}:" in err, err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_data_build_refuses_records_for_synthetic_text(tmp_path, capsys):
    argv = ["data", "build", "--model", str(STORIES), "--dataset", "privacy", "--lengths", "15"]
    argv += ["--source", "synthetic", "--records", "prefix", "--out", str(tmp_path / "d.parquet")]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "records" in err and "synthetic" in err, err
    assert not (tmp_path / "d.parquet").exists()


# ---- 1b. planning finds the job an earlier run wrote by where its paths lead ----------------
STORY = "Once upon a time there was a cat. The cat sat on the mat. It was happy.\n" * 3


@pytest.mark.parametrize(
    "what", ["model by a link", "model relative", "source relative", "source by a link"]
)
def test_planning_takes_the_earlier_job_whose_paths_lead_to_the_same_place(tmp_path, what):
    from sodaray.runner.jobs import plan_jobs

    (tmp_path / "link").symlink_to(STORIES, target_is_directory=True)
    (tmp_path / "src.txt").write_text(STORY)
    (tmp_path / "src-link.txt").symlink_to(tmp_path / "src.txt")
    build = {"dataset": "nl-id", "lengths": "1", "per_length": 1, "seed": 0}

    def spec(model: str, source: str) -> dict:
        d = {"name": "nl", "build": {**build, "source": source}}
        return sweep_spec(model, datasets=[d])

    root = tmp_path / "out" / "idn"
    (first,) = plan_jobs(
        load_sweep(
            write(tmp_path / "s" / "a.yaml", spec(str(STORIES), str(tmp_path / "src.txt")))
        ).jobs(),
        root,
    )
    model, source = str(STORIES), str(tmp_path / "src.txt")
    if what == "model by a link":
        model = str(tmp_path / "link")
    elif what == "model relative":
        model = os.path.relpath(STORIES, tmp_path / "s")
    elif what == "source relative":
        source = "../src.txt"
    else:
        source = str(tmp_path / "src-link.txt")
    jobs = load_sweep(write(tmp_path / "s" / "b.yaml", spec(model, source))).jobs()
    assert [j.config_hash for j in jobs] != [first.job.config_hash]  # spelled otherwise
    (again,) = plan_jobs(jobs, root)
    assert (again.job.name, again.job.config_hash) == (first.job.name, first.job.config_hash)
    assert again.folder == first.folder
    assert len(list((root / ".sodaray" / "jobs").iterdir())) == 1


def test_a_job_file_that_names_another_folder_is_not_followed(tmp_path):
    from sodaray.runner.jobs import plan_jobs

    (tmp_path / "link").symlink_to(STORIES, target_is_directory=True)
    root = tmp_path / "out" / "idn"
    (first,) = plan_jobs(
        load_sweep(write(tmp_path / "a.yaml", sweep_spec(str(STORIES)))).jobs(), root
    )
    job_file = first.meta / "job.json"
    info = json.loads(job_file.read_text())
    job_file.write_text(json.dumps({**info, "job": "elsewhere"}))
    jobs = load_sweep(write(tmp_path / "b.yaml", sweep_spec(str(tmp_path / "link")))).jobs()
    (again,) = plan_jobs(jobs, root)
    assert again.job.name != first.job.name and again.job.name != "elsewhere"
    assert not (root / "elsewhere").exists()
