"""The `trtattn` command line: one module per sub-command, each thin over the library (as Polygraphy's
tools are), each with `add_parser(subparsers)` and `run(args, progress) -> exit code`.

Errors a user can act on (bad input, missing dependency, failed verification) print one line and exit
non-zero; no traceback unless --debug.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import TrtattnError
from ..report import Progress
from . import bench, build, demo, fuse, inspect, normalize, run, verify, zoo
from .values import OneLineParser

COMMANDS = {"zoo": zoo, "fuse": fuse, "normalize": normalize, "build": build, "inspect": inspect, "verify": verify,
            "run": run, "bench": bench, "demo": demo}


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="trtattn", description="Turn transformer ONNX exports into TensorRT engines "
                                 "whose every attention is a native fused IAttention, and prove it.")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    sub = ap.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]  # a rank set relaunches it per rank
    try:
        from ..graph import memory

        memory.set_budget(getattr(args, "max_memory", None))  # None: the default budget (graph/memory.py)
        progress = Progress(enabled=not args.quiet)
        if getattr(args, "timings", False):
            return _timed(args, progress)
        return COMMANDS[args.command].run(args, progress)
    except TrtattnError as e:
        print(f"trtattn: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trtattn: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # an internal error: one line, traceback on request
        if args.debug:
            raise
        print(f"trtattn: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", file=sys.stderr)
        return 3


def _timed(args, progress) -> int:
    """Run the command inside a timings recording; the table goes to stderr (stdout stays the command's) and
    into the --report JSON, which the command has written by then: the report's own write is the one step
    its timings cannot include."""
    import json
    from pathlib import Path

    from ..report import write_json
    from ..timings import recording

    with recording() as recorder:
        code = COMMANDS[args.command].run(args, progress)
    timings = recorder.timings
    print(f"timings:\n{timings.table()}", file=sys.stderr)
    report = getattr(args, "report", None)
    if report and Path(report).is_file():
        data = json.loads(Path(report).read_text())
        data["timings"] = timings.to_json()
        write_json(data, report, protect=tuple(p for p in (getattr(args, "model", None), getattr(args, "output", None)) if p))
    return code
