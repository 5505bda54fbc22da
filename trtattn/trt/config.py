"""Builder configuration: optimisation profiles (computed in profiles.py), timing cache, progress monitor,
layer-info detail.

TensorRT 11 networks are strongly typed: precision comes from tensor types (the whole-model conversion of
rewrite/precision/, FP8/INT8 Q/DQ from rewrite/quantize), not from builder flags. The profiling
verbosity is DETAILED so that layer info names kernels and carries each IAttention's metadata, which
`trtattn inspect` reads.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

PROFILING_VERBOSITY = "DETAILED"  # the sidecar records it: inspect proves fusion from kernel names


def progress_monitor(trt: Any, stream=None):
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


def create_config(trt, builder, network, profiles: list[dict], *, workspace_mb: int | None = None,
                  timing_cache: Path | None = None, progress: bool = True):
    config = builder.create_builder_config()
    config.profiling_verbosity = getattr(trt.ProfilingVerbosity, PROFILING_VERBOSITY)  # kernels and metadata
    if workspace_mb:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for name, row in shapes.items():
            profile.set_shape(name, tuple(row["min"]), tuple(row["opt"]), tuple(row["max"]))
        config.add_optimization_profile(profile)
    if timing_cache is not None:
        data = timing_cache.read_bytes() if timing_cache.exists() else b""
        config.set_timing_cache(config.create_timing_cache(data), False)
    if progress:
        config.progress_monitor = progress_monitor(trt)
    return config
