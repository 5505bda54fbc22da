"""`trtattn run DIR --generate N`: greedy decoding through an export folder's parts (or a folder of
engines with its pipeline.json) on ONNX Runtime or TensorRT (runtime/pipeline.py); with a tokenizer.json
in the folder, `--text "..."` takes text in and prints text out."""

from __future__ import annotations

import contextlib
import json

import numpy as np

from ..errors import TrtattnError
from ..runtime.pipeline import generate_pipeline, load_pipeline, tokenizer_of
from ..runtime.ranks import is_secondary_rank
from .common import _load_array, open_model, prompts


def run(args, progress) -> int:
    if not args.generate:
        raise TrtattnError(f"{args.model} is a folder: give --generate N to decode through its parts "
                           "(or name one model file to run it once)")
    pipeline = load_pipeline(args.model, backend=args.backend)
    tokenizer = tokenizer_of(pipeline.folder) if args.text else None
    if args.text and tokenizer is None:
        raise TrtattnError(f"--text needs a tokenizer.json in {pipeline.folder}")
    encoder_inputs = None
    if args.text and tokenizer is not None:
        requests = [tokenizer.encode(t).ids for t in args.text]
    elif args.features:
        if pipeline.kind != "encoder-decoder":
            raise TrtattnError("--features is the encoder's input; this folder has no encoder")
        features = _load_array(args.features)
        requests = None
        with contextlib.ExitStack() as probe:
            name = probe.enter_context(open_model(pipeline.parts["encoder"], args)).input_names[0]
        encoder_inputs = [{name: features[i:i + 1]} for i in range(features.shape[0])]
    else:
        requests = prompts(args)
    with contextlib.ExitStack() as stack:
        sessions = {role: stack.enter_context(open_model(path, args)) for role, path in pipeline.parts.items()}
        backend = next(iter(sessions.values())).backend
        with progress.step(f"generating {args.generate} tokens through {pipeline.folder} ({pipeline.kind}, {backend})"):
            tokens = generate_pipeline(pipeline, sessions, requests, args.generate, encoder_inputs=encoder_inputs,
                                       eos_token_id=args.eos)
    texts = [tokenizer.decode(t) for t in tokens] if tokenizer is not None else None
    if args.json:
        rows = [{"tokens": t, **({"text": x} if texts else {})} for t, x in zip(tokens, texts or tokens)]
        print(json.dumps({"folder": str(pipeline.folder), "kind": pipeline.kind, "backend": backend,
                          "parts": {k: str(v) for k, v in pipeline.parts.items()}, "requests": rows}, indent=2))
    else:
        print(f"{pipeline.folder} ({pipeline.kind}: {', '.join(p.name for p in pipeline.parts.values())}) on {backend}:")
        for i, toks in enumerate(tokens):
            print(f"  request {i}: {' '.join(map(str, toks))}")
            if texts:
                print(f"  text {i}: {texts[i]}")
    if args.save and not is_secondary_rank():  # one rank of a set (build DIR --tp): rank 0 saves
        out = np.full((len(tokens), max(len(t) for t in tokens)), -1, np.int64)
        for i, t in enumerate(tokens):
            out[i, :len(t)] = t
        np.savez(args.save, tokens=out)
    return 0
