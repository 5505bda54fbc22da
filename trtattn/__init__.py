"""trtattn: transformer ONNX exports to TensorRT engines whose every attention is a native fused
IAttention, proven numerically against ONNX Runtime and structurally from the engine's layer info.

CPU paths (match, fuse, normalise, verify, the ONNX Runtime back end) need no GPU; tensorrt,
cuda-python and modelopt are imported lazily by the modules that need them.
"""

from . import match as _matcher  # noqa: F401 - loaded first, so that the function below keeps the name
from .site import AttentionSite, CacheKind, CausalKind, Layout, MaskKind, RopeKind, ScalePlacement, SiteKind
from .version import __version__


def match(model):
    """Find every attention site of an onnx.ModelProto (or gs.Graph)."""
    return _matcher.match(model)


def fuse(model, **kwargs):
    """Rewrite every site into the standard ONNX Attention op and verify it (see trtattn.rewrite.fuse)."""
    from .rewrite.fuse import fuse_model

    return fuse_model(model, **kwargs)


def fuse_folder(source, output, **kwargs):
    """Fuse every ONNX model of an export folder (Optimum's layout) into OUTPUT, verified; other files copied
    (see trtattn.folder.process_folder)."""
    from .folder import fuse_folder as _fuse_folder

    return _fuse_folder(source, output, **kwargs)


def normalize_folder(source, output, **kwargs):
    """normalize (TensorRT's fusion rules) every ONNX model of an export folder into OUTPUT, verified."""
    from .folder import normalize_folder as _normalize_folder

    return _normalize_folder(source, output, **kwargs)


def generate(folder, prompts, max_new_tokens: int, **kwargs):
    """Greedy tokens through an export folder's parts on ONNX Runtime (see trtattn.runtime.pipeline)."""
    from .runtime.pipeline import generate_folder

    return generate_folder(folder, prompts, max_new_tokens, **kwargs)


__all__ = ["AttentionSite", "CacheKind", "CausalKind", "Layout", "MaskKind", "RopeKind", "ScalePlacement",
           "SiteKind", "match", "fuse", "fuse_folder", "normalize_folder", "generate", "__version__"]
