"""A tuning study in MLflow: one parent run for the study (its settings as params; when the run
ends its leaderboard, plots, best preset and tuning file as artifacts) and a child run per trial,
logged as each trial ends, named for its algorithm, sampled values and number, with every
parameter that defines it under the names a sweep's jobs use (`params.*`, `model.*`,
`dataset.*`, `objective.*`), so trials and jobs line up in one table and one chart."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sodaray.cli.tracking.store import (
    KIND_TAG,
    NOTE_TAG,
    check_experiment,
    check_tracking,
    client_for,
    experiment_id,
    find_run,
    flat_params,
    guarded,
    hidden_password,
    log_metrics,
    log_params,
    rows_metrics,
    run_key,
    set_tags,
)

log = logging.getLogger(__name__)

STUDY_TAG = "sodaray.study"
TRIAL_STATES = {"COMPLETE": "FINISHED", "PRUNED": "KILLED"}  # any other: FAILED


def trial_name(algorithm: str, params: dict[str, Any], number: int) -> str:
    """`soda learning_rate=0.0651 temperature=0.1, trial 3`: what the trial tried."""
    values = " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )
    return f"{algorithm} {values}, trial {number}" if values else f"{algorithm}, trial {number}"


class StudyTracker:
    """`sodaray tune --mlflow URI`: `trial` is an Optuna callback `(study, frozen_trial)`;
    `finish(run, board)` logs what the study left behind; `stop()` marks an interrupted run.
    Each is guarded: a tracking failure is a warning, never the study's end."""

    def __init__(
        self,
        uri: str,
        spec: Any,
        *,
        out: str | Path,
        storage: str | None = None,
        model: str | None = None,
        overrides: list[str] | tuple = (),
        experiment: str | None = None,
    ) -> None:
        check_experiment(experiment)
        check_tracking(uri)  # before the tuner's imports: a missing MLflow is the one line

        from sodaray.tuner.run import study_folder
        from sodaray.tuner.storage import storage_url

        self.uri, self.experiment = uri, experiment
        self.spec = spec.on_model(model)  # the spec the study runs
        self.folder = study_folder(out, self.spec)
        self.storage = storage_url(self.spec, self.folder, storage)
        self.study_name = self.spec.study_name or self.spec.name
        self.overrides = list(overrides)
        self.client: Any = None
        self.exp = self.parent = ""
        # The study's identity in MLflow: the same study (name and storage) is the same parent
        # run when resumed; another storage is another study, with its own trial 0.
        where = self.storage if "://" in self.storage else str(Path(self.storage).absolute())
        self.key = run_key("study", where, self.study_name)
        self.trial = guarded("trial logging", self._trial)
        self.finish = guarded("study logging", self._finish)
        self.stop = guarded("study logging", self._stop)

    def study_params(self) -> dict[str, str]:
        """The study's settings: what every trial shares, the space it searches, and how."""
        spec = self.spec
        settings = {
            "study": self.study_name,
            "file": str(spec.path),
            "algorithm": spec.algorithm,
            "model": {**spec.model.identity(), "preset": spec.model.preset},
            "preset_file": spec.model.preset_file,
            "dataset": dataclasses.asdict(spec.data),
            "objective": dataclasses.asdict(spec.objective_for({})),
            "fixed": spec.fixed,
            "space": {p.name: _space(p) for p in spec.space},
            "max_steps": spec.max_steps,
            "metric": spec.metric,
            "sampler": spec.sampler,
            "pruner": spec.pruner,
            "checkpoints": spec.checkpoints,
            "seed": spec.seed,
            "trials": spec.trials,
            "start_from": spec.start_from,
            "overrides": self.overrides,
        }
        return flat_params(settings)

    def trial_params(self, params: dict[str, Any], number: int) -> dict[str, str]:
        """A trial's: the algorithm's whole config (preset, fixed and sampled values, the budget
        `params.max_steps`) and its objective, as a sweep's jobs log them; its sampled and
        fixed values apart; the study, metric and overrides."""
        spec = self.spec
        settings = {
            "study": self.study_name,
            "trial": number,
            "algorithm": spec.algorithm,
            "model": spec.model.identity(),
            "dataset": dataclasses.asdict(spec.data),
            "params": spec.config(params).to_dict(),
            "objective": dataclasses.asdict(spec.objective_for(params)),
            "sampled": params,
            "fixed": spec.fixed,
            "metric": spec.metric,
            "overrides": self.overrides,
        }
        return flat_params(settings)

    def _open(self, study: Any = None) -> str:
        """The study's run, found again or made (with its settings) on first use."""
        if self.parent:
            return self.parent
        client = client_for(self.uri)
        exp = experiment_id(client, self.uri, self.experiment or self.study_name)
        tags = {KIND_TAG: "study", STUDY_TAG: self.study_name}
        parent, new = find_run(client, exp, self.key, f"study {self.study_name}", tags)
        if not new:  # a resumed study: running again while this run adds its trials
            client.update_run(parent, "RUNNING")
        log_params(client, parent, self.study_params())
        note = self.spec.description or f"study {self.study_name} from {self.spec.path}"
        run_tags = {
            NOTE_TAG: note,
            "sodaray.storage": hidden_password(self.storage),
            "sodaray.folder": self.folder.absolute(),
            "sodaray.overrides": json.dumps(self.overrides),
        }
        if study is not None and "dataset_hash" in study.user_attrs:
            run_tags["sodaray.dataset_hash"] = study.user_attrs["dataset_hash"]
        set_tags(client, parent, run_tags)
        self.client, self.exp, self.parent = client, exp, parent
        return parent

    def _trial(self, study: Any, trial: Any) -> None:
        import optuna

        from sodaray.tuner.run import trial_file

        parent = self._open(study)
        client, spec = self.client, self.spec
        tags = {KIND_TAG: "trial", STUDY_TAG: self.study_name, "sodaray.trial": trial.number}
        run_id, _ = find_run(
            client,
            self.exp,
            run_key("trial", self.key, trial.number),
            trial_name(spec.algorithm, trial.params, trial.number),
            {k: str(v) for k, v in tags.items()},
            parent,
        )
        log_params(client, run_id, self.trial_params(trial.params, trial.number))
        # `value`: under the file's metric (the `metric` param), as Optuna calls it.
        metrics = [] if trial.value is None else [("value", trial.value, 0)]
        # What each checkpoint reported to the pruner: the exact rate, ties broken as the
        # file's `signal` says (`tuner.values.checkpoint_value`).
        metrics += [("checkpoint", v, s) for s, v in trial.intermediate_values.items()]
        path = trial_file(self.folder, trial.number)
        if path.is_file():
            metrics += self.rows_metrics(path, trial)
        log_metrics(client, run_id, metrics)
        attrs = {"state": trial.state.name, **trial.user_attrs}
        set_tags(client, run_id, {k: v for k, v in attrs.items()})
        client.set_terminated(run_id, TRIAL_STATES.get(trial.state.name, "FAILED"))
        complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if trial.value is not None:  # the study's history, step = trial number
            best = max((t.value for t in complete), default=trial.value)
            history = [("value", trial.value, trial.number), ("best_value", best, trial.number)]
            log_metrics(client, parent, history)

    def rows_metrics(self, path: Path, trial: Any) -> list[tuple[str, float, int]]:
        """Counts, rates and curves from a trial's rows, as a job's. A pruned trial's rows are
        the samples that finished before it was stopped: its rates are of every sample it was
        given, and its curves end where it was stopped (its rows say nothing of the steps
        after)."""
        from sodaray.results import ResultsError, read_results

        try:
            rows = read_results(path).to_pandas()
        except ResultsError as exc:
            log.warning(
                "trial %d's rows are unreadable (%s); logged without curves", trial.number, exc
            )
            return []
        if not len(rows):
            return []
        n = int(trial.user_attrs.get("samples", len(rows)))
        found = int(rows["found"].sum())
        exact = int(rows["exact"].fillna(False).astype(bool).sum())
        budget = self.spec.max_steps
        if trial.state.name == "PRUNED" and trial.intermediate_values:
            budget = max(trial.intermediate_values)
        counts = {"samples": n, "found": found, "exact": exact}
        counts |= {"found_rate": found / n, "exact_rate": exact / n}
        curves = rows_metrics(rows, budget, 0, n if n != len(rows) else None)
        return [(k, float(v), 0) for k, v in counts.items()] + curves

    def _finish(self, run: Any, board: dict[str, Any]) -> None:
        """The study after this run: its trial counts and best value, and as artifacts the
        leaderboard, the plots, the best preset and the tuning file."""
        parent = self._open()
        client = self.client
        states = board.get("states", {})
        metrics = [(f"trials_{k}", float(v), 0) for k, v in states.items()]
        metrics.append(("trials", float(board.get("trials", 0)), 0))
        steps = board.get("sample_steps", {})
        metrics += [(f"sample_steps_{k}", float(v), 0) for k, v in steps.items()]
        log_metrics(client, parent, metrics)
        if board.get("top"):
            set_tags(client, parent, {"sodaray.best_trial": board["top"][0]["trial"]})
        with tempfile.TemporaryDirectory() as tmp:
            shown = {**board, "storage": hidden_password(str(board.get("storage", "")))}
            Path(tmp, "leaderboard.json").write_text(json.dumps(shown, indent=1, default=str))
            client.log_artifact(parent, str(Path(tmp, "leaderboard.json")))
            if Path(self.spec.path).is_file():
                copy = Path(tmp, Path(self.spec.path).name)
                shutil.copy(self.spec.path, copy)
                client.log_artifact(parent, str(copy), "settings")
        if run.preset_path is not None and Path(run.preset_path).is_file():
            client.log_artifact(parent, str(run.preset_path))
        for plot in run.plots:
            client.log_artifact(parent, str(plot), "plots")
        client.set_terminated(parent, "FINISHED")

    def _stop(self) -> None:
        """Ctrl-C: the study's run marked killed (its finished trials are logged)."""
        if self.parent:
            self.client.set_terminated(self.parent, "KILLED")


def _space(p: Any) -> dict[str, Any]:
    """A parameter's range as given (the fields it has)."""
    fields = dataclasses.asdict(p).items()  # `is`: a bound of 0 equals False
    return {k: v for k, v in fields if k != "name" and v is not None and v is not False}
