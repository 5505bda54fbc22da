"""The ragged forms' checks run on rows that each keep real tokens and differ in length, and say which
lengths they ran on: a per-row length error cannot hide in a row without tokens (a decoder step's seq=1
with its padded row all padding, as it once did)."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from tests.conftest import tampering
from trtattn import contract
from trtattn.errors import TrtattnError
from trtattn.rewrite.fuse import fuse_model
from trtattn.routes.prepare import form_adapter, forms, prepare
from trtattn.routes.prepare.forms import verify_form


@pytest.fixture(scope="module")
def bart_step(zoo_dir):
    from trtattn import zoo
    from trtattn.zoo import generation

    path = zoo.exported(zoo_dir / "bart-decoder-step.torchscript.onnx",
                        lambda p: generation.export("bart-decoder-step", "torchscript", p))
    original = onnx.load(str(path))
    return original, prepare(original, name="bart_step", form="kv-cache", precision="fp32")


def _misread(form: onnx.ModelProto, lengths: str, error: str) -> onnx.ModelProto:
    """The form with the per-row tensor `lengths` read wrong: one short ("off by one"), or every row as
    long as the longest ("longest": padding ignored, wrong only in rows shorter than another)."""
    graph = gs.import_onnx(form)
    read = graph.tensors()[lengths]
    wrong = gs.Variable(f"{lengths}/wrong", dtype=read.dtype, shape=read.shape)
    for consumer in list(read.outputs):
        consumer.inputs = [wrong if t is read else t for t in consumer.inputs]
    if error == "off by one":
        graph.nodes.append(gs.Node("Sub", "misread", inputs=[read, gs.Constant("one", np.array(1, np.int64))],
                                   outputs=[wrong]))
    else:
        longest = gs.Variable(f"{lengths}/longest", dtype=read.dtype, shape=[1])
        graph.nodes.append(gs.Node("ReduceMax", "longest", inputs=[read], outputs=[longest], attrs={"keepdims": 1}))
        graph.nodes.append(gs.Node("Max", "misread", inputs=[read, longest], outputs=[wrong]))
    graph.toposort()
    return gs.export_onnx(graph)


@pytest.mark.parametrize("lengths,error", [("encoder_attention_mask/lengths", "off by one"),
                                           ("encoder_attention_mask/lengths", "longest"),
                                           ("kv_lengths", "off by one")])  # (causal already bounds a longer kv)
def test_kv_cache_check_catches_a_length_error_in_any_row(bart_step, lengths, error):
    """BART's decoder step at its fitted seq=1: the check raises the new tokens to 3 per row and spreads the
    masks, so the encoder's lengths (cross-attention) and the cache's (self-attention) read wrong in the
    form are caught, also where only a padded row's length is wrong ("longest")."""
    original, prepared = bart_step
    assert prepared.verification.passed
    broken = _misread(prepared.form_model, lengths, error)
    outcome = verify_form("kv-cache", original, broken, [], atol=1e-4, rtol=1e-4)
    assert outcome.passed is False and outcome.max_abs_err > 1e-2, outcome


def test_kv_cache_check_says_the_rows_lengths_every_row_with_new_tokens(bart_step):
    _, prepared = bart_step
    lengths = prepared.verification.lengths
    assert len(lengths) == 2  # one record per iteration
    for rows in lengths:
        assert min(rows["new"]) >= 1 and len(set(rows["new"])) == len(rows["new"]) > 1, rows
        encoder = rows["encoder_attention_mask"]
        assert min(encoder) >= 1 and len(set(encoder)) == len(encoder), rows
    from trtattn.report import verdict

    assert f"rows: past {lengths[0]['past']}, new {lengths[0]['new']}" in verdict(prepared.verification)


def test_kv_cache_feeds_spread_new_tokens_over_one_to_seq(bart_step):
    """At seq=1 the fitted check dims give 3 new tokens; rows keep 3, 2, 1 of them (right padding),
    and the encoder mask's rows keep 7, 4, 1."""
    original, prepared = bart_step
    form = prepared.form_model
    adapter = form_adapter(original, [i.name for i in form.graph.input], contract.cache_inputs(form))
    dims = adapter.fit({"batch": 3, "seq": 1, "past": 6, "enc_seq": 7})
    assert dims["seq"] == 3
    rows = adapter.row_lengths(adapter.original_feeds(dims, 0))
    assert rows["new"] == [3, 2, 1] and rows["past"] == [6, 6, 6], rows
    assert rows["encoder_attention_mask"] == [7, 4, 1], rows


# Survivors of issue 20's mutation run (benchmarks/mutate.py):
# each test fails when the line its docstring names is mutated.
def test_a_form_that_fails_its_check_is_not_handed_on(zoo_export, monkeypatch):
    """forms/__init__.py:102 (the guard after verify_form): Llama's padded form (its RoPE lowered) that does not
    match the original raises, naming the form, instead of going on to the build (issue 20: 2.22 off)."""
    model = onnx.load(str(zoo_export("llama", "torchscript")))
    fused = fuse_model(model)
    assert fused.ok
    assert forms.derive("padded", model, fused).verification.passed
    monkeypatch.setattr(forms, "verify_form", tampering(forms.verify_form))
    with pytest.raises(TrtattnError, match="the padded form does not match the original model"):
        forms.derive("padded", model, fused)
