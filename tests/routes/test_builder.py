"""The engine builder, checked without a GPU.

conformance: the whole build path (parse, lower, reconnect, config, profiles, progress monitor,
    build_serialized_network) runs against a stand-in for `tensorrt` that checks every class,
    method, property, enum member and argument list against the REAL TensorRT 11 bindings and
    records them. Nothing is built: build_serialized_network returns trtsim's NotAnEngine.
reference: the recorded network runs in trtsim's numpy executor (TensorRT's documented layer
    semantics; the parsed ONNX part on ONNX Runtime, or onnx's reference evaluator for bf16) and must
    equal ONNX Runtime on the original model, in padded, packed and KV-cache forms, in fp32 and in the
    fp16/bf16 whole-model conversions. This is a reference model of the layers, never a TensorRT result.
(Each build setting has its own test in tests/trt/test_build_settings.py.)
"""

import onnx
import pytest
from trtsim_reference import reference_errors

from trtattn import zoo
from trtattn.routes.builder import build
from trtattn.routes.prepare import Limits, prepare
from trtattn.testing.conformance import conformance_cases, inside_attention
from trtattn.testing.graphs import attention_model
from trtattn.verify.tolerance import CONVERSION_BOUNDS

CASES = [  # (zoo model, exporter, form): every site kind the zoo has
    ("bart", "torchscript", "padded"),  # self, causal self, cross; padding masks -> lengths
    ("bart-sdpa", "dynamo", "padded"),  # ONNX Attention ops from the exporter
    ("t5", "torchscript", "padded"),  # relative position bias, unscaled
    ("swin", "torchscript", "padded"),  # window attention, bias + shift mask
    ("vit", "dynamo", "padded"),
    ("llama", "torchscript", "padded"),  # GQA, RoPE -> add_rotary_embedding, causal + padding -> lengths
    ("llama", "dynamo", "padded"),  # the exporter's RotaryEmbedding ops
    ("gemma3", "torchscript", "padded"),  # head size 256, sliding window (a dense mask)
    ("whisper", "torchscript", "padded"),  # Q pre-scaled before the head split
    ("llama-cache", "torchscript", "kv-cache"),  # packed query over a padded cache, lower-right, kv lengths
    ("llama-cache", "dynamo", "kv-cache"),
    ("whisper-decoder-cache", "torchscript", "kv-cache"),  # + static cross-attention K/V
    ("bert", "torchscript", "packed"),  # PACKED_NHD with cumulative lengths
    ("gpt2", "torchscript", "packed"),  # packed causal
    ("llama", "torchscript", "packed"),  # packed + RoPE with position ids
    ("bert-foreign-dims", "dynamo", "packed"),  # a site fused with batch and heads merged: [N, 1, T, H] tokens
    ("llama-cache-sdpa", "dynamo", "kv-cache"),  # the past concatenated in front of an ONNX Attention op
]
PRECISION_CASES = [  # the whole model in fp16 / bf16 (ModelOpt AutoCast), each form once
    ("llama", "torchscript", "padded", "fp16"),
    ("llama", "torchscript", "padded", "bf16"),
    pytest.param("t5", "torchscript", "padded", "fp16", marks=pytest.mark.slow),  # a float bias mask in fp16 (72 s)
    ("llama-cache", "torchscript", "kv-cache", "fp16"),  # fp16 caches, updated in place
    ("whisper-decoder-cache", "torchscript", "kv-cache", "bf16"),
    ("bert", "torchscript", "packed", "fp16"),
]
LIMITS = Limits(max_batch=4, max_positions=64, max_cache=24)  # the zoo's configs; small caches for numpy
_PREPARED: dict = {}


def _prepared(zoo_export, name, exporter, form, precision="fp32"):
    """Each (model, form, precision) prepared once per session: conformance and reference share it."""
    key = (name, exporter, form, precision)
    if key not in _PREPARED:
        model = onnx.load(str(zoo_export(name, exporter)))
        _PREPARED[key] = model, prepare(model, name=f"{name}_{exporter}", form=form, precision=precision, limits=LIMITS)
    return _PREPARED[key]


def _conforms(trt, prepared, tmp_path, name):
    blob, sidecar = build(prepared, trt, tmp_path, write=False, timing_cache=None, progress=True)
    assert type(blob).__name__ == "NotAnEngine"  # recorded, never built
    assert not trt.sim.problems, trt.sim.problems
    used = set(trt.sim.used())
    assert "INetworkDefinition.add_attention_v2" in used and "Builder.build_serialized_network" in used
    attentions = [c for c in trt.sim.log if c.member == "add_attention_v2" and c.kind == "call"]
    assert len(attentions) == zoo.get(name).expected_sites
    names = [c.args["value"] for c in trt.sim.log if c.owner == "IAttention" and c.member == "name" and c.kind == "set"]
    assert sorted(names) == sorted(s["layer"] for s in sidecar["sites"])
    return used


