"""Argument types and options several commands share."""

from __future__ import annotations

import argparse


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def pair(s: str) -> tuple[float, float]:
    lo, hi = (float(x) for x in s.split(","))
    return lo, hi


def bad_input_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bad-input",
        choices=["skip", "fail"],
        default="skip",
        help="an unusable utterance: counted and skipped (skip, as data.bad_input=skip), or an error "
        "naming its line (fail)",
    )


def command(sub, name: str, about: str) -> argparse.ArgumentParser:
    """A subcommand whose one sentence ``about`` is both its line in the parent's --help and its own description."""
    return sub.add_parser(name, help=about[0].lower() + about[1:].rstrip("."), description=about)
