"""Read what ONNX Runtime runs, write nothing less valid than what was read, verify as the user loads it
(issue 26). Hand-built graphs in the styles of ONNX Runtime's transformer optimizer: each is read (with a
note naming the check it fails), fused where it has attention, and written so that ONNX Runtime with
default session options loads it; a model ONNX Runtime refuses too is refused with its reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtattn.cli import main
from trtattn.graph import io as onnxio
from trtattn.graph import validate
from trtattn.testing.graphs import attention_model

HIDDEN = 32  # attention_model's default heads * head


def _with_norm(model: onnx.ModelProto, op: str, domain: str = "", *, skip: bool = False, gamma_only=False,
               **attrs) -> onnx.ModelProto:
    """`model` with a normalization of its output appended, as ONNX Runtime's optimizer writes one; a node in
    another domain is added without importing that domain."""
    out = model.graph.output[0].name
    model.graph.initializer.extend([numpy_helper.from_array(np.full(HIDDEN, 1.5, np.float32), "norm_gamma"),
                                    numpy_helper.from_array(np.full(HIDDEN, 0.25, np.float32), "norm_beta")])
    inputs = [out] + (["x"] if skip else []) + ["norm_gamma"] + ([] if gamma_only else ["norm_beta"])
    model.graph.node.append(helper.make_node(op, inputs, ["normed"], name="norm", domain=domain, **attrs))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("normed", TensorProto.FLOAT, None))
    return model


def _loads_with_defaults(path) -> None:
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # default options: every optimization on


def _fuse(tmp_path, model: onnx.ModelProto, capsys) -> tuple[onnx.ModelProto, str]:
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    assert main(["fuse", str(src), "-o", str(out)]) == 0
    text = capsys.readouterr()
    written = onnx.load(out)
    assert sum(n.op_type == "Attention" for n in written.graph.node) == 1
    _loads_with_defaults(out)
    return written, text.out + text.err


def test_layernorm_below_opset_17_is_read_fused_and_written_valid(tmp_path, capsys):
    """ONNX defines LayerNormalization from opset 17; ONNX Runtime runs it (and its optimizer writes it) at 16."""
    model = _with_norm(attention_model(opset=16), "LayerNormalization", axis=-1, epsilon=1e-5)
    written, text = _fuse(tmp_path, model, capsys)
    assert "'LayerNormalization' does not exist at opset 16" in text and "ONNX Runtime loads it" in text
    assert validate.findings(written) == []  # at opset 23 it is an ONNX op: the output passes every check


def test_simplified_layernorm_in_the_default_domain_is_kept_as_onnx_runtime_runs_it(tmp_path, capsys):
    model = _with_norm(attention_model(opset=17), "SimplifiedLayerNormalization", gamma_only=True, axis=-1,
                       epsilon=1e-5)
    written, text = _fuse(tmp_path, model, capsys)
    assert "'SimplifiedLayerNormalization' is not an ONNX op" in text
    # the one check the input failed, and only it
    assert [(f.check, f.subject) for f in validate.findings(written)] == [("op", ("", "SimplifiedLayerNormalization"))]


def test_a_domain_the_model_does_not_import_is_imported_in_what_is_written(tmp_path, capsys):
    model = _with_norm(attention_model(opset=17), "SkipLayerNormalization", "com.microsoft", skip=True, epsilon=1e-5)
    assert [o.domain for o in model.opset_import] == [""]
    written, text = _fuse(tmp_path, model, capsys)
    assert "in domain 'com.microsoft', which the model does not import" in text
    assert {o.domain: o.version for o in written.opset_import}.get("com.microsoft") == 1
    assert validate.findings(written) == []


def test_nodes_out_of_order_are_sorted_keeping_every_name(tmp_path, capsys):
    model = attention_model(opset=17)
    names = {n.name for n in model.graph.node}
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes[::-1])
    read = onnx.ModelProto()
    read.CopyFrom(model)
    note = validate.check_read(read, "m.onnx")
    assert note and "which nothing before it defines: nodes sorted" in note
    assert {n.name for n in read.graph.node} == names and validate.findings(read) == []
    written, _ = _fuse(tmp_path, model, capsys)
    assert validate.findings(written) == []
    kept = names - {n.name for n in written.graph.node}  # the attention's nodes went into the op
    assert all(n.name in names or n.name.startswith("trtattn/") for n in written.graph.node) and kept


def _rank_mismatch_model() -> onnx.ModelProto:
    """No attention; a value_info of the wrong rank: ONNX's strict inference refuses it, ONNX Runtime runs it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Add", ["r", "x"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
                              value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 12])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nothing_to_fuse_is_copied_byte_for_byte_whatever_strict_inference_says(tmp_path, capsys):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_rank_mismatch_model(), src)
    assert main(["fuse", str(src), "-o", str(out)]) == 0
    assert "differ in rank" in capsys.readouterr().err
    assert out.read_bytes() == src.read_bytes()


