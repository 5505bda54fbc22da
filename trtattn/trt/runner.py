"""Polygraphy runners for engines built by trtattn.

Padded and packed engines run through Polygraphy's own TrtRunner. KV-cache engines update their
caches in place (each cache output aliases its input), which needs one device buffer bound to
both: they run through trtattn's TensorRT session (trt/session.py), wrapped as a Polygraphy runner
so the same Comparator judges them.
"""

from __future__ import annotations

from pathlib import Path

from ..contract import load_sidecar
from ..errors import TrtattnError
from . import compat


def engine_runner(engine: Path, sidecar: dict | None = None):
    """(Polygraphy runner, engine input names, cache input names) for a serialized engine."""
    if not engine.exists():
        raise TrtattnError(f"{engine}: no such file")
    compat.import_tensorrt()
    info = sidecar if sidecar is not None else (load_sidecar(engine) or {})
    io = info.get("io", {})
    inputs = [i["name"] for i in io.get("inputs", [])]
    aliases = io.get("aliases", {})
    if aliases:
        from polygraphy.backend.base import BaseRunner

        from .session import TrtSession

        class SessionRunner(BaseRunner):
            def __init__(self):
                super().__init__(name="tensorrt", prefix="trtattn-runner")

            def activate_impl(self):
                self.session = TrtSession(engine, sidecar=info or None)

            def get_input_metadata_impl(self):
                from polygraphy.common import TensorMetadata

                meta = TensorMetadata()
                for spec in self.session.inputs:
                    meta.add(spec.name, spec.dtype, spec.shape)
                return meta

            def infer_impl(self, feed_dict):
                return self.session.run(feed_dict)

            def deactivate_impl(self):
                del self.session

        return SessionRunner(), inputs, list(aliases.values())
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    runner = TrtRunner(EngineFromBytes(BytesFromPath(str(engine))), name="tensorrt")
    if not inputs:
        trt = compat.import_tensorrt()
        eng = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(engine.read_bytes())
        inputs = [eng.get_tensor_name(i) for i in range(eng.num_io_tensors)
                  if eng.get_tensor_mode(eng.get_tensor_name(i)) == trt.TensorIOMode.INPUT]
    return runner, inputs, []
