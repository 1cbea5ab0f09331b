"""`comet` command line. Each subcommand lives in its own module with `register(subparsers)`.

Every CometError (bad input, corrupt trace, broken rule) becomes one line on stderr and exit code 2;
no traceback reaches the user. Anything else is a bug: one line, a crash report with the traceback and
exit code 3 (comet/cli/crash.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from comet.errors import CometError

SUBCOMMANDS = ("estimate", "search", "validate", "trace", "export")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors also exit 2 with one line
        self.exit(2, f"comet: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="comet", description="Plan large LLM training runs on a replayed cluster model.")
    from comet import __version__
    parser.add_argument("--version", action="version", version=f"comet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"comet.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"comet.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):   # a path with undecodable bytes must still print
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        return _main(argv)
    except SystemExit as exc:          # argparse's --help / usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        print("comet: interrupted", file=sys.stderr)
        return 130
    except BaseException as exc:  # noqa: BLE001 - the last resort: never a traceback on the terminal
        from comet.cli.crash import report_bug
        return report_bug(exc, argv, argv[0] if argv else "")


def _main(argv: list[str]) -> int:
    from comet.cli.crash import environment_error_line
    from comet.config.paths import check_args_paths
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args_paths(args)         # output locations and input paths, before any work starts
        code = args.func(args)
    except CometError as exc:
        print(f"comet: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("comet: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:   # output piped into `head` and closed early: not an error of ours
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        line = environment_error_line(exc)
        if line is None:
            raise
        print(f"comet: error: {line}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
