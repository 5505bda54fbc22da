"""trtattn.runtime: one Session over ONNX Runtime and TensorRT, KV caches, greedy generation, packed
ragged batches, benchmarks.

On ONNX Runtime every path runs here: greedy decoding with the unfused original models, the fused
models and the kv-cache form must give the same tokens, token for token, and logits within 1e-4 at
every step, for ragged batches too. The TensorRT back end runs in the `-m trt` tests (a GPU with
TensorRT and cuda-python; they skip with the reason elsewhere). The stand-in tests at the end check
only the session's own bookkeeping (which buffer is bound where, what is copied, when a CUDA graph is
captured) against a numpy stand-in engine: nothing there is TensorRT, and they say so.
"""

from __future__ import annotations

import collections
import ctypes
import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from trtattn import contract
from trtattn.errors import TrtattnError
from trtattn.graph.feeds import make_feeds
from trtattn.routes.prepare import prepare
from trtattn.runtime import (
    ConcatCache,
    OrtSession,
    StaticCache,
    bench,
    bench_callable,
    generate,
    generate_encoder_decoder,
    markdown_table,
    open_session,
    run_packed,
    synthesize_feeds,
)
from trtattn.trt import compat

ATOL = 1e-4
LLAMA_PROMPTS = [[5, 17, 33, 9, 21, 60], [7, 8], [40, 41, 42, 43]]
WHISPER_PROMPTS = [[0, 5, 9], [0], [0, 7, 11, 3]]


def ops(model):
    return collections.Counter(n.op_type for n in model.graph.node)


# ---------------------------------------------------------------- models, exported once per session
@pytest.fixture(scope="session")
def llama_models(zoo_dir):
    from trtattn.zoo import generation

    path = generation.export_family("llama", zoo_dir)["llama-lm"]
    original = onnx.load(str(path))
    prepared = prepare(original, name="llama-lm", form="kv-cache", precision="fp32")
    fused = prepared.fused.model  # trtattn.rewrite.fuse.fuse_model(original).model
    assert ops(fused)["Attention"] == 2 and ops(original)["Attention"] == 0
    assert ops(prepared.form_model)["ScatterND"] == 4
    return {"original": original, "fused": fused, "kv-cache": prepared.form_model, "plan": prepared.plan}


@pytest.fixture(scope="session")
def whisper_models(zoo_dir):
    from trtattn.rewrite.fuse import fuse_model
    from trtattn.zoo import generation

    paths = generation.export_family("whisper", zoo_dir)
    original = {k: onnx.load(str(v)) for k, v in paths.items()}
    prepared = prepare(original["whisper-decoder-step"], name="whisper-decoder-step", form="kv-cache",
                       precision="fp32")
    fused = {k: fuse_model(v).model for k, v in original.items() if k != "whisper-decoder-step"}
    fused["whisper-decoder-step"] = prepared.fused.model
    assert all(ops(m)["Attention"] for m in fused.values())
    # the kv-cache form replaces the decode step; the encoder and the first step have no past to cache
    kv = {**fused, "whisper-decoder-step": prepared.form_model}
    return {"original": original, "fused": fused, "kv-cache": kv}


def _whisper_sessions(models):
    names = ["whisper-encoder", "whisper-decoder-init", "whisper-decoder-step"]
    return [OrtSession(models[n], name=n) for n in names]


def _features(batch, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, 16, 32)).astype(np.float32)


def _same_generation(ref, other, label):
    assert other.tokens == ref.tokens, f"{label}: tokens differ from the original's"
    assert len(other.logits) == len(ref.logits)
    for step, (a, b) in enumerate(zip(ref.logits, other.logits)):
        err = float(np.abs(a - b).max())
        assert err <= ATOL, f"{label}: logits differ by {err:.3g} at step {step}"


# ---------------------------------------------------------------- the ONNX Runtime session
def test_ort_session_describes_io_and_the_in_place_contract(llama_models):
    kv = OrtSession(llama_models["kv-cache"], name="kv")
    assert kv.backend == "onnxruntime"
    assert kv.aliases == llama_models["plan"].aliases  # what the engine's sidecar will say
    assert contract.WRITE_INDEX in kv.input_names and "attention_mask" not in kv.input_names
    cache = kv.input("past_key_values.0.key")
    assert cache.dtype == np.float32 and cache.shape[1] == 2 and cache.shape[3] == 16 and cache.dynamic
    assert kv.contract()["aliases"] == kv.aliases
    original = OrtSession(llama_models["original"])
    assert original.aliases == {} and "logits" in original.output_names
    with pytest.raises(TrtattnError, match="no value for inputs"):
        original.run({"input_ids": np.zeros((1, 2), np.int64)})
    # feeds the model does not take are ignored (the forms drop attention_mask); ints are cast
    feeds = make_feeds(llama_models["original"], dims={"batch": 1, "past": 0, "seq": 3})
    out = original.run({**feeds, "cache_write_index": np.zeros(1), "input_ids": feeds["input_ids"].astype(np.int32)})
    assert out["logits"].shape == (1, 3, 128) and out["present.0.key"].shape == (1, 2, 3, 16)


