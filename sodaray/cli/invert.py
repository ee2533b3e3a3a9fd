"""`sodaray invert`: its options, and the run that prints each target's result as it ends."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from sodaray.cli.invert_settings import (
    check_flags,
    check_places,
    config_from_flags,
    family_defaults,
    objective_from_flags,
    read_observed,
    targets_from_flags,
)
from sodaray.cli.parsing import CliError
from sodaray.io import jsontext

MAX_LENGTH = 10  # --length auto's longest length when --max-length is not given


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
    from sodaray.errors import shown

    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--param takes KEY=VALUE, got {shown(text, 80)!r}")
    from sodaray.config.configfile import override_value

    key, value = text.split("=", 1)
    try:  # YAML 1.2 numbers: 3e-6 is a float, not a string; bounded as an override
        return key.strip(), override_value(text, value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--param {shown(key.strip(), 80)}: {exc}") from exc


def add_invert_parser(sub: argparse._SubParsersAction) -> None:
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
    _add_input_options(p)
    _add_objective_options(p)
    _add_search_options(p)
    _add_placement_options(p)
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="one JSON result row per target")
    out.add_argument("--out", help="also write the result rows to this Parquet file")
    out.add_argument(
        "--dataset-label", default="", help="dataset name recorded in result rows (for reports)"
    )
    p.set_defaults(func=cmd_invert)


def _add_input_options(p: argparse.ArgumentParser) -> None:
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


def _add_objective_options(p: argparse.ArgumentParser) -> None:
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


def _add_search_options(p: argparse.ArgumentParser) -> None:
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


def _add_placement_options(p: argparse.ArgumentParser) -> None:
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


class _Results:
    """Each target's result, printed as soon as it finishes (a run cut short keeps every result
    found before) and kept as its result row (a one-row table) by sample id for --out."""

    def __init__(self, context: Any, as_json: bool, defaults: Any, bar: Any) -> None:
        self.context = context
        self.as_json = as_json
        self.chosen = None if defaults is None else defaults.to_dict()
        self.bar = bar
        self.rows: dict[int, Any] = {}

    def show(self, res: Any) -> None:
        from sodaray.results import result_rows

        table = result_rows([res], self.context)
        self.rows[res.sample_id] = table
        line = _result_line(res, table.to_pylist()[0], self.as_json, self.chosen)
        if self.bar is not None:
            self.bar.write(line)
            self.bar.result(res)
        else:
            print(line, flush=True)

    def write(self, path: str, sample_ids: Any) -> None:
        """The rows, in target order, to a Parquet file (after printing: a failed write must not
        lose them)."""
        import pyarrow as pa

        from sodaray.results import write_table_atomic

        order = [i for i in sample_ids if i in self.rows]
        table = pa.concat_tables([self.rows[i] for i in order])
        try:
            write_table_atomic(table, path)
        except OSError as exc:
            raise CliError(f"cannot write {path}: {exc.strerror or exc}") from exc
        logging.info("wrote %d result rows to %s", len(table), path)


def _progress_bar(count: int, config: Any, length: Any, max_length: int) -> Any:
    """The sample-steps bar on stderr when it is a terminal, else None."""
    if not sys.stderr.isatty():
        return None
    from sodaray.cli.progress import InvertProgress
    from sodaray.costs.flops import most_sample_steps

    per_target = most_sample_steps(1, config, length, max_length)
    return InvertProgress(count, per_target, config.stepwise)


def _say_defaults(args: argparse.Namespace, defaults: Any, model: Any) -> None:
    """Which defaults and why: a line on stdout before the results (stderr is for errors, one
    line each), in each JSON row's `defaults` with --json, and in the log."""
    family = defaults.family
    note = defaults.why()
    if family is not None and family.bos_advice and not model.prefix_ids:
        note += f"; no BOS before the input: {family.bos_advice}"
    logging.info("defaults: %s", note)
    if not args.json:
        print(f"defaults: {note}", flush=True)


def _search(run: Any, results: _Results) -> bool:
    """`run(on_result, on_batch)` searches; True when a stop signal cut it short.

    A stop (SIGINT, SIGTERM or SIGHUP) ends the run at the end of the step it comes in, not
    inside it: raised in the middle of a step, it can land in a callback from C (the denormal
    flush's OpenMP callbacks), where ctypes prints a traceback and drops it, and the run would
    go on. A second stop ends it at once."""
    from sodaray.experiment import stops

    asked: list[int] = []

    def on_interrupt(signum: int, frame: Any) -> None:
        asked.append(signum)
        if len(asked) > 1:
            raise KeyboardInterrupt

    def again(active: int) -> None:
        if asked:
            raise KeyboardInterrupt
        if results.bar is not None:
            results.bar.step(active)

    try:
        with stops.handled(on_interrupt):  # main thread only
            run(results.show, again)
    except KeyboardInterrupt:
        return True
    finally:
        if results.bar is not None:
            results.bar.close()
    return False


def cmd_invert(args: argparse.Namespace) -> int:
    from sodaray.api import invert
    from sodaray.experiment import stops
    from sodaray.model.load import load_model
    from sodaray.results import RunContext

    check_flags(args)
    config = config_from_flags(args)  # validate before the (slow) model load
    check_places(args)
    kind = args.objective or ("text" if args.output_text else "logits")
    observed, top_k = read_observed(args)  # before the load: its top-k decides the objective
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
    defaults = family_defaults(args, model)
    if defaults is not None:
        config = config_from_flags(args, defaults)
        objective = objective_from_flags(args, kind, top_k, defaults)
    targets, length = targets_from_flags(args, model, kind, objective, observed)
    max_length = MAX_LENGTH if args.max_length is None else args.max_length
    context = RunContext.for_model(
        model,
        objective,
        dataset=args.dataset_label,
        length_mode="auto" if length == "auto" else "fixed",
    )
    bar = _progress_bar(len(targets), config, length, max_length)
    results = _Results(context, args.json, defaults, bar)
    if defaults is not None:
        _say_defaults(args, defaults, model)

    def run(on_result: Any, on_batch: Any) -> None:
        invert(
            model,
            targets,
            config,
            length=length,
            max_length=max_length,
            on_result=on_result,
            on_batch=on_batch,
            executor=args.executor,
        )

    interrupted = _search(run, results)
    if args.out is not None and results.rows:
        results.write(args.out, targets.sample_ids)
    if interrupted:
        done = len(results.rows)
        kept = f"; their rows are in {args.out}" if args.out is not None and done else ""
        print(f"interrupted: {done} of {len(targets)} targets finished{kept}", file=sys.stderr)
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
