"""On a GPU with TensorRT >= 11 (the docker/ container): build every zoo model, require a fused
`mha` kernel for every site in the engine's layer info, and compare the engine with ONNX Runtime
on the original model through Polygraphy. Elsewhere these tests skip, saying why."""

import json

import onnx
import pytest

from tests.conftest import zoo_cases
from trtattn import zoo

pytestmark = pytest.mark.trt


def _tensorrt():
    from trtattn.trt import compat
    from trtattn.trt.session import trt_available

    ok, why = trt_available()  # TensorRT >= 11, cuda-python and a GPU, or the sentence saying which is missing
    if not ok:
        pytest.skip(f"TensorRT engines cannot run here ({why}); these tests run in the docker/ container")
    return compat.import_tensorrt()


FORMS = {"llama-cache": "kv-cache", "llama-cache-sdpa": "kv-cache", "whisper-decoder-cache": "kv-cache",
         "whisper-decoder-cache-sdpa": "kv-cache"}
PACKED = [("bert", "torchscript"), ("gpt2", "torchscript"), ("llama", "torchscript")]


def _build_and_check(tmp_path, zoo_export, name, exporter, form):
    trt = _tensorrt()
    from trtattn.inspect import classify, load_sites, read_engine
    from trtattn.routes.builder import build
    from trtattn.routes.prepare import prepare
    from trtattn.verify import verify_candidate

    src = zoo_export(name, exporter)
    model = onnx.load(str(src))
    # the whole model in fp16, no unfused fallback: a site without a fused kernel fails the build
    prepared = prepare(model, name=f"{name}_{exporter}_{form}", form=form, precision="fp16", decomposable=False,
                       mark_sites=form == "padded")
    assert all(a.dtype == "fp16" and not a.decomposable for a in prepared.plan.native)
    engine, sidecar = build(prepared, trt, tmp_path, progress=False)
    assert all(s["decomposable"] is False for s in json.loads(sidecar.read_text())["sites"])
    report = classify(read_engine(engine), load_sites(sidecar))
    attention = report["attention"]
    assert len(attention) == zoo.get(name).expected_sites, attention
    assert all(a["fused"] for a in attention), [a for a in attention if not a["fused"]]
    result = verify_candidate(str(engine), model, sidecar=json.loads(sidecar.read_text()), precision="fp16")
    assert result.outcome.passed, result.to_json()


@pytest.mark.parametrize("name,exporter", zoo_cases())
def test_zoo_engine_every_attention_fused_and_verified(tmp_path, zoo_export, name, exporter):
    _build_and_check(tmp_path, zoo_export, name, exporter, FORMS.get(name, "padded"))


@pytest.mark.parametrize("name,exporter", PACKED)
def test_packed_engines(tmp_path, zoo_export, name, exporter):
    _build_and_check(tmp_path, zoo_export, name, exporter, "packed")


@pytest.mark.parametrize("family", ["whisper", "bart", "t5"])
def test_encoder_decoder_folder_of_engines_generates(tmp_path, zoo_dir, capsys, family):
    """`build DIR` with TensorRT: one engine per part and pipeline.json; `run OUT --generate` decodes through
    the engines (the kv-cache form's static cache on the GPU) and starts as the export folder does (fp16
    engines: later tokens may part from the fp32 export's on a near tie)."""
    _tensorrt()
    import numpy as np
    from export_folders import encoder_decoder_folder, run_tokens

    from trtattn.cli import main

    folder = encoder_decoder_folder(family, zoo_dir, tmp_path, 3 if family == "whisper" else 2)
    assert main(["build", str(folder), "--out-dir", str(tmp_path / "built"), "--precision", "fp16"]) == 0
    out = tmp_path / "built" / folder.name
    assert json.loads((out / "pipeline.json").read_text())["built"] is True
    if family == "whisper":
        features = tmp_path / "features.npy"
        np.save(features, np.random.default_rng(0).standard_normal((1, 16, 32)).astype(np.float32))
        request = ["--features", str(features)]
    else:
        request = ["--prompt", "100,101,102,103,104,105,106"]
    want = run_tokens(capsys, folder, *request)[0]
    got = run_tokens(capsys, out, *request)[0]
    assert got[0] == want[0] and 1 <= len(got) <= 8
