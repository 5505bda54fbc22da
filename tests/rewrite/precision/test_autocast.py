"""fp16/bf16 by NVIDIA ModelOpt's AutoCast (trtattn.rewrite.precision), checked on CPU.

precision_table is checked on a hand-built model with known multiply-accumulate counts. On the fused
zoo Llama and BERT (TorchScript exports, standard ONNX Attention ops): the IO types are kept, >= 95%
of the matmul work runs in the requested dtype, the attention mask reaches the fp16 attention clamped
(no -inf), the rotary angles stay fp32, and the outputs match fp32 within the documented tolerance
(bf16 where ONNX Runtime's CPU provider has no kernels: emulated in fp32 on it, each bf16 tensor rounded,
and the ORT test says why it skips). keep_io_types=False and keep_fp32 do what they say; models AutoCast would
break are refused; the checker fails on a wrong number and on a NaN.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import trtattn
from trtattn.errors import TrtattnError, VerificationError
from trtattn.rewrite import precision as P
from trtattn.verify.tolerance import CONVERSION_BOUNDS

try:
    from trtattn.graph.feeds import make_feeds
except ImportError:  # before the package restructure (issue 14)
    from trtattn.inputs import make_feeds


needs_autocast = pytest.mark.usefixtures("autocast")


# ---------------------------------------------------------------- precision_table on known counts
def _table_model():
    """Five independent matmuls, each in its own dtype, with hand-counted work at b=2:
    MatMul fp16 [b,8,16]x[16,32]: 2*8*16*32 = 8192; Gemm fp32 [4,16]x[8,16]^T: 4*16*8 = 512;
    Conv fp16 [b,3,8,8] * [4,3,3,3] -> [b,4,6,6]: 2*4*36*27 = 7776; Attention bf16 Q [b,2,5,8],
    K/V [b,2,3,8] after a past of 4: 2*2*5*7*(8+8) = 2240; MatMul behind an int8 DequantizeLinear
    [b,4]x[4,4]: 2*4*4 = 32."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float16), "w16"),
             numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "wg"),
             numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float16), "wc"),
             numpy_helper.from_array(np.eye(4, dtype=np.float32), "wq"),
             numpy_helper.from_array(np.array(0.5, np.float32), "scale")]
    inputs = [helper.make_tensor_value_info("a", T.FLOAT16, ["b", 8, 16]),
              helper.make_tensor_value_info("g", T.FLOAT, [4, 16]),
              helper.make_tensor_value_info("c", T.FLOAT16, ["b", 3, 8, 8]),
              helper.make_tensor_value_info("q", T.BFLOAT16, ["b", 2, 5, 8]),
              helper.make_tensor_value_info("k", T.BFLOAT16, ["b", 2, 3, 8]),
              helper.make_tensor_value_info("v", T.BFLOAT16, ["b", 2, 3, 8]),
              helper.make_tensor_value_info("pk", T.BFLOAT16, ["b", 2, 4, 8]),
              helper.make_tensor_value_info("pv", T.BFLOAT16, ["b", 2, 4, 8]),
              helper.make_tensor_value_info("x8", T.INT8, ["b", 4])]
    nodes = [helper.make_node("MatMul", ["a", "w16"], ["y1"], name="mm16"),
             helper.make_node("Gemm", ["g", "wg"], ["y2"], name="gemm32", transB=1),
             helper.make_node("Conv", ["c", "wc"], ["y3"], name="conv16"),
             helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y4", "pk_out", "pv_out"], name="attn"),
             helper.make_node("DequantizeLinear", ["x8", "scale"], ["x8f"], name="dq"),
             helper.make_node("MatMul", ["x8f", "wq"], ["y5"], name="mm8")]
    outputs = [helper.make_tensor_value_info(n, T.UNDEFINED, None) for n in ("y1", "y2", "y3", "y4", "y5")]
    graph = helper.make_graph(nodes, "table", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def test_precision_table_counts_known_work():
    model = _table_model()
    work = {w.node: (w.dtype, w.macs) for w in P.matmul_work(model, dims={"b": 2})}
    assert work == {"mm16": ("fp16", 8192), "gemm32": ("fp32", 512), "conv16": ("fp16", 7776),
                    "attn": ("bf16", 2240), "mm8": ("int8", 32)}
    total = 8192 + 512 + 7776 + 2240 + 32
    table = P.precision_table(model, dims={"b": 2})
    assert list(table) == ["fp16", "bf16", "fp32", "int8"]  # largest share first
    assert table == pytest.approx({"fp16": 15968 / total, "bf16": 2240 / total, "fp32": 512 / total,
                                   "int8": 32 / total})
    # the batch scales everything but the static Gemm
    assert P.precision_table(model, dims={"b": 4})["fp32"] == pytest.approx(512 / (2 * total - 512))


def test_precision_table_counts_from_a_run_where_inference_loses_a_dim():
    """A Reshape to a shape given at run time: ONNX's inference cannot know the MatMul's input."""
    w = numpy_helper.from_array(np.ones((6, 5), np.float16), "w")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
         helper.make_node("MatMul", ["r", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", T.FLOAT16, ["n"]), helper.make_tensor_value_info("shape", T.INT64, [2])],
        [helper.make_tensor_value_info("y", T.FLOAT16, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(P.PrecisionError, match="'r'.*pass feeds"):
        P.precision_table(model, dims={"n": 12})
    feeds = {"x": np.ones(12, np.float16), "shape": np.array([2, 6], np.int64)}
    assert [(w.dtype, w.macs) for w in P.matmul_work(model, feeds)] == [("fp16", 2 * 6 * 5)]


def test_precision_table_refuses_uncounted_matmul_ops():
    node = helper.make_node("MatMulNBits", ["x", "w"], ["y"], domain="com.microsoft", name="q4")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    with pytest.raises(P.PrecisionError, match="com.microsoft:MatMulNBits .*q4"):
        P.precision_table(model)


# ---------------------------------------------------------------- the checker
def _pair(candidate_values: np.ndarray):
    """An fp32 original returning x, and a candidate returning a constant."""
    x = helper.make_tensor_value_info("x", T.FLOAT, [4])
    y = helper.make_tensor_value_info("y", T.FLOAT, [4])
    original = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "o", [x], [y]),
                                 opset_imports=[helper.make_opsetid("", 17)])
    const = numpy_helper.from_array(candidate_values.astype(np.float16), "c")
    cast = helper.make_node("Cast", ["c"], ["y"], to=T.FLOAT)
    keep = helper.make_node("Shape", ["x"], ["unused"])
    candidate = helper.make_model(helper.make_graph([keep, cast], "c", [x], [y], [const]),
                                  opset_imports=[helper.make_opsetid("", 17)])
    return original, candidate


def test_verify_fails_on_a_wrong_number_and_on_a_nan():
    feeds = [{"x": np.array([1.0, -2.0, 3.0, 4.0], np.float32)}]
    original, close = _pair(np.array([1.0, -2.0, 3.0, 4.001]))
    errors = P.verify(original, close, feeds, precision="fp16")
    assert errors["y"].nonfinite == 0 and errors["y"].rel < CONVERSION_BOUNDS["fp16"]["rel"]
    _, wrong = _pair(np.array([1.0, -2.0, 3.0, 4.5]))
    with pytest.raises(VerificationError, match="output 'y' is off by 0.5"):
        P.verify(original, wrong, feeds, precision="fp16")
    _, nan = _pair(np.array([1.0, np.nan, 3.0, 4.0]))
    with pytest.raises(VerificationError, match="'y' has 1 NaN/inf"):
        P.verify(original, nan, feeds, precision="fp16")


# ---------------------------------------------------------------- AutoCast on the fused zoo
_converted = {}


def converted(zoo_export, name, precision, **kwargs):
    """(fp32 original, Converted), once per test module: the fused zoo model (ViT as exported)."""
    key = (name, precision, tuple(sorted(kwargs.items())))
    if key not in _converted:
        original = onnx.load(str(zoo_export(name, "torchscript")))
        if name != "vit":
            original = trtattn.fuse(original).model
        options = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
        _converted[key] = (original, P.convert(original, precision, calibration_feeds=[make_feeds(original)],
                                               **options))
    return _converted[key]


def _io_types(model):
    return [(v.name, v.type.tensor_type.elem_type) for v in [*model.graph.input, *model.graph.output]]


def _check_feeds(model):
    return [make_feeds(model, seed=1), make_feeds(model, seed=2, dims={"seq": 12})]


@needs_autocast
@pytest.mark.parametrize("name", ["llama", "bert"])
def test_fp16_fused_model(zoo_export, name):
    original, result = converted(zoo_export, name, "fp16")
    assert _io_types(result.model) == _io_types(original)
    assert result.table["fp16"] >= 0.95, result.table
    attentions = [n for n in result.model.graph.node if n.op_type == "Attention"]
    assert len(attentions) == 2
    # the mask is computed in fp32 (AutoCast's range rule: finfo(float32).min), clamped, then cast
    assert any("out of range" in why for why in result.kept_fp32.values())
    clamps = [n for n in result.model.graph.node if n.name.endswith("/fp16_mask_clamp")]
    assert len(clamps) == 2 and all("clamps an attention mask" in result.kept_fp32[n.name] for n in clamps)
    errors = P.verify(original, result.model, _check_feeds(original))  # raises past CONVERSION_BOUNDS["fp16"]
    assert set(errors) == {o.name for o in original.graph.output}


@needs_autocast
def test_fp16_attention_mask_is_clamped_not_minus_inf(zoo_export):
    """The mask Attention reads is fp16's replacing fill where the fp32 mask had finfo(float32).min: not
    -inf, and not fp16's lowest value either (ONNX Runtime reads that as -inf and zeroes a fully masked row)."""
    original, result = converted(zoo_export, "llama", "fp16")
    attention = next(n for n in result.model.graph.node if n.op_type == "Attention")
    types = {v.name: v.type.tensor_type.elem_type for v in result.model.graph.value_info}
    assert types[attention.input[0]] == T.FLOAT16 and types[attention.input[3]] == T.FLOAT16
    probe = onnx.ModelProto()
    probe.CopyFrom(result.model)
    probe.graph.output.add(name=attention.input[3])
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    mask = session.run([attention.input[3]], make_feeds(original))[0]
    assert np.isfinite(mask).all() and mask.min() == np.float16(np.finfo(np.float16).min / 2)


@needs_autocast
def test_fp16_rotary_angles_stay_fp32(zoo_export):
    _, result = converted(zoo_export, "llama", "fp16")
    rotary = {n.name for n in result.model.graph.node if n.op_type in ("Sin", "Cos")}
    assert rotary and all("rotary angle" in result.kept_fp32.get(n, "") for n in rotary)


@needs_autocast
@pytest.mark.parametrize("name", ["llama", "bert"])
def test_bf16_fused_model(zoo_export, name):
    original, result = converted(zoo_export, name, "bf16")
    assert _io_types(result.model) == _io_types(original)
    assert result.table["bf16"] >= 0.95, result.table
    assert next(o.version for o in result.model.opset_import if o.domain in ("", "ai.onnx")) >= 22


@needs_autocast
@pytest.mark.parametrize("name", ["llama", "bert"])
def test_bf16_matches_fp32_on_cpu(zoo_export, name):
    """ONNX Runtime where it has bf16 kernels, else the model emulated on it or onnx's reference evaluator
    (P.compare says which)."""
    original, result = converted(zoo_export, name, "bf16")
    try:
        errors = P.verify(original, result.model, _check_feeds(original))  # raises past CONVERSION_BOUNDS["bf16"]
    except P.NotRunnableOnCpu as e:
        pytest.skip(str(e))
    assert set(errors) == {o.name for o in original.graph.output}


@needs_autocast
def test_bf16_on_onnx_runtime(zoo_export):
    original, result = converted(zoo_export, "llama", "bf16")
    why = P.ort_support(result.model)
    if why:
        pytest.skip(f"ONNX Runtime's CPU provider cannot run the bf16 model: {why}")
    _, runner = P.compare(original, result.model, _check_feeds(original)[:1])
    assert runner == "ONNX Runtime (CPU)"


@needs_autocast
def test_keep_io_types_false_converts_the_float_io(zoo_export):
    original, result = converted(zoo_export, "vit", "fp16", keep_io_types=False)
    assert {t for _, t in _io_types(original)} == {T.FLOAT}
    assert {t for _, t in _io_types(result.model)} == {T.FLOAT16}
    assert result.table["fp16"] >= 0.95
    errors = P.verify(original, result.model, [make_feeds(original, seed=1)])  # feeds cast to fp16
    assert all(e.nonfinite == 0 for e in errors.values())


@needs_autocast
def test_keep_fp32_node_stays_fp32(zoo_export):
    original = trtattn.fuse(onnx.load(str(zoo_export("bert", "torchscript")))).model
    first_ffn = next(n.name for n in original.graph.node if n.op_type == "MatMul" and "intermediate" in n.name)
    _, result = converted(zoo_export, "bert", "fp16", keep_fp32=(first_ffn,))
    node = next(n for n in result.model.graph.node if n.name == first_ffn)
    types = {i.name: i.data_type for i in result.model.graph.initializer}
    types.update({v.name: v.type.tensor_type.elem_type for v in result.model.graph.value_info})
    assert [types[t] for t in node.input] == [T.FLOAT, T.FLOAT]
    assert result.kept_fp32[first_ffn] == "asked (keep_fp32)"
    assert 0 < result.table["fp32"] < 0.5
    with pytest.raises(TrtattnError, match="keep_fp32 names no node of the model: nope"):
        P.convert(original, "fp16", keep_fp32=["nope"])


@needs_autocast
def test_ops_autocast_would_break_are_refused():
    """AutoCast moves a com.microsoft Attention into the ONNX domain (a different op): refused."""
    rng = np.random.default_rng(0)
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft", num_heads=2, name="ms_attn")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 5, 16])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)],
                              [numpy_helper.from_array(rng.standard_normal((16, 48)).astype(np.float32), "w"),
                               numpy_helper.from_array(np.zeros(48, np.float32), "b")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    with pytest.raises(P.PrecisionError, match=r"ms_attn \(com.microsoft:Attention\)"):
        P.convert(model, "fp16")


@needs_autocast
def test_convert_from_a_path_with_external_data(zoo_export, tmp_path):
    """Only the graph is loaded here; AutoCast reads the weights where they are, and nothing is left behind."""
    original = onnx.load(str(zoo_export("vit", "torchscript")))
    path = tmp_path / "vit.onnx"
    onnx.save_model(original, str(path), save_as_external_data=True, location="vit.onnx.data", size_threshold=0)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = P.convert(path, "fp16", calibration_feeds=make_feeds(original, dims={"batch": 1}))
    assert sorted(p.name for p in tmp_path.iterdir()) == before == ["vit.onnx", "vit.onnx.data"]
    assert result.table["fp16"] >= 0.95
    P.verify(path, result.model, [make_feeds(original, seed=1, dims={"batch": 1})])


def test_einsum_work_is_the_product_of_its_index_sizes():
    """XLNet and the Stable Diffusion block compute attention products with Einsum: 'bij,bjk->bik' at
    b=2, i=3, j=4, k=5 is 2*3*4*5 multiply-accumulates, in its inputs' dtype."""
    inputs = [helper.make_tensor_value_info("a", T.FLOAT16, [2, 3, 4]), helper.make_tensor_value_info("b", T.FLOAT16, [2, 4, 5]),
              helper.make_tensor_value_info("c", T.FLOAT, [2, 3, 5])]
    nodes = [helper.make_node("Einsum", ["a", "b"], ["ab"], equation="bij,bjk->bik", name="e"),
             helper.make_node("Einsum", ["c"], ["ct"], equation="bik->bki", name="t")]
    graph = helper.make_graph(nodes, "einsum", inputs, [helper.make_tensor_value_info("ab", T.FLOAT16, None),
                                                        helper.make_tensor_value_info("ct", T.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    work = {w.node: (w.dtype, w.macs) for w in P.matmul_work(model)}
    assert work == {"e": ("fp16", 120), "t": ("fp32", 30)}
    assert P.precision_table(model) == pytest.approx({"fp16": 120 / 150, "fp32": 30 / 150})


@needs_autocast
def test_control_flow_is_refused_naming_the_node():
    """AutoCast fails inside If/Loop/Scan bodies with errors that name nothing (llama-merged: a KeyError):
    refused up front, naming the node that holds the subgraphs."""
    x = helper.make_tensor_value_info("x", T.FLOAT, [2])
    branch = lambda name: helper.make_graph(  # noqa: E731
        [helper.make_node("Identity", ["x"], [f"{name}_y"])], name, [],
        [helper.make_tensor_value_info(f"{name}_y", T.FLOAT, [2])])
    cond = helper.make_tensor_value_info("cond", T.BOOL, [])
    node = helper.make_node("If", ["cond"], ["y"], name="use_cache_branch", then_branch=branch("a"), else_branch=branch("b"))
    model = helper.make_model(helper.make_graph([node], "g", [cond, x], [helper.make_tensor_value_info("y", T.FLOAT, [2])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(P.PrecisionError, match="control flow: use_cache_branch \\(If\\)"):
        P.convert(model, "fp16")


def test_rows_masked_everywhere_get_a_zero_query_in_each_attention_sharing_the_mask():
    """Two [B, S, N*H] Attentions reading one [B, 1, S, S] mask whose last query row is masked everywhere
    (finfo.min): each gets its own zero-query rows (one node per output name), and the rows stay uniform."""
    from trtattn.rewrite.precision.autocast import _clamp_masks

    b, s, heads, size = 2, 4, 2, 8
    q = helper.make_tensor_value_info("q", T.FLOAT, [b, s, heads * size])
    mask = helper.make_tensor_value_info("mask", T.FLOAT, [b, 1, s, s])
    outs = [helper.make_tensor_value_info(f"y{i}", T.FLOAT, [b, s, heads * size]) for i in range(2)]
    nodes = [helper.make_node("Attention", ["q", "q", "q", "mask"], [f"y{i}"], name=f"attn{i}", q_num_heads=heads,
                              kv_num_heads=heads) for i in range(2)]
    model = helper.make_model(helper.make_graph(nodes, "two", [q, mask], outs),
                              opset_imports=[helper.make_opsetid("", 23)])
    _clamp_masks(model, {"mask": T.FLOAT}, {"mask": 4, "q": 3})
    onnx.checker.check_model(model, full_check=True)  # every tensor written once
    rng = np.random.default_rng(0)
    m = np.zeros((b, 1, s, s), np.float32)
    m[:, :, -1, :] = np.finfo(np.float32).min
    feeds = {"q": rng.standard_normal((b, s, heads * size)).astype(np.float32), "mask": m}
    y0, y1 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    mean = np.broadcast_to(feeds["q"].mean(axis=1, keepdims=True), feeds["q"].shape)
    for y in (y0, y1):
        np.testing.assert_allclose(y[:, -1], mean[:, -1], rtol=1e-5, atol=1e-6)
