"""What runs in a fresh child process: one tool on one model (timed from loading the model to saving the
result; the tool's imports are not timed), the check of a peer's output, a zoo export."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .measure import PEERS, count_attention, file_bytes, mb, rss_kb


def _error(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def tool_worker(args) -> int:
    """Run one tool on one model in this (fresh) process; write a JSON result to --result."""
    import importlib
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    tool, src, out = args.tool, Path(args.model), Path(args.out)
    big = file_bytes(src) > 2**31 - 1 or any(src.parent.glob(src.name + "*.data"))
    res: dict = {"tool": tool, "error": None}
    import onnx  # imports are not timed: they are the same for every model

    if tool in ("trtattn", "trtattn_noverify"):
        from trtattn.graph import io as onnxio
        from trtattn.rewrite.fuse import fuse_model

        # onnxruntime and Polygraphy are imported on first use (a fuse with nothing to probe needs neither): here
        # they are the tool's imports, untimed as the peers' are (the ORT optimizer's own loads onnxruntime).
        # After trtattn's: Polygraphy reads at import the array-swap setting trtattn/verify/runners.py sets, without
        # which it imports torch to check every output (3.5 s and 185 MB more in a verified fuse)
        for name in ("onnxruntime", "polygraphy.backend.onnxrt", "polygraphy.comparator"):
            importlib.import_module(name)
    elif tool == "ort_optimizer":
        from onnxruntime.transformers.optimizer import optimize_model
    elif tool == "onnxscript":
        import onnx_ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort
    res["rss_after_imports_mb"] = mb(rss_kb())
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    try:
        if tool == "floor":
            m = onnx.load(str(src))
            if big:
                onnx.save_model(m, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                                location=out.name + ".data", size_threshold=1024)
            else:
                onnx.save_model(m, str(out))
        elif tool in ("trtattn", "trtattn_noverify"):
            m = onnxio.load(src, load_external_data=False)  # as `trtattn fuse` loads: the weights stay on disk
            t1 = time.perf_counter()
            r = fuse_model(m, verify=(tool == "trtattn"))
            res["fuse_seconds"] = time.perf_counter() - t1
            fused = [x for x in r.reports if x.status == "fused"]
            passed = r.verification.passed
            res["verification"] = {k: v for k, v in r.verification.to_json().items()
                                   if k in ("passed", "note", "max_abs_err", "slices")}
            res["reports"] = [{"name": x.site.name, "status": x.status, "reason": x.reason,
                               "max_abs_err": x.max_abs_err} for x in r.reports]
            res["fused"] = len(fused) if (passed is True or (passed is None and tool == "trtattn_noverify")) else 0
            t2 = time.perf_counter()
            onnxio.save(r.model, out)
            res["save_seconds"] = time.perf_counter() - t2
        elif tool == "ort_optimizer":
            kw = json.loads(args.ort_kwargs)
            opt = optimize_model(str(src), **kw)
            res["ort_kwargs"] = kw
            try:
                res["claimed"] = {k: v for k, v in opt.get_fused_operator_statistics().items() if "ttention" in k and v}
            except Exception:
                pass
            opt.save_model_to_file(str(out), use_external_data_format=big)
        elif tool == "onnxscript":
            model = ir.load(str(src))
            model, stats = optimize_for_ort(model)
            res["claimed"] = {k: v for k, v in stats.items() if v and k in ("sdpa", "gqa", "mha1", "mha2", "attention",
                                                                             "packed_qkv_for_gqa", "sdpa_via_mha")}
            if big:
                ir.save(model, str(out), external_data=out.name + ".data")
            else:
                ir.save(model, str(out))
        else:
            raise SystemExit(f"unknown tool {tool}")
    except BaseException as e:  # a crash is a result: 0 fused, the error noted
        import traceback

        res["error"] = _error(e)
        res["traceback"] = traceback.format_exc()[-3000:]
    res["seconds"] = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
        prof.dump_stats(args.profile)
    res["peak_mb_self"] = mb(rss_kb("VmHWM"))
    if res["error"] is None and tool != "floor":
        # honest count: the fused ops that are in the written model (not timed)
        res["ops"] = count_attention(onnx.load(str(out), load_external_data=False))
        res["op_count"] = sum(res["ops"].values())
        if tool in PEERS:
            res["fused"] = res["op_count"]
    Path(args.result).write_text(json.dumps(res))
    return 0


def check_worker(args) -> int:
    """Compare a peer's output with the original on ONNX Runtime, with trtattn's realistic inputs."""
    import warnings

    warnings.filterwarnings("ignore")
    from trtattn.graph import io
    from trtattn.verify import compare_models

    res = {"error": None}
    try:
        a = io.load(args.model, load_external_data=False)
        b = io.load(args.out, load_external_data=False)
        # peers (ORT's optimizer) may add opset imports / drop metadata: the inputs come from the original
        outcome = compare_models(a, b, [], atol=1e-3, rtol=1e-3)
        res["passed"] = bool(outcome.passed)
        res["max_abs_err"] = max(outcome.output_errors.values(), default=0.0)
    except BaseException as e:
        res["error"] = _error(e)
    Path(args.result).write_text(json.dumps(res))
    return 0


class CustomEntry:
    """A zoo entry with config overrides (more layers, bigger sizes): duck-types ZooEntry for
    trtattn.zoo.torch_export.export_entry."""

    def __init__(self, base, name: str, overrides: dict):
        self.base, self.name, self.overrides = base, name, overrides
        self.unsupported = dict(base.unsupported)
        self.family, self.impl = base.family, base.impl

    def config(self):
        cfg = self.base.config()
        for k, v in self.overrides.items():
            setattr(cfg, k, v)
        if getattr(cfg, "layer_types", None) is not None and "num_hidden_layers" in self.overrides:
            cfg.layer_types = [cfg.layer_types[0]] * cfg.num_hidden_layers
        if "hidden_size" in self.overrides and "head_dim" in cfg.to_dict():
            cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        return cfg

    @property
    def expected_sites(self) -> int:
        return self.base.count_sites(self.config())

    def build(self):
        import torch

        from trtattn.zoo import models

        torch.manual_seed(0)
        return getattr(models, self.base.builder)(self.config())


def export_worker(args) -> int:
    """Export a zoo model (optionally with config overrides) in this fresh process."""
    from trtattn import zoo
    from trtattn.zoo.torch_export import export_entry

    overrides = json.loads(args.overrides) if args.overrides else {}
    entry = zoo.get(args.base)
    if overrides:
        entry = CustomEntry(entry, args.name, overrides)
    res = {"error": None}
    t0 = time.perf_counter()
    try:
        export_entry(entry, args.exporter, args.out, force=True)
        res["sites"] = entry.expected_sites
    except BaseException as e:
        res["error"] = _error(e)
    res["seconds"] = time.perf_counter() - t0
    Path(args.result).write_text(json.dumps(res))
    return 0
