"""The command line's parser rules (one-line errors, no empty or twice-given values) and its
user-facing error."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


# Options whose empty value is meaningful, so `--x ''` is taken as given: none so far. Every
# other option and positional refuses an empty value: it is what an unset shell variable
# (`--storage "$STORAGE"`) gives, and read as "unset" it would silently fall back to a default
# (a cluster study landing in a local journal).
EMPTY_ALLOWED: frozenset[str] = frozenset()


class Parser(argparse.ArgumentParser):
    """The parser of `sodaray` and each of its subcommands."""

    def error(self, message: str) -> NoReturn:  # one line, not usage + traceback
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        """Every value given on the command line passes here (defaults do not), in every
        subcommand (each is a `Parser`): the one place an empty one is refused."""
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
