"""Options and checks several sub-commands share."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import TrtattnError
from ..graph.io import refuse_overwrite
from .values import dims_text, memory_size, non_negative, positive, tolerance


def add_model_out(p) -> None:
    p.add_argument("model", help="input ONNX model, or an export folder (every model in it; never modified)")
    p.add_argument("-o", "--output", required=True, help="output ONNX model (a folder for a folder)")
    p.add_argument("--report", help="write a JSON report here")
    add_report_html(p)
    p.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")


def add_report_html(p) -> None:
    p.add_argument("--report-html", metavar="R.html",
                   help="write a self-contained HTML report: each site drawn as exported and as replaced, or where "
                        "its match stopped (needs Graphviz's dot)")


def check_report_html(args) -> None:
    """Before any work: the HTML report's path and its drawing program."""
    path = getattr(args, "report_html", None)
    if path:
        from ..pictures import graphviz

        refuse_overwrite(path, (args.model,), force=getattr(args, "force", False))
        graphviz()


def add_verify_opts(p) -> None:
    p.add_argument("--dims", type=dims_text, help="values of symbolic dims for verification, e.g. batch=2,seq=16")
    p.add_argument("--seed", type=non_negative, default=0, help="seed of the verification inputs (default 0)")
    add_inputs_opt(p)
    add_memory_opt(p)
    p.add_argument("--atol", type=tolerance, default=None,
                   help="max abs error allowed, plus as much relative to each output's largest value (default: by the "
                        "precision the model computes in: 1e-4 fp32, 1e-2 fp16, 6e-2 bf16)")


def add_inputs_opt(p, folder: str = "") -> None:
    p.add_argument("--inputs", metavar="FILE",
                   help="verify on exactly these inputs: an .npz of arrays keyed by input name, or Polygraphy's "
                        "inputs JSON (polygraphy run --save-inputs; one input set per entry) (default: inputs "
                        "searched in the model's domain)." + folder)


def given_inputs(args, model):
    """The user's --inputs for `model` (graph.user_inputs.GivenInputs), checked against its inputs; None
    without --inputs."""
    from ..graph.user_inputs import GivenInputs

    return GivenInputs.load(getattr(args, "inputs", None), model)


def add_memory_opt(p) -> None:
    p.add_argument("--max-memory", type=memory_size, metavar="SIZE",
                   help="memory the probes and searches on ONNX Runtime may use for activations, e.g. 8G "
                        "(default: a quarter of the available memory, at most 1G)")
    p.add_argument("--timings", action="store_true",
                   help="print where the time and memory went, phase by phase (read, match and probe, fit dims, "
                        "rewrite, verify, reload, write), on stderr, and add it to the --report JSON as 'timings'")


def check_output(model, output, force: bool, report=None) -> None:
    """Before any work: never the input, and an existing output only with --force; a path that cannot be
    written (under a file, a directory) is refused now, not after the work."""
    refuse_overwrite(output, (model,), force=force)
    if report:
        refuse_overwrite(report, (model, output))


def load_model(path, progress=None, with_weights: bool = False):
    """The input model, its weights left on disk unless `with_weights` (read where something needs them: ONNX
    Runtime maps them, outputs copy them file to file), so a model of any size loads in a moment; bad input
    gives one line (ModelLoadError), a model only ONNX Runtime accepts a note."""
    from ..graph import io, validate

    model = io.load(path, load_external_data=with_weights)
    note = validate.check_read(model, path)  # an invalid model is refused before any work (graph/validate.py)
    if note:
        (progress.note if progress is not None else lambda text: print(f"[trtattn] {text}", file=sys.stderr))(note)
    return model


# ---------------------------------------------------------------- run and bench: sessions, feeds, generation
NO_TRT_EXIT = 4  # TensorRT or cuda-python missing, or no GPU: one sentence, as `trtattn build` says it


def exit_without_tensorrt(error) -> int:
    print(f"trtattn: {error}.", file=sys.stderr)
    return NO_TRT_EXIT


