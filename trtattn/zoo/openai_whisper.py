"""openai-whisper's own model with the seed's hand-made KV cache (shared/reference/whisper-onnx-kv-cache.txt),
exported by TorchScript and dynamo, eager and SDPA attention (issue 32). Run in a venv with `.[openai-whisper]`:

    python trtattn/zoo/openai_whisper.py OUT_DIR

A stand-alone script (as the foreign exporters are: openai-whisper pulls numba and triton, which this project does
not need): it imports only torch, whisper and onnx, writes its files into OUT_DIR and prints one JSON row per file
(exports() below runs it and collects them). Tiny random weights, seeded; nothing is downloaded.

The TorchScript decoder is one graph serving the first step and every later step, by the seed's calling convention
(the dynamo decoder serves the later steps only: DYNAMO_DECODER; so dynamo also writes the first step's own graph,
"decoder-first", as a user of torch.export does: no cache inputs, its caches start empty inside it; each row's
`steps` says which steps a graph serves):
    first step   x [B, n] tokens, xa [B, AUDIO_CTX, D] the encoder's output, both caches empty ([2L, B, 0, D])
    later steps  x [B, 1] the new token, xa [B, 0, D], the caches the step before returned
Each attention appends its new K/V to its cache (torch.cat) and keeps the last n_ctx positions (`k[:, -n_ctx:]`);
the caches are stacked, one tensor per kind (self, cross); the self-attention adds whisper's mask[:n, :n], which at a
later step is the (1, 1) zero broadcast over every key. Beside each decoder, OUT_DIR/<file>.steps.npz holds the
PyTorch model's run of three such steps (tokens, logits, returned caches): what the export is held to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

DIMS = dict(n_mels=80, n_audio_ctx=16, n_audio_state=64, n_audio_head=4, n_audio_layer=2, n_vocab=96,
            n_text_ctx=16, n_text_state=64, n_text_head=4, n_text_layer=2)
EXPORTERS = ("torchscript", "dynamo")
PARTS = ("encoder", "decoder", "decoder-first")
FIRST_STEP_EXPORTERS = ("dynamo",)  # who needs a first-step graph of its own: DYNAMO_DECODER
IMPLS = ("eager", "sdpa")  # whisper.model.MultiHeadAttention.use_sdpa False / True
OPSETS = {"torchscript": 17, "dynamo": 23}
FIRST_TOKENS = 3  # the first step's tokens (a prompt: start of transcript, language, task)
STEPS = (FIRST_TOKENS, 1, 1)  # the new tokens of each step the .steps.npz records
SEED = 0
PYTHON_VARIABLE = "TRTATTN_WHISPER_PYTHON"
MANIFEST = "openai-whisper.json"

# What the exporters cannot export, measured (torch 2.13.0, openai-whisper 20250625): (part, exporter, impl) -> a
# phrase of the recorded error, and why. tests/zoo/test_openai_whisper.py checks every record is still true.
UNSUPPORTED = {
    ("decoder", "torchscript", "sdpa"): ("argument 'is_causal' must be bool", "whisper's SDPA path passes "
                                         "is_causal=(n_ctx > 1), a traced size's comparison: a tensor, not a bool"),
    ("decoder", "dynamo", "sdpa"): ("argument 'is_causal' must be bool", "the same, as a SymBool"),
    ("decoder-first", "dynamo", "sdpa"): ("argument 'is_causal' must be bool", "the same, the prompt's length a "
                                          "SymInt"),
}


def file_name(part: str, exporter: str, impl: str) -> str:
    return f"openai-whisper-{part}{'-sdpa' if impl == 'sdpa' else ''}.{exporter}.onnx"


def _whisper():
    try:
        import whisper.model
    except ImportError as e:
        raise SystemExit(f"openai_whisper.py: {e}; run it with the Python of a venv with the openai-whisper extra "
                         "(trtattn/zoo/README.md)") from None
    return whisper.model


def model():
    """whisper.model.Whisper at DIMS with seeded weights that make attention matter (as the zoo's _randomize)."""
    import torch

    wm = _whisper()
    torch.manual_seed(SEED)
    m = wm.Whisper(wm.ModelDimensions(**DIMS)).eval()
    with torch.no_grad():
        for _, p in sorted(m.named_parameters()):
            if p.dim() >= 2:  # the decoder's positional embedding is torch.empty: it must be set
                p.normal_(0.0, p[0].numel() ** -0.5)
            elif bool((p == 0).all()):
                p.normal_(0.0, 0.1)
    _patch(m)
    return m


def _seed_forward(self, x, xa=None, mask=None, kv_cache=None):
    """The seed's MultiHeadAttention.forward: the new K/V appended to the cache, the last n_ctx kept, stored back."""
    import torch

    source = x if xa is None else xa
    k = torch.cat([kv_cache[self.key], self.key(source)], dim=1)[:, -self.n_ctx:, :]
    v = torch.cat([kv_cache[self.value], self.value(source)], dim=1)[:, -self.n_ctx:, :]
    kv_cache[self.key], kv_cache[self.value] = k, v
    wv, qk = self.qkv_attention(self.query(x), k, v, mask)
    return self.out(wv), qk


def _patch(m):
    """Every decoder attention takes the seed's forward (as the seed does, by swapping the object's class)."""
    wm = _whisper()
    functional = type("FunctionalMultiHeadAttention", (wm.MultiHeadAttention,), {"forward": _seed_forward})
    for block in m.decoder.blocks:
        block.attn.__class__, block.attn.n_ctx = functional, m.dims.n_text_ctx
        block.cross_attn.__class__, block.cross_attn.n_ctx = functional, m.dims.n_audio_ctx


def _modules(m):
    """(encoder, decoder) as modules of tensors only: the decoder's cache dict packed into two stacked tensors."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = m.encoder

        def forward(self, mel):
            return self.encoder(mel)

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = m.decoder
            # the self caches first: TextDecoder reads its position offset from the dict's first value
            self.keys_self = [p for b in m.decoder.blocks for p in (b.attn.key, b.attn.value)]
            self.keys_cross = [p for b in m.decoder.blocks for p in (b.cross_attn.key, b.cross_attn.value)]

        def forward(self, x, xa, cache_self_attn, cache_cross_attn):
            kv_cache = dict(zip(self.keys_self, cache_self_attn))
            kv_cache.update(zip(self.keys_cross, cache_cross_attn))
            logits = self.decoder(x, xa, kv_cache=kv_cache)
            return (logits, torch.stack([kv_cache[k] for k in self.keys_self]),
                    torch.stack([kv_cache[k] for k in self.keys_cross]))

    return Encoder().eval(), Decoder().eval()


def _first_step_module(decoder):
    """The first step alone, as a module of x and xa: its caches start empty inside it, the shapes torch.export
    cannot take as inputs (it specialises a zero-size input's dim to 0: DYNAMO_DECODER)."""
    import torch

    class FirstStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = decoder

        def forward(self, x, xa):
            empty = xa.new_zeros((2 * DIMS["n_text_layer"], x.shape[0], 0, DIMS["n_text_state"]))
            return self.decoder(x, xa, empty, empty)

    return FirstStep().eval()


ENCODER_IO = (["mel"], ["audio_features"], {"mel": {0: "batch"}})
DECODER_IO = (["x", "xa", "cache_self_attn", "cache_cross_attn"], ["logits", "new_cache_self_attn", "new_cache_cross_attn"],
              {"x": {0: "batch", 1: "seq"}, "xa": {0: "batch", 1: "audio"}, "cache_self_attn": {1: "batch", 2: "past"},
               "cache_cross_attn": {1: "batch", 2: "cross_past"}})
FIRST_STEP_IO = (DECODER_IO[0][:2], DECODER_IO[1], {n: DECODER_IO[2][n] for n in DECODER_IO[0][:2]})
IO = {"encoder": ENCODER_IO, "decoder": DECODER_IO, "decoder-first": FIRST_STEP_IO}


def _first_step(m, batch: int = 1):
    """The first step's inputs (the encoder run on a random spectrogram), in forward order."""
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    mel = torch.randn(batch, DIMS["n_mels"], 2 * DIMS["n_audio_ctx"], generator=g)
    with torch.no_grad():
        xa = m.encoder(mel)
    x = torch.randint(0, DIMS["n_vocab"], (batch, FIRST_TOKENS), generator=g)
    empty = torch.zeros(2 * DIMS["n_text_layer"], batch, 0, DIMS["n_text_state"])
    return mel, (x, xa, empty, empty.clone())


def _examples(m, part: str, exporter: str):
    """Example inputs: TorchScript traces the first step, a graph of the sizes that serves every step. torch.export
    cannot (DYNAMO_DECODER): it traces a later step, batch 2 (it specialises a dim whose example size is 0 or 1)."""
    import torch

    mel, first = _first_step(m, batch=1 if exporter == "torchscript" else 2)
    if part == "encoder":
        return (mel,)
    if exporter == "torchscript":
        return first
    if part == "decoder-first":
        return first[:2]
    layers, width = 2 * DIMS["n_text_layer"], DIMS["n_text_state"]
    # audio 2, not the later steps' 0, and contiguous: from a zero-size example or a view the ONNX translation keeps a
    # stride query ("No ONNX function found for aten.sym_stride"). The cross-attention takes no mask, so any audio
    # length is a valid later step; the graph is fed audio 0.
    return (first[0][:, :1].contiguous(), first[1][:, :2].contiguous(), torch.randn(layers, 2, FIRST_TOKENS, width),
            torch.randn(layers, 2, DIMS["n_audio_ctx"], width))


# Why the dynamo decoder serves the later steps only (measured with torch 2.13): exported at the first step, it
# specialises the empty caches to 0 (`past = 0`, `cross_past = 0`); traced at any other sizes whisper's mask[:n, :n]
# must broadcast over past + n keys, which it does only at n = 1, so torch.export guards `seq != 1` or fails
# ("The size of tensor a (s27 + s50) must match the size of tensor b (s27)").
DYNAMO_DECODER = ("torch.export cannot trace one graph for the first and the later steps: it specialises the empty "
                  "caches to 0, and whisper's mask[:n, :n] broadcasts over the past keys only at n = 1")


def _export(module, args, io, exporter: str, path: str):
    import torch

    names, outputs, axes = io
    if exporter == "torchscript":
        torch.onnx.export(module, args, path, input_names=names, output_names=outputs, dynamic_axes=axes,
                          opset_version=OPSETS[exporter], dynamo=False)
        return
    from torch.export import Dim

    shapes = tuple({a: Dim.AUTO for a in axes.get(n, {})} or None for n in names)
    program = torch.onnx.export(module, args, input_names=names, output_names=outputs, dynamic_shapes=shapes,
                                opset_version=OPSETS[exporter], dynamo=True, verbose=False, optimize=True)
    if program is None:  # only the TorchScript exporter returns nothing
        raise RuntimeError("torch.onnx.export(dynamo=True) returned no ONNX program")
    program.save(path)


def _metadata(part: str, exporter: str, impl: str) -> dict:
    """The `trtattn.inputs` record: input roles and the first step's dims (what verification feeds by default)."""
    sites = DIMS["n_audio_layer"] if part == "encoder" else 2 * DIMS["n_text_layer"]
    record = {"zoo": f"openai-whisper-{part}", "exporter": exporter, "impl": impl, "expected_sites": sites}
    if part == "encoder":
        return {**record, "inputs": {"mel": {"kind": "float"}}, "dims": {"batch": 1}}
    roles = {"x": {"kind": "token_ids", "vocab": DIMS["n_vocab"]}, "xa": {"kind": "float"},
             "cache_self_attn": {"kind": "cache"}, "cache_cross_attn": {"kind": "cache"}}
    if part == "decoder-first":
        return {**record, "inputs": {n: roles[n] for n in FIRST_STEP_IO[0]},
                "dims": {"batch": 1, "seq": FIRST_TOKENS, "audio": DIMS["n_audio_ctx"]}, "steps": [0]}
    if exporter == "torchscript":
        dims = {"batch": 1, "seq": FIRST_TOKENS, "audio": DIMS["n_audio_ctx"], "past": 0, "cross_past": 0}
        return {**record, "inputs": roles, "dims": dims, "steps": list(range(len(STEPS)))}
    dims = {"batch": 1, "seq": 1, "audio": 0, "past": FIRST_TOKENS, "cross_past": DIMS["n_audio_ctx"]}
    return {**record, "inputs": roles, "dims": dims, "steps": list(range(1, len(STEPS))), "why": DYNAMO_DECODER}


def _name_dims(model, axes: dict):
    """The inputs' symbolic dims given our names everywhere (dynamo calls them s0, s1, ...): torch_export._name_dims,
    which this stand-alone script cannot import (the venv it runs in has no trtattn)."""
    rename: dict[str, str] = {}
    for vi in model.graph.input:
        for axis, name in axes.get(vi.name, {}).items():
            dim = vi.type.tensor_type.shape.dim[axis]
            if dim.dim_param and dim.dim_param != name:
                rename.setdefault(dim.dim_param, name)
    for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        for dim in vi.type.tensor_type.shape.dim:
            if dim.dim_param in rename:
                dim.dim_param = rename[dim.dim_param]


def steps(m, batch: int = 1) -> dict:
    """The PyTorch model decoding STEPS from empty caches, each step fed the caches the step before returned: the
    tokens (x0, x1, ...), logits and returned caches of each step. The tokens are drawn, not argmax'd, so that every
    step's input is fixed whatever the logits."""
    import numpy as np
    import torch

    _, decoder = _modules(m)
    _, (x, xa, cache_self, cache_cross) = _first_step(m, batch)
    g = torch.Generator().manual_seed(SEED + 2)
    out = {"xa": xa.numpy()}
    with torch.no_grad():
        for i, n in enumerate(STEPS):
            x = x if i == 0 else torch.randint(0, DIMS["n_vocab"], (batch, n), generator=g)
            audio = xa if i == 0 else xa[:, :0]
            logits, cache_self, cache_cross = decoder(x, audio, cache_self, cache_cross)
            out[f"x{i}"], out[f"logits{i}"] = x.numpy(), logits.numpy()
            out[f"cache_self_attn{i}"], out[f"cache_cross_attn{i}"] = cache_self.numpy(), cache_cross.numpy()
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _root_cause(e: BaseException) -> str:
    """The innermost exception, in one line (as zoo.torch_export.root_cause, which this script cannot import)."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def export_one(part: str, exporter: str, impl: str, out: Path) -> dict:
    """Writes one file (and a decoder's .steps.npz); its manifest row, with the exporter's error if it failed."""
    import numpy as np
    import onnx

    wm = _whisper()
    wm.MultiHeadAttention.use_sdpa = impl == "sdpa"
    m = model()
    encoder, decoder = _modules(m)
    module = {"encoder": encoder, "decoder": decoder}.get(part) or _first_step_module(decoder)
    io = IO[part]
    name = file_name(part, exporter, impl)
    row = {"file": name, "part": part, "exporter": exporter, "impl": impl, **_metadata(part, exporter, impl)}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = str(Path(tmp) / "model.onnx")
        try:
            _export(module, _examples(m, part, exporter), io, exporter, raw)
        except Exception as e:  # recorded, as the zoo records what an exporter cannot export
            return {**row, "error": _root_cause(e)}
        onnx_model = onnx.load(raw, load_external_data=True)
    _name_dims(onnx_model, io[2])
    del onnx_model.metadata_props[:]
    onnx_model.metadata_props.add(key="trtattn.inputs", value=json.dumps(_metadata(part, exporter, impl)))
    onnx.save(onnx_model, str(out / name))
    if part != "encoder":
        np.savez(out / f"{name}.steps.npz", **steps(m))
    return row


def python() -> str | None:
    """The Python of a venv with openai-whisper: $TRTATTN_WHISPER_PYTHON, else .venv-whisper beside this checkout,
    else None."""
    given = os.environ.get(PYTHON_VARIABLE)
    if given:
        return given
    beside = Path(__file__).resolve().parents[2] / ".venv-whisper" / "bin" / "python"
    return str(beside) if beside.exists() else None


def exports(out: Path, python_path: str) -> list[dict]:
    """Every file's manifest row, the files written into `out` once by `python_path` running this script (a process
    asking while another exports waits for it: zoo.exported)."""
    from . import exported

    def make(manifest: Path):
        done = subprocess.run([python_path, __file__, str(manifest.parent)], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"openai_whisper.py failed with {python_path}:\n{done.stderr[-3000:]}")
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        partial = manifest.with_suffix(".partial")
        partial.write_text(json.dumps(rows, indent=1) + "\n")
        partial.replace(manifest)  # the manifest appears complete, after every file it names

    return json.loads(exported(Path(out) / MANIFEST, make).read_text())


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: openai_whisper.py OUT_DIR")
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        for exporter in EXPORTERS if part != "decoder-first" else FIRST_STEP_EXPORTERS:
            for impl in IMPLS:
                print(json.dumps(export_one(part, exporter, impl, out)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
