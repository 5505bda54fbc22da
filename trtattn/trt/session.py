"""The TensorRT back end of trtattn.runtime: a serialized engine run with cuda-python (trt/cuda.py).

- Named I/O tensors (TensorRT >= 10): `engine.num_io_tensors / get_tensor_name / get_tensor_mode /
  get_tensor_dtype`, `context.set_input_shape`, `context.set_tensor_address`, `infer_shapes`,
  `execute_async_v3(stream)` on a stream of our own; output shapes from `context.get_tensor_shape`
  once the inputs are set, or an IOutputAllocator where they depend on data.
- In place: an output aliased to an input (IKVCacheUpdateLayer; `engine.get_aliased_input_tensor`)
  is bound to the input's device buffer. A cache kept as session state (`set_state` / `zeros_state`)
  stays on the device across decode steps: no host copies, only the outputs asked for come back.
- `carry={output: input}` (a growing concat cache) makes the output's device buffer the input's
  state and recycles the old one for the next output: still no copies.
- CUDA graphs (`cuda_graph=True`): a run whose input shapes and every bound address equal the
  previous run's is captured once (after that previous eager run, as TensorRT requires an enqueue
  after shape changes before capture) and replayed with cudaGraphLaunch from then on; a change of
  shape or address drops the graph. Decoding with a static cache keeps both fixed, so every decode
  step after the second is one graph launch. Engines that cannot be captured run eagerly
  (`graph_note` says why).

tensorrt and cuda-python are imported when a session is created, never at `import trtattn`. Open
sessions through trtattn.runtime.open_session (which picks the back end) or construct TrtSession.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..contract import load_sidecar
from ..errors import TrtattnError
from ..session import Session, TensorInfo
from . import compat
from .cuda import Cuda, CudaError, DeviceBuffer


class _DeviceTensor:
    __slots__ = ("buffer", "shape")

    def __init__(self, buffer: DeviceBuffer, shape: tuple):
        self.buffer, self.shape = buffer, tuple(int(d) for d in shape)


def _volume(shape) -> int:
    return int(math.prod(int(d) for d in shape))


def _make_output_allocator(trt, dev: Cuda):
    """An IOutputAllocator for outputs whose shape depends on data (as Polygraphy's TrtRunner has)."""

    class OutputAllocator(trt.IOutputAllocator):
        def __init__(self):
            trt.IOutputAllocator.__init__(self)
            self.buffers: dict[str, DeviceBuffer] = {}
            self.shapes: dict[str, tuple] = {}

        def reallocate_output(self, tensor_name, memory, size, alignment):
            buf = self.buffers.get(tensor_name)
            if buf is None:
                buf = self.buffers[tensor_name] = DeviceBuffer(dev, size)
            return buf.ensure(size)

        def reallocate_output_async(self, tensor_name, memory, size, alignment, stream):
            return self.reallocate_output(tensor_name, memory, size, alignment)

        def notify_shape(self, tensor_name, shape):
            self.shapes[tensor_name] = tuple(int(d) for d in shape)

    return OutputAllocator()


class TrtSession(Session):
    backend = "tensorrt"

    def __init__(self, engine, *, sidecar: dict | None = None, name: str | None = None, cuda_graph: bool = False,
                 device: int = 0, profile: int = 0, severity: str = "WARNING", communicator=None):
        if isinstance(engine, (str, Path)) and not Path(engine).is_file():
            raise TrtattnError(f"{engine}: no such engine file")
        trt = compat.import_tensorrt()
        self._trt = trt
        self._cuda = cuda = Cuda.load()
        self._closed = True
        try:
            count = cuda.device_count()
        except CudaError as e:
            raise TrtattnError(f"no usable CUDA device for TensorRT ({e})") from None
        if count <= device:
            raise TrtattnError(f"no CUDA device {device} (this machine has {count})")
        if isinstance(engine, (str, Path)):
            path = Path(engine)
            name = name or path.stem
            sidecar = sidecar if sidecar is not None else load_sidecar(path)
            blob = path.read_bytes()
        elif isinstance(engine, (bytes, bytearray, memoryview)):
            blob = bytes(engine)
        else:
            raise TrtattnError(f"TrtSession takes a serialized engine (path or bytes), not {type(engine).__name__}")
        name = name or (sidecar or {}).get("name") or "engine"
        cuda.set_device(device)
        self._logger = trt.Logger(getattr(trt.Logger, severity))
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(blob)
        if self.engine is None:
            raise TrtattnError(f"{name}: TensorRT {trt.__version__} could not deserialize the engine (built by another "
                               "TensorRT version or for another GPU? see TensorRT's log above)")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise TrtattnError(f"{name}: TensorRT could not create an execution context (out of device memory?)")
        if communicator is not None:  # a rank engine: its collectives run over this NCCL communicator
            # (a collective call: it returns once every rank of the set has set its own)
            if not self.context.set_communicator(communicator):
                raise TrtattnError(f"{name}: TensorRT refused the NCCL communicator (set_communicator returned False)")
        self.stream = cuda.stream_create()
        self._closed = False
        if profile:
            if not self.context.set_optimization_profile_async(profile, int(self.stream)):
                raise TrtattnError(f"{name}: cannot select optimisation profile {profile}")
        inputs: list[TensorInfo] = []
        outputs: list[TensorInfo] = []
        for i in range(self.engine.num_io_tensors):
            tname = self.engine.get_tensor_name(i)
            info = TensorInfo(tname, compat.numpy_dtype(trt, self.engine.get_tensor_dtype(tname)),
                              tuple(int(d) for d in self.engine.get_tensor_shape(tname)))
            (inputs if self.engine.get_tensor_mode(tname) == trt.TensorIOMode.INPUT else outputs).append(info)
        super().__init__(name, inputs, outputs, self._engine_aliases(outputs, sidecar), sidecar)
        self._shape_io = {t.name for t in inputs + outputs if self.engine.is_shape_inference_io(t.name)}
        self._in_bufs: dict[str, DeviceBuffer] = {}
        self._out_bufs: dict[str, DeviceBuffer] = {}
        self._state: dict[str, _DeviceTensor] = {}
        self._bound_shape: dict[str, tuple] = {}
        self._bound_addr: dict[str, int] = {}
        self._allocator: Any = None  # a trt.IOutputAllocator subclass, made for the first data-dependent output
        self.cuda_graph = bool(cuda_graph)
        self.graph_note: str | None = None
        self.graph_captures = 0
        self.graph_launches = 0
        self._graph: tuple[Any, Any, Any] | None = None  # (key, graph, graph_exec)
        self._last_key: tuple | None = None

    def _engine_aliases(self, outputs, sidecar) -> dict[str, str]:
        """The engine says which outputs alias which inputs (TensorRT >= 10.15); the sidecar must agree."""
        declared = dict(((sidecar or {}).get("io") or {}).get("aliases") or {})
        if not hasattr(self.engine, "get_aliased_input_tensor"):
            return declared
        found = {}
        for o in outputs:
            alias = self.engine.get_aliased_input_tensor(o.name)
            if alias:
                found[o.name] = alias
        for out, inp in declared.items():
            if found.get(out) != inp:
                raise TrtattnError(f"the sidecar says {out} updates {inp} in place, the engine says "
                                   f"{found.get(out) or 'it aliases nothing'}; the sidecar belongs to another engine")
        return found

    # ---------------------------------------------------------------- state on the device
    def set_state(self, name, value):
        if name not in self._inputs:
            raise TrtattnError(f"{self.name}: no input named {name}")
        array = self._cast(name, value)
        buf = self._state_buffer(name, array.nbytes)
        self._cuda.h2d(buf.ptr, array, self.stream)
        self._cuda.sync(self.stream)
        self._state[name] = _DeviceTensor(buf, array.shape)

    def zeros_state(self, name: str, shape) -> None:
        """A zero-filled state (a preallocated cache) made on the device, with no host array."""
        if name not in self._inputs:
            raise TrtattnError(f"{self.name}: no input named {name}")
        nbytes = _volume(shape) * self._inputs[name].dtype.itemsize
        buf = self._state_buffer(name, nbytes)
        self._cuda.memset(buf.ptr, nbytes, self.stream)
        self._cuda.sync(self.stream)
        self._state[name] = _DeviceTensor(buf, shape)

    def _state_buffer(self, name, nbytes) -> DeviceBuffer:
        old = self._state.get(name)
        if old is not None:
            old.buffer.ensure(nbytes)
            return old.buffer
        return DeviceBuffer(self._cuda, nbytes)

    def get_state(self, name):
        st = self._state[name]
        host = np.empty(st.shape, self._inputs[name].dtype)
        self._cuda.d2h(host, st.buffer.ptr, self.stream)
        self._cuda.sync(self.stream)
        return host

    def has_state(self, name):
        return name in self._state

    def state_shape(self, name):
        return self._state[name].shape

    # ---------------------------------------------------------------- running
    def _bind(self, name: str, ptr: int, shape: tuple | None = None) -> None:
        ctx = self.context
        if shape is not None and self._bound_shape.get(name) != shape:
            if not ctx.set_input_shape(name, shape):
                raise TrtattnError(f"{self.name}: input {name} cannot take shape {list(shape)} (outside the engine's "
                                   "optimisation profile? see `trtattn build --min/--max-shapes`)")
            self._bound_shape[name] = shape
        if self._bound_addr.get(name) != ptr:
            if not ctx.set_tensor_address(name, ptr):
                raise TrtattnError(f"{self.name}: cannot bind {name}")
            self._bound_addr[name] = ptr

    def _run(self, feeds, wanted, carry):
        if self._closed:
            raise TrtattnError(f"{self.name}: the session is closed")
        cuda, ctx = self._cuda, self.context
        keep = []  # host arrays an async copy (or a shape tensor) still reads
        addr: dict[str, int] = {}
        in_shapes = {}
        for info in self.inputs:
            name = info.name
            if name in feeds:
                array = feeds[name]
                keep.append(array)
                if name in self._shape_io:  # shape tensors are read on the host
                    ptr = array.ctypes.data
                else:
                    buf = self._in_bufs.get(name)
                    if buf is None:
                        buf = self._in_bufs[name] = DeviceBuffer(cuda, array.nbytes)
                    ptr = buf.ensure(array.nbytes)
                    cuda.h2d(ptr, array, self.stream)
                shape = tuple(array.shape)
            else:
                st = self._state[name]
                ptr, shape = st.buffer.ptr, st.shape
            self._bind(name, ptr, shape)
            addr[name], in_shapes[name] = ptr, shape
        unresolved = ctx.infer_shapes()
        if unresolved:
            raise TrtattnError(f"{self.name}: TensorRT cannot infer the output shapes; inputs {', '.join(unresolved)} "
                               "are not fully specified")
        shapes: dict[str, tuple] = {}
        dynamic = []
        for info in self.outputs:
            name = info.name
            shape = tuple(int(d) for d in ctx.get_tensor_shape(name))
            alias = self.aliases.get(name)
            if alias is not None:
                ptr = addr[alias]
                if _volume(shape) != _volume(in_shapes[alias]):
                    raise TrtattnError(f"{self.name}: {name} updates {alias} in place but has shape {list(shape)}, "
                                       f"not {list(in_shapes[alias])}")
            elif any(d < 0 for d in shape):  # data-dependent: TensorRT asks for memory while it runs
                dynamic.append(name)
                continue
            else:
                buf = self._out_bufs.get(name)
                nbytes = _volume(shape) * info.dtype.itemsize
                if buf is None:
                    buf = self._out_bufs[name] = DeviceBuffer(cuda, nbytes)
                ptr = buf.ensure(nbytes)
            self._bind(name, ptr)
            addr[name], shapes[name] = ptr, shape
        if dynamic:
            if self._allocator is None:
                self._allocator = _make_output_allocator(self._trt, cuda)
            for name in dynamic:
                self._bound_addr.pop(name, None)
                if not ctx.set_output_allocator(name, self._allocator):
                    raise TrtattnError(f"{self.name}: cannot set an output allocator for {name}")
        host_values = tuple((n, feeds[n].tobytes()) for n in sorted(self._shape_io) if n in feeds)
        self._execute(in_shapes, addr, graph_ok=not dynamic, extra=host_values)
        for name in dynamic:
            shapes[name] = self._allocator.shapes[name]
            addr[name] = self._allocator.buffers[name].ptr
        results = {}
        for name in wanted:
            host = np.empty(shapes[name], self._outputs[name].dtype)
            cuda.d2h(host, addr[name], self.stream)
            results[name] = host
        cuda.sync(self.stream)
        del keep
        for out, inp in carry.items():  # the output's buffer becomes the input's state: no copy
            old = self._state.get(inp)
            if out in dynamic:
                buf = self._allocator.buffers.pop(out)
                if old is not None:
                    old.buffer.free()
            else:
                buf = self._out_bufs.pop(out)
                if old is not None:
                    self._out_bufs[out] = old.buffer
            self._state[inp] = _DeviceTensor(buf, shapes[out])
        return results

    def _execute(self, in_shapes: dict, addr: dict, graph_ok: bool, extra=()) -> None:
        ctx, cuda = self.context, self._cuda
        # a graph replays exactly what it captured: the shapes, every address, and the values of
        # shape tensors (read on the host when enqueued)
        key = (tuple(sorted(in_shapes.items())), tuple(sorted(addr.items())), extra)
        if not (self.cuda_graph and graph_ok):
            self._drop_graph()
            if not ctx.execute_async_v3(int(self.stream)):
                raise TrtattnError(f"{self.name}: execute_async_v3 failed (see TensorRT's log above)")
            return
        if self._graph is not None and self._graph[0] == key:
            cuda.launch(self._graph[2], self.stream)
            self.graph_launches += 1
            return
        self._drop_graph()
        if key != self._last_key:  # TensorRT wants one enqueue with these shapes before a capture
            self._last_key = key
            if not ctx.execute_async_v3(int(self.stream)):
                raise TrtattnError(f"{self.name}: execute_async_v3 failed (see TensorRT's log above)")
            return
        graph_exec = self._capture(key)
        if graph_exec is not None:
            cuda.launch(graph_exec, self.stream)
            self.graph_launches += 1
        elif not ctx.execute_async_v3(int(self.stream)):
            raise TrtattnError(f"{self.name}: execute_async_v3 failed (see TensorRT's log above)")

    def _capture(self, key) -> Any | None:
        """Captures one enqueue into a CUDA graph; its executable, or None if the engine must run eagerly."""
        ctx, cuda = self.context, self._cuda
        cuda.sync(self.stream)  # the input copies are done; nothing but the engine gets captured
        cuda.begin_capture(self.stream)
        ok = False
        try:
            ok = bool(ctx.execute_async_v3(int(self.stream)))
        finally:
            try:
                graph = cuda.end_capture(self.stream)
            except CudaError as e:
                graph, ok = None, False
                self.graph_note = f"the engine cannot be captured into a CUDA graph ({e}); running it eagerly"
        if not ok or graph is None:
            if graph is not None:
                cuda.destroy_graph(graph, None)
            self.graph_note = self.graph_note or "execute_async_v3 failed under stream capture; running eagerly"
            self.cuda_graph = False
            return None
        try:
            graph_exec = cuda.instantiate(graph)
        except CudaError as e:
            cuda.destroy_graph(graph, None)
            self.graph_note = f"cannot instantiate the captured CUDA graph ({e}); running eagerly"
            self.cuda_graph = False
            return None
        self._graph = (key, graph, graph_exec)
        self.graph_captures += 1
        return graph_exec

    def _drop_graph(self) -> None:
        if self._graph is not None:
            _, graph, graph_exec = self._graph
            self._graph = None
            self._cuda.destroy_graph(graph, graph_exec)

    # ---------------------------------------------------------------- resources
    def memory(self):
        free, total = self._cuda.mem_info()
        return {"kind": "device (cudaMemGetInfo)", "bytes": total - free, "total": total,
                "engine_activations": getattr(self.engine, "device_memory_size_v2", None)}

    def close(self):
        if self._closed:
            return
        self._closed = True
        try:
            self._cuda.sync(self.stream)
        finally:
            self._drop_graph()
            for buf in [*self._in_bufs.values(), *self._out_bufs.values(), *(s.buffer for s in self._state.values()),
                        *((self._allocator.buffers.values()) if self._allocator is not None else [])]:
                buf.free()
            self._in_bufs.clear()
            self._out_bufs.clear()
            self._state.clear()
            self.context = None
            self.engine = None
            self._runtime = None
            self._cuda.stream_destroy(self.stream)

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def trt_available() -> tuple[bool, str]:
    """(True, "") when a TensorRT engine can run here, else (False, why): for tests and the CLI."""
    try:
        compat.import_tensorrt()
        cuda = Cuda.load()
    except TrtattnError as e:  # missing, too old, or no cuda-python: the sentence says which
        return False, str(e)
    try:
        count = cuda.device_count()
    except CudaError as e:
        return False, f"no usable CUDA device ({e})"
    if count < 1:
        return False, "no CUDA device"
    return True, ""
