"""`run` / `bench` on a tensor-parallel rank set (NAME.tp.json, or one rank's engine, whose sidecar says it
is one of N): one process per rank on N GPUs (runtime/ranks.py), rank 0's output as the command's. With
fewer GPUs than ranks: one line before any work, exit 4 (as for no GPU)."""

from __future__ import annotations

import sys

from ..errors import TrtattnError
from ..runtime.ranks import free_port, launch, rank_commands, read_rank_set, this_rank
from .common import NO_TRT_EXIT


def ranks_of(model: str) -> int | None:
    """The number of ranks `model` belongs to (None: not a rank set)."""
    rank_set = read_rank_set(model)
    return None if rank_set is None else rank_set.ranks


def visible_gpus() -> int:
    try:
        from ..trt.cuda import Cuda

        return Cuda.load().device_count()
    except (TrtattnError, ImportError, OSError):
        return 0


def refuse(model: str, gpus: int | None = None) -> int | None:
    """NO_TRT_EXIT, said in one line, when `model` is a rank set and this machine has fewer GPUs (`gpus`,
    default: those visible) than it has ranks; None otherwise."""
    ranks = ranks_of(model)
    if ranks is None:
        return None
    have = visible_gpus() if gpus is None else gpus
    if have < ranks:
        print(f"trtattn: {model} is a tensor-parallel set of {ranks} ranks: it needs {ranks} GPUs, this machine "
              f"has {have} (docker/README.md: the multi-GPU recipe)", file=sys.stderr)
        return NO_TRT_EXIT
    return None


def run_set(args, gpus: int | None = None) -> int | None:
    """The exit code of running `args.model` as a rank set, one process per rank; None when it is not a
    rank set, this process is already one of its ranks (then the command goes on as for one engine or
    folder) or --backend ort asks for the verified forms."""
    if this_rank() is not None or args.backend == "ort":  # ort: a built folder's verified forms, on the CPU
        return None
    rank_set = read_rank_set(args.model)
    if rank_set is None:
        return None
    refused = refuse(args.model, gpus)
    if refused is not None:
        return refused
    others = [flag for flag, value in (("--prefill", args.prefill), ("--encoder", args.encoder),
                                       ("--decoder-init", args.decoder_init)) if value]
    if others:
        print(f"trtattn: error: {args.model} is a rank set; {', '.join(others)} with a rank set is not supported "
              "(generate with the step engines alone)", file=sys.stderr)
        return 2
    argv = getattr(args, "argv", None)  # set by cli.main
    if argv is None:
        raise TrtattnError(f"{args.model} is a rank set: run it through trtattn's command line (cli.main), which "
                           "relaunches that command line once per rank")
    commands = rank_commands(rank_set, argv, args.model, port=free_port(), command=args.command)
    return launch(commands)
