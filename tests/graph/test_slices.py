"""Models whose weights stay on disk (issue 11): analysis never reads them, verification maps them or runs
the model in slices of layers, outputs carry their external data, fp16 models are judged at fp16's
tolerance.

The model is trtattn/testing/write_llama.py's Llama (the graph TorchScript writes for LlamaForCausalLM) with a
hidden size of 256, so every weight matrix is over the 64 KB that a lazy load reads in.
"""

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import ROOT, sha256
from trtattn.graph import external, io, slices
from trtattn.graph.evaluate import ort_session
from trtattn.graph.feeds import make_feeds
from trtattn.graph.precision import Weighing, model_precision
from trtattn.graph.shapes import upgrade_opset
from trtattn.match import analyse, probe_feeds
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing import write_llama
from trtattn.verify import compare_models

SMALL = dict(layers=2, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=512, max_positions=64)


@pytest.fixture(scope="module")
def small_llama_path(tmp_path_factory):
    """The Llama writer's SMALL preset, in each dtype and form, written once per module."""
    out = tmp_path_factory.mktemp("scale")
    cache = {}

    def get(dtype: str = "float32", form: str = "padded") -> Path:
        if (dtype, form) not in cache:
            cache[dtype, form] = write_llama.write_llama(out / f"llama-{dtype}-{form}.onnx", dtype=dtype, form=form,
                                                         **SMALL)
        return cache[dtype, form]

    return get


