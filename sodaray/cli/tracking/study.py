"""A tuning study in MLflow: one parent run for the study (its settings as params; when the run
ends its leaderboard, plots, best preset and tuning file as artifacts) and a child run per trial,
logged as each trial ends, named for its algorithm, sampled values and number, with every
parameter that defines it under the names a sweep's jobs use (`params.*`, `model.*`,
`dataset.*`, `objective.*`), so trials and jobs line up in one table and one chart."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from sodaray.cli.tracking import store
from sodaray.io.files import shown_url

log = logging.getLogger(__name__)

STUDY_TAG = "sodaray.study"
TRIAL_STATES = {"COMPLETE": "FINISHED", "PRUNED": "KILLED"}  # any other: FAILED


def trial_name(spec: Any, trial: Any) -> str:
    """`soda learning_rate=0.0651 temperature=0.1, trial 3`: what the trial tried."""
    values = [
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items()
    ]
    return " ".join([spec.algorithm, *values]) + f", trial {trial.number}"


class StudyTracker:
    """`sodaray tune --mlflow URI` (`args`: tune's options) for the study of `spec`: `trial` is
    an Optuna callback `(study, frozen_trial)`; `finish(run, board)` logs what the study left
    behind; `stop()` marks an interrupted run. Each is guarded: a tracking failure is a
    warning, never the study's end."""

    def __init__(self, spec: Any, args: Any) -> None:
        # Before the tuner's imports: a missing MLflow is the one line.
        store.check_tracking(args.mlflow, args.mlflow_experiment)

        from sodaray.tuner.run import study_folder
        from sodaray.tuner.storage import storage_url

        self.uri, self.experiment = args.mlflow, args.mlflow_experiment
        self.spec = spec.on_model(args.model)  # the spec the study runs
        self.folder = study_folder(args.out, self.spec)
        self.storage = storage_url(self.spec, self.folder, args.storage)
        self.study_name = self.spec.study_name or self.spec.name
        self.overrides = list(args.overrides)
        self.client: Any = None
        self.exp = self.parent = ""
        # The study's identity in MLflow: the same study (name and storage) is the same parent
        # run when resumed; another storage is another study, with its own trial 0.
        where = self.storage if "://" in self.storage else str(Path(self.storage).absolute())
        self.key = store.run_key("study", where, self.study_name)
        self.trial = store.guarded("trial logging", self._trial)
        self.finish = store.guarded("study logging", self._finish)
        self.stop = store.guarded("study logging", self._stop)

    def _params(self, **settings: Any) -> dict[str, str]:
        """`settings` as params, beside what the study and each trial share."""
        spec = self.spec
        shared = {"study": self.study_name, "algorithm": spec.algorithm, "fixed": spec.fixed}
        shared |= {"dataset": dataclasses.asdict(spec.data), "metric": spec.metric}
        return store.flat_params({**shared, **settings, "overrides": self.overrides})

    def _open(self, study: Any = None) -> str:
        """The study's run, found again or made (with its settings) on first use."""
        if self.parent:
            return self.parent
        client, exp = store.open_experiment(self.uri, self.experiment or self.study_name)
        tags = {store.KIND_TAG: "study", STUDY_TAG: self.study_name}
        parent, new = store.find_run(client, exp, self.key, f"study {self.study_name}", tags)
        if not new:  # a resumed study: running again while this run adds its trials
            client.update_run(parent, "RUNNING")
        spec = self.spec  # the study's settings: what every trial shares, its space, and how
        settings = self._params(
            file=str(spec.path),
            model={**spec.model.identity(), "preset": spec.model.preset},
            preset_file=spec.model.preset_file,
            objective=dataclasses.asdict(spec.objective_for({})),
            space={p.name: _space(p) for p in spec.space},
            max_steps=spec.max_steps,
            sampler=spec.sampler,
            pruner=spec.pruner,
            checkpoints=spec.checkpoints,
            seed=spec.seed,
            trials=spec.trials,
            start_from=spec.start_from,
        )
        store.log_params(client, parent, settings)
        note = self.spec.description or f"study {self.study_name} from {self.spec.path}"
        run_tags = {
            store.NOTE_TAG: note,
            "sodaray.storage": shown_url(self.storage),
            "sodaray.folder": self.folder.absolute(),
            "sodaray.overrides": json.dumps(self.overrides),
        }
        if study is not None and "dataset_hash" in study.user_attrs:
            run_tags["sodaray.dataset_hash"] = study.user_attrs["dataset_hash"]
        store.set_tags(client, parent, run_tags)
        self.client, self.exp, self.parent = client, exp, parent
        return parent

    def _trial(self, study: Any, trial: Any) -> None:
        from optuna.trial import TrialState

        from sodaray.tuner.run import trial_file

        parent = self._open(study)
        client, spec = self.client, self.spec
        key, name = store.run_key("trial", self.key, trial.number), trial_name(spec, trial)
        tags = {store.KIND_TAG: "trial", STUDY_TAG: self.study_name}
        tags["sodaray.trial"] = str(trial.number)
        run_id, _ = store.find_run(client, self.exp, key, name, tags, parent)
        params = self._params(  # its whole config and objective, as a sweep's jobs log them
            trial=trial.number,
            model=spec.model.identity(),
            params=spec.config(trial.params).to_dict(),
            objective=dataclasses.asdict(spec.objective_for(trial.params)),
            sampled=trial.params,
        )
        store.log_params(client, run_id, params)
        # `value`: under the file's metric (the `metric` param), as Optuna calls it.
        metrics = [] if trial.value is None else [("value", trial.value, 0)]
        # What each checkpoint reported to the pruner: the exact rate, ties broken as the
        # file's `signal` says (`tuner.values.checkpoint_value`).
        metrics += [("checkpoint", v, s) for s, v in trial.intermediate_values.items()]
        path = trial_file(self.folder, trial.number)
        if path.is_file():
            metrics += self.rows_metrics(path, trial)
        store.log_metrics(client, run_id, metrics)
        store.set_tags(client, run_id, {"state": trial.state.name, **trial.user_attrs})
        client.set_terminated(run_id, TRIAL_STATES.get(trial.state.name, "FAILED"))
        if trial.value is not None:  # the study's history, step = trial number
            complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            best = max((t.value for t in complete), default=trial.value)
            history = [("value", trial.value, trial.number), ("best_value", best, trial.number)]
            store.log_metrics(client, parent, history)

    def rows_metrics(self, path: Path, trial: Any) -> list[store.MetricRow]:
        """Counts, rates and curves from a trial's rows, as a job's. A pruned trial's rows are the
        samples that finished: its rates are of every sample it was given, and its curves end
        where it was stopped."""
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
        found, exact = int(rows["found"].sum()), int(rows["exact"].fillna(False).astype(bool).sum())
        budget = self.spec.max_steps
        if trial.state.name == "PRUNED" and trial.intermediate_values:
            budget = max(trial.intermediate_values)
        counts = store.with_rates({"samples": n, "found": found, "exact": exact}, n)
        curves = store.rows_metrics(rows, budget, 0, n if n != len(rows) else None)
        return [(k, float(v), 0) for k, v in counts.items()] + curves

    def _finish(self, run: Any, board: dict[str, Any]) -> None:
        """The study after this run: its trial counts and best value, and as artifacts the
        leaderboard, the plots, the best preset and the tuning file."""
        parent = self._open()
        client = self.client
        metrics = [(f"trials_{k}", v, 0) for k, v in board.get("states", {}).items()]
        metrics.append(("trials", board.get("trials", 0), 0))
        metrics += [(f"sample_steps_{k}", v, 0) for k, v in board.get("sample_steps", {}).items()]
        store.log_metrics(client, parent, metrics)
        if board.get("top"):
            store.set_tags(client, parent, {"sodaray.best_trial": board["top"][0]["trial"]})
        shown = {**board, "storage": shown_url(str(board.get("storage", "")))}
        store.log_files(client, parent, "leaderboard.json", shown, self.spec.path)
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
