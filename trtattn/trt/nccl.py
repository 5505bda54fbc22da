"""The NCCL communicator a rank engine's execution context needs (TensorRT >= 11's multi-device inference).

TensorRT's Python bindings take the communicator as a capsule around an `ncclComm_t`
(`IExecutionContext.set_communicator(communicator: CapsuleType) -> bool`, a collective call: it blocks
until every rank has called it); TensorRT does not create one. It is made here through NCCL's own C
API in `libnccl.so.2` (the library TensorRT loads for its IDistCollectiveLayers; NCCL's pip wheel
nvidia-nccl-cu13 and NVIDIA's TensorRT container have it), with ctypes, so no other Python package is
needed:

    comm = Communicator.init(ranks, rank)    # after cudaSetDevice(rank's device); NCCL_COMM_ID in the env
    context.set_communicator(comm.capsule())

The ranks meet without a side channel: with `NCCL_COMM_ID=<host>:<port>` in every rank's environment,
`ncclGetUniqueId` gives every rank the same id (that address) and rank 0's `ncclCommInitRank` opens the
bootstrap root there (NCCL's env variable; runtime/ranks.py sets it per launch).
"""

from __future__ import annotations

import ctypes

from ..errors import MissingDependencyError, TrtattnError

LIBRARIES = ("libnccl.so.2", "libnccl.so")  # TensorRT's own search order for NCCL
UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES in nccl.h
INSTALL = ("pip install nvidia-nccl-cu13 (and put its lib/ on LD_LIBRARY_PATH), or use the container in docker/, "
           "whose TensorRT image ships NCCL")


class NcclError(TrtattnError):
    """An NCCL call failed."""


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


def load_library() -> ctypes.CDLL:
    """NCCL's shared library, as TensorRT finds it, or one sentence saying how to get it."""
    for name in LIBRARIES:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
        lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
        return lib
    raise MissingDependencyError(f"running a tensor-parallel rank set needs NCCL ({' or '.join(LIBRARIES)} was not "
                                 f"found); install it with: {INSTALL}")


def capsule(pointer: int):
    """A PyCapsule around a C pointer: what pybind11 bindings typed CapsuleType take."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    if not pointer:
        raise TrtattnError("no NCCL communicator to hand to TensorRT (a null pointer)")
    return new(pointer, None, None)


class Communicator:
    """One rank's `ncclComm_t`, made with ncclCommInitRank (every rank of the set calls it together)."""

    def __init__(self, lib: ctypes.CDLL, pointer: int, ranks: int, rank: int):
        self.lib, self.pointer, self.ranks, self.rank = lib, pointer, ranks, rank

    @classmethod
    def init(cls, ranks: int, rank: int, lib: ctypes.CDLL | None = None) -> Communicator:
        lib = lib or load_library()
        uid = UniqueId()
        _check(lib, lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        comm = ctypes.c_void_p()
        _check(lib, lib.ncclCommInitRank(ctypes.byref(comm), ranks, uid, rank), f"ncclCommInitRank (rank {rank} of {ranks})")
        return cls(lib, int(comm.value or 0), ranks, rank)

    def capsule(self):
        return capsule(self.pointer)

    def destroy(self) -> None:
        if self.pointer:
            _check(self.lib, self.lib.ncclCommDestroy(ctypes.c_void_p(self.pointer)), "ncclCommDestroy")
            self.pointer = 0


def _check(lib: ctypes.CDLL, result: int, what: str) -> None:
    if result != 0:  # ncclSuccess
        text = lib.ncclGetErrorString(result)
        raise NcclError(f"NCCL {what} failed: {text.decode() if text else result} (NCCL_DEBUG=INFO says more)")