@pytest.mark.conformance
@pytest.mark.parametrize("name,exporter,form", CASES)
def test_build_path_conforms_to_the_real_bindings(checked_trt, zoo_export, tmp_path, name, exporter, form):
    _, prepared = _prepared(zoo_export, name, exporter, form)
    used = _conforms(checked_trt, prepared, tmp_path, name)
    if form == "kv-cache":
        assert {"INetworkDefinition.add_kv_cache_update", "IAttention.key_value_lengths",
                "IKVCacheUpdateLayer.update_form", "IKVCacheUpdateLayer.update_lengths"} <= used
    if form in ("kv-cache", "packed"):
        assert "IAttention.query_lengths" in used and "IAttention.query_form" in used
    if prepared.plan.ropes:
        assert "INetworkDefinition.add_rotary_embedding" in used


@pytest.mark.conformance
@pytest.mark.parametrize("name,exporter,form,precision", PRECISION_CASES)
def test_fp16_and_bf16_networks_conform(checked_trt, zoo_export, tmp_path, name, exporter, form, precision):
    _, prepared = _prepared(zoo_export, name, exporter, form, precision)
    _conforms(checked_trt, prepared, tmp_path, name)
    assert all(a.dtype == precision for a in prepared.plan.native)
    assert prepared.plan.precision_table.get(precision, 0) >= 0.95, prepared.plan.precision_table


@pytest.mark.conformance
def test_every_tensorrt_api_the_builder_uses(checked_trt, zoo_export, tmp_path):
    """The union over the zoo cases: each name exists in the real bindings (the checker raised
    otherwise). Printed for the record."""
    from trtsim.checked import checked

    used = set()
    for case in CASES + PRECISION_CASES:
        name, exporter, form, *precision = getattr(case, "values", case)  # a pytest.param carries its marks
        trt = checked(checked_trt.sim.real)
        _, prepared = _prepared(zoo_export, name, exporter, form, *precision)
        build(prepared, trt, tmp_path, write=False)
        used |= set(trt.sim.used())
    print("\nTensorRT APIs used by the builder:\n  " + "\n  ".join(sorted(used)))
    for api in ["INetworkDefinition.add_attention_v2", "INetworkDefinition.add_rotary_embedding",
                "INetworkDefinition.add_kv_cache_update", "IAttention.mask", "IAttention.key_value_lengths",
                "IAttention.query_lengths", "IAttention.query_form", "IAttention.key_value_form",
                "IAttention.decomposable", "IAttention.metadata", "IRotaryEmbeddingLayer.name",
                "IKVCacheUpdateLayer.update_form", "IBuilderConfig.add_optimization_profile",
                "IOptimizationProfile.set_shape", "IBuilderConfig.progress_monitor",
                "IBuilderConfig.profiling_verbosity", "INetworkDefinition.remove_tensor", "OnnxParser.parse"]:
        assert api in used, api


@pytest.mark.conformance
def test_a_method_the_bindings_lack_is_caught(checked_trt):
    """Published snippets call attn.set_query_lengths(t); TensorRT 11.4 has a property instead.
    compat takes the property; calling the method would be caught."""
    from trtattn.trt import compat

    trt = checked_trt
    net = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    q = net.add_input("q", trt.float16, (-1, 2, -1, 8))
    k = net.add_input("k", trt.float16, (-1, 2, -1, 8))
    lengths = net.add_input("lengths", trt.int32, (-1,))
    attn = compat.add_attention(trt, net, q, k, k, "lower_right")
    compat.set_key_value_lengths(attn, lengths)
    with pytest.raises(AttributeError, match="set_query_lengths"):
        attn.set_query_lengths(lengths)


@pytest.mark.reference
@pytest.mark.parametrize("name,exporter,form", CASES)
def test_lowered_network_equals_onnx_runtime(checked_trt, zoo_export, name, exporter, form):
    original, prepared = _prepared(zoo_export, name, exporter, form)
    errors = reference_errors(checked_trt, prepared, original)
    assert errors and max(e for e, _ in errors.values()) <= 1e-4, errors


