"""`trtattn run` and `trtattn bench`: argparse set-up and handlers, thin over trtattn.runtime.

Wire into trtattn/cli.py:

    from .runtime import cli as runtime_cli
    runtime_cli.add_run_parser(sub)            # in build_parser(), next to the other subcommands
    runtime_cli.add_bench_parser(sub)
    if args.command == "run":   return runtime_cli.run_command(args, progress)     # in _dispatch()
    if args.command == "bench": return runtime_cli.bench_command(args, progress)

Exit codes: 0 ok; 2 a user error (bad input; one line, from cli.main); 4 TensorRT or cuda-python
missing or no GPU for an engine (one sentence, as `trtattn build` does).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import numpy as np

from ..errors import MissingDependencyError, TrtattnError

NO_TRT_EXIT = 4


def _add_common(p) -> None:
    p.add_argument("model", help="MODEL.onnx (ONNX Runtime, CPU) or NAME.engine (TensorRT; reads its NAME.json sidecar)")
    p.add_argument("--backend", default="auto", choices=["auto", "ort", "tensorrt"],
                   help="auto (default): .engine/.plan/.trt files run on TensorRT, anything else on ONNX Runtime")
    p.add_argument("--inputs", help="feeds as .npz, one array per input name (default: generated from the inputs' roles)")
    p.add_argument("--dims", help="symbolic dim values for generated feeds, e.g. batch=2,seq=16")
    p.add_argument("--seed", type=int, default=0, help="seed of generated feeds (default 0)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="TensorRT: replay runs with unchanged shapes and buffers (decode steps) as one CUDA graph")
    p.add_argument("--generate", type=int, metavar="N",
                   help="greedy-decode N new tokens; MODEL is a decoder step with logits and a KV cache")
    p.add_argument("--prompt", action="append", metavar="IDS",
                   help="token ids of one request, comma separated (repeat for a ragged batch)")
    p.add_argument("--prefill", help="generation: a separate prefill model/engine (input_ids, attention_mask, position_ids)")
    p.add_argument("--encoder", help="encoder-decoder generation: the encoder model/engine")
    p.add_argument("--decoder-init", help="encoder-decoder generation: the first decoder step (returns the cross K/V)")
    p.add_argument("--features", help="encoder-decoder generation: the encoder's input, .npy [batch, ...]")
    p.add_argument("--eos", type=int, help="generation: stop a request at this token id")
    p.add_argument("--capacity", type=int, help="generation with a kv-cache form: cache capacity (default: the model's, else 256)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def add_run_parser(sub):
    p = sub.add_parser("run", help="run an ONNX model (ONNX Runtime) or TensorRT engine once, or generate greedily")
    _add_common(p)
    p.add_argument("--save", help="write the outputs (or the generated tokens) to this .npz")
    return p


def add_bench_parser(sub):
    p = sub.add_parser("bench", help="latency percentiles, throughput and peak memory of a model or engine (markdown table)")
    _add_common(p)
    p.add_argument("--iterations", type=int, default=20, help="timed runs (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: ONNX Runtime's)")
    return p


# ---------------------------------------------------------------- helpers
def _open(path, args, threads=None):
    from .session import open_session

    options = {}
    engine = args.backend == "tensorrt" or (args.backend == "auto" and Path(path).suffix.lower() in (".engine", ".plan", ".trt"))
    if engine:
        options["cuda_graph"] = args.cuda_graph
    elif threads:
        options["threads"] = threads
    return open_session(path, backend=args.backend, **options)


def _feeds(session, args) -> dict[str, np.ndarray]:
    from ..inputs import parse_dims
    from .bench import synthesize_feeds

    if args.inputs:
        path = Path(args.inputs)
        if not path.exists():
            raise TrtattnError(f"{path}: no such file")
        try:
            with np.load(path, allow_pickle=False) as data:
                feeds = {k: data[k] for k in data.files}
        except Exception as e:
            raise TrtattnError(f"{path}: not a readable .npz of arrays ({type(e).__name__}: {e})") from None
        unknown = sorted(set(feeds) - set(session.input_names))
        if unknown:
            raise TrtattnError(f"{path} has arrays for {', '.join(unknown)}, which {session.name} does not take "
                               f"(inputs: {', '.join(session.input_names)})")
        missing = [n for n in session.input_names if n not in feeds]
        if missing:
            generated = synthesize_feeds(session, dims=parse_dims(args.dims), seed=args.seed)
            feeds.update({n: generated[n] for n in missing})
        return feeds
    return synthesize_feeds(session, dims=parse_dims(args.dims), seed=args.seed)


def _load_array(path) -> np.ndarray:
    path = Path(path)
    if not path.exists():
        raise TrtattnError(f"{path}: no such file")
    try:
        value = np.load(path, allow_pickle=False)
    except Exception as e:
        raise TrtattnError(f"{path}: not a readable .npy array ({type(e).__name__}: {e})") from None
    if not isinstance(value, np.ndarray):
        raise TrtattnError(f"{path}: expected one array (.npy), not an archive")
    return value


def _prompts(args) -> list[list[int]]:
    if not args.prompt:
        raise TrtattnError("--generate needs at least one --prompt (token ids, comma separated)")
    out = []
    for text in args.prompt:
        try:
            ids = [int(t) for t in text.replace(" ", ",").split(",") if t.strip()]
        except ValueError:
            raise TrtattnError(f"bad --prompt '{text}': expected token ids separated by commas") from None
        if not ids:
            raise TrtattnError(f"bad --prompt '{text}': no token ids")
        out.append(ids)
    return out


def _parts(args, stack) -> dict:
    """The other models generation needs (opened once, closed with the stack)."""
    parts = {}
    if args.encoder or args.decoder_init:
        if not (args.encoder and args.decoder_init and args.features):
            raise TrtattnError("encoder-decoder generation needs --encoder, --decoder-init and --features together")
        parts["features"] = _load_array(args.features)
        parts["encoder"] = stack.enter_context(_open(args.encoder, args))
        parts["decoder_init"] = stack.enter_context(_open(args.decoder_init, args))
    elif args.prefill:
        parts["prefill"] = stack.enter_context(_open(args.prefill, args))
    return parts


def _generate(args, step, parts: dict):
    from .generate import generate, generate_encoder_decoder

    prompts = _prompts(args)
    options = {"eos_token_id": args.eos, "capacity": args.capacity, "record_logits": False}
    if "encoder" in parts:
        return generate_encoder_decoder(parts["encoder"], parts["decoder_init"], step, parts["features"], prompts,
                                        args.generate, **options)
    return generate(step, prompts, args.generate, prefill=parts.get("prefill"), **options)


def _summary(outputs: dict[str, np.ndarray]) -> list[dict]:
    rows = []
    for name, v in outputs.items():
        numeric = v.size and v.dtype.kind in "fiub"
        f = v.astype(np.float64) if numeric else None
        rows.append({"name": name, "shape": "x".join(str(d) for d in v.shape) or "scalar", "dtype": v.dtype.name,
                     "min": float(np.nanmin(f)) if numeric else None, "max": float(np.nanmax(f)) if numeric else None,
                     "mean": float(np.nanmean(f)) if numeric else None,
                     "nan": int(np.isnan(f).sum()) if numeric and v.dtype.kind == "f" else 0})
    return rows


def _no_trt(e: MissingDependencyError) -> int:
    print(f"trtattn: {e}.", file=sys.stderr)
    return NO_TRT_EXIT


# ---------------------------------------------------------------- handlers
def run_command(args, progress=None) -> int:
    from ..report import table

    try:
        with contextlib.ExitStack() as stack:
            session = stack.enter_context(_open(args.model, args))
            if args.generate:
                parts = _parts(args, stack)
                with _step(progress, f"generating {args.generate} tokens with {session.name} ({session.backend})"):
                    gen = _generate(args, session, parts)
                result = {"model": str(args.model), "backend": session.backend, "cache": gen.cache,
                          "requests": [{"prompt_length": n, "tokens": t} for n, t in zip(gen.prompt_lengths, gen.tokens)]}
                if args.json:
                    print(json.dumps(result, indent=2))
                else:
                    print(f"{session.name} on {session.backend}, {gen.cache} KV cache, {len(gen.tokens)} requests:")
                    for i, (n, toks) in enumerate(zip(gen.prompt_lengths, gen.tokens)):
                        print(f"  request {i} (prompt of {n} tokens): {' '.join(map(str, toks))}")
                if args.save:
                    width = max(len(t) for t in gen.tokens)
                    tokens = np.full((len(gen.tokens), width), -1, np.int64)
                    for i, t in enumerate(gen.tokens):
                        tokens[i, :len(t)] = t
                    np.savez(args.save, tokens=tokens, prompt_lengths=np.asarray(gen.prompt_lengths))
                return 0
            feeds = _feeds(session, args)
            with _step(progress, f"running {session.name} on {session.backend}"):
                outputs = session.run(feeds)
            rows = _summary(outputs)
            if args.json:
                print(json.dumps({"model": str(args.model), "backend": session.backend, "outputs": rows}, indent=2))
            else:
                print(f"{session.name} on {session.backend}: inputs " +
                      ", ".join(f"{k}:{'x'.join(map(str, v.shape))}" for k, v in feeds.items()))
                print(table(rows, [("name", "output"), ("shape", "shape"), ("dtype", "dtype"), ("min", "min"),
                                   ("max", "max"), ("mean", "mean"), ("nan", "NaNs")]))
            if args.save:
                np.savez(args.save, **outputs)
                print(f"wrote {args.save}")
            return 0
    except MissingDependencyError as e:
        return _no_trt(e)


def bench_command(args, progress=None) -> int:
    from .bench import bench, bench_callable, markdown_table

    try:
        with contextlib.ExitStack() as stack:
            session = stack.enter_context(_open(args.model, args, threads=getattr(args, "threads", None)))
            if args.generate:
                parts = _parts(args, stack)
                prompts = _prompts(args)
                tokens = len(prompts) * args.generate
                memory = session.memory if session.backend == "tensorrt" else None
                with _step(progress, f"benchmarking generation of {args.generate} tokens x {len(prompts)} requests"):
                    result = bench_callable(lambda: _generate(args, session, parts), name=f"{session.name} (generate)",
                                            backend=session.backend,
                                            shapes=f"{len(prompts)} prompts, {args.generate} new tokens",
                                            iterations=args.iterations, warmup=args.warmup, sequences=len(prompts),
                                            tokens=tokens, memory=memory)
            else:
                feeds = _feeds(session, args)
                with _step(progress, f"benchmarking {session.name} on {session.backend}"):
                    result = bench(session, feeds, iterations=args.iterations, warmup=args.warmup)
            if args.json:
                print(json.dumps({**result.row(), "latencies_ms": result.latencies_ms}, indent=2))
            else:
                print(markdown_table([result]))
                note = getattr(session, "graph_note", None)
                if note:
                    print(f"note: {note}")
            return 0
    except MissingDependencyError as e:
        return _no_trt(e)


class _NoStep:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _step(progress, text):
    return progress.step(text) if progress is not None else _NoStep()


def main(argv=None) -> int:
    """Stand-alone entry (python -m trtattn.runtime.cli run|bench ...) until trtattn/cli.py wires these in."""
    import argparse

    from ..report import Progress

    ap = argparse.ArgumentParser(prog="trtattn")
    ap.add_argument("-q", "--quiet", action="store_true")
    sub = ap.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    add_bench_parser(sub)
    args = ap.parse_args(argv)
    progress = Progress(enabled=not args.quiet)
    try:
        return run_command(args, progress) if args.command == "run" else bench_command(args, progress)
    except TrtattnError as e:
        print(f"trtattn: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
