"""tests/trtsim: the real TensorRT bindings on CPU, the checked recording `tensorrt` stand-in, and the
numpy reference executor, each compared with something independent (the real bindings' signatures,
ONNX Runtime's standard Attention / TensorScatter / RotaryEmbedding and basic ops)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from trtsim import bindings
from trtsim.checked import (
    ArgumentError,
    BuildValidationError,
    MissingMemberError,
    NetworkError,
    NotAnEngine,
    aliased_inputs,
)
from trtsim.execute import DroppedCacheWritesWarning, ExecutionError, FullyMaskedRowsWarning, run
from trtsim.graph import plan
from trtsim.signatures import parse_signatures

conformance = pytest.mark.conformance
reference = pytest.mark.reference
TOL = dict(rtol=1e-5, atol=1e-5)
TESTS = Path(__file__).parent


# --------------------------------------------------------------------------- helpers


def ort_run(nodes, feeds: dict, outputs: list[tuple[str, np.dtype]], opset: int = 23, initializers=()):
    def info(name, dtype, shape=None):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)

    graph = helper.make_graph(nodes, "reference", [info(n, a.dtype, a.shape) for n, a in feeds.items()],
                              [info(n, d) for n, d in outputs], initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run([n for n, _ in outputs], feeds)


def new_network(trt):
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    return builder, network


def trt_dtype(trt, dtype):
    return {"float32": trt.float32, "float16": trt.float16, "int32": trt.int32, "int64": trt.int64,
            "bool": trt.bool, "int8": trt.int8}[np.dtype(dtype).name]


def add_inputs(trt, network, feeds: dict, dynamic: bool = False):
    return {name: network.add_input(name, trt_dtype(trt, a.dtype), (-1,) * a.ndim if dynamic else a.shape)
            for name, a in feeds.items()}


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def onnx_attention(q, k, v, causal="NONE", mask=None, nonpad=None):
    """The standard ONNX Attention op on ONNX Runtime, scale 1 (TensorRT's IAttention has no scale).
    ONNX Runtime anchors is_causal at the top left without a past and at the bottom right with a past
    or nonpad_kv_seqlen, so LOWER_RIGHT is expressed with a past of length Skv - Sq."""
    names, feeds = ["Q", "K", "V"], {"Q": q, "K": k, "V": v}
    if mask is not None:
        feeds["M"] = mask
    past = k.shape[2] - q.shape[2]
    if causal == "LOWER_RIGHT" and nonpad is None and past:
        assert past > 0
        feeds.update(K=k[:, :, past:], V=v[:, :, past:], PK=k[:, :, :past], PV=v[:, :, :past])
    names += ["M" if "M" in feeds else "", "PK" if "PK" in feeds else "", "PV" if "PV" in feeds else ""]
    if nonpad is not None:
        feeds["NP"] = nonpad.astype(np.int64)
        names.append("NP")
    while names[-1] == "":
        names.pop()
    outputs = ["Y", "present_key", "present_value"] if "PK" in feeds else ["Y"]  # ORT wants presents with a past
    node = helper.make_node("Attention", names, outputs, scale=1.0, is_causal=int(causal != "NONE"))
    return ort_run([node], feeds, [(n, q.dtype) for n in outputs], opset=24 if nonpad is not None else 23)[0]


def attention_network(trt, feeds, causal="NONE", q_packed=False, kv_packed=False, dynamic=True):
    """q, k, v [, mask, query_lengths, key_value_lengths] from feeds -> network with one IAttention."""
    builder, net = new_network(trt)
    t = add_inputs(trt, net, feeds, dynamic=dynamic)
    attn = net.add_attention_v2(t["q"], t["k"], t["v"], trt.AttentionNormalizationOp.SOFTMAX,
                                getattr(trt.CausalMaskKind, causal))
    if "mask" in t:
        attn.mask = t["mask"]
    if q_packed:
        attn.query_form = trt.AttentionIOForm.PACKED_NHD
        attn.query_lengths = t["query_lengths"]
    if kv_packed:
        attn.key_value_form = trt.AttentionIOForm.PACKED_NHD
    if "key_value_lengths" in t:
        attn.key_value_lengths = t["key_value_lengths"]
    attn.decomposable = True
    out = attn.get_output(0)
    out.name = "out"
    net.mark_output(out)
    return builder, net, attn


def profile_for(builder, feeds):
    profile = builder.create_optimization_profile()
    for name, a in feeds.items():
        profile.set_shape(name, a.shape, a.shape, a.shape)
    return profile


# --------------------------------------------------------------------------- part 1: bindings


@conformance
def test_real_bindings_import_on_cpu(real_trt):
    trt = real_trt
    assert trt.__name__ == "tensorrt_bindings"
    assert trt.__version__.startswith("11.")
    assert Path(trt.__file__).parent.name == "tensorrt_bindings"
    assert callable(trt.INetworkDefinition.add_attention_v2)
    assert callable(trt.INetworkDefinition.add_kv_cache_update)
    assert callable(trt.INetworkDefinition.add_rotary_embedding)
    assert isinstance(trt.IAttention.query_lengths, property)
    assert not hasattr(trt.IAttention, "set_query_lengths")  # the C++ name, absent from the Python API
    assert list(trt.CausalMaskKind.__members__) == ["NONE", "UPPER_LEFT", "LOWER_RIGHT"]
    assert bindings.stub_calls() in (0, None)  # importing ran no TensorRT function


@conformance
def test_stub_symbols_come_from_nm(real_trt):
    so = bindings.extension_path()
    assert so is not None and so.exists()
    assert set(bindings.FALLBACK_LIBRARIES) <= set(bindings.needed_libraries(so))
    derived = bindings.missing_symbols(so)
    if not bindings.shutil.which("nm"):
        pytest.skip("nm is not installed; the fallback list is used")
    assert set(bindings.FALLBACK_SYMBOLS) <= set(derived)
    assert not any(s.startswith(("Py", "_Py", "dl")) for s in derived)
    if bindings.stub_calls() is not None:  # stubs were needed: they are what the process mapped
        maps = Path("/proc/self/maps")
        if maps.exists():
            assert "trt-stubs-" in maps.read_text()


@conformance
def test_load_bindings_in_a_fresh_process(tmp_path):
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from trtsim import bindings; "
            "m = bindings.load_bindings(sys.argv[2]); "
            "print(m.__version__ if m else 'NONE', bindings.stub_calls(), bindings.unavailable_reason)")
    ok = subprocess.run([sys.executable, "-c", code, str(TESTS), str(tmp_path / "a")], capture_output=True, text=True)
    if "not installed" in ok.stdout:
        pytest.skip("TensorRT bindings are not installed")
    assert ok.returncode == 0, ok.stderr
    version, calls, reason = ok.stdout.split()
    assert version.startswith("11.") and calls in ("0", "None") and reason == "None"
    # Without gcc on PATH (and so without nm/readelf) the reason is one clear sentence.
    env = dict(os.environ, PATH="")
    bare = subprocess.run([sys.executable, "-c", code, str(TESTS), str(tmp_path / "b")], capture_output=True,
                          text=True, env=env)
    assert bare.returncode == 0, bare.stderr
    if bindings.stub_calls() is not None:
        assert bare.stdout.startswith("NONE None gcc is needed"), bare.stdout


# --------------------------------------------------------------------------- part 2: checked API


@conformance
def test_nonexistent_method_is_caught(checked_trt):
    trt = checked_trt
    _, net = new_network(trt)
    q = net.add_input("q", trt.float32, (-1, 2, -1, 8))
    attn = net.add_attention_v2(q, q, q, trt.AttentionNormalizationOp.SOFTMAX, trt.CausalMaskKind.NONE)
    lengths = net.add_input("lengths", trt.int32, (-1,))
    with pytest.raises(MissingMemberError, match=r"IAttention has no attribute 'set_query_lengths'.*'query_lengths'"):
        attn.set_query_lengths(lengths)
    assert isinstance(MissingMemberError("x"), AttributeError)
    assert not hasattr(attn, "set_key_value_lengths")  # hasattr() stays honest for version checks
    attn.query_lengths = lengths  # the 11.4 spelling is accepted
    assert attn.query_lengths is lengths
    assert [(c.owner, c.member) for c in trt.sim.log if c.kind == "missing"] == [
        ("IAttention", "set_query_lengths"), ("IAttention", "set_key_value_lengths")]
    with pytest.raises(MissingMemberError, match="INetworkDefinition has no attribute 'add_attention_v3'"):
        net.add_attention_v3
    with pytest.raises(MissingMemberError, match="has no attribute 'precision'"):
        net.get_layer(0).precision  # removed in TensorRT 11 (strongly typed only)


@conformance
def test_wrong_arguments_are_caught(checked_trt):
    trt = checked_trt
    _, net = new_network(trt)
    q = net.add_input("q", trt.float32, (1, 2, 3, 8))
    with pytest.raises(ArgumentError, match="causal_kind.*got True where a CausalMaskKind member"):
        net.add_attention_v2(q, q, q, trt.AttentionNormalizationOp.SOFTMAX, True)  # the 10.x bool
    with pytest.raises(ArgumentError, match="unexpected keyword argument 'causal'"):
        net.add_attention_v2(q, q, q, trt.AttentionNormalizationOp.SOFTMAX, causal=trt.CausalMaskKind.NONE)
    with pytest.raises(ArgumentError, match="missing argument 'causal_kind'"):
        net.add_attention_v2(q, q, q, trt.AttentionNormalizationOp.SOFTMAX)
    with pytest.raises(ArgumentError, match="input2.*ITensor"):
        net.add_elementwise(q, np.ones((1, 1, 1, 1), np.float32), trt.ElementWiseOperation.PROD)
    with pytest.raises(ArgumentError, match="rotary_embedding_dim.*got bool"):
        net.add_rotary_embedding(q, q, q, False, False)
    with pytest.raises(ArgumentError, match="shape"):
        net.add_input("x", trt.float32, "1,2")
    with pytest.raises(ArgumentError, match="float64 cannot become Weights"):
        net.add_constant((1,), np.array([0.5]))
    with pytest.raises(ArgumentError, match=r"1 << int\(flag\)"):
        trt.Builder(trt.Logger()).create_network(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    # Overloads: build_serialized_network has two; a bad call reports both.
    builder = trt.Builder(trt.Logger())
    with pytest.raises(ArgumentError) as info:
        builder.build_serialized_network(net)
    assert str(info.value).count("build_serialized_network(self") == 2


@conformance
def test_enums_are_the_real_ones(checked_trt, real_trt):
    trt = checked_trt
    assert trt.CausalMaskKind.LOWER_RIGHT is real_trt.CausalMaskKind.LOWER_RIGHT
    assert trt.float16 is real_trt.float16
    assert trt.Logger.WARNING is real_trt.ILogger.Severity.WARNING
    with pytest.raises(AttributeError):
        trt.CausalMaskKind.LOWER_LEFT
    with pytest.raises(AttributeError):
        trt.AttentionIOForm.PACKED
    with pytest.raises(MissingMemberError, match="tensorrt has no attribute 'RotaryEmbeddingMode'"):
        trt.RotaryEmbeddingMode


@conformance
def test_property_writes_are_checked(checked_trt):
    trt = checked_trt
    _, net = new_network(trt)
    q = net.add_input("q", trt.float32, (1, 2, 3, 8))
    attn = net.add_attention_v2(q, q, q, trt.AttentionNormalizationOp.SOFTMAX, trt.CausalMaskKind.NONE)
    with pytest.raises(MissingMemberError, match="get_output is a method, not a property"):
        attn.get_output = None
    with pytest.raises(MissingMemberError, match="IAttention has no attribute 'query_len'"):
        attn.query_len = q
    with pytest.raises(MissingMemberError, match="ITensor.dtype is a read-only property"):
        q.dtype = trt.float16
    with pytest.raises(ArgumentError, match="query_form.*AttentionIOForm"):
        attn.query_form = trt.CausalMaskKind.NONE
    with pytest.raises(ArgumentError, match="decomposable.*bool"):
        attn.decomposable = 1
    with pytest.raises(ArgumentError, match="mask.*ITensor"):
        attn.mask = np.ones((1, 1, 3, 3), bool)
    attn.query_form = trt.AttentionIOForm.PACKED_NHD
    attn.decomposable = True
    attn.metadata = "site 0"
    assert attn.query_form is trt.AttentionIOForm.PACKED_NHD and attn.decomposable is True
    assert attn.metadata == "site 0" and attn.causal_kind is trt.CausalMaskKind.NONE
    shuffle = net.add_shuffle(q)
    shuffle.first_transpose = (0, 2, 1, 3)
    shuffle.reshape_dims = (0, 0, 16)
    assert tuple(shuffle.get_output(0).shape) == (1, 3, 16)
    with pytest.raises(NetworkError, match="cannot reshape"):
        shuffle.reshape_dims = (5, 5)


@conformance
def test_layers_report_real_types_and_downcast(checked_trt, real_trt):
    trt = checked_trt
    _, net = new_network(trt)
    q = net.add_input("q", trt.float32, (1, 2, 4, 8))
    cache = net.add_input("cache", trt.float32, (1, 2, 16, 8))
    index = net.add_input("index", trt.int32, (1,))
    cos = net.add_input("cos", trt.float32, (1, 4, 4))
    rope = net.add_rotary_embedding(q, cos, cos, False, 0)
    kv = net.add_kv_cache_update(cache, rope.get_output(0), index, trt.KVCacheMode.LINEAR)
    net.add_attention_v2(rope.get_output(0), kv.get_output(0), kv.get_output(0),
                         trt.AttentionNormalizationOp.SOFTMAX, trt.CausalMaskKind.LOWER_RIGHT)
    types = [net.get_layer(i).type for i in range(net.num_layers)]
    L = real_trt.LayerType
    assert types == [L.ROTARY_EMBEDDING, L.KV_CACHE_UPDATE, L.ATTENTION_INPUT, L.ATTENTION_OUTPUT]
    assert isinstance(rope, trt.IRotaryEmbeddingLayer) and isinstance(rope, trt.ILayer)
    assert isinstance(q, trt.ITensor) and not isinstance(q, trt.ILayer)
    boundary = net.get_layer(2)
    assert isinstance(boundary, trt.ILayer) and not isinstance(boundary, trt.IAttentionInputLayer)
    with pytest.raises(MissingMemberError):  # get_layer returns ILayer, as the real binding does
        boundary.attention
    boundary.__class__ = trt.IAttentionInputLayer
    assert boundary.attention.causal_kind is trt.CausalMaskKind.LOWER_RIGHT
    other = net.get_layer(0)
    with pytest.raises(TypeError, match="cannot view a IRotaryEmbeddingLayer as IShuffleLayer"):
        other.__class__ = trt.IShuffleLayer
    assert kv.get_output(0)._aliases is cache  # the cache update writes in place


@conformance
def test_every_binding_signature_parses(real_trt):
    """The checker relies on docstrings; a method without a parsable signature would go unchecked."""
    unparsed = []
    for name in dir(real_trt):
        cls = getattr(real_trt, name)
        if not isinstance(cls, type) or name.startswith("_"):
            continue
        for member, value in vars(cls).items():
            if member.startswith("_") or not callable(value) or isinstance(value, type):
                continue
            if type(value).__name__ != "instancemethod":
                continue
            if not parse_signatures(value.__doc__, member):
                unparsed.append(f"{name}.{member}")
    assert unparsed == []


@conformance
def test_full_builder_flow_is_accepted_and_logged(checked_trt, tmp_path):
    trt = checked_trt
    model = _two_output_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)

    class Monitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)
            self.phases = []

        def phase_start(self, phase_name, parent_phase, num_steps):
            self.phases.append(phase_name)

        def step_complete(self, phase_name, step):
            return True

        def phase_finish(self, phase_name):
            pass

    logger = trt.Logger(trt.Logger.INFO)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(path.read_bytes(), str(path)) and parser.num_errors == 0
    x = network.get_input(0)
    assert (x.name, x.dtype, tuple(x.shape)) == ("x", trt.float32, (-1, 3))
    assert [network.get_output(i).name for i in range(network.num_outputs)] == ["a", "y"]
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 28)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    monitor = Monitor()
    config.progress_monitor = monitor
    cache = config.create_timing_cache(b"")
    assert config.set_timing_cache(cache, False)
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 3), (2, 3), (4, 3))
    profile.set_shape("p", (1, 3), (2, 3), (4, 3))
    assert config.add_optimization_profile(profile) == 0
    engine = builder.build_serialized_network(network, config)
    assert isinstance(engine, NotAnEngine)
    with pytest.raises(TypeError):
        bytes(engine)
    assert monitor.phases  # the monitor was exercised the way a build would
    used = trt.sim.used()
    for api in ("OnnxParser.parse", "IBuilderConfig.progress_monitor", "IBuilderConfig.set_memory_pool_limit",
                "IOptimizationProfile.set_shape", "Builder.build_serialized_network", "ITensor.shape"):
        assert api in used
    assert "IBuilderConfig.set_memory_pool_limit(pool=MemoryPoolType.WORKSPACE, pool_size=268435456) -> None" in \
        trt.sim.format_log()
    assert bindings.stub_calls() in (0, None)


@conformance
def test_parser_reports_errors(checked_trt):
    trt = checked_trt
    logger = trt.Logger()
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(b"not an onnx model") is False
    assert parser.num_errors == 1
    error = parser.get_error(0)
    assert error.code() is trt.ErrorCode.MODEL_DESERIALIZE_FAILED and "cannot read" in error.desc()
    assert logger.messages and logger.messages[0][0] is trt.Logger.ERROR


@conformance
def test_build_validation(checked_trt):
    trt = checked_trt
    rng = np.random.default_rng(0)
    feeds = {"q": rand(rng, 1, 2, 3, 8), "k": rand(rng, 1, 2, 3, 8), "v": rand(rng, 1, 2, 3, 8),
             "mask": np.ones((1, 1, 3, 3), bool)}
    builder, net, _ = attention_network(trt, feeds, causal="LOWER_RIGHT")
    config = builder.create_builder_config()
    with pytest.raises(BuildValidationError) as info:
        builder.build_serialized_network(net, config)
    message = str(info.value)
    assert "mask together with causal_kind" in message
    assert "need an optimization profile" in message
    builder, net, attn = attention_network(trt, {k: feeds[k] for k in "qkv"}, q_packed=False, dynamic=False)
    attn.key_value_form = trt.AttentionIOForm.PACKED_NHD
    with pytest.raises(BuildValidationError, match="needs key_value_lengths"):
        builder.build_serialized_network(net, builder.create_builder_config())


@conformance
def test_remove_tensor_in_use_is_ignored_with_a_warning(checked_trt):
    trt = checked_trt
    logger = trt.Logger()
    builder = trt.Builder(logger)
    net = builder.create_network(0)
    x = net.add_input("x", trt.float32, (2,))
    net.add_identity(x)
    net.remove_tensor(x)  # TensorRT: illegal while a layer uses it; warned and ignored
    assert net.num_inputs == 1 and trt.sim.problems and "remove_tensor ignored" in logger.messages[-1][1]


@conformance
def test_subclass_overrides_are_checked(checked_trt):
    trt = checked_trt
    with pytest.raises(ArgumentError, match="phase_start"):
        class BadMonitor(trt.IProgressMonitor):  # noqa: F841
            def phase_start(self, phase_name):
                pass

    class Quiet(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            pass

    trt.Builder(Quiet())  # a user ILogger is a valid logger
    with pytest.raises(ArgumentError, match="ILogger"):
        trt.Builder(object())


# --------------------------------------------------------------------------- part 3: reference executor


def _two_output_model():
    """x [N, 3] -> a = 2x (output); placeholder p [N, 3] -> y = p + x (output)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    p = helper.make_tensor_value_info("p", TensorProto.FLOAT, ["n", 3])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("Add", ["p", "x"], ["y"])]
    graph = helper.make_graph(nodes, "cut", [x, p], [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 3]),
                                                     helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                              initializer=[two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@reference
def test_staged_onnx_execution_through_a_placeholder(checked_trt):
    """The ONNX output `a` feeds a TensorRT layer whose result replaces the ONNX input `p`."""
    trt = checked_trt
    builder, net = new_network(trt)
    parser = trt.OnnxParser(net, builder.logger)
    assert parser.parse(_two_output_model().SerializeToString())
    onnx_layer = net.get_layer(0)
    a = next(net.get_output(i) for i in range(net.num_outputs) if net.get_output(i).name == "a")
    placeholder = next(net.get_input(i) for i in range(net.num_inputs) if net.get_input(i).name == "p")
    net.unmark_output(a)
    exp = net.add_unary(a, trt.UnaryOperation.EXP).get_output(0)
    slot = next(i for i in range(onnx_layer.num_inputs) if onnx_layer.get_input(i) is placeholder)
    onnx_layer.set_input(slot, exp)
    net.remove_tensor(placeholder)
    assert trt.sim.problems == [] and net.num_inputs == 1

    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    out = run(net, {"x": x})
    np.testing.assert_allclose(out["y"], np.exp(2 * x) + x, **TOL)
    steps, unresolved = plan(net)
    assert [st.kind for st, _ in steps] == ["ONNX", "IUnaryLayer", "ONNX"] and unresolved == []

    # A real cycle (y needs p, p computed from y) is reported, not looped on.
    builder, net = new_network(trt)
    trt.OnnxParser(net, builder.logger).parse(_two_output_model().SerializeToString())
    layer = net.get_layer(0)
    y = next(net.get_output(i) for i in range(net.num_outputs) if net.get_output(i).name == "y")
    p = next(net.get_input(i) for i in range(net.num_inputs) if net.get_input(i).name == "p")
    layer.set_input(next(i for i in range(layer.num_inputs) if layer.get_input(i) is p),
                    net.add_identity(y).get_output(0))
    net.remove_tensor(p)
    with pytest.raises(ExecutionError, match=r"outputs \['y'\] cannot be computed"):
        run(net, {"x": x})


ATTENTION_CASES = {
    # name: (Nq, Nkv, Sq, Skv, causal, mask kind)
    "mha": (4, 4, 3, 5, "NONE", None),
    "bool_mask": (4, 4, 3, 5, "NONE", "bool"),
    "float_mask": (4, 4, 3, 5, "NONE", "float"),
    "upper_left": (4, 4, 3, 5, "UPPER_LEFT", None),
    "lower_right": (4, 4, 3, 5, "LOWER_RIGHT", None),
    "lower_right_square": (2, 2, 4, 4, "LOWER_RIGHT", None),
    "gqa": (4, 2, 3, 5, "LOWER_RIGHT", None),
    "mqa": (4, 1, 3, 5, "NONE", "bool"),
}


@reference
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_padded_matches_onnx_attention(checked_trt, case):
    nq, nkv, sq, skv, causal, mask_kind = ATTENTION_CASES[case]
    rng = np.random.default_rng(1)
    b, h = 2, 8
    feeds = {"q": rand(rng, b, nq, sq, h, scale=h ** -0.5), "k": rand(rng, b, nkv, skv, h), "v": rand(rng, b, nkv, skv, h)}
    mask = None
    if mask_kind == "bool":
        mask = rng.random((b, 1, sq, skv)) < 0.7
        mask[..., 0] = True  # every row attends somewhere
    elif mask_kind == "float":
        mask = rand(rng, 1, 1, sq, skv)
    if mask is not None:
        feeds["mask"] = mask
    _, net, _ = attention_network(checked_trt, feeds, causal=causal)
    got = run(net, feeds)["out"]
    want = onnx_attention(feeds["q"], feeds["k"], feeds["v"], causal=causal, mask=mask)
    assert got.shape == feeds["q"].shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, **TOL)


