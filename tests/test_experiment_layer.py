"""The layer the runner and the tuner share: one preset rule, typed jobs, sibling packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from conftest import STORIES

from sodaray.objective.objectives import Objective
from sodaray.runner import load_sweep
from sodaray.search.gcg import GcgConfig
from sodaray.search.soda.config import SodaConfig
from sodaray.tuner import load_tuning

PACKAGE = Path(__file__).resolve().parents[1] / "sodaray"
pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

DATA = {"build": {"dataset": "random", "lengths": "1", "per_length": 2}}


def imported_modules(folder: Path) -> set[str]:
    names: set[str] = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize(("package", "sibling"), [("runner", "tuner"), ("tuner", "runner")])
def test_runner_and_tuner_are_siblings(package, sibling):
    imported = imported_modules(PACKAGE / package)
    assert not [m for m in imported if m.startswith(f"sodaray.{sibling}")]
    assert any(m.startswith("sodaray.experiment") for m in imported)


def test_experiment_layer_imports_neither():
    imported = imported_modules(PACKAGE / "experiment")
    assert not [m for m in imported if m.startswith(("sodaray.runner", "sodaray.tuner"))]


def write(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_model_preset_means_the_same_in_a_sweep_and_a_tuning_file(tmp_path):
    """gpt2-small's decay is 0.98 (the default 0.9): a tuning file's trials used to ignore it."""
    model = {"id": str(STORIES), "preset": "gpt2-small"}
    sweep = load_sweep(
        write(
            tmp_path,
            "s.yaml",
            {
                "name": "s",
                "models": [model],
                "datasets": [{"name": "random", **DATA}],
                "algorithms": [{"name": "soda"}, {"name": "gcg"}],
            },
        )
    )
    tuning = load_tuning(
        write(
            tmp_path,
            "t.yaml",
            {
                "name": "t",
                "model": model,
                "data": DATA,
                "space": {"learning_rate": {"low": 0.01, "high": 0.1}},
            },
        )
    )
    soda, gcg = sweep.jobs()
    trial = tuning.config({"learning_rate": 0.05})
    assert isinstance(soda.search, SodaConfig) and isinstance(trial, SodaConfig)
    assert soda.search.decay == trial.decay == 0.98
    assert trial.learning_rate == 0.05  # the sampled value over the preset's 0.02
    assert soda.search.learning_rate == 0.02
    assert isinstance(gcg.search, GcgConfig)  # presets hold SODA's knobs; GCG keeps its own
    assert isinstance(soda.objective, Objective)
    assert soda.config()["params"] == soda.search.to_dict()  # hashed as the actor receives it


def test_a_tuning_file_error_names_its_file_and_field(tmp_path):
    path = write(
        tmp_path,
        "t.yaml",
        {
            "name": "t",
            "model": {"id": str(STORIES), "preset": "no-such"},
            "data": DATA,
            "space": {"learning_rate": {"low": 0.01, "high": 0.1}},
        },
    )
    with pytest.raises(ValueError, match=r"t\.yaml: model\.preset: unknown preset 'no-such'"):
        load_tuning(path)


def test_gcg_top_k_is_refused_with_its_new_name(tmp_path):
    """GCG's candidate count no longer shares `top_k` with the objective's observed logits."""
    path = write(
        tmp_path,
        "s.yaml",
        {
            "name": "s",
            "models": [{"id": str(STORIES)}],
            "datasets": [{"name": "random", **DATA}],
            "algorithms": [{"name": "gcg", "params": {"top_k": 16}}],
        },
    )
    with pytest.raises(ValueError, match=r"algorithms\[0\]: gcg parameter 'top_k' is now "):
        load_sweep(path)
    (job,) = load_sweep(
        write(
            tmp_path,
            "t.yaml",
            {
                **yaml.safe_load(path.read_text()),
                "algorithms": [{"name": "gcg", "params": {"tokens_per_position": 16}}],
            },
        )
    ).jobs()
    assert job.search.tokens_per_position == 16


def test_the_old_step_flag_names_the_new_one(capsys):
    from sodaray.cli import main

    sweep = str(PACKAGE.parent / "sweeps" / "quickstart.yaml")
    assert main(["sweep", "plan", sweep, "--steps", "5", "--rate", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--steps is now --max-steps" in err


def test_replica_rows_match_texts_to_results_that_finish_out_of_order(tiny_llama):
    """A trial's results come back in finishing order: each row's true text and PII labels
    are its own sample's, taken at `picked`, not the dataset's order."""
    import sodaray
    from sodaray.experiment.replica import replica_rows
    from sodaray.experiment.spec import ModelSpec

    tokens = [[3], [5, 7], [11]]
    targets = sodaray.make_targets(tiny_llama, tokens)
    targets.sample_ids = [10, 11, 12]
    results = sodaray.invert(tiny_llama, targets, sodaray.SodaConfig(max_steps=2))
    assert [r.sample_id for r in results] == [10, 11, 12]
    rows = {
        "sample_id": [10, 11, 12],
        "text": ["ten", "eleven", "twelve"],
        "pii_labels": [["a"], ["b"], ["c"]],
    }
    finished = results[::-1]  # as if the last sample finished first
    table = replica_rows(
        tiny_llama, ModelSpec(id="tiny"), finished, Objective(), rows, [2, 1, 0], dataset="d"
    )
    out = table.to_pylist()
    assert [r["sample_id"] for r in out] == [12, 11, 10]
    assert [r["true_text"] for r in out] == ["twelve", "eleven", "ten"]
    assert [r["pii_labels"] for r in out] == [["c"], ["b"], ["a"]]
    assert {r["model"] for r in out} == {"tiny"}


def module_graph() -> dict[str, set[str]]:
    """Every import between sodaray's modules, wherever it stands in the file (top level,
    inside a function, under TYPE_CHECKING): a circle hidden in a function is still a circle."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if parts[-1] == "__init__" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + [base]
                    )
                targets.add(base.rstrip("."))
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t.startswith("sodaray") and t != name}
    modules = set(graph)
    # An import of a package's name stands for its __init__; keep only known modules.
    return {m: {t for t in ts if t in modules} for m, ts in graph.items()}