def test_open_session_picks_the_back_end_by_suffix(llama_models, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(llama_models["original"], str(path))
    with open_session(path) as s:
        assert isinstance(s, OrtSession) and s.name == "m"
    with pytest.raises(TrtattnError, match="no such engine file"):
        open_session(tmp_path / "missing.engine")
    with pytest.raises(TrtattnError, match="unknown back end"):
        open_session(path, backend="tvm")


def test_onnx_runtime_types_map_to_numpy_through_polygraphy():
    import ml_dtypes

    from trtattn.runtime.ort import numpy_dtype

    assert numpy_dtype("tensor(float16)") == np.float16 and numpy_dtype("tensor(int64)") == np.int64
    assert numpy_dtype("tensor(bfloat16)") == ml_dtypes.bfloat16  # numpy has none: ml_dtypes'
    with pytest.raises(TrtattnError, match="tensor\\(complex1\\) has no numpy equivalent"):
        numpy_dtype("tensor(complex1)")


# ---------------------------------------------------------------- caches
def test_static_cache_is_updated_in_place_and_keeps_rows_apart(llama_models):
    concat = OrtSession(llama_models["original"])
    static = OrtSession(llama_models["kv-cache"])
    g1 = generate(concat, LLAMA_PROMPTS, 4)
    g2 = generate(static, LLAMA_PROMPTS, 4, capacity=16)
    assert g1.cache == "concat" and g2.cache == "static" and g1.tokens == g2.tokens
    assert static.state_shape("past_key_values.0.key") == (3, 2, 16, 16)  # preallocated, never grows
    assert concat.state_shape("past_key_values.0.key")[2] == 6 + 3  # longest prompt + 3 decode steps
    # the same K per row, read from either cache (padding slots of the concat cache are masked out)
    c_cache, s_cache = ConcatCache(concat, 3), StaticCache(static, 3, 16)
    assert (c_cache.lengths == 0).all() and s_cache.capacity == 16


def test_static_cache_refuses_to_write_past_its_capacity(llama_models):
    static = OrtSession(llama_models["kv-cache"])
    with pytest.raises(TrtattnError, match="KV cache is full"):
        generate(static, [[3, 4, 5, 6]], 6, capacity=8)


def test_static_cache_capacity_comes_from_the_sidecar_when_the_input_leaves_it_dynamic(llama_models):
    """An engine's sidecar I/O declares the cache's capacity where the model's own input leaves it dynamic:
    that capacity is taken, and another one asked for is refused."""
    name = "past_key_values.0.key"
    plain = OrtSession(llama_models["kv-cache"])
    assert not isinstance(plain.input(name).shape[2], int)  # dynamic in the form: only the sidecar can fix it
    rows = [{**row, "shape": [row["shape"][0], 2, 24, 16]} if row["name"].startswith("past_key_values") else row
            for row in plain.contract()["inputs"]]
    declared = OrtSession(llama_models["kv-cache"], sidecar={"io": {"inputs": rows}})
    assert StaticCache(declared, 2).capacity == 24
    assert StaticCache(plain, 2).capacity != 24
    with pytest.raises(TrtattnError, match="fixed capacity of 24, not 16"):
        StaticCache(declared, 2, 16)


def test_cache_contents_match_between_concat_and_static(llama_models):
    from trtattn.runtime.cache import make_cache

    sessions = {k: OrtSession(llama_models[k]) for k in ("original", "kv-cache")}
    caches = {}
    ids = np.zeros((2, 5), np.int64)
    ids[0], ids[1, :2] = [10, 11, 12, 13, 14], [20, 21]
    lengths = np.array([5, 2])
    for k, s in sessions.items():
        cache = make_cache(s, 2, capacity=12)
        s.run(cache.step_feeds(ids, lengths), outputs=["logits"], carry=cache.carry())
        cache.advance(lengths, 5)
        s.run(cache.step_feeds(np.array([[30], [31]])), outputs=["logits"], carry=cache.carry())
        cache.advance(None, 1)
        caches[k] = cache
    for row, n in enumerate([6, 3]):
        a = caches["original"].read("past_key_values.1.value", row)
        b = caches["kv-cache"].read("past_key_values.1.value", row)
        assert a.shape == b.shape == (2, n, 16) and np.abs(a - b).max() <= ATOL


# ---------------------------------------------------------------- greedy generation, token for token
def test_llama_generation_original_fused_and_kv_cache_form_agree(llama_models):
    results = {k: generate(OrtSession(llama_models[k], name=k), LLAMA_PROMPTS, 8, capacity=32)
               for k in ("original", "fused", "kv-cache")}
    ref = results["original"]
    assert [len(t) for t in ref.tokens] == [8, 8, 8] and ref.steps == 7
    assert len({tuple(t) for t in ref.tokens}) == 3  # the rows really differ
    for k in ("fused", "kv-cache"):
        _same_generation(ref, results[k], k)
    # the ragged batch equals each request decoded alone
    for b, prompt in enumerate(LLAMA_PROMPTS):
        for k in ("original", "kv-cache"):
            alone = generate(OrtSession(llama_models[k]), [prompt], 8)
            assert alone.tokens[0] == ref.tokens[b]
            assert max(float(np.abs(x[0] - y[b]).max()) for x, y in zip(alone.logits, ref.logits)) <= ATOL


def test_left_padded_original_and_the_packed_kv_cache_form_agree(llama_models):
    """Hugging Face pads mixed-length prompts on the left; the kv-cache form packs them (no padding at all):
    the same tokens, logits within 1e-4, at every step."""
    left = generate(OrtSession(llama_models["original"]), LLAMA_PROMPTS, 6, padding_side="left")
    packed = generate(OrtSession(llama_models["kv-cache"]), LLAMA_PROMPTS, 6, capacity=16)
    assert packed.cache == "static" and len({tuple(t) for t in left.tokens}) == 3
    _same_generation(left, packed, "kv-cache form vs the left-padded original")


def test_kv_cache_form_decodes_after_a_separate_prefill(llama_models):
    """A prefill model's presents seed the static cache (StaticCache.load), then the form decodes."""
    ref = generate(OrtSession(llama_models["original"]), LLAMA_PROMPTS, 5)
    prefill = OrtSession(llama_models["fused"], name="prefill")
    for past in [i.name for i in prefill.inputs if i.name.startswith("past_key_values")]:
        prefill.zeros_state(past, (3, 2, 0, 16))  # no past: the model prefills
    got = generate(OrtSession(llama_models["kv-cache"]), LLAMA_PROMPTS, 5, prefill=prefill, capacity=24)
    _same_generation(ref, got, "prefill + kv-cache form")


def test_generation_stops_rows_at_eos(llama_models):
    ref = generate(OrtSession(llama_models["original"]), LLAMA_PROMPTS, 6)
    eos = ref.tokens[1][2]
    got = generate(OrtSession(llama_models["kv-cache"]), LLAMA_PROMPTS, 6, eos_token_id=eos)
    for full, cut in zip(ref.tokens, got.tokens):
        n = full.index(eos) + 1 if eos in full else len(full)
        assert cut == full[:n]


def test_whisper_generation_original_fused_and_kv_cache_form_agree(whisper_models):
    features = _features(3)
    results = {k: generate_encoder_decoder(*_whisper_sessions(whisper_models[k]), features, WHISPER_PROMPTS, 8,
                                           capacity=16)
               for k in ("original", "fused", "kv-cache")}
    ref = results["original"]
    assert ref.cache == "concat" and results["kv-cache"].cache == "static"
    assert len({tuple(t) for t in ref.tokens}) == 3
    for k in ("fused", "kv-cache"):
        _same_generation(ref, results[k], k)
    for b, prompt in enumerate(WHISPER_PROMPTS):
        alone = generate_encoder_decoder(*_whisper_sessions(whisper_models["kv-cache"]), features[b:b + 1], [prompt], 8)
        assert alone.tokens[0] == ref.tokens[b]


def test_whisper_cross_kv_is_state_set_once(whisper_models):
    enc, init, step = _whisper_sessions(whisper_models["kv-cache"])
    generate_encoder_decoder(enc, init, step, _features(2), WHISPER_PROMPTS[:2], 3)
    assert step.has_state("past_key_values.0.encoder.key") and step.state_shape("past_key_values.0.encoder.key") == (2, 4, 16, 16)
    assert "past_key_values.0.encoder.key" not in step.aliases.values()


# ---------------------------------------------------------------- packed ragged batches
@pytest.mark.parametrize("name", ["bert", "llama"])
def test_packed_ragged_batch_matches_the_padded_run_row_by_row(zoo_export, name):
    model = onnx.load(str(zoo_export(name, "torchscript")))
    packed = OrtSession(prepare(model, name=name, form="packed", precision="fp32").form_model, name=f"{name}-packed")
    lengths = [9, 3, 6]
    feeds = make_feeds(model, dims={"batch": 3, "seq": 9}, seed=5)
    feeds["attention_mask"] = (np.arange(9)[None] < np.asarray(lengths)[:, None]).astype(np.int64)
    padded = OrtSession(model).run(feeds)["last_hidden_state"]
    requests = [{"input_ids": feeds["input_ids"][b, :n]} for b, n in enumerate(lengths)]  # positions restart per request
    rows = run_packed(packed, requests)
    for b, n in enumerate(lengths):
        got = rows[b]["last_hidden_state"]
        assert got.shape == (n, 64)
        assert float(np.abs(got - padded[b, :n]).max()) <= ATOL


def test_packing_needs_a_packed_model(llama_models):
    with pytest.raises(TrtattnError, match="not a packed-form model"):
        run_packed(OrtSession(llama_models["original"]), [{"input_ids": np.arange(3)}])


def test_generated_packed_feeds_split_the_tokens_and_restart_positions(zoo_export):
    model = onnx.load(str(zoo_export("llama", "torchscript")))
    packed = OrtSession(prepare(model, name="llama", form="packed", precision="fp32").form_model, name="llama-packed")
    feeds = synthesize_feeds(packed, dims={"batch": 3, "seq": 8})
    cu, total = feeds[contract.CU_SEQLENS], feeds["input_ids"].shape[1]
    assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == total and (np.diff(cu) > 0).all()
    positions = contract.unpack_rows(feeds["position_ids"], cu)
    assert [p.tolist() for p in positions] == [list(range(n)) for n in np.diff(cu)]
    rows = run_packed(packed, [{"input_ids": r} for r in contract.unpack_rows(feeds["input_ids"], cu)])
    whole = packed.run(feeds)["last_hidden_state"]
    np.testing.assert_array_equal(np.concatenate([r["last_hidden_state"] for r in rows]), whole[0])


# ---------------------------------------------------------------- benchmarks
def test_bench_prints_a_markdown_table_with_the_right_columns(llama_models):
    session = OrtSession(llama_models["original"], name="llama-lm")
    feeds = synthesize_feeds(session, dims={"batch": 2, "seq": 4, "past": 3})
    assert feeds["input_ids"].shape == (2, 4) and feeds["attention_mask"].shape == (2, 7)
    result = bench(session, feeds, iterations=5, warmup=1)
    kv = OrtSession(llama_models["kv-cache"], name="llama-lm-kv")
    kv_feeds = synthesize_feeds(kv, dims={"batch": 2, "seq": 1, "max_cache": 16})
    assert (kv_feeds[contract.WRITE_INDEX] == 0).all()
    gen = bench_callable(lambda: generate(kv, LLAMA_PROMPTS, 4, capacity=16), name="llama-lm-kv (generate)",
                         backend=kv.backend, iterations=2, warmup=0, sequences=3, tokens=12)
    table = markdown_table([result, bench(kv, kv_feeds, iterations=3, warmup=1), gen])
    lines = table.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["model", "backend", "shapes", "iterations", "p50 ms", "p90 ms", "p99 ms", "mean ms",
                      "sequences/s", "tokens/s", "peak memory MiB", "memory measured"]
    assert set(lines[1].replace("|", "").replace("-", "").replace(":", "")) <= {""} and len(lines) == 5
    row = dict(zip(header, [c.strip() for c in lines[2].strip("|").split("|")]))
    assert row["model"] == "llama-lm" and row["backend"] == "onnxruntime" and row["iterations"] == "5"
    assert float(row["p50 ms"]) <= float(row["p90 ms"]) <= float(row["p99 ms"])
    assert float(row["tokens/s"]) > 0 and float(row["sequences/s"]) > 0 and float(row["peak memory MiB"]) > 10
    assert "host peak RSS" in row["memory measured"]
    assert result.sequences == 2 and result.tokens == 8 and len(result.latencies_ms) == 5


# ---------------------------------------------------------------- command line
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trtattn", "-q", *map(str, args)], capture_output=True,
                          text=True)


