"""Argument types and options several commands share."""

from __future__ import annotations

import argparse


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def pair(s: str) -> tuple[float, float]:
    lo, hi = (float(x) for x in s.split(","))
    return lo, hi


def bad_input_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bad-input", choices=["skip", "fail"], default="skip",
                        help="an unusable utterance: counted and skipped (as data.bad_input=skip), or an error")
