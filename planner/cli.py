"""The ``planner`` command line: one handler class per subcommand.

``main()`` turns a :class:`PlannerUsageError` (bad input) into one line on stderr and exit code 2,
any other failure into one line and exit code 1, and Ctrl-C into exit code 130. ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn, cast

from planner.commands import COMMANDS, BaseCommand
from planner.errors import Interrupted, PlannerUsageError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (exit code 2), as every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Subcommands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subparsers that take their arguments only once chosen, so that ``planner --help`` and
    each command import only that command's module (the arguments' defaults and types live
    there). ``add_subparsers(action=...)`` is argparse's documented hook for this class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unfilled: dict[str, tuple[argparse.ArgumentParser, BaseCommand]] = {}

    def add_command(self, command: BaseCommand) -> None:
        p = self.add_parser(command.name, help=command.help, description=command.help)
        # SUPPRESS: not given after the command, it leaves `planner --debug COMMAND`'s alone
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks on errors")
        p.set_defaults(handler=command)
        self._unfilled[command.name] = (p, command)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        unfilled = self._unfilled.pop(values[0], None)
        if unfilled is not None:
            command_parser, command = unfilled
            command.add_arguments(command_parser)
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="planner",
        description="Parallel Planner: find the fastest parallelization strategy that fits.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = cast(_Subcommands, parser.add_subparsers(dest="command", metavar="COMMAND",
                                                   required=True, action=_Subcommands))
    for command in COMMANDS:
        sub.add_command(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; Ctrl-C at any point (parsing the arguments imports the command's
    module) is exit code 130 and one line."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("planner: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if getattr(args, "storage", None) == "":  # not the default: a variable that expanded empty
        print(f"planner {args.command}: error: --storage is empty; give a journal path or a"
              " database URL, or leave the option out for the default", file=sys.stderr)
        return EXIT_USAGE
    try:
        return args.handler.run(args)
    except PlannerUsageError as e:
        if args.debug:
            traceback.print_exc()
        print(f"planner {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `planner ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt as e:
        what = str(e) if isinstance(e, Interrupted) else "interrupted"
        print(f"planner {args.command}: {what}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if args.debug:
            traceback.print_exc()
        hint = "" if args.debug else " (rerun with --debug for the traceback)"
        print(f"planner {args.command}: failed: {type(e).__name__}: {e}{hint}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