@reference
@pytest.mark.parametrize("causal", ["NONE", "LOWER_RIGHT"])
def test_attention_padded_kv_lengths_match_nonpad_kv_seqlen(checked_trt, causal):
    rng = np.random.default_rng(2)
    feeds = {"q": rand(rng, 2, 4, 2, 8), "k": rand(rng, 2, 2, 6, 8), "v": rand(rng, 2, 2, 6, 8),
             "key_value_lengths": np.array([3, 6], np.int32)}
    _, net, _ = attention_network(checked_trt, feeds, causal=causal)
    got = run(net, feeds)["out"]
    want = onnx_attention(feeds["q"], feeds["k"], feeds["v"], causal=causal, nonpad=feeds["key_value_lengths"])
    np.testing.assert_allclose(got, want, **TOL)
    # Keys past the length really are ignored: garbage there changes nothing.
    feeds["k"][0, :, 3:] = 1e3
    np.testing.assert_allclose(run(net, feeds)["out"], got, **TOL)


def _per_sequence_reference(q_seqs, k_seqs, v_seqs, causal):
    """Packed reference: ONNX Attention on each sequence alone ([N, S, H] pieces)."""
    outs = [onnx_attention(q[None], k[None], v[None], causal=causal)[0] for q, k, v in zip(q_seqs, k_seqs, v_seqs)]
    return np.concatenate([o.transpose(1, 0, 2) for o in outs])


