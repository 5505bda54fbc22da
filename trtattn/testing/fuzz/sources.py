"""The models the fuzzer mutates, the inputs it checks them on, and ONNX Runtime helpers.

Inputs are the fuzzer's own (not trtattn's): built from the input roles the zoo and trtattn/testing/graphs.py
write into the model's metadata ("trtattn.inputs": token ids in the vocabulary, padding masks with
padded rows, caches, positions), at other dims and seeds than trtattn's verification uses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from trtattn.graph.feeds import most_padding
from trtattn.graph.roles import RoleKind, role_kind

ROOT = Path(__file__).resolve().parents[3]  # the checkout: out/fuzz/zoo by default
ort.set_default_logger_severity(4)  # a mutant ONNX Runtime rejects is reported by the fuzzer, not logged

# Small zoo entries with decomposed attention (eager), plus TorchScript's decomposition of SDPA.
ZOO_MODELS = ("bert", "llama", "gpt2", "bart", "vit", "t5", "whisper", "gemma3", "llama-cache",
              "whisper-decoder-cache", "bert-sdpa", "llama-sdpa")
# Exported by torch at an older opset (what ONNX's version converter cannot reach from the others).
OLD_OPSETS = ("bert.torchscript@12", "gpt2.torchscript@13", "llama.torchscript@14")
# Hand-built attention graphs (trtattn/testing/graphs.py attention_model keyword arguments).
HAND_BUILT: dict[str, dict] = {
    "hand.plain": {},
    "hand.additive": {"mask_style": "additive_input"},
    "hand.bool_where": {"mask_style": "bool_where"},
    "hand.where_not_gqa": {"mask_style": "where_not", "kv_heads": 2},
    "hand.causal_range": {"mask_style": "causal_range", "scale_style": "mul_q"},
    "hand.window_bsnh": {"mask_style": "window_range", "k_style": "bsnh"},
    "hand.bias_sqrt_qk": {"mask_style": "bias_and_mask", "scale_style": "sqrt_qk"},
    "hand.rank3": {"rank": 3, "scale_style": "mul_after"},
    "hand.opset11": {"opset": 11, "mask_style": "notequal_where"},
    "hand.trilu_split": {"mask_style": "causal_trilu", "qkv_style": "split", "noise": True},
}
# The CI slice: every hand-built graph and three zoo exports that fuse fast.
QUICK_SOURCES = (*HAND_BUILT, "bert.dynamo", "llama.dynamo", "vit.torchscript")


def all_sources() -> list[str]:
    from trtattn import zoo

    names = list(HAND_BUILT)
    for model in ZOO_MODELS:
        names += [f"{model}.{x}" for x in zoo.get(model).exporters
                  if not (x == "dynamo" and model.endswith("-sdpa"))]  # dynamo writes SDPA as ONNX Attention
    return names + list(OLD_OPSETS)


def zoo_dir() -> Path:
    return Path(os.environ.get("TRTATTN_ZOO_CACHE") or ROOT / "out" / "fuzz" / "zoo")


def load_source(name: str) -> onnx.ModelProto:
    if name in HAND_BUILT:
        from .. import graphs

        return graphs.attention_model(**HAND_BUILT[name])
    from trtattn import zoo

    name, _, opset = name.partition("@")
    model, exporter = name.rsplit(".", 1)
    path = zoo_dir() / (f"{model}.{exporter}.opset{opset}.onnx" if opset else f"{model}.{exporter}.onnx")
    zoo.exported(path, lambda p: zoo.export(model, exporter, p, opset=int(opset) if opset else None))
    return onnx.load(str(path))


# ------------------------------------------------------------------ inputs
def metadata(model: onnx.ModelProto) -> dict:
    raw = next((p.value for p in model.metadata_props if p.key == "trtattn.inputs"), None)
    return json.loads(raw) if raw else {"inputs": {}, "dims": {}}


def _dim(d, dims: dict) -> int:
    if d.HasField("dim_value"):
        return d.dim_value
    name = d.dim_param
    try:  # names such as "past+seq"
        return sum(dims[p.strip()] for p in name.split("+"))
    except KeyError:
        raise ValueError(f"no value for the symbolic dim '{name}'") from None


_NP = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32,
       onnx.TensorProto.BOOL: np.bool_, onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.DOUBLE: np.float64}


def _role(inp: onnx.ValueInfoProto, roles: dict) -> dict:
    """The input's role in the metadata; else token ids for int64, a float otherwise."""
    return roles.get(inp.name, {"kind": RoleKind.TOKEN_IDS if inp.type.tensor_type.elem_type == onnx.TensorProto.INT64
                                else RoleKind.FLOAT})


