"""The ``pipedream`` command line: ``pipedream profile | plan | simulate | train | report``.

Each subcommand lives in :mod:`pipedream.commands` as a module with ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Building the parser imports only the command
modules, which import torch, numpy, pandas and the rest inside ``run()``, so ``pipedream --help`` is
quick. Bad input raises :class:`pipedream.errors.PipeDreamError` (an unreadable path raises OSError),
printed as one ``error:`` line with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import signal
import sys

import pipedream.commands
from pipedream.errors import EXIT_USAGE, PipeDreamError

ORDER = ("profile", "plan", "simulate", "train", "report")


def command_names() -> list[str]:
    """Subcommands present in :mod:`pipedream.commands`, in flow order (profile → report)."""
    found = {m.name for m in pkgutil.iter_modules(pipedream.commands.__path__)}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command."""
    parser = argparse.ArgumentParser(prog="pipedream", description="PipeDream reproduction: profile a model, plan a "
                                     "pipeline for a cluster, simulate it, train it (PipeDream or data parallelism) "
                                     "and report Table 1.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in command_names():
        module = importlib.import_module(f"pipedream.commands.{name}")
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except PipeDreamError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # a path that cannot be read or written (permissions, full disk, ...)
        where = f": {e.filename}" if e.filename else ""
        print(f"error: {e.strerror or e}{where}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGINT/SIGTERM where a command turns them into Interrupted
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"error: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
