"""The `hami` command: a thin dispatcher over subcommands (`simulate`, `inspect`, `explain`, `snapshot`).

Users see one line on stderr and exit status 2 for anything wrong with what they gave us (a flag, a
file, a row), never a traceback; an unexpected failure is one line and status 1 (set HAMI_DEBUG=1 to
get the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from hami import __version__
from hami.errors import HamiError, InvalidRequest

EXIT_USAGE = 2
#: Modules of the `simulate` extra (setup.cfg).
SIMULATE_EXTRA = ("numpy", "matplotlib")


def _one_line(text: object) -> str:
    """Users get one line per error, whatever a message (a YAML parser's, an OS error's) holds."""
    return " ".join(str(text).split())


class UsageError(Exception):
    """A command-line problem found by argparse."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage + error and exiting (we print one line)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    from hami.simulate.arguments import add_arguments

    parser = _Parser(prog="hami", description="HAMi legacy-mode GPU sharing tools.")
    parser.add_argument("--version", action="version", version=f"hami {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sim = sub.add_parser(
        "simulate",
        help="replay a cluster trace through the scheduler core and report placement quality",
        description="Replay pods through kube-scheduler's CPU/memory fit and the scheduler extender's core "
        "(fit, scoring, reservation), then report how well each policy packs the cluster. Without "
        "--nodes/--pods a built-in generated cluster and workload are used.",
    )
    add_arguments(sim)
    from hami.tools.command import add_commands

    add_commands(sub)
    from hami.tools.clusteryaml import add_command as add_snapshot

    add_snapshot(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hami` console script; returns the exit status."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        if getattr(args, "run", None) is not None:
            return args.run(args)  # inspect, explain, snapshot (hami.tools): they map their own errors
        from hami.simulate.command import run_simulate

        return run_simulate(args)
    except UsageError as e:
        print(_one_line(e), file=sys.stderr)
        return EXIT_USAGE
    except InvalidRequest as e:
        print(f"hami: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"hami: error: {where}{_one_line(e.strerror or e)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("hami: interrupted", file=sys.stderr)
        return 130
    except HamiError as e:
        print(f"hami: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, never a traceback
        if isinstance(e, ModuleNotFoundError) and e.name in SIMULATE_EXTRA:
            # The simulator's libraries are an extra (servers do not carry them): say how to get them.
            print(
                f"hami: error: hami simulate needs {e.name}, which is not installed; install the simulate "
                "extra: pip install -e '.[simulate]'",
                file=sys.stderr,
            )
            return EXIT_USAGE
        if os.environ.get("HAMI_DEBUG"):
            traceback.print_exc()
        print(
            f"hami: internal error: {type(e).__name__}: {_one_line(e)} (set HAMI_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
