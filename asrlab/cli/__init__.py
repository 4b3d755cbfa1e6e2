"""``asrlab <command>``: parses arguments, calls the package, formats the output.

The only module (with the notebooks) that prints; everything else logs. Each command's parser sits beside
its handler (data, bench, train, runs, watch); a handler imports what it runs when it runs, so that a command
pays at start-up only for its own imports (``asrlab shards inspect`` or ``asrlab notebooks`` never load torch).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from ..errors import UsageError
from . import bench, data, runs, train, watch

COMMANDS = (data, bench, train, runs, watch)


DESCRIPTION = (
    "asrlab trains a small speech recognizer (Conformer-CTC, on WeNet-style data) and finds out why a "
    "training run went wrong: a stalled rank, an idle GPU, a NaN loss, a resume that starts the epoch "
    "again. Make and check data, train, decode, and ask the doctor what happened to a run."
)
EPILOG = (
    "start with: asrlab synth data/ && asrlab train --data data/train/data.list --exp exp/tiny, "
    "then asrlab doctor exp/tiny; asrlab COMMAND --help says more about each command"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="asrlab", description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages too")
    sub = p.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        title="commands",
        help="one of these (asrlab COMMAND --help says what it takes)",
    )
    for module in COMMANDS:
        module.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # what --nproc relaunches under torchrun
    if isinstance(getattr(args, "overrides", None), list):  # KEY=VALUE overrides: before or after options
        args.overrides += [x for x in extra if "=" in x and not x.startswith("-")]
        extra = [x for x in extra if x not in args.overrides]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return args.func(args)
    except (UsageError, FileNotFoundError) as e:  # what a person can fix; anything else is a bug: its traceback
        print(f"asrlab: error: {e}", file=sys.stderr)
        if getattr(args, "json", False):  # a reader of --json gets its answer where it reads
            print(json.dumps({"error": str(e)}))
        return 2
    except BrokenPipeError:  # the reader went away (``asrlab doctor EXP | head``): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush does not fail
        return 0


__all__ = ["build_parser", "main"]
