"""Argparse types that check each command-line value against its range, and a parser whose errors are one
line: a bad value is refused before any work, naming the option."""

from __future__ import annotations

import argparse
import math


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block): 'trtattn fuse: error: argument --atol: ...'."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def tolerance(text: str) -> float:
    """A finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a tolerance is a finite number >= 0")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def non_negative(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0")
    return value


def positive(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return value


def memory_size(text: str) -> int:
    """Bytes from '8G', '512M', '1.5G', '1048576' (K, M, G, T are powers of 1024)."""
    from ..errors import TrtattnError
    from ..graph.memory import parse_size

    try:
        value = parse_size(text)
    except TrtattnError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size (e.g. 8G, 512M)") from None
    if value < 1 << 20:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1M")
    return value


def dims_text(text: str) -> str:
    """--dims checked now (name=positive integer, comma separated); the commands parse it again."""
    from ..errors import TrtattnError
    from .dims import parse_dims

    try:
        parse_dims(text)
    except TrtattnError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text
