"""A 2-D mask input is read as per-row key lengths (IAttention's key_value_lengths) only when its axes say so:
axis 0 on the logits' batch, axis 1 on their key (routes/prepare/mask_axes.py). A [Sq, Skv] mask, a transposed
[S, B] one or a [B, 1, Sq, Skv] one is a general mask that IAttention takes as its mask; the engine's profiles
read its dims as sequences, not a batch. (The [Sq, Skv] mask was read as [B, S] lengths and refused: "padded
form does not match ... max abs error 16.5".)"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mask_models import MODELS, D, key_flags, self_attention

from trtattn.routes.prepare import prepare
from trtattn.trt.plan import TensorIO
from trtattn.trt.profiles import DEFAULT_MAX_BATCH, DEFAULT_MAX_POSITIONS, PlanLimits, default_profiles

SIZES = {"b": 3, "s": 6}


def padded(model: onnx.ModelProto):
    return prepare(model, name="m", precision="fp32", form="padded")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_general_mask_goes_to_iattention_as_its_mask(name):
    """Taken as IAttention's mask, and the form computes what the original does on a random mask (key 0 kept)."""
    shape, nodes, key_axis = MODELS[name]
    model = self_attention(shape, nodes)
    prepared = padded(model)
    assert prepared.verification.passed and prepared.verification.max_abs_err <= 1e-5
    (site,) = prepared.plan.attentions
    assert (site.kv_lengths, site.causal, site.mask_kind) == (None, "none", "boolean") and site.mask
    assert prepared.plan.right_padded == []
    (mask,) = (n.input[3] for n in prepared.form_model.graph.node if n.op_type == "Attention")
    assert mask == site.mask and "lengths" not in mask
    rng = np.random.default_rng(1)
    mask_value = rng.random([SIZES.get(d, d) for d in shape]) < 0.5
    mask_value[(slice(None),) * key_axis + (0,)] = True
    feeds = {"x": rng.standard_normal((SIZES["b"], SIZES["s"], D)).astype(np.float32), "mask": mask_value}
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], feeds)[0]
                 for m in (model, prepared.form_model))
    assert np.abs(got - want).max() <= 1e-5


def test_a_query_key_mask_notes_why_and_its_profile_runs_its_dims_as_sequences():
    prepared = padded(self_attention(*MODELS["query_key"][:2]))
    assert any("not read as [batch, key] padding (by its axes)" in note for note in prepared.plan.notes)
    (profile,) = prepared.plan.profiles
    positions = prepared.plan.limits.max_positions
    assert profile["mask"]["max"] == [positions, positions]
    assert profile["x"]["max"] == [DEFAULT_MAX_BATCH, positions, D]


def test_a_batch_key_padding_mask_is_still_read_as_lengths():
    prepared = padded(self_attention(["b", "s"], key_flags("mask")))
    assert prepared.verification.passed and prepared.verification.max_abs_err <= 1e-5
    assert prepared.plan.right_padded == ["mask"]
    (site,) = prepared.plan.attentions
    assert (site.kv_lengths, site.mask) == ("mask/lengths", None)


def test_profiles_take_a_batch_only_where_a_symbol_is_at_axis_0_alone():
    inputs = [TensorIO("x", "float32", ["b", "s", D]), TensorIO("mask", "bool", ["s", "s"]),
              TensorIO("general", "float32", ["b", 1, "s", "s"]), TensorIO("cu", "int32", ["b+1"])]
    (profile,) = default_profiles(inputs, PlanLimits(DEFAULT_MAX_BATCH, DEFAULT_MAX_POSITIONS))
    p = DEFAULT_MAX_POSITIONS
    assert profile["mask"]["max"] == [p, p] and profile["x"]["max"] == [DEFAULT_MAX_BATCH, p, D]
    assert profile["general"]["max"] == [DEFAULT_MAX_BATCH, 1, p, p]
    assert profile["cu"]["max"] == [DEFAULT_MAX_BATCH + 1]


@pytest.mark.reference
def test_the_recorded_network_takes_a_query_key_mask_as_iattentions_mask(checked_trt):
    """The [s, s] mask reaches IAttention as its mask (no lengths, no causal kind), and trtsim's executor of the
    recorded network equals ONNX Runtime on the original with a random mask."""
    from trtsim.dtypes import to_numpy
    from trtsim.execute import run

    from trtattn.trt.network import build_network

    shape, nodes, key_axis = MODELS["query_key"]
    model = self_attention(shape, nodes)
    prepared = padded(model)
    builder = checked_trt.Builder(checked_trt.Logger(checked_trt.Logger.WARNING))
    network = build_network(checked_trt, builder, checked_trt.Logger(checked_trt.Logger.WARNING), prepared.cut,
                            prepared.plan)
    assert not checked_trt.sim.problems, checked_trt.sim.problems
    sets = {c.member for c in checked_trt.sim.log if c.owner == "IAttention" and c.kind == "set"}
    assert "mask" in sets and "key_value_lengths" not in sets
    rng = np.random.default_rng(3)
    mask_value = rng.random((SIZES["s"], SIZES["s"])) < 0.5
    mask_value[:, 0] = True
    feeds = {"x": rng.standard_normal((SIZES["b"], SIZES["s"], D)).astype(np.float32), "mask": mask_value}
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], feeds)
    types = {t.name: to_numpy(t.dtype) for t in (network.get_input(i) for i in range(network.num_inputs))}
    got = run(network, {k: v.astype(types[k]) for k, v in feeds.items()})["y"]
    assert np.abs(got - want).max() <= 1e-4
