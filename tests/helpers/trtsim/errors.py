"""Exceptions raised by trtsim; each says what TensorRT would do or what trtsim does not emulate."""


class MissingMemberError(AttributeError):
    """The member does not exist on the real class (an AttributeError, so hasattr() is honest)."""


class ArgumentError(TypeError):
    """A call or property write that pybind11 would reject (or that is a known misuse)."""


class NotEmulatedError(NotImplementedError):
    """Valid TensorRT usage that trtsim does not emulate; the message names what to add."""


class NetworkError(ValueError):
    """A network that TensorRT would reject (bad shapes, foreign tensors, bad indices)."""


class ShapeError(NetworkError):
    """Layer shapes that cannot work (found while inferring build-time shapes)."""


class BuildValidationError(RuntimeError):
    """build_serialized_network found problems a real build would fail on."""


class ExecutionError(RuntimeError):
    """The network cannot be evaluated with these inputs (TensorRT would fail or the result is undefined)."""