@reference
@pytest.mark.parametrize("causal", ["NONE", "LOWER_RIGHT"])
def test_attention_packed_matches_per_sequence_runs(checked_trt, causal):
    rng = np.random.default_rng(3)
    nq, nkv, h = 4, 2, 8
    q_lens, kv_lens = [2, 3], [4, 5]
    q_seqs = [rand(rng, nq, n, h, scale=h ** -0.5) for n in q_lens]
    k_seqs = [rand(rng, nkv, n, h) for n in kv_lens]
    v_seqs = [rand(rng, nkv, n, h) for n in kv_lens]
    pack = lambda seqs: np.concatenate([s.transpose(1, 0, 2) for s in seqs])  # noqa: E731
    feeds = {"q": pack(q_seqs), "k": pack(k_seqs), "v": pack(v_seqs),
             "query_lengths": np.array([0, 2, 5], np.int32), "key_value_lengths": np.array([0, 4, 9], np.int32)}
    _, net, _ = attention_network(checked_trt, feeds, causal=causal, q_packed=True, kv_packed=True)
    got = run(net, feeds)["out"]
    assert got.shape == (5, nq, h)
    np.testing.assert_allclose(got, _per_sequence_reference(q_seqs, k_seqs, v_seqs, causal), **TOL)


@reference
def test_attention_packed_query_on_padded_cache(checked_trt):
    """Decode: one new token per sequence (packed) against a padded cache with per-batch lengths."""
    rng = np.random.default_rng(4)
    nq, nkv, h, max_s = 4, 2, 8, 6
    kv_lens = [3, 5]
    cache_k, cache_v = rand(rng, 2, nkv, max_s, h), rand(rng, 2, nkv, max_s, h)
    q_seqs = [rand(rng, nq, 1, h, scale=h ** -0.5) for _ in kv_lens]
    feeds = {"q": np.concatenate([s.transpose(1, 0, 2) for s in q_seqs]), "k": cache_k, "v": cache_v,
             "query_lengths": np.array([0, 1, 2], np.int32), "key_value_lengths": np.array(kv_lens, np.int32)}
    _, net, _ = attention_network(checked_trt, feeds, causal="LOWER_RIGHT", q_packed=True)
    want = _per_sequence_reference(q_seqs, [cache_k[b, :, :n] for b, n in enumerate(kv_lens)],
                                   [cache_v[b, :, :n] for b, n in enumerate(kv_lens)], "LOWER_RIGHT")
    np.testing.assert_allclose(run(net, feeds)["out"], want, **TOL)


