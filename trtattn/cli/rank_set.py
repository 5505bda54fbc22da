"""`run` / `bench` on a tensor-parallel rank set (NAME.tp.json, or one rank's engine, whose sidecar says it
is one of N): one line before any work when this machine has fewer GPUs than ranks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import NO_TRT_EXIT


def ranks_of(model: str) -> int | None:
    """The number of ranks `model` belongs to (None: not a rank set)."""
    path = Path(model)
    if path.name.endswith(".tp.json") and path.is_file():
        return int(json.loads(path.read_text())["tensor_parallel"])
    sidecar = path.with_suffix(".json")
    if path.suffix in (".engine", ".plan", ".trt") and sidecar.is_file():
        try:
            tp = json.loads(sidecar.read_text()).get("tensor_parallel")
        except (ValueError, OSError):
            return None
        return int(tp["ranks"]) if isinstance(tp, dict) else None
    return None


def visible_gpus() -> int:
    from ..errors import TrtattnError

    try:
        from ..trt.cuda import Cuda

        return Cuda.load().device_count()
    except (TrtattnError, ImportError, OSError):
        return 0


def refuse(model: str, gpus=None) -> int | None:
    """The exit code when `model` is a rank set this machine cannot run (None: not a rank set, go on)."""
    ranks = ranks_of(model)
    if ranks is None:
        return None
    have = (gpus or visible_gpus)()
    if have < ranks:
        print(f"trtattn: {model} is a tensor-parallel set of {ranks} ranks: it needs {ranks} GPUs, this machine "
              f"has {have} (docker/README.md: the multi-GPU recipe)", file=sys.stderr)
        return NO_TRT_EXIT
    print(f"trtattn: {model}: running a set of {ranks} ranks (one process per GPU over NCCL) is not implemented "
          "in run/bench yet", file=sys.stderr)
    return 1
