"""`sodaray invert`: its options, what they ask for (their checks before the model loads, the
algorithm's config, the objective and the targets), and the run that prints each target's result
as it ends."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from sodaray.cli import CliError
from sodaray.errors import first_line, shown
from sodaray.io import jsontext

MAX_LENGTH = 10  # --length auto's longest length when --max-length is not given
FLAG_PARAMS = ("max_steps", "max_batch_size", "seed")  # algorithm parameters with their own flag


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
    """`--param KEY=VALUE` as (key, value), the value read as an override of a file's field."""
    from sodaray.config.configfile import override_value

    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--param takes KEY=VALUE, got {shown(text, 80)!r}")
    key, value = text.split("=", 1)
    try:  # YAML 1.2 numbers: 3e-6 is a float, not a string; bounded as an override
        return key.strip(), override_value(text, value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--param {shown(key.strip(), 80)}: {exc}") from exc


def add_parser(sub: argparse._SubParsersAction) -> None:
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
    obj.add_argument("--objective", choices=["logits", "text"])
    obj.add_argument("--top-k", type=int, help="observe only the top-k logits")
    obj.add_argument(
        "--space",
        choices=["raw", "centred", "logprobs"],
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
        help="observed output positions of --prompt/--tokens (default 1; an observed output "
        "has its own)",
    )
    # None: the preset file's setting, else the objective's default (huber, 0).
    obj.add_argument("--loss", choices=["huber", "mse"], help="default: huber")
    obj.add_argument("--fluency-weight", type=float, help="default: 0")
    obj.add_argument(
        "--text-loss",
        choices=["logprob", "prob"],
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
        help="input length N, or 'auto' (default: the true length when known)",
    )
    srch.add_argument(
        "--max-length", type=int, help="longest length for --length auto (default 10)"
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
    srch.add_argument("--max-steps", type=int)
    srch.add_argument("--max-batch-size", type=int)
    srch.add_argument("--seed", type=int, help="default 0")
    _add_run_options(p)
    p.set_defaults(func=cmd_invert)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """The model placement and output groups of `invert`."""
    run = p.add_argument_group("model placement")
    run.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    run.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    run.add_argument(
        "--executor",
        choices=["eager", "graph"],
        help="how a SODA step runs: graph (default: on a GPU the whole step captured once per "
        "shape and replayed as a CUDA graph; on a CPU the same as eager) or eager (op by op)",
    )
    run.add_argument(
        "--bos",
        action=argparse.BooleanOptionalAction,
        help="prepend BOS as fixed context (default: as the tokenizer does)",
    )
    run.add_argument("--trust-remote-code", action="store_true")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="one JSON result row per target")
    out.add_argument("--out", help="also write the result rows to this Parquet file")
    out.add_argument(
        "--dataset-label", default="", help="dataset name recorded in result rows (for reports)"
    )


def _search(search: Any, show: Any, bar: Any) -> bool:
    """`search(on_result=show, on_batch=...)`, `bar` (or None) moved and closed; True when a stop
    signal cut it short. A stop (SIGINT, SIGTERM or SIGHUP) ends the run at the end of its step,
    not inside it: raised mid-step, it can land in a callback from C (the denormal flush's OpenMP
    callbacks), where ctypes prints a traceback and drops it, and the run would go on. A second
    stop ends it at once."""
    from sodaray.experiment import stops

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

    try:
        with stops.handled(on_interrupt):  # main thread only
            search(on_result=show, on_batch=again)
    except KeyboardInterrupt:
        return True
    finally:
        if bar is not None:
            bar.close()
    return False


def cmd_invert(args: argparse.Namespace) -> int:
    from functools import partial

    import pyarrow as pa

    from sodaray.api import invert
    from sodaray.config.families import defaults_for
    from sodaray.experiment import stops
    from sodaray.model.load import load_model
    from sodaray.objective.targets import read_logits_file
    from sodaray.results import RunContext, result_rows, write_table_atomic

    check_flags(args)
    config = config_from_flags(args)  # validate before the (slow) model load
    check_places(args)
    kind = args.objective or ("text" if args.output_text else "logits")
    # The logits file's (values, indices), before the load: a file of top-k logits decides the
    # top-k observed, and so the objective.
    observed = read_logits_file(args.logits_file) if args.logits_file else None
    top_k = args.top_k
    if observed is not None and observed[1] is not None:
        top_k = int(observed[1].shape[-1])
        if args.top_k is not None and args.top_k != top_k:
            raise CliError(
                f"--top-k {args.top_k}, but {args.logits_file} holds the top {top_k} logits "
                "of each position: leave out --top-k"
            )
    objective = objective_from_flags(args, kind, top_k)
    logging.info("loading %s", args.model)
    model = load_model(
        args.model,
        gguf_file=args.gguf_file,
        device=args.device,
        dtype=args.dtype,
        bos=args.bos,
        trust_remote_code=args.trust_remote_code,
    )
    defaults = None
    if not (args.preset or args.preset_file):  # the family's, by the config's `model_type`
        defaults = defaults_for(getattr(getattr(model.model, "config", None), "model_type", None))
        config = config_from_flags(args, defaults)
        objective = objective_from_flags(args, kind, top_k, defaults)
    targets, length = targets_from_flags(args, model, objective, observed)
    max_length = MAX_LENGTH if args.max_length is None else args.max_length
    mode = "auto" if length == "auto" else "fixed"
    context = RunContext.for_model(model, objective, dataset=args.dataset_label, length_mode=mode)
    bar = None
    if sys.stderr.isatty():  # the sample-steps bar
        from sodaray.cli.progress import InvertProgress
        from sodaray.costs.flops import most_sample_steps

        per_target = most_sample_steps(1, config, length, max_length)
        bar = InvertProgress(len(targets), per_target, config.stepwise)
    chosen = None if defaults is None else defaults.to_dict()
    if defaults is not None:  # which and why: on stdout before the results, in --json's rows
        note = defaults.why()
        if defaults.family is not None and defaults.family.bos_advice and not model.prefix_ids:
            note += f"; no BOS before the input: {defaults.family.bos_advice}"
        logging.info("defaults: %s", note)
        if not args.json:
            print(f"defaults: {note}", flush=True)
    rows: dict[int, Any] = {}  # each target's result row (a one-row table) by sample id

    def show(res: Any) -> None:  # as soon as it ends: a run cut short keeps what it found
        rows[res.sample_id] = table = result_rows([res], context)
        line = _result_line(res, table.to_pylist()[0], args.json, chosen)
        if bar is None:
            print(line, flush=True)
        else:
            bar.write(line)
            bar.result(res)

    search = partial(
        invert, model, targets, config, length=length, max_length=max_length, executor=args.executor
    )
    interrupted = _search(search, show, bar)
    if args.out is not None and rows:  # after printing: a failed write must not lose them
        table = pa.concat_tables([rows[i] for i in targets.sample_ids if i in rows])
        try:
            write_table_atomic(table, args.out)
        except OSError as exc:
            raise CliError(f"cannot write {args.out}: {exc.strerror or exc}") from exc
        logging.info("wrote %d result rows to %s", len(table), args.out)
    if interrupted:
        done = len(rows)
        kept = f"; their rows are in {args.out}" if args.out is not None and done else ""
        print(f"interrupted: {done} of {len(targets)} targets finished{kept}", file=sys.stderr)
        return stops.exit_code()  # 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP
    return 0


def _result_line(res: Any, row: dict[str, Any], as_json: bool, defaults: dict | None) -> str:
    """One result as `invert` prints it: the result row as JSON (its JSON columns decoded, and
    `defaults`: the family defaults used, null under a preset), or a line for people."""
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


def check_flags(args: argparse.Namespace) -> None:
    """The flags, checked before the load: inputs or one observed output; a setting given two
    ways is refused, or where one over the other is the point (a --param over a named preset)
    noted; a flag the chosen inputs never read is refused by name."""
    observed = bool(args.output_text or args.logits_file)
    if bool(args.prompt or args.tokens) + bool(args.output_text) + bool(args.logits_file) != 1:
        raise CliError(
            "give inputs (--prompt/--tokens) or one observed output "
            "(--output-text or --logits-file), not both and not neither"
        )
    if any(not p for p in args.prompt):
        raise CliError("--prompt is empty")
    if args.top_k is not None and args.top_k < 1:
        raise CliError(f"--top-k must be at least 1, not {args.top_k}")
    params: dict[str, Any] = {}  # --param's, each given once and not also as its own flag
    for key, value in args.param:
        if key in params and params[key] != value:
            raise CliError(
                f"--param {key} given twice ({params[key]!r}, then {value!r}): give it once"
            )
        params[key] = value
    for key in FLAG_PARAMS:
        if getattr(args, key) is not None and key in params:
            flag = "--" + key.replace("_", "-")
            raise CliError(f"{flag} and --param {key}=... both given: give {key} once")
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
        _note_overrides(args, params)


def _note_overrides(args: argparse.Namespace, params: dict[str, Any]) -> None:
    """A line on stderr for each --param that overrides the named preset's value (stdout may
    be JSON; stderr's error lines start `sodaray: error:`, these `sodaray: note:`)."""
    from sodaray.config.presets import preset_params

    preset = preset_params("soda", args.preset, args.preset_file)  # the file's over the name's
    if args.preset_file:
        from sodaray.experiment.spec import check_preset_params

        check_preset_params(preset, args.preset_file)
    for key, value in sorted(params.items()):
        if key in preset and preset[key] != value:
            note = f"{key}: --param's {value!r} is used, not the preset's {preset[key]!r}"
            sys.stderr.write(f"sodaray: note: {shown(note)}\n")


def check_places(args: argparse.Namespace) -> None:
    """The device, the output file, the model's files and the logits file, before the load."""
    from sodaray.config.capacity import check_device
    from sodaray.config.validation import check_output_file
    from sodaray.io.files import check_model_files, regular_file

    if args.device:
        check_device(args.device)
    if args.out is not None:
        check_output_file(args.out)
    check_model_files(os.path.expanduser(args.model), args.gguf_file)  # a FIFO, no weights
    if args.logits_file:
        regular_file(args.logits_file, "logits file")  # a directory, /dev/zero: said so


def config_from_flags(args: argparse.Namespace, defaults: Any = None):
    """The algorithm's config: the named preset, or with none the family `defaults` (None before
    the model loads, to check the flags' own values), then --param and the parameters' flags."""
    from sodaray.api import make_config
    from sodaray.config.families import starting_params

    if (args.preset or args.preset_file) and args.algorithm != "soda":
        raise CliError("--preset holds SODA parameters; use it with --algorithm soda")
    base = starting_params(args.algorithm, defaults, args.preset, args.preset_file)
    flags = {key: getattr(args, key) for key in FLAG_PARAMS}
    params = {**base, **dict(args.param), **{k: v for k, v in flags.items() if v is not None}}
    params.setdefault("seed", 0)
    return make_config(args.algorithm, params, source="parameters")


def objective_from_flags(
    args: argparse.Namespace, kind: str, top_k: int | None, defaults: Any = None
):
    """The objective from the flags over the preset file's comparison settings (`objective:
    {space: centred}`), or with no preset the model's family's (`defaults`)."""
    from sodaray.config.families import starting_objective
    from sodaray.config.validation import make_objective

    settings = starting_objective({"kind": kind, "top_k": top_k}, defaults, args.preset_file)
    given = {"space": args.space, "loss": args.loss, "fluency_weight": args.fluency_weight}
    settings.update({k: v for k, v in given.items() if v is not None})
    return make_objective(
        {
            "kind": kind,
            "top_k": args.top_k,
            **settings,
            "output_tokens": 1 if args.output_tokens is None else args.output_tokens,
            "text_loss": args.text_loss or "logprob",
            "fluency_form": args.fluency_form,
            "confirm": args.confirm,
            "atol": args.atol,
            "rtol": args.rtol,
        }
    )


def targets_from_flags(args: argparse.Namespace, model: Any, objective: Any, observed: Any):
    """The targets the inputs or the observed output make, and the length to search: an
    observed output's is unknown, so `auto` unless given."""
    from sodaray.config.capacity import check_context
    from sodaray.objective.targets import make_targets, targets_from_logits, targets_from_text

    length = args.length
    if args.prompt or args.tokens:
        texts_tokens = [model.encode(p) for p in args.prompt] + list(args.tokens)
        # The greedy continuation must fit too.
        longest = length if isinstance(length, int) else max(len(t) for t in texts_tokens)
        check_context(model, longest, objective.output_tokens)
        return make_targets(model, texts_tokens, objective=objective), length
    if args.output_text:  # `check_flags` refused --objective logits
        return targets_from_text(model, args.output_text, objective=objective), length or "auto"
    values, indices = observed
    try:
        targets = targets_from_logits(model, values, indices, objective=objective)
    except ValueError as exc:  # its shape or values: the file is what is wrong
        raise CliError(f"{args.logits_file}: {first_line(exc)}") from exc
    return targets, length or "auto"
