"""trtattn inspect ENGINE|LAYERINFO: which attentions fused, from the engine's layer info."""

from __future__ import annotations


def add_parser(sub) -> None:
    from ..trt.inspect import add_inspect_parser

    add_inspect_parser(sub)


def run(args, progress) -> int:
    from ..trt.inspect import run_inspect

    return run_inspect(args)
