"""trtattn bench MODEL|ENGINE: latency percentiles, throughput and peak memory (a markdown table), of
one run or of greedy generation. Exit codes as `trtattn run`."""

from __future__ import annotations

import contextlib
import json

from ..errors import MissingDependencyError
from .common import (
    add_session_opts,
    exit_without_tensorrt,
    generate_from_args,
    generation_parts,
    open_model,
    prompts,
    session_feeds,
)
from .values import non_negative, positive


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="latency percentiles, throughput and peak memory of a model or engine (markdown table)")
    add_session_opts(p)
    p.add_argument("--iterations", type=positive, default=20, help="timed runs (default 20)")
    p.add_argument("--warmup", type=non_negative, default=3, help="untimed runs first (default 3)")
    p.add_argument("--threads", type=positive, help="ONNX Runtime intra-op threads (default: ONNX Runtime's)")


def run(args, progress) -> int:
    from .rank_set import run_set

    code = run_set(args)  # a rank set: one process per GPU (or, on too few GPUs, one line before any work)
    if code is not None:
        return code
    from ..runtime import bench, bench_callable, markdown_table

    try:
        with contextlib.ExitStack() as stack:
            session = stack.enter_context(open_model(args.model, args, threads=args.threads))
            if args.generate:
                parts = generation_parts(args, stack)
                batch = len(prompts(args))
                memory = session.memory if session.backend == "tensorrt" else None  # device memory; else host RSS
                with progress.step(f"benchmarking generation of {args.generate} tokens x {batch} requests"):
                    result = bench_callable(lambda: generate_from_args(args, session, parts),
                                            name=f"{session.name} (generate)", backend=session.backend,
                                            shapes=f"{batch} prompts, {args.generate} new tokens",
                                            iterations=args.iterations, warmup=args.warmup, sequences=batch,
                                            tokens=batch * args.generate, memory=memory)
            else:
                feeds = session_feeds(session, args)
                with progress.step(f"benchmarking {session.name} on {session.backend}"):
                    result = bench(session, feeds, iterations=args.iterations, warmup=args.warmup)
            if args.json:
                print(json.dumps({**result.row(), "latencies_ms": result.latencies_ms}, indent=2))
            else:
                print(markdown_table([result]))
                if getattr(session, "graph_note", None):  # TensorRT: why runs were not replayed as a CUDA graph
                    print(f"note: {session.graph_note}")
            return 0
    except MissingDependencyError as e:
        return exit_without_tensorrt(e)