@reference
def test_attention_fully_masked_rows_are_zero_and_reported(checked_trt):
    rng = np.random.default_rng(5)
    mask = np.ones((1, 1, 3, 4), bool)
    mask[0, 0, 1] = False
    feeds = {"q": rand(rng, 1, 2, 3, 8), "k": rand(rng, 1, 2, 4, 8), "v": rand(rng, 1, 2, 4, 8), "mask": mask}
    _, net, _ = attention_network(checked_trt, feeds)
    with pytest.warns(FullyMaskedRowsWarning, match="2 query rows attend to no key"):
        got = run(net, feeds)["out"]
    assert np.all(got[:, :, 1] == 0)
    np.testing.assert_allclose(got, onnx_attention(feeds["q"], feeds["k"], feeds["v"], mask=mask), **TOL)


@reference
def test_attention_mask_with_causal_is_an_error(checked_trt):
    rng = np.random.default_rng(6)
    feeds = {"q": rand(rng, 1, 2, 3, 8), "k": rand(rng, 1, 2, 3, 8), "v": rand(rng, 1, 2, 3, 8),
             "mask": np.ones((1, 1, 3, 3), bool)}
    _, net, _ = attention_network(checked_trt, feeds, causal="UPPER_LEFT")
    with pytest.raises(ExecutionError, match="mask together with causal_kind UPPER_LEFT"):
        run(net, feeds)


