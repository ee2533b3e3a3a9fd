"""Issue 28: every command that prints results or plans takes `--json` and prints one JSON
object (invert, sweep status and tune have their own tests)."""

from __future__ import annotations

import json

from conftest import STORIES

from sodaray.cli import main
from sodaray.data.store import RANDOM_SOURCE


def test_data_build_sweep_run_and_report_print_one_json_object(tmp_path, capsys, local_ray):
    data = tmp_path / "d.parquet"
    argv = ["data", "build", "--model", str(STORIES), "--dataset", "random", "--lengths", "1-2"]
    assert main([*argv, "--per-length", "2", "--out", str(data), "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["rows"] == 4 and built["by_length"] == {"1": 2, "2": 2}
    assert built["fallback"] is None and built["source"] == RANDOM_SOURCE
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        f'name: js\nmodels: [{{id: "{STORIES}", num_cpus: 1}}]\n'
        f'datasets: [{{name: mine, path: "{data}"}}]\nalgorithms: [{{name: soda}}]\nmax_steps: 5\n'
    )
    assert main(["sweep", "run", str(sweep), "--out", str(tmp_path / "o"), "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["sweep"] == "js" and run["shards_run"] == 1 and run["failed"] == []
    assert [j["samples_done"] for j in run["status"]] == [4]
    out = tmp_path / "rep"
    assert main(["report", str(tmp_path / "o"), "--out", str(out), "--json", "--no-figures"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 4 and "jobs" in report["tables"]
    assert all((out / f).exists() for f in report["files"])
