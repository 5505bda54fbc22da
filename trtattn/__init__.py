"""trtattn: transformer ONNX exports to TensorRT engines whose every attention is a native fused
IAttention, proven numerically against ONNX Runtime and structurally from the engine's layer info.

CPU paths (match, fuse, normalise, verify, the ONNX Runtime back end) need no GPU; tensorrt,
cuda-python and modelopt are imported lazily by the modules that need them.
"""

__version__ = "0.1.0"

from .site import AttentionSite, CacheKind, CausalKind, Layout, MaskKind, RopeKind, ScalePlacement, SiteKind  # noqa: E402


def match(model):
    """Find every attention site of an onnx.ModelProto (or gs.Graph)."""
    from .match import match as _match

    return _match(model)


def fuse(model, **kwargs):
    """Rewrite every site into the standard ONNX Attention op and verify it (see trtattn.fuse)."""
    from .fuse import fuse_model

    return fuse_model(model, **kwargs)


__all__ = ["AttentionSite", "CacheKind", "CausalKind", "Layout", "MaskKind", "RopeKind", "ScalePlacement",
           "SiteKind", "match", "fuse", "__version__"]
