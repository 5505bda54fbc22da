"""User-facing errors: each carries one sentence the CLI prints as-is (no traceback)."""


class TrtattnError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ModelLoadError(TrtattnError):
    """The file is missing, empty, truncated, not ONNX, or its external data is missing."""


class SitesRefused(TrtattnError):
    """Attention sites that cannot become what was asked (an IAttention, a fused op), each with why: the
    commands list them and exit 1, as `fuse` does for a site it cannot fuse."""

    def __init__(self, message: str, sites: list[tuple[str, str]]):
        super().__init__(message)
        self.sites = sites  # (site, why)


class VerificationError(TrtattnError):
    """The rewritten model does not match the original on ONNX Runtime."""


class MissingDependencyError(TrtattnError):
    """An optional dependency (tensorrt, cuda-python, modelopt, torch) is not installed."""


def require(module: str, purpose: str, install: str):
    """Import an optional dependency lazily, or raise one sentence saying how to get it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(f"{purpose} needs the '{module}' package ({e}); install it with: {install}") from None
