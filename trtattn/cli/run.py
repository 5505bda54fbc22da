"""trtattn run MODEL|ENGINE: one run (a table of the outputs), or greedy generation with a KV cache.
`trtattn run DIR --generate N`: through an export folder's parts (cli/pipeline.py).

Exit codes: 0 ok; 2 a user error (one line, from cli.main); 4 TensorRT or cuda-python missing or no
GPU for an engine (one sentence, as `trtattn build` says it)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np

from ..errors import MissingDependencyError
from ..report import table
from .common import (
    add_session_opts,
    exit_without_tensorrt,
    generate_from_args,
    generation_parts,
    open_model,
    session_feeds,
)


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run an ONNX model (ONNX Runtime) or TensorRT engine once, or generate greedily")
    add_session_opts(p)
    p.add_argument("--save", help="write the outputs (or the generated tokens) to this .npz")
    p.add_argument("--text", action="append", metavar="TEXT",
                   help="MODEL is an export folder with a tokenizer.json: generate from this text, print text "
                        "(repeat for several requests)")


def run(args, progress) -> int:
    from .rank_set import run_set

    code = run_set(args)  # a rank set: one process per GPU (or, on too few GPUs, one line before any work)
    if code is not None:
        return code
    if Path(args.model).is_dir():  # an export folder (or a folder of engines): the whole pipeline
        from . import pipeline

        try:
            return pipeline.run(args, progress)
        except MissingDependencyError as e:
            return exit_without_tensorrt(e)
    try:
        with contextlib.ExitStack() as stack:
            session = stack.enter_context(open_model(args.model, args))
            if args.generate:
                _generate(args, session, generation_parts(args, stack), progress)
            else:
                _run_once(args, session, progress)
            return 0
    except MissingDependencyError as e:
        return exit_without_tensorrt(e)


def _generate(args, session, parts, progress) -> None:
    with progress.step(f"generating {args.generate} tokens with {session.name} ({session.backend})"):
        gen = generate_from_args(args, session, parts)
    if args.json:
        print(json.dumps({"model": str(args.model), "backend": session.backend, "cache": gen.cache,
                          "requests": [{"prompt_length": n, "tokens": t}
                                       for n, t in zip(gen.prompt_lengths, gen.tokens)]}, indent=2))
    else:
        print(f"{session.name} on {session.backend}, {gen.cache} KV cache, {len(gen.tokens)} requests:")
        for i, (n, toks) in enumerate(zip(gen.prompt_lengths, gen.tokens)):
            print(f"  request {i} (prompt of {n} tokens): {' '.join(map(str, toks))}")
    if args.save and not _secondary():  # one rank of a set: rank 0 saves
        tokens = np.full((len(gen.tokens), max(len(t) for t in gen.tokens)), -1, np.int64)  # -1 after an early eos
        for i, t in enumerate(gen.tokens):
            tokens[i, :len(t)] = t
        np.savez(args.save, tokens=tokens, prompt_lengths=np.asarray(gen.prompt_lengths))


def _run_once(args, session, progress) -> None:
    feeds = session_feeds(session, args)
    with progress.step(f"running {session.name} on {session.backend}"):
        outputs = session.run(feeds)
    rows = [_summary(name, value) for name, value in outputs.items()]
    if args.json:
        print(json.dumps({"model": str(args.model), "backend": session.backend, "outputs": rows}, indent=2))
    else:
        print(f"{session.name} on {session.backend}: inputs " +
              ", ".join(f"{k}:{'x'.join(map(str, v.shape))}" for k, v in feeds.items()))
        print(table(rows, [("name", "output"), ("shape", "shape"), ("dtype", "dtype"), ("min", "min"),
                           ("max", "max"), ("mean", "mean"), ("nan", "NaNs")]))
    if args.save and not _secondary():
        np.savez(args.save, **outputs)
        print(f"wrote {args.save}")


def _secondary() -> bool:
    from ..runtime.ranks import is_secondary_rank

    return is_secondary_rank()


def _summary(name: str, v: np.ndarray) -> dict:
    head = {"name": name, "shape": "x".join(str(d) for d in v.shape) or "scalar", "dtype": v.dtype.name}
    if not (v.size and v.dtype.kind in "fiub"):
        return {**head, "min": None, "max": None, "mean": None, "nan": 0}
    f = v.astype(np.float64)
    return {**head, "min": float(np.nanmin(f)), "max": float(np.nanmax(f)), "mean": float(np.nanmean(f)),
            "nan": int(np.isnan(f).sum()) if v.dtype.kind == "f" else 0}
