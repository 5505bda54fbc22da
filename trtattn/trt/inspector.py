"""An engine's layer information through TensorRT's IEngineInspector, as the JSON trtexec --exportLayerInfo
writes (trtattn.inspect parses it; this module only deserializes the engine, since only trt/ imports tensorrt).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import MissingDependencyError, TrtattnError
from . import compat


def engine_layer_info(path: str | Path, data: bytes | None = None) -> tuple[str, str]:
    """(the engine's layer information as JSON text, the TensorRT version that read it)."""
    path = Path(path)
    try:
        trt = compat.import_tensorrt()
    except (MissingDependencyError, OSError) as e:  # not installed, or its libraries do not load
        raise MissingDependencyError(
            f"reading the engine {path.name} needs TensorRT >= 11, which cannot be imported here "
            f"({'not installed' if isinstance(e, MissingDependencyError) else type(e).__name__}; pip install "
            "--extra-index-url https://pypi.nvidia.com tensorrt-cu13, or use the docker/ container), whereas a "
            "trtexec --exportLayerInfo JSON or --dumpLayerInfo log of it is read without TensorRT") from None
    data = path.read_bytes() if data is None else data
    try:
        runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
        engine = runtime.deserialize_cuda_engine(data)
    except Exception as e:
        raise TrtattnError(f"TensorRT {trt.__version__} could not load {path.name}: "
                           f"{' '.join(str(e).split())}") from None
    if engine is None:
        raise TrtattnError(f"TensorRT {trt.__version__} could not deserialize {path.name} (not an engine, or built "
                           "by another TensorRT version or for another GPU)")
    if engine.profiling_verbosity == trt.ProfilingVerbosity.NONE:
        raise TrtattnError(f"{path.name} was built with profiling verbosity NONE, so it holds no layer information; "
                           "rebuild it with ProfilingVerbosity.DETAILED")
    inspector = engine.create_engine_inspector()
    return inspector.get_engine_information(trt.LayerInformationFormat.JSON), trt.__version__
