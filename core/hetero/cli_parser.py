"""The ``hetero`` command's argument parsing: subcommands whose usage errors are their own, and the options several
commands share."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from .cli_errors import EXIT_ERROR
from .progress import clear_line


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors say which command they belong to and print that command's usage (a
    subcommand's unknown flag is its own error, not the root's)."""

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if not getattr(self, "is_subcommand", False) or self._intermixing:
            return super().parse_known_args(args, namespace)
        # Positionals after flags too (`run MODEL -n 8 "prompt"`), which plain argparse refuses with nargs="?".
        self._intermixing = True
        try:
            parsed, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        clear_line()
        self.print_usage(sys.stderr)
        command = self.prog.removeprefix("hetero").strip()
        where = f"{command}: " if command else ""
        sys.stderr.write(f"hetero: error: {where}{message} (see `{self.prog} -h`)\n")
        sys.exit(EXIT_ERROR)


def add_backend_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-b", "--backend", action="append", default=[], metavar="NAME[,NAME]",
                   help="backends in preference order, e.g. cpu or opencl,cpu (default: HETERO_BACKENDS, else every "
                        "working backend); opencl:1 picks a device")


def add_output_options(p: argparse.ArgumentParser) -> None:
    """--quiet / -v on every subcommand (they may also come before it)."""
    p.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS,
                   help="no progress lines (they only ever show on a terminal)")
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="each phase's time, and warnings about backends skipped automatically")


def add_command(sub: Any, name: str, help_text: str, func: Callable[[argparse.Namespace], int]
                ) -> argparse.ArgumentParser:
    """A subcommand whose unknown flags are its own usage error (see ``CommandParser``)."""
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.is_subcommand = True
    p.set_defaults(func=func)
    return p


def backends_of(args: argparse.Namespace) -> list[str] | None:
    """``-b cpu -b opencl,cpu`` -> ["cpu", "opencl", "cpu"]; None when not given."""
    return [b.strip() for spec in args.backend for b in spec.split(",") if b.strip()] or None
