"""normalize: on every zoo export, each attention Softmax ends up behind BMM1 -> at most one
Where/Add (a Cast allowed) -> Softmax with the scale on the Q side, equal to the original on ONNX
Runtime; fusability verdicts on hand-made edge cases; a model with nothing to improve is unchanged."""

import json

import numpy as np
import onnx
import pytest

from tests.conftest import sha256, zoo_cases
from trtattn.cli import main
from trtattn.match import match
from trtattn.rewrite.normalize import normalize_model
from trtattn.rewrite.normalize.fusability import verdict
from trtattn.site import AttentionSite, MaskKind, MaskStep, ScalePlacement, SiteKind
from trtattn.testing.graphs import attention_model


def chain_violations(model: onnx.ModelProto | onnx.GraphProto) -> list:
    """Every Softmax (in If/Loop/Scan bodies too) fed by MatMul -> [one Where/Add] -> [Cast] with no Mul/Div
    on the logits, and the first MatMul's operands: a scale may only sit on Q or K."""
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    producers = {o: n for n in graph.node for o in n.output}
    bad = [v for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
           for v in chain_violations(a.g)]
    for sm in (n for n in graph.node if n.op_type == "Softmax"):
        t, chain = sm.input[0], []
        while t in producers and producers[t].op_type != "MatMul":
            n = producers[t]
            chain.append(n.op_type)
            t = n.input[1] if n.op_type == "Where" else n.input[0]
        masking = [c for c in chain if c != "Cast"]
        if len(masking) > 1 or any(c not in ("Where", "Add") for c in masking) or t not in producers:
            bad.append((sm.name, chain))
    return bad


# Entries whose sites normalize lists instead of rewriting, by class: (what the reason says, how many).
LISTED = {
    "gemma2": ("soft-capped", 2),  # TensorRT's implicit pattern has no soft-capping step
    "bert-int8": ("logits are quantized", 2),
    "led": ("not a product with V", 2),  # the matcher's: Longformer's sliding-chunk encoder attention
}  # (sites in If/Loop bodies are normalized in place: chunked-loop, llama-merged)


@pytest.mark.parametrize("name,exporter", zoo_cases())
def test_zoo_follows_tensorrt_rules_after_normalize(zoo_export, name, exporter):
    model = onnx.load(str(zoo_export(name, exporter)))
    result = normalize_model(model)
    reason, listed = LISTED.get(name, ("", 0))
    not_normalized = [s.action for s in result.sites if s.action.startswith("skipped")] + \
        [s.reason for s in result.skipped]
    assert len(not_normalized) == listed and all(reason in why for why in not_normalized), not_normalized
    assert result.ok == (not listed), [r.row() for r in result.sites]
    listed_softmaxes = {r.site.softmax for r in result.sites if r.action.startswith("skipped")} | \
        {s.node for s in result.skipped}
    assert [v for v in chain_violations(result.model) if v[0] not in listed_softmaxes] == []
    if result.changed:
        v = result.verification
        assert v.passed and v.max_abs_err <= 1e-4
        assert all(r.max_abs_err is not None and r.max_abs_err <= 1e-4 for r in result.sites
                   if not r.action.startswith("skipped") and not r.site.graph)  # a body's: in the outputs
    after = match(result.model)
    assert len(after.sites) == len(result.sites) == len(match(model).sites)
    for site in after.sites:
        if site.source == "pattern" and site.softmax not in listed_softmaxes:
            assert site.scale_placement in (ScalePlacement.ON_Q, ScalePlacement.SQRT_ON_QK, ScalePlacement.NONE)
            assert not [s for s in site.mask_steps if s.op == "scale"]


@pytest.mark.parametrize("name", ["llama", "gpt2", "bart"])
def test_purely_causal_masks_become_range_comparisons(zoo_export, name):
    model = onnx.load(str(zoo_export(name, "torchscript")))
    result = normalize_model(model)
    causal = [r for r in result.sites if "Range" in r.mask_form]
    if name == "bart":  # the decoder self-attentions have no padding input: pure causal
        assert len(causal) == 2 and all(r.after.causal_skip for r in causal)
    else:  # causal + padding mask: kept as one Add of the combined mask
        assert causal == [] and all(r.mask_form == "Add (float)" for r in result.sites)


def test_gemma3_window_is_a_range_band(zoo_export):
    model = onnx.load(str(zoo_export("gemma3", "torchscript")))
    result = normalize_model(model)
    assert [r.site.window for r in result.sites] == [4, None]


