"""End to end, the Gemma3 split-cache prefill of graph-transforms-mha-to-sha.txt (issue 32): `fuse` writes one
Attention op per attention, over the cache and the new slice in the op's past/present form; `fuse --ops trt`
writes IAttention with the KV-cache update (TRT_KVCacheUpdate) verified through trtattn_plugins' CPU kernels;
`build` plans the same (exit 4 on CPU)."""

import json

import onnx
import pytest

from trtattn.cli import main
from trtattn.routes.trt_ops import fuse_trt
from trtattn.testing.pieces import split_cache_model


def _ops(model: onnx.ModelProto, op: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op]


def test_fuse_writes_the_cache_as_the_ops_past(tmp_path):
    path, out = tmp_path / "split.onnx", tmp_path / "fused.onnx"
    onnx.save(split_cache_model(v_transposed=False), path)
    assert main(["fuse", str(path), "-o", str(out)]) == 0
    (attention,) = _ops(onnx.load(out), "Attention")
    assert list(attention.input[4:6]) == ["k_cache", "v_cache"]  # past_key, past_value: the inputs themselves
    assert len(attention.output) == 3  # Y, present_key, present_value


def test_fuse_trt_reaches_iattention_with_the_cache_update():
    result = fuse_trt(split_cache_model(v_transposed=False), name="split", precision="fp32")
    assert result.ok, result.verification
    plan = result.prepared.plan
    (attention,) = plan.attentions
    assert (attention.q_heads, attention.kv_heads) == (4, 1)
    assert sorted(c.cache for c in plan.cache_updates) == ["k_cache", "v_cache"]
    assert len(_ops(result.model, "TRT_Attention")) == 1 and len(_ops(result.model, "TRT_KVCacheUpdate")) == 2


def test_fuse_trt_of_a_transposed_value_cache_reads_the_concatenation():
    """A V cache stored [B, 1, H, KV_LEN] is not a cache TensorRT updates in place ([B, N, S, H]): the op reads
    Concat(past, new), verified, without a cache update."""
    result = fuse_trt(split_cache_model(v_transposed=True), name="split_t", precision="fp32")
    assert result.ok, result.verification
    assert not result.prepared.plan.cache_updates and len(_ops(result.model, "TRT_Attention")) == 1


@pytest.mark.slow
def test_fuse_trt_of_the_single_head_form():
    result = fuse_trt(split_cache_model(form="sha", v_transposed=False), name="split_sha", precision="fp32")
    assert result.ok, result.verification
    assert len(result.prepared.plan.attentions) == 4


def test_build_plans_iattention_and_the_cache_update(tmp_path):
    path, plan = tmp_path / "split.onnx", tmp_path / "plan.json"
    onnx.save(split_cache_model(v_transposed=False), path)
    assert main(["build", str(path), "--precision", "fp32", "--plan-json", str(plan),
                 "--out-dir", str(tmp_path / "engines")]) == 4  # no TensorRT on CPU: planned, not built
    written = json.loads(plan.read_text())
    assert written["form"] == "kv-cache"
    (site,) = written["sites"]
    assert site["kv_lengths"] and site["reason"] is None  # IAttention reads each row's cache length
    inputs = {i["name"]: i["shape"] for i in written["inputs"]}
    assert "cache_write_index" in inputs and inputs["k_cache"][2] > 6  # preallocated, updated in place