def _copy(src: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for p in (src, src.with_name(src.name + ".data")):
        (folder / p.name).write_bytes(p.read_bytes())
    return folder / src.name


def _site_records(result) -> list:
    return [(s.name, s.q_heads, s.kv_heads, s.head_size, round(s.scale, 6), s.mask.value, s.causal.value,
             s.cache.value, s.query, s.key, s.value, s.output) for s in result.sites]


def test_lazy_load_leaves_the_weights_in_their_file(small_llama_path):
    path = small_llama_path()
    model = io.load(path, load_external_data=False)
    data = path.with_name(path.name + ".data")
    assert io.data_dir(model) == path.parent.resolve()
    assert external.external_bytes(model) > 0.9 * data.stat().st_size  # the weights are on disk...
    assert io.weight_bytes(model) < external.INLINE_LIMIT * 16  # ...and the proto holds only small tensors
    assert model.ByteSize() < 200_000


def test_analysis_never_reads_the_weights(small_llama_path, tmp_path):
    """The data file is replaced by NaNs of the same size after the load: what the analysis finds and
    what the masks mean must not change, and the rewritten model still names the bytes on disk."""
    path = _copy(small_llama_path(), tmp_path)
    model = upgrade_opset(io.load(path, load_external_data=False), 23)
    _, clean, clean_meanings = analyse(model, probe_feeds(model))
    data = path.with_name(path.name + ".data")
    data.write_bytes(b"\xff" * data.stat().st_size)  # NaN in every float, garbage in every int
    _, poisoned, meanings = analyse(model, probe_feeds(model))
    assert len(poisoned.sites) == SMALL["layers"]
    assert _site_records(poisoned) == _site_records(clean)
    assert {k: (m.pattern, m.causal, m.window, m.padding, m.bias) for k, m in meanings.items()} == \
        {k: (m.pattern, m.causal, m.window, m.padding, m.bias) for k, m in clean_meanings.items()}
    assert all(m.pattern == "causal" and m.padding for m in meanings.values())
    fused = fuse_model(io.load(path, load_external_data=False), verify=False)
    assert [r.status for r in fused.reports] == ["fused"] * SMALL["layers"]
    assert io.weight_bytes(fused.model) < external.INLINE_LIMIT * 16  # no weight was copied into the proto
    assert external.source_files(fused.model) == {data.resolve()}


def test_fuse_verifies_and_writes_external_data_without_touching_the_input(small_llama_path, tmp_path):
    path = _copy(small_llama_path(), tmp_path / "in")
    before = {p.name: sha256(p) for p in path.parent.iterdir()}
    out = tmp_path / "out" / "fused.onnx"
    proc = subprocess.run([sys.executable, "-m", "trtattn", "fuse", str(path), "-o", str(out)], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "2 fused" in proc.stdout and "passed" in proc.stdout
    assert {p.name: sha256(p) for p in path.parent.iterdir()} == before
    data = out.with_name(out.name + ".data")
    umask = os.umask(0)
    os.umask(umask)
    for p in (out, data):
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask
    written_model = io.load(out)  # complete: every weight loads, byte for byte the input's
    original = io.load(path)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in written_model.graph.initializer}
    for t in original.graph.initializer:
        if t.name in weights:
            assert np.array_equal(weights[t.name], onnx.numpy_helper.to_array(t)), t.name
    assert sum(n.op_type == "Attention" for n in written_model.graph.node) == SMALL["layers"]
    lazy = io.load(out, load_external_data=False)
    assert all(int(dict((e.key, e.value) for e in t.external_data).get("offset", 0)) % external.ALIGN == 0
               for t in lazy.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)


def test_outputs_never_replace_the_weights_of_an_input(small_llama_path, tmp_path):
    path = _copy(small_llama_path(), tmp_path)
    model = io.load(path, load_external_data=False)
    data = path.with_name(path.name + ".data")
    before = sha256(data)
    with pytest.raises(Exception, match="input's weights"):
        io.save(model, path, protect=())  # its PATH.data would be the file the model reads
    assert sha256(data) == before


def test_a_model_without_attention_keeps_its_external_data(tmp_path):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 64])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 64])
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w")
    graph = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "mlp", [x], [y], [w])
    src = tmp_path / "mlp.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(src),
              save_as_external_data=True, location="mlp.weights", size_threshold=0)
    out = tmp_path / "copy" / "mlp.onnx"
    proc = subprocess.run([sys.executable, "-m", "trtattn", "fuse", str(src), "-o", str(out)], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    loaded = io.load(out)  # loadable: the weights came along
    assert np.array_equal(onnx.numpy_helper.to_array(loaded.graph.initializer[0]),
                          onnx.numpy_helper.to_array(w))


def test_a_sliced_run_computes_what_the_whole_model_computes(small_llama_path):
    model = io.load(small_llama_path(form="cache"), load_external_data=False)
    names = [o.name for o in model.graph.output]
    pieces = slices.plan(model, names, budget=1 << 20)
    assert len(pieces) >= 4 and all(p.weights <= 1 << 20 or len(p.nodes) == 1 for p in pieces)
    feeds = [make_feeds(model, seed=seed) for seed in (0, 1)]
    session = ort_session(model)
    for one, sliced in zip(feeds, slices.run(model, pieces, feeds, names)):
        for name, value in zip(names, session.run(names, one)):
            np.testing.assert_array_equal(sliced[name], value)


def test_the_matcher_measures_a_model_too_large_for_one_session_in_slices(small_llama_path, monkeypatch):
    """The matcher measures the shapes inference cannot name by running the model (graph/measure.py): a model
    over half the memory runs there in slices of layers too (whole, the 8B's measurement held 21 GB), and
    the sites found are the same."""
    from trtattn.match import match

    whole = _site_records(match(io.load(small_llama_path(), load_external_data=False)))
    sessions = []
    real = slices.run
    monkeypatch.setattr(slices, "run", lambda *a, **k: sessions.append(len(a[1])) or real(*a, **k))
    monkeypatch.setenv(slices.SLICE_ENV, "1")  # slices of at most 1 MB of weights
    assert _site_records(match(io.load(small_llama_path(), load_external_data=False))) == whole and len(whole) == 2
    assert sessions and sessions[0] >= 4  # it ran, in slices


def test_fp16_weights_count_twice_in_a_slice(small_llama_path):
    """ONNX Runtime's CPU provider holds an fp32 copy of each fp16 MatMul weight: a slice's budget counts
    them at twice their size, so an fp16 model is cut into slices of half the bytes."""
    model = io.load(small_llama_path("float16"), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    pieces = slices.plan(model, [o.name for o in model.graph.output], budget=1 << 20)
    for p in pieces:
        on_disk = sum(external.nbytes(inits[n]) for n in {i for node in p.nodes for i in node.input} if n in inits
                      if inits[n].data_type == onnx.TensorProto.FLOAT16)
        assert p.weights >= 2 * on_disk and (2 * on_disk <= 1 << 20 or len(p.nodes) == 1)
    assert sum(p.weights for p in pieces) >= 2 * sum(external.nbytes(t) for t in inits.values()
                                                     if t.data_type == onnx.TensorProto.FLOAT16)


def test_fuse_verifies_in_slices_when_told_to(small_llama_path, monkeypatch):
    monkeypatch.setenv(slices.SLICE_ENV, "1")  # slices of at most 1 MB of weights
    result = fuse_model(io.load(small_llama_path(), load_external_data=False))
    assert result.ok and result.verification.slices >= 4
    assert all(r.max_abs_err is not None and r.max_abs_err < 1e-4 for r in result.reports)


def test_fp16_models_are_verified_at_fp16_tolerance(small_llama_path):
    model = io.load(small_llama_path("float16"), load_external_data=False)
    assert model_precision(model, Weighing.STORED).name == "fp16"
    result = fuse_model(model)
    assert result.ok, result.verification
    assert 0 < result.verification.max_abs_err <= 1e-2  # fp16 rounding, not an fp32-exact match
    strict = fuse_model(model, atol=1e-5, rtol=1e-5)
    assert not strict.ok and all(r.status != "fused" and "verification failed" in r.reason for r in strict.reports)


def test_a_wrong_candidate_fails_at_any_tolerance(small_llama_path):
    """The looser fp16 bound still catches a real difference: the same model with one weight changed."""
    model = io.load(small_llama_path("float16"), load_external_data=False)
    changed = io.load(small_llama_path("float16"))
    w = next(t for t in changed.graph.initializer if "layers.1.self_attn.v_proj" in t.name)
    array = onnx.numpy_helper.to_array(w).copy()
    array[:, :8] *= -1
    w.CopyFrom(onnx.numpy_helper.from_array(array, w.name))
    outcome = compare_models(model, changed, atol=1e-2, rtol=1e-2)
    assert not outcome.passed and max(outcome.output_errors.values()) > 0.05


def _constant_output(values, name="y"):
    """A model giving `values` whatever its input (x * 0 + values)."""
    h = onnx.helper
    c = onnx.numpy_helper.from_array(np.asarray(values, np.float32), "c")
    zero = onnx.numpy_helper.from_array(np.zeros(len(values), np.float32), "zero")
    nodes = [h.make_node("Mul", ["x", "zero"], ["x0"]), h.make_node("Add", ["x0", "c"], [name])]
    graph = h.make_graph(nodes, "const", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [len(values)])],
                         [h.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [len(values)])], [c, zero])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("error,passes", [(0.015, True), (0.07, False)])
