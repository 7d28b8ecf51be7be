"""The ``medrt`` command line: a thin dispatcher over ``medrt.commands``.

Each command module exposes ``register(subparsers)``, which adds its parser and
sets ``func`` to a callable ``(args) -> int`` exit code. Library code logs; only
commands print, for people, or as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import Any

from medrt import __version__
from medrt.allocator import limit_arenas
from medrt.errors import MedrtError
from medrt.privacy import setup_console_logging

# Exit codes, documented in the README.
EXIT_OK = 0
EXIT_PARTIAL = 1  # completed, but some inputs had errors
EXIT_FAILED = 2  # nothing useful done: bad usage or a fatal error
EXIT_BROKEN_PIPE = 141  # the reader went away (``medrt eval ... | head``): 128 + SIGPIPE, as a shell reports it

COMMANDS = (
    "medrt.commands.info",
    "medrt.commands.checks",
    "medrt.commands.phantom",
    "medrt.commands.bench",
    "medrt.commands.models",
    "medrt.commands.eval",
    "medrt.commands.stream",
    "medrt.commands.batch",
    "medrt.commands.listen",
    "medrt.commands.spool",
    "medrt.commands.view",
)


_VERBOSE_AFTER = "verbose_after_command"


class _Parser(argparse.ArgumentParser):
    """The top parser: a ``-v`` after the command adds to one before it (``medrt -v batch
    ... -v`` is ``-vv``). The command's parser counts into its own namespace, which
    argparse then copies over the top one's: with one dest, it replaced the count before."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        ns, rest = super().parse_known_args(args, namespace)
        ns.verbose = getattr(ns, "verbose", 0) + vars(ns).pop(_VERBOSE_AFTER, 0)
        return ns, rest


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="medrt",
        description="Real-time medical-imaging inference (research use; not for clinical use).",
    )
    parser.add_argument("--version", action="version", version=f"medrt {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=argparse.ArgumentParser)
    for name in COMMANDS:
        import_module(name).register(sub)
    _verbose_after_command(sub)
    return parser


def _verbose_after_command(sub: argparse._SubParsersAction) -> None:
    """``-v`` after the command too (``medrt batch IN --out OUT -v``), where people type it
    when a run needs a closer look; it was a usage error there. It counts into a dest of
    its own, which :class:`_Parser` adds to the count before the command."""
    for command in set(sub.choices.values()):
        command.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, dest=_VERBOSE_AFTER,
                             help="more log output (-vv for debug); also accepted before the command")
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _verbose_after_command(action)


def _setup_logging(verbosity: int, quiet: bool = False) -> None:
    # --quiet (batch, stream): errors only; a batch's per-file warnings are in its errors.csv.
    # -v wins over it. pydicom and highdicom quote header values (a patient's name, a birth
    # date) in their warnings; those go through logging, with the values taken out (medrt.privacy).
    level = logging.ERROR if quiet and not verbosity else logging.WARNING - 10 * min(verbosity, 2)
    setup_console_logging(level)


def main(argv: Sequence[str] | None = None) -> int:
    # Before any thread starts: the listener, the viewer and a long batch make thread pools
    # series after series, and glibc's default of 8 arenas per core kept what each freed
    # (medrt.allocator). MALLOC_ARENA_MAX in the environment overrides it.
    limit_arenas()
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose, quiet=bool(getattr(args, "quiet", False)))
    try:
        return int(args.func(args))
    except MedrtError as exc:
        print(f"medrt: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("medrt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output closed the pipe. Point stdout at /dev/null so that
        # Python's flush at exit does not raise again, and stop quietly (Python docs,
        # "Note on SIGPIPE").
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