def _query_length(model: onnx.ModelProto, roles: dict, dims: dict) -> int | None:
    """The last axis of the token ids or positions (graph/feeds.query_length), None without them."""
    weights = {i.name for i in model.graph.initializer}
    lengths = [_dim(i.type.tensor_type.shape.dim[-1], dims) for i in model.graph.input
               if i.name not in weights and i.type.tensor_type.shape.dim and role_kind(_role(i, roles), i.name) in
               (RoleKind.TOKEN_IDS, RoleKind.POSITION_IDS)]
    return min(lengths) if lengths else None


def make_feeds(model: onnx.ModelProto, dims: dict, seed: int) -> dict[str, np.ndarray]:
    """One input set from the roles in the model's metadata, at `dims`, seeded."""
    rng = np.random.default_rng(seed)
    roles = metadata(model).get("inputs", {})
    init = {i.name for i in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    queries = _query_length(model, roles, dims)
    for inp in model.graph.input:
        if inp.name in init:
            continue
        tt = inp.type.tensor_type
        shape = [_dim(d, dims) for d in tt.shape.dim]
        dtype = _NP[tt.elem_type]
        role = _role(inp, roles)
        kind = role_kind(role, inp.name)
        x: np.ndarray
        if kind is RoleKind.TOKEN_IDS:
            x = rng.integers(0, role.get("vocab", 2), shape)
        elif kind is RoleKind.PADDING_MASK:  # row 0 full, the others padded to a random length >= half
            # and every query keeps a key, as trtattn's own feeds (graph/feeds.most_padding); the fuzzer does not know
            # a source's sliding window, so the narrowest there is (2 keys)
            x = np.ones(shape)
            most = most_padding(shape[-1], role.get("side"), queries, window=2)
            for b in range(1, shape[0]):
                keep = int(rng.integers(max((shape[-1] + 1) // 2, shape[-1] - most), shape[-1] + 1))
                if role.get("side") == "left":
                    x[b, : shape[-1] - keep] = 0
                else:
                    x[b, keep:] = 0
        elif kind is RoleKind.ONES_MASK:
            x = np.ones(shape)
        elif kind is RoleKind.POSITION_IDS:
            start = dims.get("past", 0) if role.get("offset") == "past" else 0
            x = np.broadcast_to(np.arange(start, start + shape[-1]), shape)
        else:  # float, cache
            x = rng.standard_normal(shape)
        feeds[inp.name] = np.ascontiguousarray(x).astype(dtype)
    return feeds


def feed_sets(model: onnx.ModelProto, seed: int) -> list[dict]:
    """Two input sets at dims unlike trtattn's defaults (batch 3 and 2, sequences longer and shorter);
    the model's own dims (other seeds) where the graph bakes its example sizes in."""
    base = dict(metadata(model).get("dims", {}))
    varied = [{k: (3 if k == "batch" else v + 2) for k, v in base.items()},
              {k: (2 if k == "batch" else max(1, v - 1)) for k, v in base.items()}]
    sets = []
    for i, dims in enumerate(varied):
        for candidate in (dims, base):
            feeds = make_feeds(model, candidate, seed * 7919 + 101 + i)
            try:
                run(model, feeds)
            except Exception:
                continue
            sets.append(feeds)
            break
        else:
            raise ValueError("the source model runs on none of the fuzzer's input sets")
    return sets


# ------------------------------------------------------------------ ONNX Runtime
def session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto | ort.InferenceSession, feeds: dict) -> dict[str, np.ndarray]:
    sess = model if isinstance(model, ort.InferenceSession) else session(model)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def difference(a: dict, b: dict, atol: float, rtol: float) -> tuple[bool, float, str]:
    """(close, max abs error, the worst output or why not comparable); NaN equals NaN."""
    if set(a) != set(b):
        return False, float("inf"), f"outputs differ: {sorted(set(a) ^ set(b))}"
    worst, name, close = 0.0, "", True
    for k in sorted(a):
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.shape != y.shape:
            return False, float("inf"), f"{k}: shape {x.shape} vs {y.shape}"
        if x.dtype == np.bool_ or np.issubdtype(x.dtype, np.integer):
            if not np.array_equal(x, y):
                return False, float("inf"), f"{k}: integer values differ"
            continue
        x, y = x.astype(np.float64), y.astype(np.float64)
        both_nan = np.isnan(x) & np.isnan(y)
        err = np.where(both_nan, 0.0, np.abs(x - y))
        err = np.nan_to_num(err, nan=np.inf)
        if not np.all(err <= atol + rtol * np.abs(np.nan_to_num(y))):
            close = False
        m = float(err.max()) if err.size else 0.0
        if m > worst:
            worst, name = m, k
    return close, worst, name
