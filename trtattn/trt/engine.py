"""Build the engine and write engines/NAME.engine with its NAME.json sidecar, atomically."""

from __future__ import annotations

import json
import platform
from pathlib import Path

from ..errors import TrtattnError
from ..graph.io import atomic_write
from ..version import __version__
from .config import PROFILING_VERBOSITY


def gpu_name() -> str:
    """The GPU the engine is built on, for the sidecar ("unknown" where CUDA cannot say)."""
    from .cuda import Cuda

    try:
        return Cuda.load().device_name(0)
    except Exception:  # no cuda-python or no device: the sidecar says so
        return "unknown"


def build_serialized(trt, builder, network, config):
    """The serialized engine (TensorRT's IHostMemory, a buffer)."""
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise TrtattnError("TensorRT could not build the engine (see the log above); with --decomposable "
                           "attentions that have no fused kernel fall back to unfused layers")
    return blob


def write_engine(engine, sidecar: dict, out_dir: Path, name: str, force: bool = False) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    engine_path, json_path = out_dir / f"{name}.engine", out_dir / f"{name}.json"
    if engine_path.exists() and not force:
        raise TrtattnError(f"{engine_path} exists; pass --force to replace it")
    atomic_write(engine_path, memoryview(engine).tobytes())
    atomic_write(json_path, (json.dumps(sidecar, indent=2, default=str) + "\n").encode())
    return engine_path, json_path


def sidecar(plan, *, trt_version: str | None, source: str, gpu: str | None = None) -> dict:
    """NAME.json: what was built, how (profiles, verbosity, decomposable per site) and the I/O contract."""
    return {
        "name": plan.name,
        "source": source,
        "trtattn_version": __version__,
        "tensorrt_version": trt_version,
        "gpu": gpu,
        "host": platform.node(),
        "form": plan.form,
        "precision": plan.precision,
        "profiling_verbosity": PROFILING_VERBOSITY,
        "profiles": plan.profiles,
        "limits": plan.limits_json(),
        "precision_table": plan.precision_table,
        "io": plan.io_json(),
        "sites": [{"name": a.site, "layer": a.layer if a.reason is None else None, "onnx_node": a.node,
                   "dtype": a.dtype, "causal": a.causal, "mask": a.mask_kind if a.mask else "none",
                   "query_form": a.query_form, "kv_form": a.kv_form, "kv_lengths": a.kv_lengths,
                   "normalization_quantize_to_type": a.normalization_quantize_to_type,
                   "decomposable": a.decomposable, "reason": a.reason,
                   "q_heads": a.q_heads, "kv_heads": a.kv_heads, "head_size": a.head_size}
                  for a in plan.attentions],
        "rope": [r.node for r in plan.ropes],
        "kv_cache": [c.node for c in plan.cache_updates],
        "notes": plan.notes,
    }