def test_fold_scale_into_weights_leaves_no_mul_on_q():
    model = attention_model(scale_style="div_after")
    result = normalize_model(model, fold_scale_into_weights=True)
    assert result.ok and [r.scale_to for r in result.sites] == ["q_weights"]
    (site,) = match(result.model).sites
    assert site.scale_placement == ScalePlacement.NONE  # the scale now lives in the weights
    assert result.verification.max_abs_err <= 1e-4


def test_fold_refuses_a_fused_qkv_projection():
    model = attention_model(scale_style="div_after", qkv_style="split")
    result = normalize_model(model, fold_scale_into_weights=True)
    assert result.ok and [r.scale_to for r in result.sites] == ["q"]  # a Mul, not the shared weights


def test_nothing_to_improve_changes_nothing(tmp_path):
    model = attention_model(scale_style="mul_q", mask_style="additive_input")
    from trtattn.rewrite.normalize.cleanup import cleanup

    model, _ = cleanup(model)  # already folded, already normal
    src, out, report = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(model, str(src))
    assert main(["-q", "normalize", str(src), "-o", str(out), "--report", str(report)]) == 0
    assert out.read_bytes() == src.read_bytes()
    data = json.loads(report.read_text())
    assert data["changed"] is False and data["verification"]["note"] == "nothing to improve"


def test_normalize_bad_input_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_text("nope")
    assert main(["normalize", str(bad), "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a valid ONNX model" in err[0]


def test_normalize_keeps_the_input(tmp_path):
    src = tmp_path / "in.onnx"
    onnx.save(attention_model(mask_style="bias_and_mask"), str(src))
    before = sha256(src)
    assert main(["-q", "normalize", str(src), "-o", str(tmp_path / "out.onnx")]) == 0
    assert sha256(src) == before


# ------------------------------------------------------------------ fusability verdicts
def _site(head=64, dtype="float16", mask=MaskKind.NONE, steps=(), placement=ScalePlacement.ON_Q, **kw):
    return AttentionSite(name="s", kind=SiteKind.SELF, query="q", key="k", value="v", output="o", q_heads=8,
                         kv_heads=8, head_size=head, v_head_size=head, scale=head ** -0.5, scale_placement=placement,
                         mask=mask, mask_steps=tuple(steps), dtype=dtype, **kw)


@pytest.mark.parametrize("head,ok", [(64, True), (80, True), (96, True), (256, True), (512, False), (12, False),
                                     (100, False)])
def test_head_sizes(head, ok):
    v = verdict(_site(head), precision="fp16")
    assert v.implicit is ok and v.iattention is ok
    if not ok:
        assert f"head size {head}" in v.implicit_why[0]


def test_fp32_has_no_fused_kernel():
    v = verdict(_site(64, "float32"), precision="fp32")
    assert not v.implicit and not v.iattention and "fp32" in v.iattention_why[0]
    assert verdict(_site(64, "float32"), precision="bf16").iattention


@pytest.mark.parametrize("mask,steps", [(MaskKind.BOOLEAN, [MaskStep("where", "m", -np.inf)]),
                                        (MaskKind.ADDITIVE, [MaskStep("add", "m")])])
def test_one_mask_op_fuses(mask, steps):
    assert verdict(_site(mask=mask, steps=steps), precision="fp16").implicit


def test_a_second_op_in_the_chain_blocks_implicit_fusion_not_iattention():
    steps = [MaskStep("add", "bias"), MaskStep("add", "mask")]
    v = verdict(_site(mask=MaskKind.ADDITIVE, steps=steps), precision="fp16")
    assert not v.implicit and "2 ops between" in v.implicit_why[0] and v.iattention


def test_scale_after_bmm1_blocks_implicit_fusion():
    steps = [MaskStep("scale", value=0.125)]
    v = verdict(_site(steps=steps, placement=ScalePlacement.AFTER_BMM1), precision="fp16")
    assert not v.implicit and "after the first MatMul" in v.implicit_why[0] and v.iattention


def test_causal_mask_from_range_allows_skipping():
    from trtattn.match.probe import MaskMeaning
    from trtattn.site import CausalKind

    meaning = MaskMeaning(causal=CausalKind.UPPER_LEFT, pattern="causal")
    steps = [MaskStep("where", "m", -np.inf)]
    assert verdict(_site(mask=MaskKind.BOOLEAN, steps=steps), meaning=meaning, mask_ops={"Range", "LessOrEqual"}).causal_skip
    assert not verdict(_site(mask=MaskKind.BOOLEAN, steps=steps), meaning=meaning, mask_ops={"Trilu"}).causal_skip


@pytest.mark.parametrize("head,seq,ok", [(64, 512, True), (64, 1024, False), (80, 128, False), (32, None, False)])
def test_int8_limits(head, seq, ok):
    assert verdict(_site(head), precision="int8", max_seq=seq).iattention is ok
