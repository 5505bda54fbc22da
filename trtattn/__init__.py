"""trtattn: transformer ONNX exports to TensorRT engines whose every attention is a native fused
IAttention, proven numerically against ONNX Runtime and structurally from the engine's layer info.

CPU paths (match, fuse, normalise, verify, the ONNX Runtime back end) need no GPU; tensorrt,
cuda-python and modelopt are imported lazily by the modules that need them.
"""

from .site import AttentionSite, CacheKind, CausalKind, Layout, MaskKind, RopeKind, ScalePlacement, SiteKind, SiteStatus
from .version import __version__


def find_attention(model):
    """Find every attention site of an onnx.ModelProto (or gs.Graph): .sites, and .skipped with why
    (trtattn.match.match; named apart from it so that `trtattn.match` stays the subpackage)."""
    from .match import match

    return match(model)


def fuse(model, **kwargs):
    """Rewrite every site of a model (an onnx.ModelProto or a path: its weights stay on disk) into the
    standard ONNX Attention op and verify it (see trtattn.rewrite.fuse). In a notebook the result draws
    itself: every site as exported and as replaced."""
    from .rewrite.fuse import fuse_model

    if not hasattr(model, "graph"):
        from .graph import io

        model = io.load(model, load_external_data=False)
    result = fuse_model(model, **kwargs)
    result.original = model
    return result


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
           "SiteKind", "SiteStatus", "find_attention", "fuse", "fuse_folder", "normalize_folder", "generate",
           "__version__"]
