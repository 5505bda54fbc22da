"""The CUDA runtime calls trtattn makes, through cuda-python (cuda.bindings.runtime >= 12.6), each checked.

cuda-python returns (err, *values) from every call; `Cuda.check` turns a failure into a CudaError
naming the call, and returns the values. Imported lazily: `Cuda.load()` is the only import of
cuda-python, and a missing one is one sentence saying what to install.
"""

from __future__ import annotations

import numpy as np

from ..errors import TrtattnError, require

INSTALL = ("pip install 'cuda-python>=12.6' (the trt extra: pip install -e '.[trt]'), on a machine with an "
           "NVIDIA GPU and driver, or use the container in docker/")


class CudaError(TrtattnError):
    """A CUDA runtime call failed."""


def import_cudart():
    """cuda-python's runtime bindings (cuda.bindings.runtime, cuda-python >= 12.6), or one sentence."""
    return require("cuda.bindings.runtime", "running a TensorRT engine", INSTALL)


class Cuda:
    """The checked calls, over a cuda.bindings.runtime module (or a stand-in with its names)."""

    def __init__(self, rt):
        self.rt = rt

    @classmethod
    def load(cls) -> Cuda:
        return cls(import_cudart())

    def check(self, result, what: str):
        err, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
        if err != self.rt.cudaError_t.cudaSuccess:
            name, text = self.rt.cudaGetErrorName(err)[1], self.rt.cudaGetErrorString(err)[1]
            name = name.decode() if isinstance(name, bytes) else str(name)
            text = text.decode() if isinstance(text, bytes) else str(text)
            raise CudaError(f"CUDA {what} failed: {name} ({text})")
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else rest

    def device_name(self, device: int = 0) -> str:
        props = self.check(self.rt.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
        return props.name.decode() if isinstance(props.name, bytes) else str(props.name)

    def device_count(self) -> int:
        return int(self.check(self.rt.cudaGetDeviceCount(), "cudaGetDeviceCount"))

    def set_device(self, device: int) -> None:
        self.check(self.rt.cudaSetDevice(device), "cudaSetDevice")

    def malloc(self, nbytes: int) -> int:
        return int(self.check(self.rt.cudaMalloc(max(int(nbytes), 1)), "cudaMalloc"))

    def free(self, ptr: int) -> None:
        self.check(self.rt.cudaFree(ptr), "cudaFree")

    def memset(self, ptr: int, nbytes: int, stream) -> None:
        if nbytes:
            self.check(self.rt.cudaMemsetAsync(ptr, 0, nbytes, stream), "cudaMemsetAsync")

    def h2d(self, dst: int, array: np.ndarray, stream) -> None:
        if array.nbytes:
            self.check(self.rt.cudaMemcpyAsync(dst, array.ctypes.data, array.nbytes,
                                               self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (H2D)")

    def d2h(self, array: np.ndarray, src: int, stream) -> None:
        if array.nbytes:
            self.check(self.rt.cudaMemcpyAsync(array.ctypes.data, src, array.nbytes,
                                               self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (D2H)")

    def stream_create(self):
        return self.check(self.rt.cudaStreamCreateWithFlags(self.rt.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")

    def stream_destroy(self, stream) -> None:
        self.check(self.rt.cudaStreamDestroy(stream), "cudaStreamDestroy")

    def sync(self, stream) -> None:
        self.check(self.rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def mem_info(self) -> tuple[int, int]:
        free, total = self.check(self.rt.cudaMemGetInfo(), "cudaMemGetInfo")
        return int(free), int(total)

    # CUDA graphs
    def begin_capture(self, stream) -> None:
        self.check(self.rt.cudaStreamBeginCapture(stream, self.rt.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal),
                   "cudaStreamBeginCapture")

    def end_capture(self, stream):
        return self.check(self.rt.cudaStreamEndCapture(stream), "cudaStreamEndCapture")

    def instantiate(self, graph):
        return self.check(self.rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")

    def launch(self, graph_exec, stream) -> None:
        self.check(self.rt.cudaGraphLaunch(graph_exec, stream), "cudaGraphLaunch")

    def destroy_graph(self, graph, graph_exec) -> None:
        if graph_exec is not None:
            self.check(self.rt.cudaGraphExecDestroy(graph_exec), "cudaGraphExecDestroy")
        if graph is not None:
            self.check(self.rt.cudaGraphDestroy(graph), "cudaGraphDestroy")


class DeviceBuffer:
    """Raw device memory that grows (doubling) and never shrinks."""

    def __init__(self, cuda: Cuda, nbytes: int):
        self.cuda = cuda
        self.nbytes = max(int(nbytes), 1)
        self.ptr = cuda.malloc(self.nbytes)

    def ensure(self, nbytes: int) -> int:
        if nbytes > self.nbytes:
            self.cuda.free(self.ptr)
            self.ptr = 0
            self.nbytes = max(int(nbytes), 2 * self.nbytes)
            self.ptr = self.cuda.malloc(self.nbytes)
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            self.cuda.free(self.ptr)
            self.ptr = 0
