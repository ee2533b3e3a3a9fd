"""The `sodaray` command: its parser, assembled from each command's module, and `main()`.

Each command's options and code live in a module named for it (`invert`, `report`, `sweep`,
`tune`, `data`, `train`), above the runner, the tuner and the inverter they drive, which know
nothing of argparse. Bad input ends in one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import Any, NoReturn

from sodaray.errors import first_line

EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """The parser of `sodaray` and each of its subcommands. No option or positional takes an
    empty value: it is what an unset shell variable (`--storage "$STORAGE"`) gives, and read as
    "unset" it would silently fall back to a default (a cluster study in a local journal)."""

    def error(self, message: str) -> NoReturn:  # one line, not usage + traceback
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        """Every value given on the command line passes here (defaults do not), in every
        subcommand (each is a `Parser`): the one place an empty one is refused."""
        if "" in arg_strings and not isinstance(action, argparse._SubParsersAction):
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


LIBRARY_ERRORS = (  # (module, error): bad input to a library, said in one line
    ("yaml", "YAMLError"),
    ("safetensors", "SafetensorError"),
    ("sqlalchemy.exc", "SQLAlchemyError"),
    ("optuna.exceptions", "OptunaError"),
)


def build_parser() -> argparse.ArgumentParser:
    from sodaray.cli import data, invert, report, sweep, train, tune

    parser = Parser(prog="sodaray", description="Search-based language-model inversion.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    from sodaray import __version__  # cheap: the package imports its heavy modules lazily

    parser.add_argument("--version", action="version", version=f"sodaray {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in (invert, report, sweep, tune, data, train):  # in `--help`'s order
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from sodaray.experiment import stops

    # Before anything imports Ray: no native SIGTERM handler (a stack dump, no cleanup) in
    # this driver; the stop rule below answers SIGTERM.
    os.environ.setdefault(stops.NO_NATIVE_HANDLER, "1")

    code: int | None  # None: stopped
    try:
        # SIGTERM and SIGHUP stop a command as Ctrl-C does, from before the parse on: one
        # "interrupted" line, what finished kept, Ray shut down; exit 128 + the signal's number.
        with stops.handled():
            code = _command(argv)
    except KeyboardInterrupt:
        code = None
    except Exception:
        # A stop may come as an error (a KeyboardInterrupt inside a lazy import is raised as an
        # ImportError): a stop all the same, not a traceback.
        if stops.last_signal() is None:
            raise
        code = None
    # A stop some layer swallowed (turned into an error it noted and went past): the command
    # did not do all it was asked, and says so as a stopped one.
    if code is None or (stops.last_signal() is not None and code != stops.exit_code()):
        sys.stderr.write("sodaray: interrupted\n")
        return stops.exit_code()
    return code


def _command(argv: list[str] | None) -> int:
    """The command `argv` names, run: its exit code, or one line and 2 for bad input."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    # KEY=VALUE overrides may come after options (`sweep run F --out o max_steps=5`), where a
    # plain parse stops taking positionals (each is checked as KEY=VALUE where it is applied);
    # an unknown option is argparse's error.
    if rest and hasattr(args, "overrides") and all(not a.startswith("-") for a in rest):
        args.overrides = [*args.overrides, *rest]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        _quiet_libraries()
    try:
        return int(args.func(args) or 0)
    except _edge_errors() as exc:
        sys.stderr.write(f"sodaray: error: {first_line(exc)}\n")
        return EXIT_USAGE


def _edge_errors() -> tuple[type[BaseException], ...]:
    """Errors that are the user's input or environment, by kind: bad values, files that cannot
    be read or written (a read-only folder, a full disk), numbers too large, bad YAML, corrupt
    weight files, storage URLs and Ray connections. Only modules already loaded are consulted."""
    found = [getattr(sys.modules.get(module), name, None) for module, name in LIBRARY_ERRORS]
    kinds = [k for k in found if isinstance(k, type) and issubclass(k, BaseException)]
    return (CliError, ValueError, OSError, OverflowError, *kinds)


def _quiet_libraries() -> None:
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")  # read at import: no retry chatter
    warnings.filterwarnings("ignore")
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    with contextlib.suppress(ImportError):
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
