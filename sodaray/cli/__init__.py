"""The `sodaray` command. Bad input ends in one line on stderr and exit code 2.

The top floor: `invert`, `data build` and `report` are here; `sweep` (`cli.sweep`), `tune`
(`cli.tune`) and `train-inverter` (`cli.train`) each have a module, above the runner, the tuner
and the inverter they drive, which know nothing of argparse.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from sodaray.io import jsontext

EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


# Options whose empty value is meaningful, so `--x ''` is taken as given: none so far. Every
# other option and positional refuses an empty value: it is what an unset shell variable
# (`--storage "$STORAGE"`) gives, and read as "unset" it silently fell back to a default
# (a cluster study landing in a local journal).
EMPTY_ALLOWED: frozenset[str] = frozenset()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + traceback
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        """Every value given on the command line passes here (defaults do not), in every
        subcommand (each is a `_Parser`): the one place an empty one is refused."""
        if (
            "" in arg_strings
            and not isinstance(action, argparse._SubParsersAction)
            and not EMPTY_ALLOWED.intersection(action.option_strings)
        ):
            name = action.option_strings[-1] if action.option_strings else action.metavar
            self.error(f"{name or action.dest}: empty value (unset variable?)")
        value = super()._get_values(action, arg_strings)
        if type(action) is argparse._StoreAction and action.option_strings:
            # `--max-steps 1 ... --max-steps 3`: argparse keeps the last, silently.
            given = self.__dict__.setdefault("_given", {})
            if action.dest in given and given[action.dest] != value:
                self.error(
                    f"{action.option_strings[-1]} given twice ({given[action.dest]!r}, then "
                    f"{value!r}): give it once"
                )
            given[action.dest] = value
        return value

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._given: dict[str, Any] = {}  # what each option was given in this parse
        return super().parse_known_args(args, namespace)


def _parse_tokens(text: str) -> list[int]:
    from sodaray.config.validation import parse_int_list

    try:
        return parse_int_list(text)  # "1 2" and "1,,2" refused, not guessed at
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _parse_length(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--length takes a positive integer or 'auto', not {text!r}"
        ) from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"--length must be at least 1, not {value}")
    return value


def _parse_param(text: str) -> tuple[str, Any]:
    from sodaray.errors import shown

    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--param takes KEY=VALUE, got {shown(text, 80)!r}")
    from sodaray.config.configfile import override_value

    key, value = text.split("=", 1)
    try:  # YAML 1.2 numbers: 3e-6 is a float, not a string; bounded as an override
        return key.strip(), override_value(text, value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--param {shown(key.strip(), 80)}: {exc}") from exc


def _add_invert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "invert",
        help="recover the input behind a model output",
        description="Recover the exact input that produced a model's output.",
        epilog="Each target's result goes to stdout as it finishes. On a terminal a bar on "
        "stderr counts sample-steps (one search step of one target) out of the most the "
        "targets can take (their whole budget at each length tried; a found target's unused "
        "budget leaves the total), with the rate, the most time left at it, and the targets "
        "finished and found.",
    )
    p.add_argument("--model", required=True, help="hub id, local folder, or .gguf file")
    p.add_argument("--gguf-file", help="GGUF file name inside the --model folder")
    src = p.add_argument_group("what to invert (inputs whose output is observed, or the output)")
    src.add_argument("--prompt", action="append", default=[], help="an input text (repeatable)")
    src.add_argument(
        "--tokens",
        action="append",
        default=[],
        type=_parse_tokens,
        help="an input as token ids, e.g. 1,2,3 (repeatable)",
    )
    src.add_argument(
        "--output-text",
        action="append",
        default=[],
        help="an observed output text (text objective; repeatable)",
    )
    src.add_argument("--logits-file", help="observed logits (.npy or .safetensors)")
    obj = p.add_argument_group("objective")
    obj.add_argument("--objective", choices=["logits", "text"], default=None)
    obj.add_argument("--top-k", type=int, help="observe only the top-k logits")
    obj.add_argument(
        "--space",
        choices=["raw", "centred", "logprobs"],
        default=None,
        help="where logits are compared (loss and match check): raw, centred (minus each "
        "position's mean) or logprobs; a --logits-file holds values of this space",
    )
    obj.add_argument(
        "--confirm",
        choices=["space", "both"],
        default="both",
        help="a match in centred or logprobs space: also held to the raw logits where they are "
        "known, as with --prompt/--tokens (both, default: turns down one space's near-collisions), "
        "or in the space alone; a --logits-file is always checked in its space",
    )
    obj.add_argument(
        "--output-tokens",
        type=int,
        default=None,
        help="observed output positions of --prompt/--tokens (default 1; an observed output "
        "has its own)",
    )
    # None: the preset file's setting, else the objective's default (huber, 0).
    obj.add_argument("--loss", choices=["huber", "mse"], default=None, help="default: huber")
    obj.add_argument("--fluency-weight", type=float, default=None, help="default: 0")
    obj.add_argument(
        "--text-loss",
        choices=["logprob", "prob"],
        default=None,
        help="text objective: log-prob margins (authors' code, default) or Eq. 5's prob margins",
    )
    obj.add_argument(
        "--fluency-form",
        choices=["argmax", "relaxed"],
        default="argmax",
        help="fluency penalty: NLL of the argmax tokens (paper, default) or relaxed cross-entropy",
    )
    obj.add_argument("--atol", type=float, help="match tolerance (default by model size)")
    obj.add_argument("--rtol", type=float, help="match tolerance (default by model size)")
    srch = p.add_argument_group("search")
    srch.add_argument(
        "--algorithm",
        default="soda",
        help="soda (default), gcg, embedding or inverter (--param checkpoint=PATH)",
    )
    srch.add_argument(
        "--length",
        type=_parse_length,
        default=None,
        help="input length N, or 'auto' (default: the true length when known)",
    )
    srch.add_argument(
        "--max-length", type=int, default=None, help="longest length for --length auto (default 10)"
    )
    srch.add_argument("--preset", help="paper preset name, e.g. tinystories-33m")
    srch.add_argument("--preset-file", help="preset YAML (e.g. written by `sodaray tune`)")
    srch.add_argument(
        "--param",
        action="append",
        default=[],
        type=_parse_param,
        help="algorithm parameter KEY=VALUE (repeatable), e.g. temperature=0.03",
    )
    srch.add_argument("--max-steps", type=int, default=None)
    srch.add_argument("--max-batch-size", type=int, default=None)
    srch.add_argument("--seed", type=int, default=None, help="default 0")
    run = p.add_argument_group("model placement")
    run.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    run.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    run.add_argument(
        "--executor",
        choices=["eager", "graph"],
        default=None,
        help="how a SODA step runs: graph (default: on a GPU the whole step captured once per "
        "shape and replayed as a CUDA graph; on a CPU the same as eager) or eager (op by op)",
    )
    run.add_argument(
        "--bos",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="prepend BOS as fixed context (default: as the tokenizer does)",
    )
    run.add_argument("--trust-remote-code", action="store_true")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="one JSON result row per target")
    out.add_argument("--out", help="also write the result rows to this Parquet file")
    out.add_argument(
        "--dataset-label", default="", help="dataset name recorded in result rows (for reports)"
    )
    p.set_defaults(func=cmd_invert)


MAX_LENGTH = 10  # --length auto's longest length when --max-length is not given


def _note(text: str) -> None:
    """A line on stderr saying which of two values given for one setting is used (stdout may
    be JSON; stderr's error lines start `sodaray: error:`, these `sodaray: note:`)."""
    from sodaray.errors import shown

    sys.stderr.write(f"sodaray: note: {shown(text)}\n")


def _given_once(args: argparse.Namespace) -> None:
    """A setting given two ways where one would silently win is refused in one line, or, where
    one overriding the other is the point (a --param over a named preset), a note says which
    is used; a flag the chosen inputs never read is refused by name. Checked before the load."""
    from sodaray.errors import shown

    params: dict[str, Any] = {}
    for key, value in args.param:
        if key in params and params[key] != value:
            raise CliError(
                f"--param {key} given twice ({params[key]!r}, then {value!r}): give it once"
            )
        params[key] = value
    for flag, key in (
        ("--max-steps", "max_steps"),
        ("--max-batch-size", "max_batch_size"),
        ("--seed", "seed"),
    ):
        if getattr(args, key) is not None and key in params:
            raise CliError(f"{flag} and --param {key}=... both given: give {key} once")
    observed = bool(args.output_text or args.logits_file)
    if observed and args.output_tokens is not None:
        raise CliError(
            "--output-tokens counts the observed positions of --prompt/--tokens; an observed "
            "output (--output-text, --logits-file) has its own: leave it out"
        )
    if args.output_text and args.objective == "logits":
        raise CliError("--output-text observes text: use --objective text, not logits")
    if args.logits_file and args.objective == "text":
        raise CliError("--logits-file observes logits: use --objective logits, not text")
    kind = args.objective or ("text" if args.output_text else "logits")
    if args.text_loss is not None and kind != "text":
        raise CliError("--text-loss is for the text objective (--objective text); leave it out")
    auto = args.length == "auto" or (args.length is None and observed)
    if args.max_length is not None and not auto:
        raise CliError(
            "--max-length bounds --length auto; with a fixed length (given, or the inputs' "
            "own) it is never read: leave it out or give --length auto"
        )
    if args.gguf_file is not None and args.model.endswith(".gguf"):
        raise CliError(
            f"--model {args.model} is a GGUF file and --gguf-file names another: give "
            "--model FILE.gguf, or --model FOLDER --gguf-file FILE.gguf"
        )
    if args.preset and args.preset_file:
        raise CliError(
            "--preset and --preset-file both given (the file's values would silently win): give one"
        )
    if not args.dataset_label.isprintable():  # a label in tables and figures: one line
        raise CliError(
            f"--dataset-label {shown(args.dataset_label, 80)!r}: not a printable name (a line "
            "break or control character)"
        )
    if (args.preset or args.preset_file) and args.algorithm == "soda":
        from sodaray.config.presets import get_preset, load_preset_file

        preset = dict(get_preset(args.preset).soda) if args.preset else {}
        if args.preset_file:
            from sodaray.experiment.spec import check_preset_params

            preset.update(load_preset_file(args.preset_file))
            check_preset_params(preset, args.preset_file)
        for key, value in sorted(params.items()):
            if key in preset and preset[key] != value:
                _note(f"{key}: --param's {value!r} is used, not the preset's {preset[key]!r}")


def _algorithm_config(args: argparse.Namespace, defaults: Any = None):
    """The algorithm's config from the flags: the named preset, or with none the model's family
    defaults (`defaults`, a `sodaray.config.families.Defaults`; None before the model is loaded, to
    check the flags' own values), then --param, --max-steps, --max-batch-size and --seed."""
    from sodaray.api import make_config
    from sodaray.config.families import starting_params

    if (args.preset or args.preset_file) and args.algorithm != "soda":
        raise CliError("--preset holds SODA parameters; use it with --algorithm soda")
    base = starting_params(args.algorithm, defaults, args.preset, args.preset_file)
    params = {**base, **dict(args.param)}
    if args.max_steps is not None:
        params["max_steps"] = args.max_steps
    if args.max_batch_size is not None:
        params["max_batch_size"] = args.max_batch_size
    params["seed"] = args.seed if args.seed is not None else params.get("seed", 0)
    return make_config(args.algorithm, params, source="parameters")


def _objective(args: argparse.Namespace, kind: str, top_k: int | None, defaults: Any = None):
    """The objective from the flags over the preset file's comparison settings (`objective:
    {space: centred}`), or with no preset the model's family's (`defaults`)."""
    from sodaray.config.families import starting_objective
    from sodaray.config.validation import make_objective

    settings = starting_objective({"kind": kind, "top_k": top_k}, defaults, args.preset_file)
    given = {"space": args.space, "loss": args.loss, "fluency_weight": args.fluency_weight}
    settings.update({k: v for k, v in given.items() if v is not None})
    return make_objective(
        dict(
            kind=kind,
            top_k=args.top_k,
            **settings,
            output_tokens=1 if args.output_tokens is None else args.output_tokens,
            text_loss=args.text_loss or "logprob",
            fluency_form=args.fluency_form,
            confirm=args.confirm,
            atol=args.atol,
            rtol=args.rtol,
        )
    )


def _family_defaults(args: argparse.Namespace, model: Any) -> Any:
    """The model's family defaults when no preset is named (None when one is), by its loaded
    config's `model_type` (`sodaray.config.families`, the rule sweeps and tuning use too)."""
    if args.preset or args.preset_file:
        return None
    from sodaray.config.families import defaults_for

    return defaults_for(getattr(getattr(model.model, "config", None), "model_type", None))


def cmd_invert(args: argparse.Namespace) -> int:
    from sodaray.api import invert
    from sodaray.model.load import load_model
    from sodaray.objective.objectives import Objective
    from sodaray.objective.targets import (
        make_targets,
        read_logits_file,
        targets_from_logits,
        targets_from_text,
    )

    sources = sum(
        [bool(args.prompt or args.tokens), bool(args.output_text), bool(args.logits_file)]
    )
    if sources != 1:
        raise CliError(
            "give inputs (--prompt/--tokens) or one observed output "
            "(--output-text or --logits-file), not both and not neither"
        )
    if any(not p for p in args.prompt):
        raise CliError("--prompt is empty")
    if args.top_k is not None and args.top_k < 1:
        raise CliError(f"--top-k must be at least 1, not {args.top_k}")
    _given_once(args)
    config = _algorithm_config(args)  # validate before the (slow) model load
    from sodaray.config.validation import check_context, check_device, check_output_file

    if args.device:
        check_device(args.device)
    if args.out is not None:
        check_output_file(args.out)
    from sodaray.io.files import check_model_files, regular_file

    check_model_files(os.path.expanduser(args.model), args.gguf_file)  # a FIFO, no weights
    if args.logits_file:
        regular_file(args.logits_file, "logits file")  # a directory, /dev/zero: said so
    kind = args.objective or ("text" if args.output_text else "logits")
    observed = None  # a logits file, read before the load: its top-k decides the objective too
    top_k = args.top_k
    if args.logits_file:
        observed = read_logits_file(args.logits_file)
        if observed[1] is not None:
            top_k = int(observed[1].shape[-1])
            if args.top_k is not None and args.top_k != top_k:
                raise CliError(
                    f"--top-k {args.top_k}, but {args.logits_file} holds the top {top_k} logits "
                    "of each position: leave out --top-k"
                )
    objective: Objective = _objective(args, kind, top_k)
    logging.info("loading %s", args.model)
    model = load_model(
        args.model,
        gguf_file=args.gguf_file,
        device=args.device,
        dtype=args.dtype,
        bos=args.bos,
        trust_remote_code=args.trust_remote_code,
    )
    defaults = _family_defaults(args, model)
    if defaults is not None:
        config = _algorithm_config(args, defaults)
        objective = _objective(args, kind, top_k, defaults)
    length = args.length
    if args.prompt or args.tokens:
        texts_tokens = [model.encode(p) for p in args.prompt] + list(args.tokens)
        longest = max(len(t) for t in texts_tokens)  # the greedy continuation must fit too
        check_context(
            model,
            length if isinstance(length, int) else longest,
            1 if args.output_tokens is None else args.output_tokens,
        )
        targets = make_targets(model, texts_tokens, objective=objective)
    elif args.output_text:
        if kind != "text":
            raise CliError("--output-text observes text: use --objective text")
        targets = targets_from_text(model, args.output_text, objective=objective)
        length = length or "auto"
    else:
        values, indices = observed
        try:
            targets = targets_from_logits(model, values, indices, objective=objective)
        except ValueError as exc:  # its shape or values: the file is what is wrong
            from sodaray.errors import first_line

            raise CliError(f"{args.logits_file}: {first_line(exc)}") from exc
        length = length or "auto"

    max_length = MAX_LENGTH if args.max_length is None else args.max_length
    from sodaray.results import RunContext, result_rows

    context = RunContext.for_model(
        model,
        objective,
        dataset=args.dataset_label,
        length_mode="auto" if length == "auto" else "fixed",
    )
    bar = None
    if sys.stderr.isatty():
        from sodaray.cli.progress import InvertProgress
        from sodaray.costs.flops import most_sample_steps

        per_target = most_sample_steps(1, config, length, max_length)
        bar = InvertProgress(len(targets), per_target, config.stepwise)
    done: dict[int, Any] = {}  # sample id -> its result row (a one-row table)
    chosen = None if defaults is None else defaults.to_dict()

    def show(res) -> None:
        """Print a target's result as soon as it finishes: a run cut short (Ctrl-C, a time
        limit) keeps every result found before."""
        table = result_rows([res], context)
        done[res.sample_id] = table
        line = _result_line(res, table.to_pylist()[0], args.json, chosen)
        if bar is not None:
            bar.write(line)
            bar.result(res)
        else:
            print(line, flush=True)

    # Ctrl-C stops at the end of the step it comes in (`on_batch`), not inside it: raised in
    # the middle of a step, it can land in a callback from C (the denormal flush's OpenMP
    # callbacks), where ctypes prints a traceback and drops it, and the run would go on. A
    # second Ctrl-C stops at once.
    asked: list[int] = []

    def on_interrupt(signum: int, frame: Any) -> None:
        asked.append(signum)
        if len(asked) > 1:
            raise KeyboardInterrupt

    def again(active: int) -> None:
        if asked:
            raise KeyboardInterrupt
        if bar is not None:
            bar.step(active)

    if defaults is not None:
        # Which defaults and why: a line on stdout before the results (stderr is for errors,
        # one line each), in each JSON row's `defaults` with --json, and in the log.
        family = defaults.family
        note = defaults.why()
        if family is not None and family.bos_advice and not model.prefix_ids:
            note += f"; no BOS before the input: {family.bos_advice}"
        logging.info("defaults: %s", note)
        if not args.json:
            print(f"defaults: {note}", flush=True)
    from sodaray.experiment import stops

    interrupted = False
    try:
        with stops.handled(on_interrupt):  # SIGINT, SIGTERM and SIGHUP alike; main thread only
            invert(
                model,
                targets,
                config,
                length=length,
                max_length=max_length,
                on_result=show,
                on_batch=again,
                executor=args.executor,
            )
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    if args.out is not None and done:  # after printing: a failed write must not lose them
        import pyarrow as pa

        from sodaray.results import write_table_atomic

        order = [i for i in targets.sample_ids if i in done]
        table = pa.concat_tables([done[i] for i in order])
        try:
            write_table_atomic(table, args.out)
        except OSError as exc:
            raise CliError(f"cannot write {args.out}: {exc.strerror or exc}") from exc
        logging.info("wrote %d result rows to %s", len(table), args.out)
    if interrupted:
        kept = f"; their rows are in {args.out}" if args.out is not None and done else ""
        print(f"interrupted: {len(done)} of {len(targets)} targets finished{kept}", file=sys.stderr)
        return stops.exit_code()  # 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP
    return 0


def _result_line(
    res: Any, row: dict[str, Any], as_json: bool, defaults: dict[str, Any] | None = None
) -> str:
    """One result as `invert` prints it: the result schema's row as JSON (its JSON columns
    decoded; `defaults`: the family defaults used, null when a preset was named), or a line
    for people."""
    if as_json:
        row["defaults"] = defaults
        row["params"] = json.loads(row["params"])
        row["versions"] = json.loads(row["versions"])
        row["finished_at"] = row["finished_at"].isoformat()  # as JSON, with its UTC offset
        return jsontext.dumps(row, default=str)  # a diverged loss: null, not NaN
    status = "FOUND" if res.found else "not found"
    exact = "" if res.exact is None else (" exact" if res.exact else " (differs from true)")
    return (
        f"[{res.sample_id}] {status}{exact} after {res.steps} steps "
        f"({res.seconds:.1f}s): tokens={res.tokens} text={res.text!r}"
    )


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="regenerate the paper's tables and figures from result files",
        description="Tables (Markdown, LaTeX, CSV) and figures (PNG) from result Parquet files "
        "or folders; each table is generated wherever its rows are present.",
    )
    p.add_argument("results", nargs="+", help="result Parquet files or folders of them")
    p.add_argument("--out", default="report", help="output folder (default: ./report)")
    p.add_argument("--format", default="md,latex,csv", help="comma-separated: md, latex, csv")
    p.add_argument(
        "--embedding-model",
        help="sentence-embedding model folder for Cos. Sim. (default: all-MiniLM-L6-v2 from "
        "the local Hugging Face cache, skipped when absent)",
    )
    p.add_argument("--no-figures", action="store_true", help="tables only")
    p.add_argument(
        "--extrapolate",
        type=int,
        metavar="STEPS",
        help="also the budget tables and figure: exact against the step budget per model and "
        "length (Wilson intervals), extrapolated to STEPS (e.g. 100000, the paper's) by four "
        "fits with bootstrap intervals (seconds per group)",
    )
    p.add_argument("--json", action="store_true", help="what was written, as one JSON object")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from sodaray.config.validation import check_output_dir, split_list
    from sodaray.report import build_report

    if not args.format.replace(",", "").strip():
        raise CliError(f"--format names no format ({args.format!r}); give md, latex and/or csv")
    formats = split_list(args.format, "--format", "md,csv")  # `md,,csv` as --tokens 1,,2
    check_output_dir(args.out)
    model = args.embedding_model
    if model is not None and model.startswith(("/", ".", "~")):
        from sodaray.io.files import what_is

        kind = what_is(Path(model).expanduser())
        if kind is None:
            raise CliError(f"--embedding-model {model}: no such model folder")
        if kind != "a directory":
            raise CliError(f"--embedding-model {model} is {kind}, not a model folder")
    report = build_report(
        args.results,
        args.out,
        formats=formats,
        embedding_model=args.embedding_model,
        figures=not args.no_figures,
        extrapolate=args.extrapolate,
    )
    if args.json:
        summary = {
            "rows": report.rows,
            "tables": [t.name for t in report.tables],
            "files": [str(f) for f in report.files],
            "skipped": {s.name: s.reason for s in report.skipped},
            "notes": list(report.notes),
            "captions": dict(report.captions),
        }
        print(jsontext.dumps(summary))
        return 0
    print(f"{report.rows} result rows -> {len(report.tables)} tables in {args.out}")
    for path in report.files:
        print(f"  {path}")
    for skipped in report.skipped:
        print(f"  skipped {skipped.name}: {skipped.reason}")
    for note in report.notes:
        print(f"  note: {note}")
    return 0


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "data",
        help="build evaluation datasets",
        description="Evaluation datasets of token sequences for one model's tokenizer.",
    )
    data_sub = p.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    b = data_sub.add_parser(
        "build",
        help="build a dataset as Parquet",
        description="Build a dataset of token sequences (random, nl-id, nl-ood or privacy) for "
        "a model's tokenizer; only the tokenizer and config are loaded, never the weights. "
        "Seed 1 is the test set, seed 0 the validation set used for tuning.",
    )
    b.add_argument("--model", required=True, help="hub id, local folder, or .gguf file")
    b.add_argument("--gguf-file", help="GGUF file name inside the --model folder")
    b.add_argument("--dataset", required=True, help="random, nl-id, nl-ood or privacy")
    b.add_argument("--lengths", help="token lengths: A-B, N or 1,3,5 (default 1-10; privacy 15-24)")
    b.add_argument("--per-length", type=int, help="samples per length (default 1000; privacy 500)")
    b.add_argument("--seed", type=int, default=1, help="1: test set (default), 0: validation")
    b.add_argument(
        "--source",
        help="hf (the Hugging Face hub, default), synthetic (privacy), or a local "
        "JSONL/CSV/text file",
    )
    b.add_argument(
        "--vocab",
        choices=["tokenizer", "model"],
        default=None,
        help="random ids over len(tokenizer) (default, as the authors) or the config's padded "
        "vocab_size",
    )
    b.add_argument(
        "--records",
        choices=["whole", "prefix"],
        default=None,
        help="privacy: records whose whole text has the length (default, as the authors) or "
        "prefixes of longer records",
    )
    b.add_argument("--out", required=True, help="output Parquet file")
    b.add_argument("--json", action="store_true", help="what was written, as one JSON object")
    b.set_defaults(func=cmd_data_build)