def add_session_opts(p) -> None:
    """The model, its back end, its feeds and generation: what `run` and `bench` both take."""
    p.add_argument("model", help="MODEL.onnx (ONNX Runtime, CPU) or NAME.engine (TensorRT; reads its NAME.json sidecar); "
                                 "for run --generate also an export folder or a folder of engines (pipeline.json)")
    p.add_argument("--backend", default="auto", choices=["auto", "ort", "tensorrt"],
                   help="auto (default): .engine/.plan/.trt files run on TensorRT, anything else on ONNX Runtime")
    p.add_argument("--inputs", help="feeds as .npz, one array per input name (default: generated from the inputs' roles)")
    p.add_argument("--dims", type=dims_text, help="symbolic dim values for generated feeds, e.g. batch=2,seq=16")
    p.add_argument("--seed", type=non_negative, default=0, help="seed of generated feeds (default 0)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="TensorRT: replay runs with unchanged shapes and buffers (decode steps) as one CUDA graph")
    p.add_argument("--generate", type=positive, metavar="N",
                   help="greedy-decode N new tokens; MODEL is a decoder step with logits and a KV cache")
    p.add_argument("--prompt", action="append", metavar="IDS",
                   help="token ids of one request, comma separated (repeat for a ragged batch)")
    p.add_argument("--prefill", help="generation: a separate prefill model/engine (input_ids, attention_mask, position_ids)")
    p.add_argument("--encoder", help="encoder-decoder generation: the encoder model/engine")
    p.add_argument("--decoder-init", help="encoder-decoder generation: the first decoder step (returns the cross K/V)")
    p.add_argument("--features", help="encoder-decoder generation: the encoder's input, .npy [batch, ...]")
    p.add_argument("--eos", type=int, help="generation: stop a request at this token id")
    p.add_argument("--capacity", type=positive,
                   help="generation with a kv-cache form: cache capacity (default: the model's, else 256)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def open_model(path, args, threads=None):
    """A session for MODEL (or --prefill/--encoder/...) with the options its back end takes."""
    from ..contract import is_engine_path
    from ..runtime import open_session

    options = {}
    if args.backend == "tensorrt" or (args.backend == "auto" and is_engine_path(path)):
        from ..runtime.ranks import session_options

        options["cuda_graph"] = args.cuda_graph
        options.update(session_options(path))  # one rank of a launched set: its device and NCCL communicator
    else:
        load_model(path)  # an invalid ONNX model: one line from trtattn, not ONNX Runtime's error
        if threads:
            options["threads"] = threads
    return open_session(path, backend=args.backend, **options)


def session_feeds(session, args) -> dict:
    """--inputs (checked against the session's inputs), the rest generated from --dims and --seed."""
    import numpy as np

    from ..runtime import synthesize_feeds
    from .dims import parse_dims

    if not args.inputs:
        return synthesize_feeds(session, dims=parse_dims(args.dims), seed=args.seed)
    path = Path(args.inputs)
    if not path.exists():
        raise TrtattnError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as data:
            feeds = {k: data[k] for k in data.files}
    except Exception as e:
        raise TrtattnError(f"{path}: not a readable .npz of arrays ({type(e).__name__}: {e})") from None
    unknown = sorted(set(feeds) - set(session.input_names))
    if unknown:
        raise TrtattnError(f"{path} has arrays for {', '.join(unknown)}, which {session.name} does not take "
                           f"(inputs: {', '.join(session.input_names)})")
    missing = [n for n in session.input_names if n not in feeds]
    if missing:
        generated = synthesize_feeds(session, dims=parse_dims(args.dims), seed=args.seed)
        feeds.update({n: generated[n] for n in missing})
    return feeds


def prompts(args) -> list[list[int]]:
    if not args.prompt:
        raise TrtattnError("--generate needs at least one --prompt (token ids, comma separated)")
    out = []
    for text in args.prompt:
        try:
            ids = [int(t) for t in text.replace(" ", ",").split(",") if t.strip()]
        except ValueError:
            raise TrtattnError(f"bad --prompt '{text}': expected token ids separated by commas") from None
        if not ids:
            raise TrtattnError(f"bad --prompt '{text}': no token ids")
        out.append(ids)
    return out


def _load_array(path):
    import numpy as np

    path = Path(path)
    if not path.exists():
        raise TrtattnError(f"{path}: no such file")
    try:
        value = np.load(path, allow_pickle=False)
    except Exception as e:
        raise TrtattnError(f"{path}: not a readable .npy array ({type(e).__name__}: {e})") from None
    if not isinstance(value, np.ndarray):
        raise TrtattnError(f"{path}: expected one array (.npy), not an archive")
    return value


def generation_parts(args, stack) -> dict:
    """The other models generation needs (--prefill, or --encoder/--decoder-init/--features), opened
    once and closed with `stack` (a contextlib.ExitStack)."""
    parts = {}
    if args.encoder or args.decoder_init:
        if not (args.encoder and args.decoder_init and args.features):
            raise TrtattnError("encoder-decoder generation needs --encoder, --decoder-init and --features together")
        parts["features"] = _load_array(args.features)
        parts["encoder"] = stack.enter_context(open_model(args.encoder, args))
        parts["decoder_init"] = stack.enter_context(open_model(args.decoder_init, args))
    elif args.prefill:
        parts["prefill"] = stack.enter_context(open_model(args.prefill, args))
    return parts


def generate_from_args(args, step, parts: dict):
    """Greedy decoding of --prompt requests for --generate tokens with `step` (and `parts`)."""
    from ..runtime import generate, generate_encoder_decoder

    requests = prompts(args)
    options = {"eos_token_id": args.eos, "capacity": args.capacity, "record_logits": False}
    if "encoder" in parts:
        return generate_encoder_decoder(parts["encoder"], parts["decoder_init"], step, parts["features"], requests,
                                        args.generate, **options)
    return generate(step, requests, args.generate, prefill=parts.get("prefill"), **options)
