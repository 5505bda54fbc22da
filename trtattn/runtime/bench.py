"""Benchmarks for either back end: latency percentiles, throughput, peak memory; a markdown table.

    result = bench(session, feeds, iterations=50, warmup=5)
    print(markdown_table([result]))

Latency is wall time per `session.run` (host to host: input copies, execution, output copies).
Throughput counts sequences (the batch; a packed batch's len(cu_seqlens) - 1) and tokens (the
token inputs' elements). Memory: ONNX Runtime reports the process's peak resident set during the
timed runs (VmHWM after resetting it through /proc/self/clear_refs; where that is not allowed, the
process's lifetime peak, ru_maxrss); TensorRT reports device memory in use (cudaMemGetInfo,
the highest seen after any run). Timings belong here, never in test asserts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..contract import CU_SEQLENS, WRITE_INDEX, cu_seqlens, pack_rows
from ..errors import TrtattnError
from ..host_memory import peak_rss, reset_peak_rss

MIB = 1 << 20


@dataclass
class BenchResult:
    name: str
    backend: str
    shapes: str
    iterations: int
    warmup: int
    latencies_ms: list[float] = field(repr=False, default_factory=list)
    sequences: int = 0  # per run
    tokens: int = 0  # per run
    peak_memory: int | None = None  # bytes
    memory_kind: str = ""

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    @property
    def mean_ms(self) -> float:
        return float(np.mean(self.latencies_ms)) if self.latencies_ms else float("nan")

    def row(self) -> dict:
        mean_s = self.mean_ms / 1e3
        return {"name": self.name, "backend": self.backend, "shapes": self.shapes, "iterations": self.iterations,
                "p50": self.percentile(50), "p90": self.percentile(90), "p99": self.percentile(99),
                "mean": self.mean_ms,
                "seq_per_s": self.sequences / mean_s if self.sequences and mean_s > 0 else None,
                "tok_per_s": self.tokens / mean_s if self.tokens and mean_s > 0 else None,
                "peak_mib": self.peak_memory / MIB if self.peak_memory is not None else None,
                "memory": self.memory_kind}


COLUMNS = [("name", "model"), ("backend", "backend"), ("shapes", "shapes"), ("iterations", "iterations"),
           ("p50", "p50 ms"), ("p90", "p90 ms"), ("p99", "p99 ms"), ("mean", "mean ms"),
           ("seq_per_s", "sequences/s"), ("tok_per_s", "tokens/s"), ("peak_mib", "peak memory MiB"),
           ("memory", "memory measured")]


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v).replace("|", "\\|")


def markdown_table(results: list[BenchResult], columns=COLUMNS) -> str:
    rows = [r.row() for r in results]
    lines = ["| " + " | ".join(h for _, h in columns) + " |",
             "|" + "|".join("---:" if k not in ("name", "backend", "shapes", "memory") else "---" for k, _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(k)) for k, _ in columns) + " |")
    return "\n".join(lines)


def count_work(session, feeds: dict) -> tuple[int, int]:
    """(sequences, tokens) one run of these feeds processes."""
    if CU_SEQLENS in feeds:
        cu = np.asarray(feeds[CU_SEQLENS])
        return len(cu) - 1, int(cu[-1])
    ids = next((np.asarray(feeds[n]) for n in ("input_ids", "decoder_input_ids") if n in feeds), None)
    if ids is not None and ids.ndim == 2:
        return int(ids.shape[0]), int(ids.size)
    first = next((np.asarray(v) for k, v in feeds.items() if k in session.input_names), None)
    return (int(first.shape[0]) if first is not None and first.ndim else 0), 0


def describe_shapes(feeds: dict, names=None) -> str:
    keys = [k for k in feeds if names is None or k in names]
    return ", ".join(f"{k}:{'x'.join(str(d) for d in np.asarray(feeds[k]).shape)}" for k in keys[:4]) + \
        (f" (+{len(keys) - 4})" if len(keys) > 4 else "")


def bench_callable(fn, *, name: str, backend: str, shapes: str = "", iterations: int = 20, warmup: int = 3,
                   sequences: int = 0, tokens: int = 0, memory=None) -> BenchResult:
    """Time `fn()` (warmup runs first). `memory()` -> {"kind", "bytes"} is sampled after every timed
    run (device memory); without it the host's peak RSS over the timed runs is reported."""
    if iterations < 1 or warmup < 0:
        raise TrtattnError("iterations must be >= 1 and warmup >= 0")
    for _ in range(warmup):
        fn()
    reset = memory is None and reset_peak_rss()
    peak, kind = None, ""
    latencies = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        latencies.append((time.perf_counter() - t0) * 1e3)
        if memory is not None:
            m = memory()
            kind = m.get("kind", "")
            if m.get("bytes") is not None:
                peak = max(peak or 0, int(m["bytes"]))
    if memory is None:
        peak = peak_rss()
        kind = "host peak RSS" + ("" if reset else " (process lifetime)")
    return BenchResult(name, backend, shapes, iterations, warmup, latencies, sequences, tokens, peak, kind)