def _tensorrt_importable() -> bool:
    try:
        import tensorrt  # noqa: F401
    except Exception:
        return False
    return True


def test_cli_run_generate_and_bench(llama_models, tmp_path):
    path = tmp_path / "llama-lm.onnx"
    onnx.save(llama_models["kv-cache"], str(path))
    proc = _cli("run", path, "--generate", 4, "--prompt", "5,17,33,9,21,60", "--prompt", "7,8", "--capacity", 16,
                "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    # the original model, as Hugging Face generates: mixed-length prompts padded on the left
    ref = generate(OrtSession(llama_models["original"]), LLAMA_PROMPTS[:2], 4, padding_side="left")
    assert data["cache"] == "static" and [r["tokens"] for r in data["requests"]] == ref.tokens
    proc = _cli("run", path, "--dims", "batch=1,total_tokens=2", "--save", tmp_path / "out.npz")
    assert proc.returncode == 0, proc.stderr
    assert "logits" in proc.stdout and np.load(tmp_path / "out.npz")["logits"].shape == (1, 2, 128)
    proc = _cli("bench", path, "--iterations", 3, "--warmup", 1, "--dims", "batch=2,seq=1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("| model | backend |") and "| onnxruntime |" in proc.stdout
    proc = _cli("run", path, "--generate", 2)
    assert proc.returncode == 2 and "needs at least one --prompt" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(_tensorrt_importable(), reason="tensorrt is importable here: the engine would really be loaded")
def test_cli_engine_without_tensorrt_is_one_sentence(tmp_path):
    engine = tmp_path / "x.engine"
    engine.write_bytes(b"not an engine")
    proc = _cli("run", engine)
    assert proc.returncode == 4
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "TensorRT >= 11 is needed" in lines[0] and "Traceback" not in proc.stderr


def test_importing_the_runtime_imports_neither_tensorrt_nor_cuda():
    code = ("import sys, trtattn.runtime, trtattn.runtime.backends, trtattn.trt.session, trtattn.trt.cuda, trtattn.cli; "
            "print(sorted(m for m in sys.modules if m == 'tensorrt' or m.startswith('cuda')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ---------------------------------------------------------------- TensorRT (GPU, in docker/)
@pytest.fixture(scope="module")
def trt_gpu():
    from trtattn.trt.session import trt_available

    ok, why = trt_available()
    if not ok:
        pytest.skip(f"TensorRT engines cannot run here: {why}")
    from trtattn.trt import compat

    return compat.import_tensorrt()


def _engine(trt, model, tmp_path, name, form, **kw):
    from trtattn.routes.builder import build

    prepared = prepare(model, name=name, form=form, **kw)
    engine, sidecar = build(prepared, trt, tmp_path, progress=False)
    return engine, prepared


@pytest.mark.trt
def test_trt_kv_cache_engine_generates_like_onnx_runtime_with_caches_in_place(trt_gpu, llama_models, tmp_path):
    from trtattn.trt.session import TrtSession

    engine, prepared = _engine(trt_gpu, llama_models["original"], tmp_path, "llama-lm-kv", "kv-cache",
                               precision="fp32", decomposable=True)
    with TrtSession(engine) as s:
        assert s.aliases == prepared.plan.aliases  # from the engine itself, and the sidecar agrees
        ref = generate(OrtSession(llama_models["kv-cache"]), LLAMA_PROMPTS, 6)
        got = generate(s, LLAMA_PROMPTS, 6)
        assert got.tokens == ref.tokens and got.cache == "static"
        assert max(float(np.abs(a - b).max()) for a, b in zip(ref.logits, got.logits)) <= 1e-2  # TF32 matmuls
        # the decode steps wrote into the cache's own device buffers: one buffer bound to input and output
        assert all(s._bound_addr[inp] == s._bound_addr[out] == s._state[inp].buffer.ptr for out, inp in s.aliases.items())
        assert s.state_shape(next(iter(s.aliases.values())))[2] == 256  # the engine's capacity (its profile)


@pytest.mark.trt
def test_trt_cuda_graph_decode_matches_eager(trt_gpu, llama_models, tmp_path):
    from trtattn.trt.session import TrtSession

    engine, _ = _engine(trt_gpu, llama_models["original"], tmp_path, "llama-lm-kv", "kv-cache", precision="fp32",
                        decomposable=True)
    with TrtSession(engine) as eager, TrtSession(engine, cuda_graph=True) as graphed:
        a = generate(eager, LLAMA_PROMPTS, 8)
        b = generate(graphed, LLAMA_PROMPTS, 8)
        if graphed.graph_note:
            pytest.skip(f"this engine cannot be captured: {graphed.graph_note}")
        assert a.tokens == b.tokens
        assert graphed.graph_captures == 1 and graphed.graph_launches == b.steps - 1
        assert max(float(np.abs(x - y).max()) for x, y in zip(a.logits, b.logits)) <= 1e-5


@pytest.mark.trt
def test_trt_concat_engine_carries_presents_on_the_device(trt_gpu, llama_models, tmp_path):
    from trtattn.trt.session import TrtSession

    engine, _ = _engine(trt_gpu, llama_models["original"], tmp_path, "llama-lm", "padded", precision="fp32",
                        decomposable=True)
    ref = generate(OrtSession(llama_models["original"]), LLAMA_PROMPTS, 5)
    prefill = OrtSession(llama_models["original"])  # the engine's profile starts at past length 1
    for past in [i.name for i in prefill.inputs if i.name.startswith("past_key_values")]:
        prefill.zeros_state(past, (3, 2, 0, 16))
    with TrtSession(engine) as s:
        got = generate(s, LLAMA_PROMPTS, 5, prefill=prefill)
        assert got.cache == "concat" and got.tokens == ref.tokens


@pytest.mark.trt
def test_trt_packed_engine_matches_the_padded_run(trt_gpu, zoo_export, tmp_path):
    from trtattn.trt.session import TrtSession

    model = onnx.load(str(zoo_export("bert", "torchscript")))
    engine, _ = _engine(trt_gpu, model, tmp_path, "bert-packed", "packed")
    lengths = [9, 3, 6]
    feeds = make_feeds(model, dims={"batch": 3, "seq": 9}, seed=5)
    feeds["attention_mask"] = (np.arange(9)[None] < np.asarray(lengths)[:, None]).astype(np.int64)
    padded = OrtSession(model).run(feeds)["last_hidden_state"]
    with TrtSession(engine) as s:
        rows = run_packed(s, [{"input_ids": feeds["input_ids"][b, :n]} for b, n in enumerate(lengths)])
        for b, n in enumerate(lengths):
            assert float(np.abs(rows[b]["last_hidden_state"].astype(np.float32) - padded[b, :n]).max()) <= 2e-2
        table = markdown_table([bench(s, synthesize_feeds(s), iterations=5, warmup=2)])
        assert "| tensorrt |" in table and "device" in table


# ---------------------------------------------------------------- the TensorRT session's bookkeeping, with stand-ins
class _Device:
    """cuda.bindings.runtime stand-in: 'device' memory is host memory (numpy), so the stand-in engine
    can compute; stream capture records launches for replay. Counts every call."""

    cudaError_t = SimpleNamespace(cudaSuccess=0)
    cudaMemcpyKind = SimpleNamespace(cudaMemcpyHostToDevice="H2D", cudaMemcpyDeviceToHost="D2H")
    cudaStreamCaptureMode = SimpleNamespace(cudaStreamCaptureModeGlobal=0)
    cudaStreamNonBlocking = 1

    def __init__(self):
        self.mem, self.calls, self.capture, self.graphs = {}, collections.Counter(), None, {}

    def __getattribute__(self, name):
        if name.startswith("cuda") and name[4].isupper() and callable(object.__getattribute__(self, name)):
            object.__getattribute__(self, "calls")[name] += 1
        return object.__getattribute__(self, name)

    def cudaGetDeviceCount(self):
        return 0, 1

    def cudaSetDevice(self, device):
        return (0,)

    def cudaGetErrorName(self, err):
        return 0, b"stand-in error"

    cudaGetErrorString = cudaGetErrorName

    def cudaMalloc(self, n):
        a = np.zeros(n, np.uint8)
        self.mem[a.ctypes.data] = a
        return 0, a.ctypes.data

    def cudaFree(self, ptr):
        del self.mem[ptr]
        return (0,)

    def cudaMemsetAsync(self, ptr, value, n, stream):
        ctypes.memset(ptr, value, n)
        return (0,)

    def cudaMemcpyAsync(self, dst, src, n, kind, stream):
        self.calls[kind] += 1
        ctypes.memmove(dst, src, n)
        return (0,)

    def cudaStreamCreateWithFlags(self, flags):
        return 0, 7

    def cudaStreamSynchronize(self, stream):
        return (0,)

    def cudaStreamDestroy(self, stream):
        return (0,)

    def cudaMemGetInfo(self):
        return 0, 1 << 30, 2 << 30

    def cudaStreamBeginCapture(self, stream, mode):
        self.capture = []
        return (0,)

    def cudaStreamEndCapture(self, stream):
        graph, self.capture = len(self.graphs) + 1, None
        self.graphs[graph] = self._recorded
        return 0, graph

    def cudaGraphInstantiate(self, graph, flags):
        return 0, graph

    def cudaGraphLaunch(self, graph_exec, stream):
        for fn in self.graphs[graph_exec]:
            fn()
        return (0,)

    def cudaGraphExecDestroy(self, graph_exec):
        return (0,)

    def cudaGraphDestroy(self, graph):
        return (0,)


def _view(ptr, shape, dtype):
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer((ctypes.c_uint8 * n).from_address(ptr), dtype).reshape(shape)


class _OrtEngine:
    """A stand-in engine that computes with ONNX Runtime on the buffers bound to it (host memory
    here): the I/O, dtypes and aliases of the model, TensorRT's named-tensor calls."""

    def __init__(self, device, model):
        import onnxruntime as ort

        from trtattn.runtime.ort import graph_aliases, numpy_dtype

        self.device, self.aliases = device, graph_aliases(model)
        self.session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        self.io = {}
        for mode, items in (("INPUT", self.session.get_inputs()), ("OUTPUT", self.session.get_outputs())):
            for t in items:
                self.io[t.name] = (mode, numpy_dtype(t.type), tuple(d if isinstance(d, int) else -1 for d in t.shape))
        self.names = list(self.io)
        self.num_io_tensors = len(self.names)
        self.device_memory_size_v2 = 0

    def get_tensor_name(self, i):
        return self.names[i]

    def get_tensor_mode(self, name):
        return self.io[name][0]

    def get_tensor_dtype(self, name):
        return compat.DATATYPES[self.io[name][1].name]  # the stand-in trt.DataType's member

    def get_tensor_shape(self, name):
        return self.io[name][2]

    def get_aliased_input_tensor(self, name):
        return self.aliases.get(name)

    def is_shape_inference_io(self, name):
        return False

    def create_execution_context(self):
        return _Context(self)


class _Context:
    takes_communicators = True  # what set_communicator answers (TensorRT: False when it cannot use it)

    def __init__(self, engine):
        self.engine, self.shapes, self.addr, self.enqueues, self.result = engine, {}, {}, 0, {}
        self.communicator = None

    def set_communicator(self, communicator):
        assert type(communicator).__name__ == "PyCapsule"
        self.communicator = communicator
        return self.takes_communicators

    def _inputs(self, addr, shapes):
        return {n: _view(addr[n], shapes[n], self.engine.io[n][1]).copy() for n, (m, _, _) in self.engine.io.items()
                if m == "INPUT"}

    def set_input_shape(self, name, shape):
        assert isinstance(shape, tuple) and self.engine.io[name][0] == "INPUT"
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name, ptr):
        assert isinstance(ptr, int) and name in self.engine.io
        self.addr[name] = ptr
        return True

    def infer_shapes(self):
        missing = [n for n, (m, _, _) in self.engine.io.items() if m == "INPUT" and n not in self.shapes]
        if not missing:  # the stand-in learns its output shapes by running (the inputs are on the 'device')
            outs = self.engine.session.run(None, self._inputs(self.addr, self.shapes))
            self.result = {o.name: v.shape for o, v in zip(self.engine.session.get_outputs(), outs)}
        return missing

    def get_tensor_shape(self, name):
        return self.shapes[name] if name in self.shapes else self.result[name]

    def execute_async_v3(self, stream_handle):
        assert isinstance(stream_handle, int)
        self.enqueues += 1
        addr, shapes = dict(self.addr), dict(self.shapes)  # a graph bakes in the bindings of its capture
        engine = self.engine

        def run():
            outs = engine.session.run(None, self._inputs(addr, shapes))
            for o, v in zip(engine.session.get_outputs(), outs):
                _view(addr[o.name], v.shape, v.dtype)[...] = v  # an aliased output lands in its input's buffer

        dev = engine.device
        if dev.capture is not None:
            dev.capture.append(run)
            dev._recorded = dev.capture
        else:
            run()
        return True


@pytest.fixture
def stand_in_trt(monkeypatch):
    """Returns engine(model) -> serialized 'engine' bytes for the stand-in Runtime."""
    device = _Device()
    engines = {}
    fake = SimpleNamespace(
        __version__="11.4.0", TensorIOMode=SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT"),
        Logger=type("Logger", (), {"WARNING": 2, "__init__": lambda self, severity: None}),
        Runtime=type("Runtime", (), {"__init__": lambda self, logger: None,
                                     "deserialize_cuda_engine": lambda self, blob: engines[bytes(blob)]}),
        INetworkDefinition=type("INetworkDefinition", (), {"add_attention_v2": None}),
        DataType=SimpleNamespace(**{member: member for member in compat.DATATYPES.values()}))
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    from trtattn.trt import cuda

    monkeypatch.setattr(cuda, "import_cudart", lambda: device)

    def engine(model):
        key = f"stand-in {len(engines)}".encode()
        engines[key] = _OrtEngine(device, model)
        return key

    engine.device = device
    return engine


def _copies(device, fn):
    before = collections.Counter(device.calls)
    result = fn()
    return result, device.calls["H2D"] - before["H2D"], device.calls["D2H"] - before["D2H"]


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_stand_in_session_decodes_with_the_cache_in_place(stand_in_trt, llama_models, cuda_graph):
    """Not TensorRT: ONNX Runtime behind TensorRT's runtime calls checks the session's bookkeeping:
    the cache is bound to input and output alike and never copied; a CUDA graph is captured once."""
    from trtattn.trt.session import TrtSession

    on_ort = OrtSession(llama_models["kv-cache"])
    ref = generate(on_ort, LLAMA_PROMPTS, 8, capacity=16)
    s = TrtSession(stand_in_trt(llama_models["kv-cache"]), name="stand-in", cuda_graph=cuda_graph,
                   sidecar={"io": {"aliases": llama_models["plan"].aliases}})
    assert s.aliases == llama_models["plan"].aliases
    got, h2d, d2h = _copies(stand_in_trt.device, lambda: generate(s, LLAMA_PROMPTS, 8, capacity=16))
    _same_generation(ref, got, "stand-in session")
    # per run: input_ids, position_ids, cu_seqlens and cache_write_index in, logits out; the caches never move
    runs = got.steps + 1
    assert (h2d, d2h) == (4 * runs, runs)
    for out, inp in s.aliases.items():
        assert s._bound_addr[out] == s._bound_addr[inp] == s._state[inp].buffer.ptr
        np.testing.assert_allclose(s.get_state(inp), on_ort.get_state(inp), atol=1e-5)  # the whole cache, in place
    if cuda_graph:  # the prefill and the first decode step run eagerly, then one capture, replayed
        assert s.graph_captures == 1 and s.graph_launches == got.steps - 1 and s.context.enqueues == 3
    else:
        assert s.graph_captures == 0 and s.context.enqueues == runs
    s.close()
    assert not stand_in_trt.device.mem  # every device buffer freed


def test_stand_in_session_carries_presents_into_the_past_without_copies(stand_in_trt, llama_models):
    """Not TensorRT: a growing concat cache swaps device buffers (carry), nothing comes back to the host."""
    from trtattn.trt.session import TrtSession

    ref = generate(OrtSession(llama_models["original"]), LLAMA_PROMPTS, 6)
    s = TrtSession(stand_in_trt(llama_models["original"]), name="stand-in")
    assert s.aliases == {}
    got, h2d, d2h = _copies(stand_in_trt.device, lambda: generate(s, LLAMA_PROMPTS, 6))
    _same_generation(ref, got, "stand-in concat session")
    runs = got.steps + 1
    assert (h2d, d2h) == (3 * runs, runs)  # input_ids, attention_mask, position_ids; logits
    assert s.state_shape("past_key_values.0.key") == (3, 2, 6 + got.steps, 16)
    s.close()


def test_stand_in_session_hands_a_rank_its_nccl_communicator(stand_in_trt, llama_models, monkeypatch):
    """Not TensorRT: a rank engine's session gives its execution context the NCCL communicator (a capsule,
    as IExecutionContext.set_communicator takes it) before any run, and stops if TensorRT refuses it."""
    from trtattn.trt.nccl import capsule
    from trtattn.trt.session import TrtSession

    communicator = capsule(0x1000)
    s = TrtSession(stand_in_trt(llama_models["kv-cache"]), name="rank0", communicator=communicator)
    assert s.context.communicator is communicator and s.context.enqueues == 0
    s.close()
    assert TrtSession(stand_in_trt(llama_models["kv-cache"]), name="one").context.communicator is None
    monkeypatch.setattr(_Context, "takes_communicators", False)
    with pytest.raises(TrtattnError, match="rank1: TensorRT refused the NCCL communicator"):
        TrtSession(stand_in_trt(llama_models["kv-cache"]), name="rank1", communicator=communicator)


def test_stand_in_session_rejects_a_sidecar_from_another_engine(stand_in_trt, llama_models):
    from trtattn.trt.session import TrtSession

    with pytest.raises(TrtattnError, match="belongs to another engine"):
        TrtSession(stand_in_trt(llama_models["kv-cache"]), sidecar={"io": {"aliases": {"logits": "input_ids"}}})


@pytest.mark.conformance
def test_stand_in_calls_exist_in_the_real_tensorrt_bindings(real_trt):
    """Every TensorRT member the session calls on the engine and context exists in the real
    bindings with a signature that takes the arguments the session passes."""
    from trtsim.signatures import parse_signatures

    calls = {"ICudaEngine": {"get_tensor_name": 1, "get_tensor_mode": 1, "get_tensor_dtype": 1, "get_tensor_shape": 1,
                             "get_aliased_input_tensor": 1, "is_shape_inference_io": 1, "create_execution_context": 0},
             "IExecutionContext": {"set_input_shape": 2, "set_tensor_address": 2, "infer_shapes": 0, "get_tensor_shape": 1,
                                   "execute_async_v3": 1, "set_output_allocator": 2, "set_optimization_profile_async": 2,
                                   "set_communicator": 1},
             "Runtime": {"deserialize_cuda_engine": 1}}
    for cls, methods in calls.items():
        for method, nargs in methods.items():
            sigs = parse_signatures(getattr(getattr(real_trt, cls), method).__doc__, method)
            assert any(len([p for p in s.params if not p.has_default]) <= nargs <= len(s.params) for s in sigs), \
                f"{cls}.{method} takes no {nargs} arguments: {[str(s) for s in sigs]}"
    for prop in ("num_io_tensors", "device_memory_size_v2"):
        assert isinstance(getattr(real_trt.ICudaEngine, prop), property)
    assert "reallocate_output_async" in real_trt.IOutputAllocator.__doc__ and "notify_shape" in real_trt.IOutputAllocator.__doc__


@pytest.mark.parametrize("written_by", ["fuse --ops trt", "build --save-onnx"])
def test_greedy_generation_through_an_attention_ops_own_cache_form(written_by):
    """A decoder whose standard Attention op takes past_key/past_value: its kv-cache form (TRT_KVCacheUpdate and
    TRT_Attention through trtattn_plugins, or the verified TensorScatter form build saves) generates what the
    original does with past/present, token for token, a ragged batch in one run (right-padded [B, S] steps)
    as each prompt alone through the original."""
    from trtattn.routes.trt_ops import fuse_trt
    from trtattn.testing.contrib_graphs import attention_decoder

    original = attention_decoder()
    if written_by == "fuse --ops trt":
        form = fuse_trt(original, name="decoder").model
        assert any(n.op_type == "TRT_KVCacheUpdate" for n in form.graph.node)
    else:
        form = prepare(original, name="decoder").form_model
        assert any(n.op_type == "TensorScatter" for n in form.graph.node)
    session = open_session(form)
    assert session.aliases == {"present_key": "past_key", "present_value": "past_value"}
    prompts = [[3, 5, 7, 1], [2, 9], [11]]
    got = generate(session, prompts, 6)
    assert got.cache == "static"
    for row, prompt in enumerate(prompts):
        want = generate(open_session(original), [prompt], 6)
        assert want.cache == "concat" and got.tokens[row] == want.tokens[0]
        for step, logits in enumerate(want.logits):
            np.testing.assert_allclose(got.logits[step][row], logits[0], atol=2e-2, rtol=2e-2)  # fp16 attention