def cmd_data_build(args: argparse.Namespace) -> int:
    from sodaray.data.build import build_dataset, parse_lengths
    from sodaray.data.store import dataset_hash, dataset_metadata, write_dataset

    lengths = parse_lengths(args.lengths) if args.lengths is not None else None
    if args.per_length is not None and args.per_length < 1:
        raise CliError(f"--per-length must be at least 1, not {args.per_length}")
    from sodaray.data.build import DATASETS

    # Flags only one kind of dataset reads, refused by name where another would ignore them
    # (an unknown dataset is refused as such by the build).
    if args.vocab is not None and args.dataset in DATASETS and args.dataset != "random":
        raise CliError(
            f"--vocab is for the random dataset (ids drawn at random), not {args.dataset}"
        )
    if args.records is not None and args.dataset in DATASETS and args.dataset != "privacy":
        raise CliError(f"--records is for the privacy dataset, not {args.dataset}")
    if not 0 <= args.seed < 2**63:  # as a sweep's seeds: numpy's generators take no more
        raise CliError(f"--seed must be in [0, 2**63), not {args.seed}")
    if not args.out.endswith(".parquet"):
        raise CliError(f"--out names a Parquet file ending in .parquet, not {args.out!r}")
    from sodaray.config.validation import check_output_file

    check_output_file(args.out)
    table = build_dataset(
        args.model,
        args.dataset,
        lengths=lengths,
        per_length=args.per_length,
        seed=args.seed,
        source=args.source,
        gguf_file=args.gguf_file,
        vocab=args.vocab or "tokenizer",
        records=args.records or "whole",
    )
    path = write_dataset(table, args.out)
    # Where the rows came from, as the file's metadata records it: a privacy build that could
    # not reach the hub is Faker text, not ai4privacy's records, and its numbers are not the
    # paper's; a caller reading only the JSON must see that.
    info = dataset_metadata(table)["info"]
    fallback = info.get("fallback")
    if args.json:
        lengths = table.column("length").to_pylist()
        counts = {str(n): lengths.count(n) for n in sorted(set(lengths))}
        print(
            jsontext.dumps(
                {
                    "path": str(path),
                    "rows": len(table),
                    "by_length": counts,
                    "sha256": dataset_hash(table),
                    "source": info.get("source"),
                    "fallback": fallback,  # None, or what was used instead of --source
                    "documents_reused": info.get("documents_reused", 0),
                }
            )
        )
        return 0
    print(f"wrote {path}: {len(table)} rows, sha256 {dataset_hash(table)}")
    print(f"  source: {info.get('source')}")
    if fallback:
        print(f"  fallback: {fallback} (the source asked for could not be read; see the warning)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sodaray", description="Search-based language-model inversion.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    from sodaray import __version__  # cheap: the package imports its heavy modules lazily

    parser.add_argument("--version", action="version", version=f"sodaray {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_invert(sub)
    _add_report(sub)
    from sodaray.cli.sweep import add_sweep_parser

    add_sweep_parser(sub)
    from sodaray.cli.tune import add_tune_parser

    add_tune_parser(sub)
    _add_data(sub)
    from sodaray.cli.train import add_train_parser

    add_train_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from sodaray.experiment import stops

    # Before anything imports Ray: no native SIGTERM handler (a stack dump, no cleanup) in
    # this driver; the stop rule below answers SIGTERM.
    os.environ.setdefault(stops.NO_NATIVE_HANDLER, "1")

    try:
        # SIGTERM and SIGHUP stop a command as Ctrl-C does, from before the parse on: one
        # "interrupted" line, what finished kept, Ray shut down; exit 128 + the signal's number.
        with stops.handled():
            code = _command(argv)
    except KeyboardInterrupt:
        sys.stderr.write("sodaray: interrupted\n")
        return stops.exit_code()
    except Exception:
        if stops.last_signal() is None:
            raise
        # The stop came as an error (a KeyboardInterrupt inside a lazy import is raised as an
        # ImportError): a stop all the same, not a traceback.
        sys.stderr.write("sodaray: interrupted\n")
        return stops.exit_code()
    if stops.last_signal() is not None and code != stops.exit_code():
        # A stop some layer swallowed (turned into an error it noted and went past): the
        # command did not do all it was asked, and says so as a stopped one.
        sys.stderr.write("sodaray: interrupted\n")
        return stops.exit_code()
    return code


def _command(argv: list[str] | None) -> int:
    """The command `argv` names, run: its exit code, or one line and 2 for bad input."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    # KEY=VALUE overrides may come after options (`sweep run F --out o max_steps=5`), where a
    # plain parse stops taking positionals; an unknown option is argparse's error.
    if rest and hasattr(args, "overrides") and all(_is_override(a) for a in rest):
        args.overrides = [*args.overrides, *rest]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        _quiet_libraries()
    try:
        return int(args.func(args) or 0)
    except _edge_errors() as exc:
        from sodaray.errors import first_line

        sys.stderr.write(f"sodaray: error: {first_line(exc)}\n")
        return EXIT_USAGE


def _is_override(arg: str) -> bool:
    return not arg.startswith("-")  # checked as KEY=VALUE where it is applied


def _edge_errors() -> tuple[type[BaseException], ...]:
    """Errors that are the user's input or environment, by kind: bad values, files that cannot
    be read or written (a read-only folder, a full disk), numbers too large, bad YAML, corrupt
    weight files, storage URLs and Ray connections. Only modules already loaded are consulted."""
    kinds: list[type[BaseException]] = [CliError, ValueError, OSError, OverflowError]
    found = {
        "yaml": "YAMLError",
        "safetensors": "SafetensorError",
        "sqlalchemy.exc": "SQLAlchemyError",
        "optuna.exceptions": "OptunaError",
    }
    for module, name in found.items():
        kind = getattr(sys.modules.get(module), name, None)
        if isinstance(kind, type) and issubclass(kind, BaseException):
            kinds.append(kind)
    return tuple(kinds)


def _quiet_libraries() -> None:
    import os
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")  # read at import: no retry chatter
    warnings.filterwarnings("ignore")
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