@pytest.mark.reference
@pytest.mark.parametrize("name,exporter,form,precision", PRECISION_CASES)
def test_fp16_and_bf16_networks_match_the_fp32_original(checked_trt, zoo_export, name, exporter, form, precision):
    """The converted model's network, attention in fp16/bf16, against the fp32 original: within the
    precision's tolerance (relative to each output's largest value)."""
    original, prepared = _prepared(zoo_export, name, exporter, form, precision)
    errors = reference_errors(checked_trt, prepared, original)
    worst = max(r for _, r in errors.values())
    assert errors and worst <= CONVERSION_BOUNDS[precision]["rel"], errors


@pytest.mark.reference
@pytest.mark.parametrize("kwargs", [{"rank": 3}, {"k_style": "bsnh", "mask_style": "bool_where"},
                                    {"kv_heads": 1, "mask_style": "causal_range"}, {"mask_style": "window_range"}])
def test_hand_built_edge_cases(checked_trt, kwargs):
    original = attention_model(**kwargs)
    prepared = prepare(original, name="edge", precision="fp32")
    errors = reference_errors(checked_trt, prepared, original)
    assert errors and max(e for e, _ in errors.values()) <= 1e-4, errors


@pytest.mark.reference
def test_soft_capped_sites_stay_in_tensorrts_implicit_form(checked_trt, zoo_export, tmp_path):
    """Gemma 2 soft-caps its logits: no IAttention; each site is written as MatMul, Tanh, one mask op, Softmax,
    MatMul for TensorRT's own fusion, named in the plan with the reason, and still computes the original."""
    from trtattn.errors import TrtattnError

    original, prepared = _prepared(zoo_export, "gemma2", "torchscript", "padded")
    sites = prepared.plan.plan_json()["sites"]
    assert len(sites) == 2 and not prepared.plan.native
    assert all("soft-capped" in s["reason"] and "implicit form" in s["reason"] for s in sites)
    ops = [n.op_type for n in prepared.cut.model.graph.node]
    written = [n.op_type for n in prepared.cut.model.graph.node if n.name.startswith("trtattn/implicit/")]
    assert "Attention" not in ops and written.count("Tanh") == written.count("Softmax") == 2
    blob, _ = build(prepared, checked_trt, tmp_path, write=False, progress=False)
    assert not [c for c in checked_trt.sim.log if c.member == "add_attention_v2"] and not checked_trt.sim.problems
    errors = reference_errors(checked_trt, prepared, original)
    assert errors and max(e for e, _ in errors.values()) <= 1e-4, errors
    with pytest.raises(TrtattnError, match="soft-capped.*only the padded form"):
        prepare(original, name="g", form="packed", precision="fp32", limits=LIMITS)


@pytest.mark.reference
def test_kv_cache_cross_attention_reads_the_encoder_padding_mask_as_lengths(checked_trt, zoo_dir):
    """BART's decoder step as the kv-cache form: its cross-attention's only mask is the encoder's padding
    mask (an input over the encoder's axis, not the tokens'), lowered as IAttention key/value lengths; the
    recorded network equals ONNX Runtime on the original, a padded encoder row included."""
    from trtattn import zoo
    from trtattn.zoo import generation

    path = zoo.exported(zoo_dir / "bart-decoder-step.torchscript.onnx",
                        lambda p: generation.export("bart-decoder-step", "torchscript", p))
    original = onnx.load(str(path))
    prepared = prepare(original, name="bart_step", form="kv-cache", precision="fp32", limits=LIMITS)
    cross = [s for s in prepared.plan.plan_json()["sites"] if "encoder_attn" in s["name"]]
    assert len(cross) == 2 and all(s["kv_lengths"] == "encoder_attention_mask/lengths" for s in cross), cross
    errors = reference_errors(checked_trt, prepared, original, dims={"seq": 3})  # the padded row keeps 2 tokens
    assert errors and max(e for e, _ in errors.values()) <= 1e-4, errors


@pytest.mark.reference
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in conformance_cases("RotaryEmbedding", expanded=True)
                                  if c.inputs["input"].ndim == 4])
def test_rotary_embedding_bodies_lower_to_rope_layers(checked_trt, case):
    """Issue 25: ONNX's RotaryEmbedding function body on Q and K, read and written back as RotaryEmbedding ops by
    fuse, becomes two IRotaryEmbeddingLayers (interleaved, partial, with or without position ids), and the
    network computes what the original computes on ONNX Runtime."""
    original, _ = inside_attention(case)
    prepared = prepare(original, name="rope", precision="fp32")
    assert len(prepared.plan.ropes) == 2 and len(prepared.plan.native) == 1
    errors = reference_errors(checked_trt, prepared, original)
    assert errors and max(e for e, _ in errors.values()) <= 1e-4, errors
    calls = [c for c in checked_trt.sim.log if c.member == "add_rotary_embedding" and c.kind == "call"]
    assert len(calls) == 2
