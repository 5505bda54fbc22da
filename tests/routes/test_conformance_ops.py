"""onnx's backend cases of the Attention op (opset 23/24/25) through the TensorRT route and normalize (issue 25,
part B): each converts to IAttention and verifies (on ONNX Runtime through trtattn_plugins, and against onnx's
reference outputs), or names IAttention's limit with exit 1, which the case's own node shows (it soft-caps its
logits). A QK output (issue 25) is computed beside IAttention by the op's own function body, over a past cache
too, and checked against onnx's reference like Y. bf16 cases convert but are not run (ONNX Runtime has no bf16
kernel): the TensorRT ops verified emulated in fp32 against onnx's reference, a bf16 plan. Models ONNX Runtime
refuses are skipped, named.
The bulk is slow; FAST is one case per configuration class."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from trtattn.testing.conformance import conformance_cases
from trtattn.testing.op_cases import LIMITS, expected_limit, run_case

CASES = {c.name: c for c in conformance_cases("Attention", expanded=False)}  # one data set each
FAST = {"attention_3d_diff_heads_sizes_causal", "attention_4d_gqa_with_past_and_present_fp16",
        "attention_3d_gqa_with_past_and_present", "attention_4d_attn_mask_3d_causal", "attention_local_window_with_past",
        "attention_4d_causal_nonpad_negative_offset_structural_empty", "attention_local_window_ext_cache_rank3_head_mask",
        "attention_4d_with_qk_matmul", "attention_24_fullymasked_qk_matmul_output_mode3_zero",
        "attention_3d_with_past_and_present_qk_matmul_softcap",
        "attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_causal", "attention_3d_softcap",
        "attention_bidirectional_window",
        "attention_23_boolmask_fullymasked_row_nan_robustness", "attention_4d_causal_bf16"}
REPRESENTATIVE = ["attention_3d_diff_heads_with_past_and_present", "attention_4d_causal_nonpad_attn_mask_composition",
                  "attention_local_window_with_past", "attention_4d_attn_mask_4d_causal", "attention_3d_local_window",
                  "attention_4d_with_qk_matmul_softmax", "attention_3d_with_past_and_present_qk_matmul_softmax"]


def _params():
    return [pytest.param(name, id=name, marks=() if name in FAST else pytest.mark.slow) for name in sorted(CASES)]


def _has_past(model: onnx.ModelProto) -> bool:
    node = next(n for n in model.graph.node if n.op_type == "Attention")
    return len(node.input) > 4 and bool(node.input[4])


@pytest.mark.parametrize("name", _params())
def test_op_case_converts_or_names_its_limit(name, tmp_path):
    case = CASES[name]
    outcome = run_case(case, tmp_path)
    if outcome.skipped:  # ONNX Runtime, the reference, cannot run it: refused in one line by every command
        assert (outcome.fuse_exit, outcome.build_exit, outcome.normalize_exit) == (2, 2, 2), outcome
        assert "ONNX Runtime" in outcome.why, outcome.why
        pytest.skip(outcome.skipped)
    if outcome.not_run:  # bf16: converted, verified emulated in fp32; or refused where ORT refuses the fp32 model
        if outcome.fuse_exit == 2:
            assert "does not run on ONNX Runtime" in outcome.why and outcome.build_exit == 2, outcome
            return
        assert outcome.fuse_exit == 0 and outcome.matches_reference, (outcome.why, outcome.reference_error)
        assert outcome.build_exit == 4 and set(outcome.plan_dtypes) == {"bf16", "bfloat16"}, outcome.plan_dtypes
        assert outcome.normalize_exit == 0  # read widened: already TensorRT's form, written as read (bf16)
        return
    limit = expected_limit(case.model)
    if limit is None:
        assert outcome.fuse_exit == 0, outcome.why
        assert outcome.matches_reference, (outcome.reference_error, outcome.reference_bound)
        assert outcome.form == ("kv-cache" if _has_past(case.model) else "padded")
        assert outcome.build_exit == 4  # the plan made; no TensorRT builder on this machine
        assert outcome.normalize_exit == 0
    else:
        assert outcome.fuse_exit == 1 and LIMITS[limit] in outcome.why, outcome.why
        # build: a soft-capped site is planned in TensorRT's implicit form, except over a past cache
        assert outcome.build_exit == (1 if _has_past(case.model) else 4)
        assert outcome.normalize_exit == 0


def _reference(trt, case, tmp_path, precision="fp32"):
    """The case prepared in `precision`, its network recorded against the real bindings and run on trtsim's
    executor, against the original on ONNX Runtime."""
    from trtsim_reference import reference_errors

    from trtattn.routes.builder import build
    from trtattn.routes.prepare import prepare

    prepared = prepare(case.model, name="case", precision=precision)
    blob, _ = build(prepared, trt, tmp_path, write=False, timing_cache=None, progress=True)
    assert type(blob).__name__ == "NotAnEngine" and not trt.sim.problems, trt.sim.problems
    used = set(trt.sim.used())
    assert "INetworkDefinition.add_attention_v2" in used
    assert ("INetworkDefinition.add_kv_cache_update" in used) == bool(prepared.plan.cache_updates)
    return reference_errors(trt, prepared, case.model)


def _network_params():
    """Every case that converts (no limit, runnable on ONNX Runtime): REPRESENTATIVE fast, the rest slow."""
    names = [n for n, c in sorted(CASES.items()) if not c.cpu_unrunnable and expected_limit(c.model) is None
             and n != "attention_4d_diff_heads_mask4d_padded_kv"]  # the model ONNX Runtime refuses
    return [pytest.param(n, id=n, marks=() if n in REPRESENTATIVE else pytest.mark.slow) for n in names]


@pytest.mark.conformance
@pytest.mark.reference
@pytest.mark.parametrize("name", _network_params())
def test_op_case_networks_match_onnx_runtime(checked_trt, name, tmp_path):
    """The builder's network (IAttention, KV-cache update layers) checked against the real bindings and run on
    the numpy reference executor, against the original on ONNX Runtime."""
    case = CASES[name]
    errors = _reference(checked_trt, case, tmp_path)
    fp16 = any(v.dtype == np.float16 for v in case.inputs.values())  # an fp16 model computes (and rounds) in fp16
    assert errors and max(r if fp16 else e for e, r in errors.values()) <= (1e-2 if fp16 else 1e-4), errors
    node = next(n for n in case.model.graph.node if n.op_type == "Attention")
    assert node.output[3:4] in ([], [""]) or node.output[3] in errors, errors  # a QK output is compared as well


def test_cases_cover_every_configuration():
    """The suite this file runs has every configuration the route must handle (so a shrunk onnx fails here)."""
    words = " ".join(name for name in CASES)
    for part in ("3d", "4d", "gqa", "diff_heads", "scaled", "causal", "attn_mask", "bool", "past_and_present",
                 "nonpad", "window", "softcap", "qk_matmul", "fp16", "bf16"):
        assert part in words, part
    assert sum(1 for c in CASES.values() if not c.cpu_unrunnable) >= 87
    assert any(np.asarray(v).dtype == np.bool_ for c in CASES.values() for v in c.inputs.values())


@pytest.mark.conformance
@pytest.mark.reference
@pytest.mark.parametrize("precision", ["fp16", "bf16"])  # bf16: trtsim runs the ONNX ops around the layers
@pytest.mark.parametrize("name", REPRESENTATIVE)  # emulated in fp32 on ORT's CPU (each bf16 tensor rounded)
def test_op_case_networks_in_fp16_and_bf16(checked_trt, name, precision, tmp_path):
    """The fp32 cases as fp16/bf16 engines (IAttention and the cache updates in fp16/bf16) against the fp32
    original, within the precision's tolerance of each output's largest value."""
    from trtattn.verify.tolerance import CONVERSION_BOUNDS

    errors = _reference(checked_trt, CASES[name], tmp_path, precision)
    assert errors and max(r for _, r in errors.values()) <= CONVERSION_BOUNDS[precision]["rel"], errors