def _kv_network(trt, feeds, packed=False):
    builder, net = new_network(trt)
    t = add_inputs(trt, net, feeds, dynamic=True)
    layer = net.add_kv_cache_update(t["cache"], t["update"], t["write_indices"], trt.KVCacheMode.LINEAR)
    if packed:
        layer.update_form = trt.AttentionIOForm.PACKED_NHD
        layer.update_lengths = t["update_lengths"]
    out = layer.get_output(0)
    out.name = "present"
    net.mark_output(out)
    return net


def onnx_tensor_scatter(cache, update, write_indices):
    node = helper.make_node("TensorScatter", ["c", "u", "w"], ["o"], axis=-2)
    feeds = {"c": cache, "u": update, "w": write_indices.astype(np.int64)}
    return ort_run([node], feeds, [("o", cache.dtype)], opset=24)[0]


@reference
def test_kv_cache_update_matches_tensor_scatter(checked_trt):
    rng = np.random.default_rng(7)
    feeds = {"cache": rand(rng, 2, 2, 6, 4), "update": rand(rng, 2, 2, 2, 4), "write_indices": np.array([1, 4], np.int32)}
    net = _kv_network(checked_trt, feeds)
    assert aliased_inputs(net) == {"present": "cache"}  # in place, like engine.get_aliased_input_tensor
    got = run(net, feeds)["present"]
    np.testing.assert_allclose(got, onnx_tensor_scatter(feeds["cache"], feeds["update"], feeds["write_indices"]), **TOL)


@reference
def test_kv_cache_update_packed_matches_tensor_scatter(checked_trt):
    rng = np.random.default_rng(8)
    cache = rand(rng, 2, 2, 6, 4)
    seqs = [rand(rng, 2, 1, 4), rand(rng, 2, 3, 4)]  # [N, S_b, H]
    w = np.array([2, 0], np.int32)
    feeds = {"cache": cache, "update": np.concatenate([s.transpose(1, 0, 2) for s in seqs]), "write_indices": w,
             "update_lengths": np.array([0, 1, 4], np.int32)}
    got = run(_kv_network(checked_trt, feeds, packed=True), feeds)["present"]
    want = np.concatenate([onnx_tensor_scatter(cache[b:b + 1], seqs[b][None], w[b:b + 1]) for b in range(2)])
    np.testing.assert_allclose(got, want, **TOL)


@reference
def test_kv_cache_update_drops_writes_past_the_end(checked_trt):
    rng = np.random.default_rng(9)
    feeds = {"cache": rand(rng, 1, 2, 6, 4), "update": rand(rng, 1, 2, 3, 4), "write_indices": np.array([4], np.int32)}
    with pytest.warns(DroppedCacheWritesWarning, match="1 writes"):
        got = run(_kv_network(checked_trt, feeds), feeds)["present"]
    np.testing.assert_array_equal(got[0, :, 4:], feeds["update"][0, :, :2])
    np.testing.assert_array_equal(got[0, :, :4], feeds["cache"][0, :, :4])


ROPE_CASES = [(interleaved, dim, ids) for interleaved in (False, True) for dim in (0, 4) for ids in (False, True)]


@reference
@pytest.mark.parametrize("interleaved,rotary_dim,with_ids", ROPE_CASES)
def test_rotary_embedding_matches_onnx(checked_trt, interleaved, rotary_dim, with_ids):
    trt = checked_trt
    rng = np.random.default_rng(10)
    b, n, s, h, max_pos = 2, 3, 4, 8, 10
    half = (rotary_dim or h) // 2
    feeds = {"x": rand(rng, b, n, s, h)}
    if with_ids:
        angles = rng.random((max_pos, half)) * 3
        feeds["position_ids"] = rng.integers(0, max_pos, (b, s)).astype(np.int64)
    else:
        angles = rng.random((b, s, half)) * 3
    feeds["cos"], feeds["sin"] = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    _, net = new_network(trt)
    t = add_inputs(trt, net, feeds, dynamic=True)
    layer = net.add_rotary_embedding(t["x"], t["cos"], t["sin"], interleaved, rotary_dim)
    if with_ids:
        layer.set_input(3, t["position_ids"])
    out = layer.get_output(0)
    out.name = "out"
    net.mark_output(out)
    got = run(net, feeds)["out"]

    names = ["x", "cos", "sin"] + (["position_ids"] if with_ids else [])
    node = helper.make_node("RotaryEmbedding", names, ["y"], interleaved=int(interleaved),
                            rotary_embedding_dim=rotary_dim)
    want = ort_run([node], {k: feeds[k] for k in names}, [("y", np.float32)], opset=23)[0]
    np.testing.assert_allclose(got, want, **TOL)
    if rotary_dim:
        np.testing.assert_array_equal(got[..., rotary_dim:], feeds["x"][..., rotary_dim:])  # passes through


