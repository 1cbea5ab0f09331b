"""argparse value types that check range and finiteness where a flag enters (argparse turns the
ValueError into `comet: error: argument --flag: ...` and exit 2)."""

from __future__ import annotations

import argparse
import math

MAX_COUNT = 10**9     # GPUs, batch sizes, degrees: beyond any machine that exists (largest runs ~1e5 GPUs)


def _int(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_COUNT:,}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int(text, 1)


def non_negative_int(text: str) -> int:
    return _int(text, 0)


def _float(text: str, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    if value < 0 or (positive and value == 0):
        raise argparse.ArgumentTypeError(f"must be {'>' if positive else '>='} 0, got {value:g}")
    return value


def positive_float(text: str) -> float:
    return _float(text, True)


def non_negative_float(text: str) -> float:
    return _float(text, False)
