"""tests/trtsim, part 1 and 2: the real TensorRT bindings import on CPU through stub libraries, and the checked
recording `tensorrt` stand-in catches every use the real bindings would refuse (members, overloads, property
types, enums, subclass overrides), compared with the real bindings' own signatures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from trtsim import bindings
from trtsim.errors import ArgumentError, BuildValidationError, MissingMemberError, NetworkError
from trtsim.signatures import parse_signatures
from trtsim.values import NotAnEngine
from trtsim_cases import attention_network, new_network, rand, two_output_model

conformance = pytest.mark.conformance
reference = pytest.mark.reference
HELPERS = Path(bindings.__file__).parent.parent  # tests/helpers, where trtsim and trtsim_cases live


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
    code = ("import sys; from trtsim import bindings; "  # python -c imports from its working directory
            "m = bindings.load_bindings(sys.argv[1]); "
            "print(m.__version__ if m else 'NONE', bindings.stub_calls(), bindings.unavailable_reason)")
    ok = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a")], capture_output=True, text=True, cwd=HELPERS)
    if "not installed" in ok.stdout:
        pytest.skip("TensorRT bindings are not installed")
    assert ok.returncode == 0, ok.stderr
    version, calls, reason = ok.stdout.split()
    assert version.startswith("11.") and calls in ("0", "None") and reason == "None"
    # Without gcc on PATH (and so without nm/readelf) the reason is one clear sentence.
    env = dict(os.environ, PATH="")
    bare = subprocess.run([sys.executable, "-c", code, str(tmp_path / "b")], capture_output=True,
                          text=True, env=env, cwd=HELPERS)
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
    model = two_output_model()
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
    trt.OnnxParser(net, builder.logger).parse(two_output_model().SerializeToString())
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

    from trtsim.builder import RecBuilder, RecConfig, RecProfile, RecTimingCache
    from trtsim.network import RecNetwork
    from trtsim.objects import RecAttention, RecLayer, RecTensor, SimWeights
    from trtsim.parser import RecParser, RecParserError

    layer_classes = [cls for cls in vars(real_trt).values()
                     if isinstance(cls, type) and issubclass(cls, real_trt.ILayer)]
    owners = {RecNetwork: [real_trt.INetworkDefinition], RecBuilder: [real_trt.Builder],
              RecConfig: [real_trt.IBuilderConfig], RecProfile: [real_trt.IOptimizationProfile],
              RecParser: [real_trt.OnnxParser], RecAttention: [real_trt.IAttention], RecTensor: [real_trt.ITensor],
              RecTimingCache: [real_trt.ITimingCache], RecParserError: [real_trt.ParserError],
              SimWeights: [real_trt.Weights], RecLayer: layer_classes}
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