@reference
def test_rotary_embedding_packed_with_position_ids(checked_trt):
    trt = checked_trt
    rng = np.random.default_rng(11)
    t_tokens, n, h, max_pos = 5, 2, 8, 12
    angles = rng.random((max_pos, h // 2)) * 3
    feeds = {"x": rand(rng, t_tokens, n, h), "cos": np.cos(angles).astype(np.float32),
             "sin": np.sin(angles).astype(np.float32), "position_ids": np.array([0, 1, 0, 1, 2], np.int32)}
    _, net = new_network(trt)
    t = add_inputs(trt, net, feeds)
    layer = net.add_rotary_embedding(t["x"], t["cos"], t["sin"], False, 0)
    layer.set_input(3, t["position_ids"])
    layer.get_output(0).name = "out"
    net.mark_output(layer.get_output(0))
    got = run(net, feeds)["out"]
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "ids"], ["y"])
    want = ort_run([node], {"x": feeds["x"].transpose(1, 0, 2)[None], "cos": feeds["cos"], "sin": feeds["sin"],
                            "ids": feeds["position_ids"][None].astype(np.int64)}, [("y", np.float32)])[0]
    np.testing.assert_allclose(got, want[0].transpose(1, 0, 2), **TOL)


# Simple layers against the equivalent ONNX op: (build TensorRT layer, ONNX node(s), feeds, attrs)


def _elementwise(op):
    def build(trt, net, t):
        return net.add_elementwise(t["a"], t["b"], getattr(trt.ElementWiseOperation, op)).get_output(0)
    return build


def _unary(op):
    def build(trt, net, t):
        return net.add_unary(t["a"], getattr(trt.UnaryOperation, op)).get_output(0)
    return build


def _shuffle(trt, net, t):
    layer = net.add_shuffle(t["a"])
    layer.first_transpose = (0, 2, 1)
    layer.reshape_dims = (0, -1)
    layer.second_transpose = (1, 0)
    return layer.get_output(0)


def _dynamic_reshape(trt, net, t):
    layer = net.add_shuffle(t["a"])
    layer.set_input(1, t["shape"])
    return layer.get_output(0)


def _slice(trt, net, t):
    return net.add_slice(t["a"], (1, 3, 0), (1, 2, 3), (1, -1, 2)).get_output(0)


def _dynamic_slice(trt, net, t):
    layer = net.add_slice(t["a"], (0, 0, 0), (1, 1, 1), (1, 1, 1))
    layer.set_input(1, t["starts"])
    layer.set_input(2, t["sizes"])
    return layer.get_output(0)


def _concat(trt, net, t):
    layer = net.add_concatenation([t["a"], t["b"]])
    layer.axis = 1
    return layer.get_output(0)


def _gather(trt, net, t):
    return net.add_gather(t["a"], t["idx"], 1).get_output(0)


def _unsqueeze(trt, net, t):
    axes = net.add_constant((2,), np.array([0, 3], np.int64)).get_output(0)
    return net.add_unsqueeze(t["a"], axes).get_output(0)


def _squeeze(trt, net, t):
    axes = net.add_constant((1,), np.array([1], np.int64)).get_output(0)
    return net.add_squeeze(t["a"], axes).get_output(0)


def _quantize(to_type):
    def build(trt, net, t):
        return net.add_quantize(t["a"], t["scale"], getattr(trt, to_type)).get_output(0)
    return build


def _dequantize(trt, net, t):
    return net.add_dequantize(t["q"], t["scale"], trt.float32).get_output(0)


_RNG = np.random.default_rng(12)
_A = _RNG.standard_normal((2, 4, 6)).astype(np.float32)
_B = _RNG.standard_normal((2, 1, 6)).astype(np.float32) + 3
_POS = np.abs(_A) + 0.5
_I = _RNG.integers(-9, 9, (2, 4, 6)).astype(np.int32)
_J = _RNG.integers(1, 5, (2, 4, 6)).astype(np.int32) * np.where(_RNG.random((2, 4, 6)) < 0.5, -1, 1).astype(np.int32)
_HALVES = np.array([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]], np.float32)