def test_an_elements_error_is_judged_against_its_outputs_scale(error, passes):
    """fp16 bound 0.01 + 0.01 * 5 for an output whose largest value is 5: an element near 0 may be off by
    0.015 (rounding grows with the values it was computed from: logits after 32 fp16 layers), not 0.07."""
    outcome = compare_models(_constant_output([5.0, 1e-3]), _constant_output([5.0, 1e-3 + error]), atol=1e-2, rtol=1e-2)
    assert outcome.passed == passes and outcome.bounds["y"] == pytest.approx(0.06)


def test_session_source_links_the_weights_for_tools_that_open_a_path(small_llama_path):
    model = io.load(small_llama_path(), load_external_data=False)
    with io.session_source(model) as source:
        assert isinstance(source, str) and os.path.exists(source)
        session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
        feeds = make_feeds(model)
        np.testing.assert_allclose(session.run(None, feeds)[0], ort_session(model).run(None, feeds)[0], atol=1e-5)


def test_kv_cache_form_of_a_lazily_loaded_model_counts_its_precision(small_llama_path):
    """build's kv-cache form of a model loaded without its weights: its precision table runs the form where
    ONNX's inference loses a dim, reading the weights where the model records them (it failed: ONNX Runtime
    refuses external data for a model given as bytes)."""
    from trtattn.routes.prepare import prepare

    model = io.load(small_llama_path(form="cache"), load_external_data=False)
    prepared = prepare(model, name="llama", form="kv-cache", precision="fp32")
    assert prepared.plan.precision_table == {"fp32": 1.0}


def test_the_work_count_runs_a_model_too_large_for_one_session_in_slices(small_llama_path, monkeypatch):
    """precision's work count needs a run where ONNX's inference leaves shapes open (the kv-cache form); a model
    too large for one session (the 8B fp16 cache model's form: killed at 24 GB) runs in slices, counting the same."""
    from trtattn.contract import cache_inputs
    from trtattn.rewrite.precision import work
    from trtattn.routes.prepare import forms, prepare

    path = small_llama_path("float16", form="cache")
    original = io.load(path, load_external_data=False)
    before = sorted(path.parent.iterdir())
    form = prepare(original, name="llama", form="kv-cache", precision="fp32").form_model
    adapter = forms.form_adapter(original, [i.name for i in form.graph.input], cache_inputs(form))
    feeds = adapter.feeds(adapter.original_feeds(None, 0))
    whole = work.count_work(form, feeds, None, None, path.parent)
    assert sorted(path.parent.iterdir()) == before  # its probe model is not written beside the weights
    sessions = []
    real = slices.run
    monkeypatch.setattr(slices, "run", lambda *a, **k: sessions.append(len(a[1])) or real(*a, **k))
    monkeypatch.setenv(slices.SLICE_ENV, "1")  # slices of at most 1 MB of weights
    sliced = work.count_work(form, feeds, None, None, path.parent)
    assert sessions and sessions[-1] >= 4  # it ran, in slices
    assert sliced == whole and sum(w.macs for w in whole) > 0