def test_the_package_has_no_import_circle():
    graph = module_graph()
    assert len(graph) > 40 and graph["sodaray.search.soda.batch"]  # the walk saw the package
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    # A package's __init__ re-exporting its own modules is not a circle of the house.
    circles = [
        c for c in circles if not any(a.startswith(b + ".") for a, b in zip(c[1:], c, strict=False))
    ]
    assert circles == []


def test_no_private_api_of_optuna_or_ray_is_used():
    """Public APIs of dependencies only: the tuner once served Optuna's storage over its
    private gRPC module and read `study._storage`."""
    private = ("optuna.storages._", "._storage", "._study_id", "ray._private", "ray._raylet")
    hits = [
        f"{path.relative_to(PACKAGE)}: {needle}"
        for path in PACKAGE.rglob("*.py")
        for needle in private
        if needle in path.read_text()
    ]
    assert hits == []


def _runs(folder: Path, size: int = 6) -> dict[tuple[str, ...], str]:
    """Every run of `size` consecutive code lines in a folder (stripped; blank lines, comments
    and lines of bare punctuation skipped), mapped to where it first stands."""
    runs: dict[tuple[str, ...], str] = {}
    for path in sorted(folder.glob("*.py")):
        lines = [
            (n, line.strip())
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if line.strip() and not line.strip().startswith("#") and any(c.isalnum() for c in line)
        ]
        for i in range(len(lines) - size + 1):
            key = tuple(text for _, text in lines[i : i + size])
            runs.setdefault(key, f"{path.name}:{lines[i][0]}")
    return runs


def test_execution_lives_in_one_place_under_runner_and_tuner():
    """The split copies this layer replaced were the runner and the tuner each carrying its own
    execution: so neither holds a run of six code lines the other holds too, and only
    experiment/ talks to Ray actors. (A cap on the three folders' lines once stood in for this;
    it measured features as well as copies, and the placement, progress and cost features
    outgrew it without a line repeated.)"""
    runner, tuner = _runs(PACKAGE / "runner"), _runs(PACKAGE / "tuner")
    shared = sorted(f"runner/{runner[k]} ~ tuner/{tuner[k]}" for k in runner.keys() & tuner.keys())
    assert shared == []
    for name in ("runner", "tuner"):
        text = "".join(p.read_text() for p in (PACKAGE / name).glob("*.py"))
        assert ".remote(" not in text and "ray.wait(" not in text and "ray.get(" not in text
