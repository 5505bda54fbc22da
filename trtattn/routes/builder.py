"""The Python-builder route (`trtattn build`): the prepared form parsed by TensorRT's OnnxParser with every
planned site lowered through the network API (IAttention, KV-cache update, rotary embedding), configured
(profiles, timing cache, progress), built, and written as engine + sidecar.

    prepared = prepare(model, name="llama", form="padded", precision="fp16")   # routes/prepare, no TensorRT
    engine_path, sidecar_path = build(prepared, trt, "engines")               # TensorRT >= 11
"""

from __future__ import annotations

from pathlib import Path

from .prepare import Prepared


def build(prepared: Prepared, trt, out_dir: str | Path, *, force: bool = False, timing_cache: Path | None = None,
          workspace_mb: int | None = None, progress: bool = True, logger=None, write: bool = True):
    """Build with the given tensorrt module. Returns (engine path, sidecar path) or, with
    write=False, the serialized engine and the sidecar dict."""
    from ..trt import engine as engine_mod
    from ..trt.config import create_config
    from ..trt.network import build_network

    logger = logger or trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = build_network(trt, builder, logger, prepared.cut, prepared.plan)
    config = create_config(trt, builder, network, prepared.plan.profiles, workspace_mb=workspace_mb,
                           timing_cache=timing_cache, progress=progress)
    blob = engine_mod.build_serialized(trt, builder, network, config)
    if timing_cache is not None:
        engine_mod.atomic_write(Path(timing_cache), bytes(config.get_timing_cache().serialize()))
    info = engine_mod.sidecar(prepared.plan, trt_version=getattr(trt, "__version__", None), source=prepared.source,
                              gpu=engine_mod.gpu_name())
    if not write:
        return blob, info
    return engine_mod.write_engine(blob, info, Path(out_dir), prepared.plan.name, force=force)