SIMPLE_CASES = {
    "sum": (_elementwise("SUM"), [helper.make_node("Add", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "prod": (_elementwise("PROD"), [helper.make_node("Mul", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "sub": (_elementwise("SUB"), [helper.make_node("Sub", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "div": (_elementwise("DIV"), [helper.make_node("Div", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "div_int": (_elementwise("DIV"), [helper.make_node("Div", ["a", "b"], ["y"])], {"a": _I, "b": _J}),
    "max": (_elementwise("MAX"), [helper.make_node("Max", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "min": (_elementwise("MIN"), [helper.make_node("Min", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "pow": (_elementwise("POW"), [helper.make_node("Pow", ["a", "b"], ["y"])], {"a": _POS, "b": _B}),
    "and": (_elementwise("AND"), [helper.make_node("And", ["a", "b"], ["y"])], {"a": _A > 0, "b": _B > 3}),
    "or": (_elementwise("OR"), [helper.make_node("Or", ["a", "b"], ["y"])], {"a": _A > 0, "b": _B > 3}),
    "equal": (_elementwise("EQUAL"), [helper.make_node("Equal", ["a", "b"], ["y"])], {"a": _I, "b": _J}),
    "less": (_elementwise("LESS"), [helper.make_node("Less", ["a", "b"], ["y"])], {"a": _A, "b": _B - 3}),
    "greater": (_elementwise("GREATER"), [helper.make_node("Greater", ["a", "b"], ["y"])], {"a": _A, "b": _B - 3}),
    "exp": (_unary("EXP"), [helper.make_node("Exp", ["a"], ["y"])], {"a": _A}),
    "log": (_unary("LOG"), [helper.make_node("Log", ["a"], ["y"])], {"a": _POS}),
    "sqrt": (_unary("SQRT"), [helper.make_node("Sqrt", ["a"], ["y"])], {"a": _POS}),
    "recip": (_unary("RECIP"), [helper.make_node("Reciprocal", ["a"], ["y"])], {"a": _POS}),
    "neg": (_unary("NEG"), [helper.make_node("Neg", ["a"], ["y"])], {"a": _A}),
    "erf": (_unary("ERF"), [helper.make_node("Erf", ["a"], ["y"])], {"a": _A}),
    "round": (_unary("ROUND"), [helper.make_node("Round", ["a"], ["y"])], {"a": _HALVES}),
    "not": (_unary("NOT"), [helper.make_node("Not", ["a"], ["y"])], {"a": _A > 0}),
    "sign": (_unary("SIGN"), [helper.make_node("Sign", ["a"], ["y"])], {"a": _A}),
    "shuffle": (_shuffle, [helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
                           helper.make_node("Reshape", ["t", "s"], ["r"]),
                           helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0])],
                {"a": _A, "s": np.array([0, -1], np.int64)}),
    "dynamic_reshape": (_dynamic_reshape, [helper.make_node("Reshape", ["a", "shape"], ["y"])],
                        {"a": _A, "shape": np.array([4, 0, -1], np.int64)}),
    "slice": (_slice, [helper.make_node("Slice", ["a", "st", "en", "ax", "sp"], ["y"])],
              {"a": _A, "st": np.array([1, 3, 0], np.int64), "en": np.array([2, 1, 6], np.int64),
               "ax": np.array([0, 1, 2], np.int64), "sp": np.array([1, -1, 2], np.int64)}),
    "dynamic_slice": (_dynamic_slice, [helper.make_node("Slice", ["a", "starts", "ends"], ["y"])],
                      {"a": _A, "starts": np.array([0, 1, 2], np.int64), "sizes": np.array([2, 3, 3], np.int64),
                       "ends": np.array([2, 4, 5], np.int64)}),
    "concat": (_concat, [helper.make_node("Concat", ["a", "b"], ["y"], axis=1)], {"a": _A, "b": _B}),
    "select": (lambda trt, net, t: net.add_select(t["c"], t["a"], t["b"]).get_output(0),
               [helper.make_node("Where", ["c", "a", "b"], ["y"])], {"c": _A > 0, "a": _A, "b": _B}),
    "shape": (lambda trt, net, t: net.add_shape(t["a"]).get_output(0), [helper.make_node("Shape", ["a"], ["y"])],
              {"a": _A}),
    "gather": (_gather, [helper.make_node("Gather", ["a", "idx"], ["y"], axis=1)],
               {"a": _A, "idx": np.array([[0, -1], [2, 3]], np.int32)}),
    "unsqueeze": (_unsqueeze, [helper.make_node("Unsqueeze", ["a", "ax"], ["y"])],
                  {"a": _A, "ax": np.array([0, 3], np.int64)}),
    "squeeze": (_squeeze, [helper.make_node("Squeeze", ["a", "ax"], ["y"])],
                {"a": _B, "ax": np.array([1], np.int64)}),
    "cast": (lambda trt, net, t: net.add_cast(t["a"], trt.int32).get_output(0),
             [helper.make_node("Cast", ["a"], ["y"], to=TensorProto.INT32)], {"a": _A * 5}),
    "cast_half": (lambda trt, net, t: net.add_cast(t["a"], trt.float16).get_output(0),
                  [helper.make_node("Cast", ["a"], ["y"], to=TensorProto.FLOAT16)], {"a": _A}),
    "quantize_int8": (_quantize("int8"), [helper.make_node("QuantizeLinear", ["a", "scale", "zp"], ["y"])],
                      {"a": _A * 40, "scale": np.array(0.5, np.float32)}),
    "quantize_fp8": (_quantize("fp8"), [helper.make_node("QuantizeLinear", ["a", "scale", "zp"], ["y"])],
                     {"a": _A * 300, "scale": np.array(0.25, np.float32)}),
    "dequantize": (_dequantize, [helper.make_node("DequantizeLinear", ["q", "scale"], ["y"])],
                   {"q": _I.astype(np.int8), "scale": np.array(0.125, np.float32)}),
}

# Inputs only the ONNX side needs (constants in the TensorRT network or attributes there).
_ONNX_ONLY = {"s", "st", "en", "ax", "sp", "ends", "zp"}
_TRT_ONLY = {"sizes"}


@reference
@pytest.mark.parametrize("case", list(SIMPLE_CASES))
def test_simple_layers_match_onnx_ops(checked_trt, case):
    trt = checked_trt
    build, nodes, feeds = SIMPLE_CASES[case]
    _, net = new_network(trt)
    trt_feeds = {k: v for k, v in feeds.items() if k not in _ONNX_ONLY}
    out = build(trt, net, add_inputs(trt, net, trt_feeds))
    out.name = "y"
    net.mark_output(out)
    got = run(net, trt_feeds)["y"]
    onnx_feeds = {k: v for k, v in feeds.items() if k not in _TRT_ONLY}
    initializers = []
    if case.startswith("quantize"):  # the zero point fixes ONNX's output type (uint8 by default)
        zp_type = TensorProto.FLOAT8E4M3FN if case.endswith("fp8") else TensorProto.INT8
        initializers = [helper.make_tensor("zp", zp_type, [], [0])]
    want = ort_run(nodes, onnx_feeds, [("y", got.dtype)], opset=21, initializers=initializers)[0]
    if want.dtype == np.uint8 and got.dtype.itemsize == 1 and got.dtype != np.uint8:
        want = want.view(got.dtype)  # ONNX Runtime hands FP8 back as raw bytes
    assert got.dtype == want.dtype and got.shape == want.shape
    # The build-time shape the checker computed agrees with the run-time one (-1 = dynamic).
    assert len(out.shape) == got.ndim and all(d in (-1, n) for d, n in zip(out.shape, got.shape))
    if got.dtype.itemsize == 1 and got.dtype != np.bool_:  # int8 / fp8: compare the bytes
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    elif got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **TOL)


@reference
def test_executor_checks_feeds(checked_trt):
    trt = checked_trt
    _, net = new_network(trt)
    x = net.add_input("x", trt.float32, (-1, 3))
    net.mark_output(net.add_identity(x).get_output(0))
    with pytest.raises(ExecutionError, match="is float64, the network declares FLOAT"):
        run(net, {"x": np.zeros((2, 3))})
    with pytest.raises(ExecutionError, match=r"shape \(2, 4\), the network declares \(-1, 3\)"):
        run(net, {"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(ExecutionError, match="not network inputs"):
        run(net, {"x": np.zeros((2, 3), np.float32), "z": np.zeros(1)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run(net, {"x": np.ones((2, 3), np.float32)}, return_all=True)["x"].shape == (2, 3)


def _attention_block(cut: bool, b=2, s=5, n=2, h=8):
    """x [B, S, D] -> q, k, v [B, N, S, H] -> attention -> [B, S, D] @ Wo. With cut=True the graph stops at
    q, k, v (outputs) and restarts from a placeholder input `attn`, as the builder cuts models."""
    d = n * h
    rng = np.random.default_rng(13)
    inits = [helper.make_tensor(f"W{r}", TensorProto.FLOAT, [d, d], rng.standard_normal((d, d)).astype(np.float32).ravel())
             for r in "qkvo"]
    inits += [helper.make_tensor("heads", TensorProto.INT64, [4], [0, 0, n, h]),
              helper.make_tensor("merged", TensorProto.INT64, [3], [0, 0, d])]
    nodes = []
    for r in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"W{r}"], [f"{r}_flat"]),
                  helper.make_node("Reshape", [f"{r}_flat", "heads"], [f"{r}_bsnh"]),
                  helper.make_node("Transpose", [f"{r}_bsnh"], [r], perm=[0, 2, 1, 3])]
    if not cut:
        nodes.append(helper.make_node("Attention", ["q", "k", "v"], ["attn"], is_causal=1))
    nodes += [helper.make_node("Transpose", ["attn"], ["attn_bsnh"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["attn_bsnh", "merged"], ["attn_flat"]),
              helper.make_node("MatMul", ["attn_flat", "Wo"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", d])
    bnsh = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", n, "seq", h])  # noqa: E731
    inputs, outputs = [x], [y]
    if cut:
        inputs.append(bnsh("attn"))
        outputs += [bnsh(r) for r in "qkv"]
    model = helper.make_model(helper.make_graph(nodes, "block", inputs, outputs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model, rng.standard_normal((b, s, d)).astype(np.float32), h


@reference
def test_cut_graph_with_native_attention_matches_the_uncut_model(checked_trt):
    """The builder's pattern end to end: parse the cut model, put IAttention between its q/k/v outputs
    and its placeholder input, and compare with the uncut model (ONNX Attention) on ONNX Runtime."""
    trt = checked_trt
    cut, x, h = _attention_block(cut=True)
    full, _, _ = _attention_block(cut=False)
    builder, net = new_network(trt)
    assert trt.OnnxParser(net, builder.logger).parse(cut.SerializeToString())
    outputs = {net.get_output(i).name: net.get_output(i) for i in range(net.num_outputs)}
    for name in "qkv":
        net.unmark_output(outputs[name])
    scale = net.add_constant((1, 1, 1, 1), np.array([h ** -0.5], np.float32)).get_output(0)
    q = net.add_elementwise(outputs["q"], scale, trt.ElementWiseOperation.PROD).get_output(0)
    attn = net.add_attention_v2(q, outputs["k"], outputs["v"], trt.AttentionNormalizationOp.SOFTMAX,
                                trt.CausalMaskKind.UPPER_LEFT)
    placeholder = next(net.get_input(i) for i in range(net.num_inputs) if net.get_input(i).name == "attn")
    for i in range(net.num_layers):
        layer = net.get_layer(i)
        for j in range(layer.num_inputs):
            if layer.get_input(j) is placeholder:
                layer.set_input(j, attn.get_output(0))
    net.remove_tensor(placeholder)
    assert [net.get_output(i).name for i in range(net.num_outputs)] == ["y"] and trt.sim.problems == []

    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 1, 16), x.shape, (4, 64, 16))
    config.add_optimization_profile(profile)
    assert isinstance(builder.build_serialized_network(net, config), NotAnEngine)

    got = run(net, {"x": x})["y"]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    want = ort.InferenceSession(full.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@conformance
def test_value_classes_and_context_managers(checked_trt):
    trt = checked_trt
    assert tuple(trt.Dims([2, 3])) == (2, 3) and tuple(trt.Dims3(1, 2, 3)) == (1, 2, 3)
    assert tuple(trt.Permutation([0, 2, 1])) == (0, 2, 1)
    with pytest.raises(ArgumentError):
        trt.Dims3([1, 2])
    weights = trt.Weights(np.arange(4, dtype=np.float32))
    assert weights.dtype == trt.float32 and weights.size == 4
    with trt.Builder(trt.Logger()) as builder, builder.create_network(0) as net:
        layer = net.add_constant(trt.Dims([2, 2]), weights)
        assert tuple(layer.get_output(0).shape) == (2, 2)
        np.testing.assert_array_equal(layer.weights, np.arange(4, dtype=np.float32))
    with pytest.raises(NotImplementedError, match="a module"):
        trt.tensorrt
    with pytest.raises(NotImplementedError, match="constructing tensorrt.Runtime"):
        trt.Runtime(trt.Logger())
    with pytest.raises(TypeError, match="No constructor defined"):
        trt.ITensor()
    assert trt.init_libnvinfer_plugins(trt.Logger(), "") is True
    with pytest.raises(NotImplementedError, match="get_plugin_registry"):
        trt.get_plugin_registry()


@conformance
def test_build_rejects_a_mistyped_placeholder(checked_trt):
    trt = checked_trt
    builder, net = new_network(trt)
    trt.OnnxParser(net, builder.logger).parse(_two_output_model().SerializeToString())
    layer = net.get_layer(0)
    p = next(net.get_input(i) for i in range(net.num_inputs) if net.get_input(i).name == "p")
    half = net.add_cast(net.get_input(0), trt.float16).get_output(0)
    layer.set_input(next(i for i in range(layer.num_inputs) if layer.get_input(i) is p), half)
    net.remove_tensor(p)
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 3), (2, 3), (4, 3))
    config.add_optimization_profile(profile)
    with pytest.raises(BuildValidationError, match="ONNX input 'p' is FLOAT but is fed HALF"):
        builder.build_serialized_network(net, config)


@conformance
def test_trtsim_implements_only_real_members(real_trt):
    """Every emulated method, getter and setter of trtsim names a real member, and each method takes
    exactly the binding's parameter names (so a call the checker accepts always reaches it)."""
    import inspect

    from trtsim import checked as c

    layer_classes = [cls for cls in vars(real_trt).values()
                     if isinstance(cls, type) and issubclass(cls, real_trt.ILayer)]
    owners = {c.RecNetwork: [real_trt.INetworkDefinition], c.RecBuilder: [real_trt.Builder],
              c.RecConfig: [real_trt.IBuilderConfig], c.RecProfile: [real_trt.IOptimizationProfile],
              c.RecParser: [real_trt.OnnxParser], c.RecAttention: [real_trt.IAttention], c.RecTensor: [real_trt.ITensor],
              c.RecTimingCache: [real_trt.ITimingCache], c.RecParserError: [real_trt.ParserError],
              c.SimWeights: [real_trt.Weights], c.RecLayer: layer_classes}
    problems = []
    for rec, classes in owners.items():
        for attr, fn in vars(rec).items():
            kind, _, name = attr[1:].partition("_")
            if not attr.startswith(("_m_", "_get_", "_set_")):
                continue
            reals = [getattr(cls, name) for cls in classes if hasattr(cls, name)]
            if not reals:
                problems.append(f"{rec.__name__}.{attr}: no real member '{name}'")
            elif kind == "m":
                wanted = {p.name for r in reals for s in parse_signatures(r.__doc__, name) for p in s.params}
                have = set(list(inspect.signature(fn).parameters)[1:])
                if have != wanted:
                    problems.append(f"{rec.__name__}.{attr}{sorted(have)} != binding {sorted(wanted)}")
            elif not all(isinstance(r, property) and (kind == "get" or r.fset) for r in reals):
                problems.append(f"{rec.__name__}.{attr}: '{name}' is not a {'settable ' if kind == 'set' else ''}property")
    assert problems == []
