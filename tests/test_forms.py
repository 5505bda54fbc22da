"""The forms the engine builder lowers, each verified on ONNX Runtime before TensorRT sees it;
`trtattn build` without TensorRT: the plan, one sentence, non-zero exit, no traceback."""

import collections
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from trtattn import contract as forms
from trtattn.verify import adapter_for
from trtattn.build import prepare
from trtattn.errors import TrtattnError
from trtattn.graph.inputs import make_feeds


def ops(model):
    return collections.Counter(n.op_type for n in model.graph.node)


def run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in sess.get_inputs()}
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {k: v for k, v in feeds.items() if k in wanted})))


@pytest.mark.parametrize("name,exporter", [("llama", "torchscript"), ("gemma3", "torchscript"), ("llama", "dynamo"),
                                           ("llama-cache", "torchscript")])
def test_padded_form_turns_rope_into_rotary_embedding_ops(zoo_export, name, exporter):
    model = onnx.load(str(zoo_export(name, exporter)))
    prepared = prepare(model, name=name)
    assert ops(prepared.form_model)["RotaryEmbedding"] == 4  # Q and K of both layers
    assert len(prepared.plan.ropes) == 4 and len(prepared.plan.attentions) == 2
    assert not any(n.op_type == "Neg" for n in prepared.cut.model.graph.node)  # rotate_half is gone


@pytest.mark.parametrize("name,exporter", [("llama-cache", "torchscript"), ("llama-cache", "dynamo"),
                                           ("llama-cache-sdpa", "torchscript"), ("whisper-decoder-cache", "torchscript"),
                                           ("whisper-decoder-cache", "dynamo")])
def test_kv_cache_form(zoo_export, name, exporter):
    model = onnx.load(str(zoo_export(name, exporter)))
    prepared = prepare(model, name=name, form="kv-cache")
    form = prepared.form_model
    assert ops(form)["TensorScatter"] == 4 and ops(form)["Concat"] == 0 or ops(form)["TensorScatter"] == 4
    plan = prepared.plan
    assert len(plan.cache_updates) == 4
    self_attn = [a for a in plan.attentions if a.kv_lengths]
    assert len(self_attn) == 2 and all(a.causal == "lower_right" and a.mask is None for a in self_attn)
    assert set(plan.aliases.values()) == set(forms.cache_inputs(form))
    assert "attention_mask" not in {i["name"] for i in plan.inputs}
    assert any(i["name"] == forms.WRITE_INDEX for i in plan.inputs)


def test_kv_cache_form_ragged_rows_match_the_original_row_by_row(zoo_export):
    """Rows with different cache lengths in one batch: each equals the original run on that row alone."""
    model = onnx.load(str(zoo_export("llama-cache", "torchscript")))
    form = prepare(model, name="x", form="kv-cache").form_model
    caches = forms.cache_inputs(form)
    pasts, seq, capacity = [6, 3], 4, 16
    batch_feeds = {"input_ids": None, "position_ids": None}
    rows = []
    for b, past in enumerate(pasts):
        feeds = make_feeds(model, dims={"batch": 1, "past": past, "seq": seq}, seed=b, padding=False)
        rows.append((feeds, run(model, feeds)))
    batch_feeds = {"input_ids": np.concatenate([f["input_ids"] for f, _ in rows]),
                   "position_ids": np.concatenate([f["position_ids"] for f, _ in rows]),
                   forms.WRITE_INDEX: np.asarray(pasts, np.int64)}
    for name in caches:
        buf = np.zeros((2, 2, capacity, 16), np.float32)
        for b, (f, _) in enumerate(rows):
            buf[b, :, :pasts[b]] = f[name][0]
        batch_feeds[name] = buf
    out = run(form, batch_feeds)
    for b, (f, ref) in enumerate(rows):
        assert np.abs(out["last_hidden_state"][b] - ref["last_hidden_state"][0]).max() <= 1e-4
        present = out["present.0.key"][b, :, :pasts[b] + seq]
        assert np.abs(present - ref["present.0.key"][0]).max() <= 1e-4
        assert not out["present.0.key"][b, :, pasts[b] + seq:].any()  # nothing written past the new tokens


@pytest.mark.parametrize("name,exporter", [("bert", "torchscript"), ("bert", "dynamo"), ("gpt2", "torchscript"),
                                           ("llama", "torchscript"), ("llama-sdpa", "dynamo"), ("bert-sdpa", "dynamo")])