def test_a_model_onnx_runtime_refuses_is_refused_with_its_reason(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("FooBar", ["x"], ["y"], name="foo")], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    src = tmp_path / "in.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    assert main(["fuse", str(src), "-o", str(tmp_path / "out.onnx")]) == 2
    err = capsys.readouterr().err
    assert "'FooBar' is not an ONNX op" in err and "ONNX Runtime refuses it too" in err and "No Op registered" in err
    assert not (tmp_path / "out.onnx").exists()


def test_a_written_model_may_fail_only_the_checks_its_input_failed(tmp_path):
    """The input fails strict inference (and ONNX Runtime runs it): an output failing it too is written; an
    output failing a check the input passed is not."""
    src = tmp_path / "in.onnx"
    onnx.save(_rank_mismatch_model(), src)
    onnxio.save(_rank_mismatch_model(), tmp_path / "same.onnx", protect=(src,))
    worse = _rank_mismatch_model()
    worse.graph.output.append(helper.make_tensor_value_info("ghost", TensorProto.FLOAT, None))
    with pytest.raises(validate.InvalidModelError, match="'ghost' is produced by no node"):
        onnxio.save(worse, tmp_path / "worse.onnx", protect=(src,))
    with pytest.raises(validate.InvalidModelError, match="differ in rank"):  # no input: the strict check holds
        onnxio.save(_rank_mismatch_model(), tmp_path / "alone.onnx")
    assert not (tmp_path / "worse.onnx").exists() and not (tmp_path / "alone.onnx").exists()


def test_an_int8_model_at_opset_20_is_written_at_23_so_onnx_runtime_loads_it(tmp_path, capsys):
    """int8 projections, the head split after them in float: at opset 21+ ONNX Runtime's Q/DQ propagation inserts
    a QuantizeLinear with output_dtype INT8, its int8 -> uint8 transformer gives it a uint8 zero point, and the
    session is refused (graph/qdq_pairs.py). The pairs written out, the fused model loads with default options
    and computes what the original computes."""
    from trtattn.graph.shapes import upgrade_opset

    model = attention_model(opset=20, qdq="proj")
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # the input loads
    with pytest.raises(Exception, match="output_dtype INT8 does not match y_zero_point type UINT8"):
        ort.InferenceSession(upgrade_opset(model, 23).SerializeToString(), providers=["CPUExecutionProvider"])
    written, _ = _fuse(tmp_path, model, capsys)  # loads with default options (in _fuse)
    assert next(o.version for o in written.opset_import if o.domain == "") == 23
    assert validate.findings(written) == []
    x = np.random.default_rng(1).standard_normal((2, 6, HIDDEN)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = ort.InferenceSession(str(tmp_path / "out.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got[0], expected[0], atol=1e-5)


def test_a_fused_model_onnx_runtime_refuses_with_default_options_is_not_written(tmp_path, capsys, monkeypatch):
    """Verification compares at ONNX Runtime's basic level; the model is then loaded as the user will load it,
    and a refusal there keeps the original (exit 1, ONNX Runtime's reason in the table)."""
    from trtattn.rewrite import fuse

    monkeypatch.setattr(fuse, "write_propagated_pairs", lambda model: 0)  # the int8 model as written before
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(attention_model(opset=20, qdq="proj"), src)
    assert main(["fuse", str(src), "-o", str(out)]) == 1
    text = capsys.readouterr().out
    assert "ONNX Runtime with default session options refuses the rewritten model" in text and "output_dtype" in text
    assert not out.exists()


def test_verify_fails_an_onnx_candidate_onnx_runtime_refuses_with_default_options(tmp_path, capsys):
    """The int8 model raised to opset 23 as it was written before: valid ONNX, equal at the basic level the
    comparison runs at, refused with default options: `trtattn verify` fails it, saying why."""
    from trtattn.graph.shapes import upgrade_opset

    model = attention_model(opset=20, qdq="proj")
    src, candidate = tmp_path / "in.onnx", tmp_path / "candidate.onnx"
    onnx.save(model, src)
    onnx.save(upgrade_opset(model, 23), candidate)
    assert main(["verify", str(candidate), "--onnx", str(src)]) == 1
    out = capsys.readouterr().out
    assert "refuses the candidate" in out and "output_dtype INT8" in out and "FAILED" in out
    onnx.save(model, candidate)  # the original itself passes
    assert main(["verify", str(candidate), "--onnx", str(src)]) == 0


def test_sorting_counts_what_a_subgraph_reads_from_the_scope_around_it():
    """An If whose branch reads a name a later node defines: the If goes after that node, as ONNX Runtime
    orders them; the model then passes every check and runs."""
    def branch(name):
        return helper.make_graph([helper.make_node("Identity", ["a"], [f"{name}_out"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2])])

    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch("then"), else_branch=branch("else")),
             helper.make_node("Relu", ["x"], ["a"], name="relu")]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(helper.make_graph(nodes, "g", [cond, x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    assert [f.check for f in validate.findings(model)] == ["order", "order"]  # each branch reads 'a' too early
    note = validate.check_read(model, "m.onnx")
    assert note and "nodes sorted" in note
    assert [n.name for n in model.graph.node] == ["relu", "if"] and validate.findings(model) == []
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"cond": np.array(True), "x": np.array([-1.0, 2.0], np.float32)})[0]
    np.testing.assert_array_equal(got, [0.0, 2.0])
