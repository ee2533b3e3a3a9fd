"""What `sodaray invert`'s flags ask for: their checks before the model loads, the algorithm's
config, the objective and the targets."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from sodaray.cli.parsing import CliError


def check_flags(args: argparse.Namespace) -> None:
    """The flags, checked before the load: inputs or one observed output; a setting given two
    ways where one would silently win is refused in one line, or, where one overriding the other
    is the point (a --param over a named preset), a note says which is used; a flag the chosen
    inputs never read is refused by name."""
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
    params = _given_params(args)
    _check_unread(args)
    if (args.preset or args.preset_file) and args.algorithm == "soda":
        _note_overrides(args, params)


def _given_params(args: argparse.Namespace) -> dict[str, Any]:
    """--param's values by key, each given once and not also as its own flag."""
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
    return params


def _check_unread(args: argparse.Namespace) -> None:
    """Flags the chosen inputs never read, and settings named two ways, refused by name."""
    from sodaray.errors import shown

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


def _note_overrides(args: argparse.Namespace, params: dict[str, Any]) -> None:
    """A line on stderr for each --param that overrides the named preset's value (stdout may
    be JSON; stderr's error lines start `sodaray: error:`, these `sodaray: note:`)."""
    from sodaray.config.presets import get_preset, load_preset_file
    from sodaray.errors import shown

    preset = dict(get_preset(args.preset).soda) if args.preset else {}
    if args.preset_file:
        from sodaray.experiment.spec import check_preset_params

        preset.update(load_preset_file(args.preset_file))
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


def read_observed(args: argparse.Namespace) -> tuple[Any, int | None]:
    """The logits file's (values, indices), None without one, and the top-k observed: a file of
    top-k logits decides it."""
    from sodaray.objective.targets import read_logits_file

    top_k = args.top_k
    if not args.logits_file:
        return None, top_k
    observed = read_logits_file(args.logits_file)
    if observed[1] is not None:
        top_k = int(observed[1].shape[-1])
        if args.top_k is not None and args.top_k != top_k:
            raise CliError(
                f"--top-k {args.top_k}, but {args.logits_file} holds the top {top_k} logits "
                "of each position: leave out --top-k"
            )
    return observed, top_k


def config_from_flags(args: argparse.Namespace, defaults: Any = None):
    """The algorithm's config from the flags: the named preset, or with none the model's family
    defaults (`defaults`, a `sodaray.config.families.Defaults`; None before the model is loaded,
    to check the flags' own values), then --param, --max-steps, --max-batch-size and --seed."""
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


def family_defaults(args: argparse.Namespace, model: Any) -> Any:
    """The model's family defaults when no preset is named (None when one is), by its loaded
    config's `model_type` (`sodaray.config.families`, the rule sweeps and tuning use too)."""
    if args.preset or args.preset_file:
        return None
    from sodaray.config.families import defaults_for

    return defaults_for(getattr(getattr(model.model, "config", None), "model_type", None))


def targets_from_flags(
    args: argparse.Namespace, model: Any, kind: str, objective: Any, observed: Any
):
    """The targets the inputs or the observed output make, and the length to search: an
    observed output's is unknown, so `auto` unless given."""
    from sodaray.config.capacity import check_context
    from sodaray.objective.targets import make_targets, targets_from_logits, targets_from_text

    length = args.length
    if args.prompt or args.tokens:
        texts_tokens = [model.encode(p) for p in args.prompt] + list(args.tokens)
        longest = max(len(t) for t in texts_tokens)  # the greedy continuation must fit too
        check_context(
            model,
            length if isinstance(length, int) else longest,
            1 if args.output_tokens is None else args.output_tokens,
        )
        return make_targets(model, texts_tokens, objective=objective), length
    if args.output_text:
        if kind != "text":
            raise CliError("--output-text observes text: use --objective text")
        return targets_from_text(model, args.output_text, objective=objective), length or "auto"
    values, indices = observed
    try:
        targets = targets_from_logits(model, values, indices, objective=objective)
    except ValueError as exc:  # its shape or values: the file is what is wrong
        from sodaray.errors import first_line

        raise CliError(f"{args.logits_file}: {first_line(exc)}") from exc
    return targets, length or "auto"