def test_packed_form_matches_the_padded_model_token_for_token(zoo_export, name, exporter):
    model = onnx.load(str(zoo_export(name, exporter)))
    prepared = prepare(model, name=name, form="packed")
    form = prepared.form_model
    assert forms.CU_SEQLENS in {i.name for i in form.graph.input}
    assert "attention_mask" not in {i.name for i in form.graph.input}
    assert all(a.form == "packed" and a.q_lengths == forms.CU_SEQLENS and a.mask is None for a in prepared.plan.attentions)
    # three ragged rows, longer than the verification the form ran with
    feeds = make_feeds(model, dims={"batch": 3, "seq": 9}, seed=3)
    lengths = [9, 4, 7]
    mask = np.zeros((3, 9), np.int64)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    feeds["attention_mask"] = mask
    ref = run(model, feeds)
    out = run(form, adapter_for(model, [i.name for i in form.graph.input]).feeds(feeds))
    name0 = model.graph.output[0].name
    expect = np.concatenate([ref[name0][b, :n] for b, n in enumerate(lengths)])
    assert np.abs(out[name0][0] - expect).max() <= 1e-4


@pytest.mark.parametrize("name,form,message", [("gemma3", "packed", "window"), ("bart", "packed", "cross-attention"), ("t5", "packed", "a bias"),
                                               ("bart", "kv-cache", "past cache"), ("vit", "packed", "token inputs")])
def test_forms_refuse_what_they_cannot_express(zoo_export, name, form, message):
    model = onnx.load(str(zoo_export(name, "torchscript")))
    with pytest.raises(TrtattnError, match=message):
        prepare(model, name=name, form=form)


def test_build_without_tensorrt_prints_the_plan_and_one_sentence(zoo_export, tmp_path):
    src = zoo_export("llama", "torchscript")
    script = Path(sys.executable).parent / "trtattn"
    proc = subprocess.run([str(script), "build", str(src), "--out-dir", str(tmp_path), "--save-onnx", str(tmp_path)],
                          capture_output=True, text=True)
    try:
        import tensorrt  # noqa: F401

        pytest.skip("TensorRT is installed: the build runs for real (see the trt tests)")
    except ImportError:
        pass
    assert proc.returncode == 4
    assert "build plan for llama.torchscript: 2 IAttention" in proc.stdout
    assert "trtattn/attn/model/layers.0/self_attn" in proc.stdout
    err = [line for line in proc.stderr.splitlines() if not line.startswith("[trtattn]")]
    assert len(err) == 1 and "TensorRT >= 11 is needed" in err[0] and "docker/" in err[0]
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("*.engine"))
    assert (tmp_path / "llama.torchscript.padded.onnx").exists() and (tmp_path / "llama.torchscript.padded.cut.onnx").exists()


@pytest.mark.parametrize("name,form", [("llama", "padded"), ("llama-cache", "kv-cache"), ("bert", "packed")])
def test_verify_command_compares_a_form_model_with_the_original(zoo_export, tmp_path, name, form):
    from trtattn.graph import io as onnxio
    from trtattn.cli import main

    src = zoo_export(name, "torchscript")
    prepared = prepare(onnx.load(str(src)), name=name, form=form)
    candidate = onnxio.save(prepared.form_model, tmp_path / f"{name}.{form}.onnx")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["-q", "verify", str(candidate), "--onnx", str(src), "--json"]) == 0
    data = json.loads(buf.getvalue())
    assert data["passed"] and data["form"] == form and data["runner"] == "onnxruntime"
    assert data["outputs"] and max(data["outputs"].values()) <= 1e-4
    if form != "packed":  # site outputs keep their layout: per-site errors
        assert len(data["sites"]) == 2


def test_verify_a_broken_candidate_fails(zoo_export, tmp_path):
    """A form model whose attention scale is off by 2%: verify must say FAILED, exit 1."""
    from trtattn.graph import io as onnxio
    from trtattn.cli import main

    src = zoo_export("bert", "torchscript")
    model = prepare(onnx.load(str(src)), name="bert").form_model
    for node in model.graph.node:
        if node.op_type == "Attention":
            for a in node.attribute:
                if a.name == "scale":
                    a.f *= 1.02
    candidate = onnxio.save(model, tmp_path / "broken.onnx")
    assert main(["-q", "verify", str(candidate), "--onnx", str(src)]) == 1


def test_verify_against_the_wrong_original_is_one_line(zoo_export, tmp_path, capsys):
    from trtattn.cli import main

    assert main(["-q", "verify", str(zoo_export("llama", "torchscript")), "--onnx",
                 str(zoo_export("bert", "torchscript"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "position_ids" in err[0]
