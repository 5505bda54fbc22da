"""Builder configuration: optimisation profiles, timing cache, progress monitor, layer-info detail.

TensorRT 11 networks are strongly typed: precision comes from tensor types (the attention's is set
by casts in lower.py, FP8/INT8 by Q/DQ from the quantize pass), not from builder flags.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import TrtattnError
from ..graph.inputs import dim_value


def parse_shapes(text: str | None) -> dict[str, tuple[int, ...]]:
    """trtexec style: 'input_ids:1x16,attention_mask:1x16' -> {name: (1, 16)}."""
    out = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, dims = part.rpartition(":")
        if not sep or not name:
            raise TrtattnError(f"bad shape '{part}': expected name:AxBxC")
        try:
            out[name] = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            raise TrtattnError(f"bad shape '{part}': dimensions must be integers separated by 'x'") from None
    return out


FIXED_DIM = "max_cache"
DEFAULT_MAX_CACHE = 256


def default_profile(inputs: list[dict], dims: dict[str, int], max_factor: int = 4) -> list[dict]:
    """min/opt/max per input: dynamic dims run from 1 (batch) or 1 (sequence) to max_factor x the
    verification value; static dims stay. Caches keep their capacity."""
    rows = []
    for io in inputs:
        shape = io["shape"]
        if all(isinstance(d, int) and d > 0 for d in shape):
            continue
        opt = tuple(d if isinstance(d, int) and d > 0 else dim_value(d if isinstance(d, str) else None, dims) for d in shape)
        fixed = [isinstance(s, int) and s > 0 or s == FIXED_DIM for s in shape]  # a cache's capacity does not vary
        low = tuple(d if f else 1 for d, f in zip(opt, fixed))
        high = tuple(d if f else d * max_factor for d, f in zip(opt, fixed))
        rows.append({"name": io["name"], "min": list(low), "opt": list(opt), "max": list(high)})
    return rows


def apply_overrides(profile: list[dict], minimum: dict, optimum: dict, maximum: dict) -> list[dict]:
    by_name = {p["name"]: p for p in profile}
    for key, table in (("min", minimum), ("opt", optimum), ("max", maximum)):
        for name, shape in table.items():
            if name not in by_name:
                raise TrtattnError(f"--{key}-shapes names '{name}', which is not a dynamic engine input "
                                   f"({', '.join(by_name) or 'none'})")
            by_name[name][key] = list(shape)
    for p in profile:
        if not all(a <= b <= c for a, b, c in zip(p["min"], p["opt"], p["max"])):
            raise TrtattnError(f"profile for '{p['name']}': min {p['min']} <= opt {p['opt']} <= max {p['max']} does not hold")
    return profile


def progress_monitor(trt, stream=None):
    """An IProgressMonitor that prints TensorRT's build phases and steps (a text progress bar)."""
    stream = stream or sys.stderr

    class Monitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)
            self._steps: dict[str, int] = {}

        def phase_start(self, phase_name, parent_phase, num_steps):
            self._steps[phase_name] = int(num_steps)
            indent = "  " if parent_phase else ""
            print(f"[trtattn] {indent}{phase_name} ({num_steps} steps)", file=stream, flush=True)

        def step_complete(self, phase_name, step):
            total = self._steps.get(phase_name, 0)
            if total > 1:
                done = int(20 * (int(step) + 1) / total)
                print(f"\r[trtattn]   [{'#' * done}{'.' * (20 - done)}] {int(step) + 1}/{total}", file=stream,
                      end="", flush=True)
            return True  # False would cancel the build

        def phase_finish(self, phase_name):
            if self._steps.get(phase_name, 0) > 1:
                print(file=stream, flush=True)

    return Monitor()


def create_config(trt, builder, network, profile: list[dict], *, workspace_mb: int | None = None,
                  timing_cache: Path | None = None, progress: bool = True):
    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # layer info shows kernels and metadata
    if workspace_mb:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    if profile:
        opt = builder.create_optimization_profile()
        for p in profile:
            opt.set_shape(p["name"], tuple(p["min"]), tuple(p["opt"]), tuple(p["max"]))
        config.add_optimization_profile(opt)
    if timing_cache is not None:
        data = timing_cache.read_bytes() if timing_cache.exists() else b""
        config.set_timing_cache(config.create_timing_cache(data), False)
    if progress:
        config.progress_monitor = progress_monitor(trt)
    return config