def bench(session, feeds: dict, *, iterations: int = 20, warmup: int = 3, name: str | None = None,
          outputs=None) -> BenchResult:
    """Latency and throughput of `session.run(feeds)`."""
    own = {k: v for k, v in feeds.items() if k in session.input_names}
    sequences, tokens = count_work(session, own)
    memory = session.memory if session.backend == "tensorrt" else None
    return bench_callable(lambda: session.run(own, outputs=outputs), name=name or session.name, backend=session.backend,
                          shapes=describe_shapes(own), iterations=iterations, warmup=warmup, sequences=sequences,
                          tokens=tokens, memory=memory)


# ---------------------------------------------------------------- inputs when none are given
def synthesize_feeds(session, *, dims: dict | None = None, seed: int = 0, model=None) -> dict[str, np.ndarray]:
    """Feeds for every input: from the ONNX model's input roles (trtattn.inputs.make_feeds) where
    there is one (an ONNX session's own model, or an engine sidecar's source model), else from
    names and shapes; dynamic dims from `dims`, the sidecar's dim names and its profile's opt shape.
    The inputs the forms add get consistent values: cache_write_index 0, cu_seqlens splitting the
    tokens evenly, positions 0..S-1."""
    from ..graph.dim_names import DEFAULT_DIMS, dim_value, resolve_dims
    from ..graph.feeds import make_feeds

    rng = np.random.default_rng(seed)
    model = model if model is not None else getattr(session, "model", None)
    if model is None and session.sidecar and session.sidecar.get("source") and Path(session.sidecar["source"]).exists():
        from ..graph import io as onnxio

        model = onnxio.load(session.sidecar["source"])
    dims = resolve_dims(model, dims) if model is not None else {**DEFAULT_DIMS, **(dims or {})}
    named = {io["name"]: io["shape"] for io in ((session.sidecar or {}).get("io") or {}).get("inputs", [])}
    profiles = (session.sidecar or {}).get("profiles") or []  # [{input: {"min", "opt", "max"}}]: the first
    opt = {name: row["opt"] for name, row in (profiles[0] if profiles else {}).items()}
    base = {}
    if model is not None:
        shapes = {}
        for info in session.inputs:
            shapes[info.name] = _shape(info, named, opt, dims, dim_value)
        try:
            base = make_feeds(model, dims=dims, seed=seed, shapes=shapes)
        except Exception:
            base = {}
    feeds = {}
    for info in session.inputs:
        shape = _shape(info, named, opt, dims, dim_value)
        if info.name in base and tuple(base[info.name].shape) == tuple(shape):
            feeds[info.name] = base[info.name].astype(info.dtype, copy=False)
            continue
        low = info.name.lower()
        if info.dtype.kind in "iu":
            value: np.ndarray
            if "position" in low:
                value = np.broadcast_to(np.arange(shape[-1] if shape else 1), shape)
            elif "mask" in low:
                value = np.ones(shape)
            else:
                value = rng.integers(0, 2, size=shape)
            feeds[info.name] = np.asarray(value).astype(info.dtype)
        elif info.dtype == np.bool_:
            feeds[info.name] = np.ones(shape, np.bool_)
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(info.dtype)
    if WRITE_INDEX in feeds:
        feeds[WRITE_INDEX] = np.zeros_like(feeds[WRITE_INDEX])
    if CU_SEQLENS in feeds:
        total = next((v.shape[1] for k, v in feeds.items() if v.ndim == 2 and v.shape[0] == 1), 0)
        rows = max(len(feeds[CU_SEQLENS]) - 1, 1)
        lengths = np.diff(np.linspace(0, total, rows + 1).round().astype(np.int64))  # the tokens split evenly
        feeds[CU_SEQLENS] = cu_seqlens(lengths).astype(feeds[CU_SEQLENS].dtype)
        if "position_ids" in feeds and feeds["position_ids"].ndim == 2:
            positions = pack_rows(np.arange(n) for n in lengths)
            feeds["position_ids"] = positions.astype(feeds["position_ids"].dtype)
    return feeds


def _shape(info, named, opt, dims, dim_value) -> list[int]:
    out = []
    names = named.get(info.name) or []
    for axis, d in enumerate(info.shape):
        if isinstance(d, int) and d >= 0:
            out.append(d)
            continue
        label = d if isinstance(d, str) else (names[axis] if axis < len(names) and isinstance(names[axis], str) else None)
        if label is not None:
            out.append(dim_value(label, dims))
        elif info.name in opt:
            out.append(int(opt[info.name][axis]))
        else:
            out.append(dim_value(None, dims))
    return out
