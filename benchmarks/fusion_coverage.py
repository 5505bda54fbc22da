#!/usr/bin/env python
"""Attention-fusion coverage and cost of trtattn, ONNX Runtime's optimizer and onnxscript.

trtattn against ONNX Runtime's transformers optimizer and onnxscript's ORT fusions, on every zoo
model and exporter, in one run on one machine:

    python benchmarks/fusion_coverage.py [--quick] [--json FILE] [--models a,b] [--exporters x,y]
                                         [--no-scaling] [--no-large] [--profile-slow]

Per model x exporter it reports
- coverage: attention sites in the model (from the zoo config), sites fused by trtattn (reports
  with status "fused", counted only when its verification passed) and by each peer (fused attention
  ops counted in the peer's *output model*, never what the tool says it did); a tool that crashes
  gets 0 and its error is noted;
- cost: wall time and peak RSS of each tool, each run in a fresh subprocess (peak RSS from the
  kernel's rusage of that child, os.wait4), timed from loading the model to saving the result,
  against the floor: onnx.load + onnx.save of the same model. trtattn is timed with its
  verification and without it (verify=False): the peers do not verify.

Then scaling (one family at 2, 8 and 32 layers: time per layer should stay flat) and a model over
2 GB with external data (peak memory relative to the size of the weights).

Models are exported once into --work-dir (default out/bench) and reused by later runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent

TOOLS = ("floor", "trtattn", "trtattn_noverify", "ort_optimizer", "onnxscript")
PEERS = ("ort_optimizer", "onnxscript")

# Fused attention ops, by domain, that count as "this site was fused" in an output model.
ATTENTION_OPS = {
    "": {"Attention"},  # the standard ONNX op (opset 23)
    "com.microsoft": {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
                      "PackedMultiHeadAttention", "DecoderMaskedMultiHeadAttention",
                      "DecoderMaskedSelfAttention", "DecoderAttention", "LongformerAttention",
                      "SparseAttention", "PagedAttention", "QAttention", "QOrderedAttention",
                      "QOrderedLongformerAttention", "RelativePositionBias"},
}
# onnxscript's intermediate fusion op (domain ai.onnxruntime._fusion): left in the graph only if a
# later rule did not consume it; counted, since it stands for one fused attention.
ATTENTION_OPS_ANY_DOMAIN = {"SDPA", "MultiHeadAttention", "GroupQueryAttention", "Attention"}
NOT_ATTENTION = {("com.microsoft", "RelativePositionBias")}  # a helper op, not an attention

# ONNX Runtime transformers optimizer: model_type per zoo family, and which config fields give
# num_heads / hidden_size. Chosen by trying every plausible model type and opt level on every
# export (see --explore-ort) and keeping the best per family; the choice is printed with the table.
ORT_MODEL_TYPE = {
    "bart": "bart", "whisper": "bart", "whisper-decoder-cache": "bart", "t5": "t5", "swin": "swin",
    "vit": "vit", "bert": "bert", "gpt2": "gpt2", "llama": "gpt_neox", "llama-cache": "gpt_neox",
    "gemma3": "gpt_neox",
}
ORT_OPT_LEVEL: dict[str, int | None] = {}  # family -> opt_level (None: the model type's default)

QUICK_MODELS = ["bart", "bert", "gpt2", "llama", "llama-cache", "swin-sdpa", "t5", "whisper-decoder-cache"]
QUICK_EXPORTERS = ["torchscript", "dynamo"]

SCALING_FAMILY = "llama"
SCALING_LAYERS = (2, 8, 32)
QUICK_SCALING_LAYERS = (2, 8)

# Large model: Llama with 552M parameters (2.2 GB of float32 weights), saved with external data.
LARGE_CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=8,
                    num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=512)


# ====================================================================== helpers shared by both sides
def _mb(kb: float) -> float:
    return round(kb / 1024.0, 1)


def _rss_kb(field: str = "VmRSS") -> int:
    """This process's resident memory (VmRSS) or its peak (VmHWM), in kB, from /proc.

    The peak is read from /proc rather than getrusage: ru_maxrss of a process started by
    fork/vfork + exec also counts the parent's memory at the time of the exec (Linux keeps the
    pre-exec high-water mark), which here would be the benchmark's own process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _file_bytes(path: Path) -> int:
    """Size of a model and its external data files."""
    path = Path(path)
    total = path.stat().st_size
    for p in path.parent.glob(path.name + "*.data"):
        total += p.stat().st_size
    data = path.parent / (path.name + ".data")
    if not data.exists():
        import onnx

        m = onnx.load(str(path), load_external_data=False)
        locs = {e.value for t in _all_tensors(m) for e in t.external_data if e.key == "location"}
        for loc in locs:
            p = path.parent / loc
            if p.exists() and not p.name.startswith(path.name):
                total += p.stat().st_size
    return total


def _all_tensors(model):
    from onnx.external_data_helper import _get_all_tensors

    return _get_all_tensors(model)


def count_attention(model) -> dict[str, int]:
    """Fused attention ops in a model (main graph, subgraphs and functions), by domain:op."""
    counts: dict[str, int] = {}

    def visit(nodes):
        for n in nodes:
            dom = n.domain or ""
            dom = "" if dom == "ai.onnx" else dom
            hit = n.op_type in ATTENTION_OPS.get(dom, set()) or (
                dom not in ("", "com.microsoft") and n.op_type in ATTENTION_OPS_ANY_DOMAIN)
            if hit and (dom, n.op_type) not in NOT_ATTENTION:
                key = f"{dom or 'ai.onnx'}:{n.op_type}"
                counts[key] = counts.get(key, 0) + 1
            for a in n.attribute:
                if a.g is not None and a.g.node:
                    visit(a.g.node)
                for g in a.graphs:
                    visit(g.node)

    visit(model.graph.node)
    used = {(n.domain, n.op_type) for n in model.graph.node}
    for f in model.functions:  # only functions the graph calls (onnxscript inlines its own)
        if (f.domain, f.name) in used:
            visit(f.node)
    return counts


# ====================================================================== worker (one tool, one model)
def _worker(args) -> int:
    """Run one tool on one model in this (fresh) process; write a JSON result to --result."""
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    tool, src, out = args.tool, Path(args.model), Path(args.out)
    big = _file_bytes(src) > 2**31 - 1 or any(src.parent.glob(src.name + "*.data"))
    res: dict = {"tool": tool, "error": None}
    prof = None
    # imports are not timed: they are the same for every model
    import onnx

    if tool in ("trtattn", "trtattn_noverify"):
        from trtattn.graph import io as onnxio
        from trtattn.rewrite.fuse import fuse_model
    elif tool == "ort_optimizer":
        from onnxruntime.transformers.optimizer import optimize_model
    elif tool == "onnxscript":
        import onnx_ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort
    res["rss_after_imports_mb"] = _mb(_rss_kb())
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
            m = onnxio.load(src)
            t1 = time.perf_counter()
            r = fuse_model(m, verify=(tool == "trtattn"))
            res["fuse_seconds"] = time.perf_counter() - t1
            fused = [x for x in r.reports if x.status == "fused"]
            passed = r.verification.get("passed")
            res["verification"] = {k: v for k, v in r.verification.items() if k in ("passed", "note", "max_abs_err")}
            res["reports"] = [{"name": x.site.name, "status": x.status, "reason": x.reason,
                               "max_abs_err": x.max_abs_err} for x in r.reports]
            res["fused"] = len(fused) if (passed is True or (passed is None and tool == "trtattn_noverify")) else 0
            onnxio.save(r.model, out)
        elif tool == "ort_optimizer":
            fam = args.family
            kw = json.loads(args.ort_kwargs)
            opt = optimize_model(str(src), **kw)
            res["ort_kwargs"] = kw
            try:
                res["claimed"] = {k: v for k, v in opt.get_fused_operator_statistics().items()
                                  if "ttention" in k and v}
            except Exception:
                pass
            opt.save_model_to_file(str(out), use_external_data_format=big)
            del fam
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

        res["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
        res["traceback"] = traceback.format_exc()[-3000:]
    res["seconds"] = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
        prof.dump_stats(args.profile)
    res["peak_mb_self"] = _mb(_rss_kb("VmHWM"))
    if res["error"] is None and tool != "floor":
        # honest count: the fused ops that are in the written model (not timed)
        saved = onnx.load(str(out), load_external_data=False)
        res["ops"] = count_attention(saved)
        res["op_count"] = sum(res["ops"].values())
        if tool in PEERS:
            res["fused"] = res["op_count"]
    Path(args.result).write_text(json.dumps(res))
    return 0


# ====================================================================== parent: exporting
class _CustomEntry:
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


def _export_worker(args) -> int:
    """Export a zoo model (optionally with config overrides) in this fresh process."""
    from trtattn import zoo
    from trtattn.zoo.torch_export import export_entry

    overrides = json.loads(args.overrides) if args.overrides else {}
    entry = zoo.get(args.base)
    if overrides:
        entry = _CustomEntry(entry, args.name, overrides)
        if "vocab_size" in overrides:  # token ids stay below the zoo's VOCAB: fine for any larger vocab
            pass
    res = {"error": None}
    t0 = time.perf_counter()
    try:
        export_entry(entry, args.exporter, args.out, force=True)
        res["sites"] = entry.expected_sites
    except BaseException as e:
        res["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
    res["seconds"] = time.perf_counter() - t0
    Path(args.result).write_text(json.dumps(res))
    return 0


def _zoo_hash() -> str:
    """Exports are reused only while the zoo's code (builders, exporter settings) is unchanged."""
    import hashlib

    import trtattn.zoo

    h = hashlib.sha256()
    for f in sorted(Path(trtattn.zoo.__file__).parent.glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


# ====================================================================== parent: running children
def _run_child(argv: list[str], timeout: float, log: Path) -> tuple[dict, float, int | None]:
    """Run this script as a child; returns (its JSON result, peak RSS MB from wait4, exit code)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    cmd = [sys.executable, str(HERE)] + argv + ["--result", result_path]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(log, "ab") as lf:
        lf.write(("\n$ " + " ".join(cmd) + "\n").encode())
        lf.flush()
        proc = subprocess.Popen(cmd, stdout=lf, stderr=lf, env=env, cwd=str(ROOT))
        deadline = time.monotonic() + timeout
        status = None
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                _, status, ru = os.wait4(proc.pid, 0)
                proc.returncode = -9
                res = {"error": f"timeout after {timeout:.0f} s"}
                os.unlink(result_path)
                return res, _mb(ru.ru_maxrss), -9
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
    peak = _mb(ru.ru_maxrss)
    try:
        res = json.loads(Path(result_path).read_text())
    except (OSError, ValueError):
        code = proc.returncode
        why = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        res = {"error": f"the process died without a result ({why}{', out of memory?' if code == -9 else ''})"}
    finally:
        if os.path.exists(result_path):
            os.unlink(result_path)
    return res, peak, proc.returncode


def _ort_kwargs(family: str, cfg) -> dict:
    """num_heads / hidden_size from the zoo config, as ORT's optimizer asks for them."""
    mt = ORT_MODEL_TYPE.get(family, "bert")
    d = cfg.to_dict()
    heads = d.get("num_attention_heads") or d.get("encoder_attention_heads") or d.get("n_head") or d.get("num_heads")
    hidden = d.get("hidden_size") or d.get("d_model") or d.get("n_embd")
    if family == "swin":  # heads differ per stage ([2, 4]): one number would be wrong for a stage; auto-detect
        heads, hidden = 0, 0
    if family == "t5":
        hidden = d["num_heads"] * d["d_kv"]
    if d.get("head_dim") and heads:  # Gemma: heads x head_dim is the attention width, not hidden_size
        hidden = heads * d["head_dim"] if family == "gemma3" else hidden
    kw = {"model_type": mt, "num_heads": int(heads or 0), "hidden_size": int(hidden or 0)}
    if family in ORT_OPT_LEVEL:
        kw["opt_level"] = ORT_OPT_LEVEL[family]
    return kw


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work_dir).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = self.work / "bench.log"
        self.timeout = args.timeout

    def say(self, msg: str):
        print(msg, file=sys.stderr, flush=True)

    def export(self, base: str, exporter: str, name: str | None = None, overrides: dict | None = None) -> tuple[Path | None, dict]:
        name = name or base
        d = self.work / "models" / f"{name}.{exporter}"
        d.mkdir(parents=True, exist_ok=True)
        path = d / "model.onnx"
        meta_path = d / "export.json"
        if path.exists() and meta_path.exists():
            meta = json.loads(meta_path.read_text())
            if meta.get("overrides") == (overrides or {}) and meta.get("zoo_hash") == _zoo_hash():
                return path, meta
        self.say(f"  exporting {name} ({exporter}) ...")
        argv = ["--_export", "--base", base, "--name", name, "--exporter", exporter, "--out", str(path)]
        if overrides:
            argv += ["--overrides", json.dumps(overrides)]
        res, peak, _ = _run_child(argv, self.args.export_timeout, self.log)
        res["peak_mb"] = peak
        res["overrides"] = overrides or {}
        res["zoo_hash"] = _zoo_hash()
        if res.get("error"):
            self.say(f"  export failed: {res['error']}")
            return None, res
        meta_path.write_text(json.dumps(res))
        return path, res

    def run_tool(self, tool: str, model: Path, family: str, cfg=None, profile: str | None = None) -> dict:
        out_dir = model.parent / "out"
        out_dir.mkdir(exist_ok=True)
        out = out_dir / f"{tool}.onnx"
        for old in out_dir.glob(f"{tool}.onnx*"):
            old.unlink()
        argv = ["--_worker", "--tool", tool, "--model", str(model), "--out", str(out), "--family", family]
        if tool == "ort_optimizer":
            argv += ["--ort-kwargs", json.dumps(_ort_kwargs(family, cfg))]
        if profile:
            argv += ["--profile", profile]
        res, peak, code = _run_child(argv, self.timeout, self.log)
        # the child's own high-water mark; the kernel's rusage only if it died before reporting
        res["peak_mb"] = res.get("peak_mb_self", peak)
        res["out"] = str(out)
        if code not in (0, None) and not res.get("error"):
            res["error"] = f"exit code {code}"
        if res.get("error"):
            res["fused"] = 0
        return res

    def check_peer(self, model: Path, out: Path) -> dict:
        """Does the peer's output still compute the same thing? (not timed; trtattn verifies itself)"""
        argv = ["--_check", "--model", str(model), "--out", str(out)]
        res, _, _ = _run_child(argv, self.timeout, self.log)
        return res

    # ------------------------------------------------------------ one row
    def run_best(self, tool: str, model: Path, family: str, cfg, repeat: int | None = None) -> dict:
        """The fastest of --repeat runs (timings on a 2-core machine are noisy); the highest peak."""
        runs = [self.run_tool(tool, model, family, cfg) for _ in range(max(1, repeat or self.args.repeat))]
        ok = [r for r in runs if not r.get("error")] or runs
        best = min(ok, key=lambda r: r.get("seconds", float("inf")))
        best["peak_mb"] = max(r["peak_mb"] for r in runs)
        best["all_seconds"] = [round(r.get("seconds", 0.0), 3) for r in runs]
        return best

    def row(self, name: str, exporter: str, path: Path, family: str, sites: int, cfg, tools=TOOLS,
            check: bool = True, repeat: int | None = None) -> dict:
        import onnx

        pre = count_attention(onnx.load(str(path), load_external_data=False))
        row = {"model": name, "exporter": exporter, "sites": sites, "size_mb": round(_file_bytes(path) / 2**20, 1),
               "already_fused": sum(pre.values()), "fused": {}, "seconds": {}, "peak_mb": {}, "errors": {},
               "ops": {}, "details": {}}
        for tool in tools:
            r = self.run_best(tool, path, family, cfg, repeat)
            row["seconds"][tool] = round(r.get("seconds", 0.0), 3) if not (r.get("error") or "").startswith("timeout") else None
            row["peak_mb"][tool] = r["peak_mb"]
            if r.get("error"):
                row["errors"][tool] = r["error"]
            if tool == "floor":
                continue
            row["fused"][tool] = r.get("fused", 0)
            row["ops"][tool] = r.get("ops", {})
            det = {k: r[k] for k in ("claimed", "ort_kwargs", "verification", "fuse_seconds", "traceback",
                                     "rss_after_imports_mb", "all_seconds") if k in r}
            if tool.startswith("trtattn") and "reports" in r:
                det["skipped"] = [x for x in r["reports"] if x["status"] != "fused"]
                det["ops_in_output"] = r.get("op_count")
            row["details"][tool] = det
            if check and tool in PEERS and not r.get("error") and r.get("fused"):
                c = self.check_peer(path, Path(r["out"]))
                det["output_matches_original"] = c.get("passed") if not c.get("error") else None
                if c.get("error"):
                    det["check_error"] = c["error"]
                elif not c.get("passed"):
                    det["check_max_abs_err"] = c.get("max_abs_err")
        # trtattn is also measured against the floor and the fastest peer (for the profile list)
        self.say(f"  {name:28s} {exporter:11s} sites {sites:3d}  " + "  ".join(
            f"{t}={row['fused'].get(t, '-')}/{row['seconds'].get(t)}s" for t in tools if t != "floor")
            + f"  floor={row['seconds'].get('floor')}s")
        return row


ORT_CANDIDATES = {
    "bart": ["bart", "bert"], "whisper": ["bart", "bert"], "whisper-decoder-cache": ["bart", "bert"],
    "t5": ["t5", "bert"], "swin": ["swin", "vit", "bert"], "vit": ["vit", "bert"], "bert": ["bert"],
    "gpt2": ["gpt2", "bert"], "llama": ["gpt_neox", "phi", "qwen3", "gpt2", "bert"],
    "llama-cache": ["gpt_neox", "phi", "qwen3", "gpt2", "bert"], "gemma3": ["gpt_neox", "phi", "qwen3", "gpt2", "bert"],
}


def explore_ort(bench: "Bench", names: list[str], exporters: list[str]) -> dict:
    """Try every plausible ORT model type, opt level and num_heads/hidden_size source on every export
    (in this process, untimed); print the attention ops each choice leaves in the output."""
    import logging

    logging.disable(logging.WARNING)
    from onnxruntime.transformers.optimizer import optimize_model

    from trtattn import zoo

    results: dict = {}
    for name in names:
        entry = zoo.get(name)
        for exporter in entry.exporters:
            if exporter not in exporters:
                continue
            path, _ = bench.export(name, exporter)
            if path is None:
                continue
            cfg_kw = _ort_kwargs(entry.family, entry.config())
            for mt in ORT_CANDIDATES.get(entry.family, ["bert"]):
                for heads in ("config", "auto"):
                    for level in (None, 0, 2):
                        kw = {"model_type": mt, "opt_level": level,
                              "num_heads": cfg_kw["num_heads"] if heads == "config" else 0,
                              "hidden_size": cfg_kw["hidden_size"] if heads == "config" else 0}
                        try:
                            opt = optimize_model(str(path), **kw)
                            n = sum(count_attention(opt.model).values())
                        except Exception as e:
                            n = f"error {type(e).__name__}"
                        key = (entry.family, mt, heads, level)
                        results.setdefault(key, []).append((name, exporter, n))
    best: dict = {}
    for (fam, mt, heads, level), got in results.items():
        total = sum(n for _, _, n in got if isinstance(n, int))
        print(f"{fam:22s} {mt:9s} heads={heads:6s} opt_level={level!s:4s} total={total:3d}  " +
              " ".join(f"{a}/{b[0]}={n}" for a, b, n in got))
        if fam not in best or total > best[fam][0]:
            best[fam] = (total, mt, heads, level)
    print()
    for fam, (total, mt, heads, level) in best.items():
        print(f"best for {fam}: model_type={mt} heads={heads} opt_level={level} ({total} fused)")
    return best


def _check_worker(args) -> int:
    """Compare a peer's output with the original on ONNX Runtime, with trtattn's realistic inputs."""
    import warnings

    warnings.filterwarnings("ignore")
    import onnx

    from trtattn.verify import compare_models

    res = {"error": None}
    try:
        a = onnx.load(args.model)
        b = onnx.load(args.out)
        # peers (ORT's optimizer) may add opset imports / drop metadata: the inputs come from the original
        outcome = compare_models(a, b, [], atol=1e-3, rtol=1e-3)
        res["passed"] = bool(outcome.passed)
        res["max_abs_err"] = max(outcome.output_errors.values(), default=0.0)
    except BaseException as e:
        res["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
    Path(args.result).write_text(json.dumps(res))
    return 0


# ====================================================================== table
def _fmt_s(v) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def _fmt_fused(row, tool) -> str:
    n = row["fused"].get(tool)
    if n is None:
        return "-"
    s = str(n)
    if tool in row["errors"]:
        s += " (err)"
    det = row["details"].get(tool, {})
    if det.get("output_matches_original") is False:
        s += " (wrong)"
    elif det.get("check_error"):
        s += " (invalid)"
    return s


def _correct(row, tool) -> bool:
    """A peer's fusions count as correct when its output model runs and matches the original."""
    det = row["details"].get(tool, {})
    return tool not in row["errors"] and det.get("output_matches_original") is not False and not det.get("check_error")


def coverage_table(rows: list[dict]) -> str:
    head = ("| model | exporter | sites | already fused in input | trtattn (verified) | ORT optimizer | onnxscript "
            "| floor s | trtattn s | trtattn no-verify s | ORT s | onnxscript s "
            "| floor MB | trtattn MB | no-verify MB | ORT MB | onnxscript MB |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        s, p = r["seconds"], r["peak_mb"]
        lines.append("| " + " | ".join([
            r["model"], r["exporter"], str(r["sites"]), str(r.get("already_fused", 0)),
            _fmt_fused(r, "trtattn"), _fmt_fused(r, "ort_optimizer"), _fmt_fused(r, "onnxscript"),
            _fmt_s(s.get("floor")), _fmt_s(s.get("trtattn")), _fmt_s(s.get("trtattn_noverify")),
            _fmt_s(s.get("ort_optimizer")), _fmt_s(s.get("onnxscript")),
            *(f"{p.get(t):.0f}" if p.get(t) is not None else "-" for t in TOOLS)]) + " |")
    tot = {t: sum(r["fused"].get(t, 0) for r in rows) for t in ("trtattn", "ort_optimizer", "onnxscript")}
    good = {t: sum(r["fused"].get(t, 0) for r in rows if _correct(r, t)) for t in PEERS}
    new = {t: sum(max(0, r["fused"].get(t, 0) - r.get("already_fused", 0)) for r in rows if _correct(r, t))
           for t in ("trtattn",) + PEERS}
    sites = sum(r["sites"] for r in rows)
    pre = sum(r.get("already_fused", 0) for r in rows)
    lines.append(f"| **total** | | **{sites}** | {pre} | **{tot['trtattn']}** | "
                 f"**{tot['ort_optimizer']}** ({good['ort_optimizer']} correct) | **{tot['onnxscript']}** "
                 f"({good['onnxscript']} correct) |" + " |" * 10)
    lines.append(f"| **correct, beyond those already fused in the input** | | **{sites - pre}** | | **{new['trtattn']}** | "
                 f"**{new['ort_optimizer']}** | **{new['onnxscript']}** |" + " |" * 10)
    return "\n".join(lines)


def scaling_table(rows: list[dict]) -> str:
    """Seconds per tool, and the marginal seconds per added layer ((t_n - t_prev) / (n - prev)):
    flat marginal cost means linear scaling; the fixed cost (imports, sessions) sits in the first row."""
    tools = ("trtattn", "trtattn_noverify", "ort_optimizer", "onnxscript", "floor")
    lines = ["| model | layers | sites | trtattn fused | " + " | ".join(
        f"{t} s | {t} s/added layer" for t in tools) + " | trtattn MB |",
        "|" + "|".join(["---"] * (5 + 2 * len(tools))) + "|"]
    prev = None
    for r in sorted(rows, key=lambda r: r["layers"]):
        n, s = r["layers"], r["seconds"]
        cells = [r["model"], str(n), str(r["sites"]), str(r["fused"].get("trtattn"))]
        for t in tools:
            cells.append(_fmt_s(s.get(t)))
            if prev is not None and s.get(t) is not None and prev["seconds"].get(t) is not None:
                cells.append(f"{(s[t] - prev['seconds'][t]) / (n - prev['layers']):.3f}")
            else:
                cells.append("-")
        cells.append(f"{r['peak_mb'].get('trtattn', 0):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
        prev = r
    return "\n".join(lines)


def large_table(rows: list[dict]) -> str:
    lines = ["| model | weights MB | sites | tool | fused | seconds | peak MB | peak / weights | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        w = r["size_mb"]
        for t in TOOLS:
            if t not in r["seconds"]:
                continue
            pk = r["peak_mb"].get(t)
            lines.append(f"| {r['model']} | {w:.0f} | {r['sites']} | {t} | {r['fused'].get(t, '-') if t != 'floor' else '-'} "
                         f"| {_fmt_s(r['seconds'].get(t))} | {pk:.0f} | {pk / w:.2f}x | {r['errors'].get(t, '')} |")
    return "\n".join(lines)


def slow_summary(rows: list[dict]) -> str:
    """One line per kind of slowness, with the worst cases (the coverage table has every number)."""
    n = len(rows)
    nv_slower = [r for r in rows if _ratio(r, "trtattn_noverify") > 1]
    v_slower = [r for r in rows if _ratio(r, "trtattn") > 1]
    over_floor = [r for r in rows if r["seconds"].get("trtattn") and r["seconds"].get("floor")
                  and r["seconds"]["trtattn"] > 3 * r["seconds"]["floor"]]
    worst = sorted(nv_slower, key=lambda r: -_ratio(r, "trtattn_noverify"))[:3]
    lines = [f"- trtattn without verification is slower than the fastest peer on {len(nv_slower)} of {n} rows "
             f"(worst: " + ", ".join(f"{r['model']}/{r['exporter']} {_ratio(r, 'trtattn_noverify'):.1f}x" for r in worst) + ")",
             f"- with verification: slower than the fastest peer on {len(v_slower)} of {n} rows",
             f"- more than 3x the load+save floor on {len(over_floor)} of {n} rows (median "
             f"{_median([r['seconds']['trtattn'] / max(r['seconds']['floor'], 1e-3) for r in over_floor]):.0f}x; "
             "the floor is milliseconds for the small zoo models; trtattn's smallest time is "
             f"{min((r['seconds']['trtattn'] for r in rows if r['seconds'].get('trtattn')), default=0):.2f} s)"]
    big = [r for r in rows if r["seconds"].get("floor") and r["seconds"]["floor"] > 1]
    for r in big:
        s = r["seconds"]
        lines.append(f"- {r['model']}: trtattn {_fmt_s(s.get('trtattn'))} s (no-verify {_fmt_s(s.get('trtattn_noverify'))} s) "
                     f"against a floor of {_fmt_s(s['floor'])} s")
    return "\n".join(lines)


def _ratio(r, tool) -> float:
    s = r["seconds"]
    peers = [s[p] for p in PEERS if s.get(p) is not None and p not in r["errors"]]
    if s.get(tool) is None or not peers:
        return 0.0
    return s[tool] / max(min(peers), 1e-3)


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def slow_rows(rows: list[dict]) -> list[str]:
    """Rows where trtattn (without verification, like the peers) is slower than the fastest peer
    that fused at least as much, or more than 3x the load+save floor."""
    out = []
    for r in rows:
        s = r["seconds"]
        t, nv, floor = s.get("trtattn"), s.get("trtattn_noverify"), s.get("floor")
        peers = [s[p] for p in PEERS if s.get(p) is not None and p not in r["errors"]]
        why = []
        if nv is not None and peers and nv > min(peers):
            why.append(f"no-verify {nv:.2f}s > fastest peer {min(peers):.2f}s")
        if t is not None and peers and t > min(peers):
            why.append(f"verified {t:.2f}s > fastest peer {min(peers):.2f}s")
        if t is not None and floor and t > 3 * floor:
            why.append(f"verified {t:.2f}s = {t / floor:.0f}x floor")
        if why:
            out.append(f"{r['model']}/{r['exporter']}: " + "; ".join(why))
    return out


def profile_top(pf: Path, n: int = 15) -> list[str]:
    """The trtattn functions with the most cumulative time in a cProfile dump."""
    import pstats

    try:
        st = pstats.Stats(str(pf)).stats
    except (OSError, TypeError, EOFError):
        return []
    rows = sorted(((v[3], k) for k, v in st.items() if "/trtattn/" in k[0]), reverse=True)[:n]
    return [f"{t:7.2f}s {k[0].split('/trtattn/')[-1]}:{k[1]} {k[2]}" for t, k in rows]


# ====================================================================== main
def _machine() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    info = {"python": platform.python_version(), "cpus": os.cpu_count()}
    for pkg in ("onnx", "onnxruntime", "onnxscript", "onnx-ir", "onnx-graphsurgeon", "polygraphy", "torch",
                "transformers"):
        try:
            info[pkg] = version(pkg)
        except PackageNotFoundError:
            info[pkg] = "-"
    try:
        with open("/proc/meminfo") as f:
            info["mem_gb"] = round(int(f.readline().split()[1]) / 2**20, 1)
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"a subset ({', '.join(QUICK_MODELS)}; scaling at "
                    f"{', '.join(map(str, QUICK_SCALING_LAYERS))} layers; no large model), under 15 minutes")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--models", help="comma-separated zoo names (default: all; with --quick: the quick subset)")
    ap.add_argument("--exporters", help="comma-separated: torchscript, dynamo (default: each entry's exporters)")
    ap.add_argument("--work-dir", default=str(ROOT / "out" / "bench"), help="exports and outputs (default out/bench)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per tool run (default 1800)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per tool and model; the fastest counts (default 2)")
    ap.add_argument("--export-timeout", type=float, default=1800)
    ap.add_argument("--no-coverage", action="store_true", help="skip the per-model coverage table")
    ap.add_argument("--export-only", action="store_true", help="only export the models into --work-dir")
    ap.add_argument("--explore-ort", action="store_true",
                    help="try every plausible ORT optimizer model type / opt level per family and print the best")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--no-large", action="store_true")
    ap.add_argument("--large", action="store_true", help="run the >2 GB model even with --quick")
    ap.add_argument("--no-check-peers", action="store_true", help="do not check peers' outputs on ONNX Runtime")
    ap.add_argument("--scaling-layers", help="e.g. 2,8,32")
    ap.add_argument("--profile-slow", action="store_true",
                    help="profile trtattn (cProfile) on rows where it is slower than a peer or > 3x the floor")
    # worker modes (internal)
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_export", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_check", action="store_true", help=argparse.SUPPRESS)
    for a in ("--tool", "--model", "--out", "--family", "--result", "--ort-kwargs", "--profile", "--base", "--name",
              "--exporter", "--overrides"):
        ap.add_argument(a, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker:
        return _worker(args)
    if args._export:
        return _export_worker(args)
    if args._check:
        return _check_worker(args)

    from trtattn import zoo

    started = time.perf_counter()
    bench = Bench(args)
    names = args.models.split(",") if args.models else (QUICK_MODELS if args.quick else list(zoo.ZOO))
    wanted_exporters = args.exporters.split(",") if args.exporters else (QUICK_EXPORTERS if args.quick else list(zoo.EXPORTERS))
    report = {"machine": _machine(), "quick": args.quick, "ort_model_types": ORT_MODEL_TYPE, "rows": [],
              "scaling": [], "large": [], "export_failures": []}

    if args.explore_ort:
        explore_ort(bench, names, wanted_exporters)
        return 0

    # ---------------------------------------------------------------- warm-up
    # one untimed run of every tool on a small model: the first process to import torch, sympy and
    # onnxruntime after boot reads them from disk, which would be charged to whichever row comes first
    if not args.export_only and not args.no_warmup:
        warm, _ = bench.export("vit", "torchscript")
        if warm is not None:
            bench.say("warm-up (untimed) ...")
            for tool in TOOLS:
                bench.run_tool(tool, warm, "vit", zoo.get("vit").config())

    # ---------------------------------------------------------------- coverage and cost
    if not args.no_coverage:
        bench.say("coverage and cost:")
        for name in names:
            entry = zoo.get(name)
            for exporter in entry.exporters:
                if exporter not in wanted_exporters:
                    continue
                path, meta = bench.export(name, exporter)
                if path is None:
                    report["export_failures"].append({"model": name, "exporter": exporter, "error": meta.get("error")})
                    continue
                if args.export_only:
                    continue
                row = bench.row(name, exporter, path, entry.family, entry.expected_sites, entry.config(),
                                check=not args.no_check_peers)
                row["export_seconds"] = meta.get("seconds")
                report["rows"].append(row)

    # ---------------------------------------------------------------- scaling
    if not args.no_scaling:
        layers = [int(x) for x in args.scaling_layers.split(",")] if args.scaling_layers else (
            QUICK_SCALING_LAYERS if args.quick else SCALING_LAYERS)
        bench.say(f"scaling ({SCALING_FAMILY}, torchscript, {layers} layers):")
        base = zoo.get(SCALING_FAMILY)
        for n in layers:
            name = f"{SCALING_FAMILY}-{n}L"
            ov = {"num_hidden_layers": n}
            path, meta = bench.export(SCALING_FAMILY, "torchscript", name, ov)
            if path is None:
                report["export_failures"].append({"model": name, "exporter": "torchscript", "error": meta.get("error")})
                continue
            ce = _CustomEntry(base, name, ov)
            if args.export_only:
                continue
            row = bench.row(name, "torchscript", path, base.family, ce.expected_sites, ce.config(), check=False)
            row["layers"] = n
            report["scaling"].append(row)

    # ---------------------------------------------------------------- large weights
    if (not args.no_large and not args.quick) or args.large:
        bench.say("large weights (> 2 GB, external data):")
        base = zoo.get("llama")
        name = "llama-2GB"
        path, meta = bench.export("llama", "torchscript", name, LARGE_CONFIG)
        if path is None:
            report["export_failures"].append({"model": name, "exporter": "torchscript", "error": meta.get("error")})
        else:
            ce = _CustomEntry(base, name, LARGE_CONFIG)
            if args.export_only:
                return 0
            row = bench.row(name, "torchscript", path, base.family, ce.expected_sites, ce.config(), check=False,
                            repeat=1)  # one run per tool: minutes each, and the noise is small at this size
            row["export"] = meta
            report["large"].append(row)

    # ---------------------------------------------------------------- profiles
    every = report["rows"] + report["scaling"] + report["large"]
    slow = slow_rows(every)
    if args.profile_slow and slow:
        bench.say("profiling trtattn where it is slow (the three largest such models):")
        prof_dir = bench.work / "profiles"
        prof_dir.mkdir(exist_ok=True)
        flagged = [r for r in every if any(s.startswith(f"{r['model']}/{r['exporter']}:") for s in slow)]
        for r in sorted(flagged, key=lambda r: -r["size_mb"])[:3]:
            path = bench.work / "models" / f"{r['model']}.{r['exporter']}" / "model.onnx"
            pf = prof_dir / f"{r['model']}.{r['exporter']}.prof"
            bench.run_tool("trtattn", path, r["model"], None, profile=str(pf))
            r["profile"] = str(pf)
            r["profile_top"] = profile_top(pf)

    report["seconds_total"] = round(time.perf_counter() - started, 1)

    # ---------------------------------------------------------------- print
    m = report["machine"]
    print(f"# Attention fusion coverage ({'quick' if args.quick else 'full'} run, {report['seconds_total'] / 60:.1f} min)\n")
    print(f"Machine: {m.get('cpu', '?')}, {m['cpus']} CPUs, {m.get('mem_gb', '?')} GB; python {m['python']}, "
          + ", ".join(f"{k} {v}" for k, v in m.items() if k not in ("cpu", "cpus", "mem_gb", "python")) + ".\n")
    if report["rows"]:
        print("## Coverage and cost\n")
        print("Fused counts are attention ops in each tool's output model (trtattn: sites fused and verified). "
              "Seconds: load + fuse (+ verify) + save, in a fresh process; MB: peak RSS of that process.\n")
        print(coverage_table(report["rows"]))
        print()
    if report["scaling"]:
        print("## Scaling\n")
        print(scaling_table(report["scaling"]))
        print()
    if report["large"]:
        print("## Large weights\n")
        print(large_table(report["large"]))
        print()
    notes = []
    for r in every:
        for t, e in r["errors"].items():
            notes.append(f"- {r['model']}/{r['exporter']} {t}: {e}")
        for t in PEERS:
            det = r["details"].get(t, {})
            if det.get("output_matches_original") is False:
                notes.append(f"- {r['model']}/{r['exporter']} {t}: output differs from the original "
                             f"(max abs err {det.get('check_max_abs_err')})")
            if det.get("check_error"):
                notes.append(f"- {r['model']}/{r['exporter']} {t}: its output does not run: {det['check_error']}")
        for t in ("trtattn", "trtattn_noverify"):
            for sk in r["details"].get(t, {}).get("skipped", []):
                notes.append(f"- {r['model']}/{r['exporter']} {t}: skipped {sk['name']}: {sk['reason']}")
    for f in report["export_failures"]:
        notes.append(f"- export {f['model']}/{f['exporter']} failed: {f['error']}")
    if notes:
        print("## Errors and skipped sites\n")
        print("\n".join(dict.fromkeys(notes)))
        print()
    if slow:
        print("## Where trtattn is slower than the fastest peer or > 3x the load+save floor\n")
        print(slow_summary(every))
        print()
    profiled = [r for r in every if r.get("profile_top")]
    if profiled:
        print("## Profiles (cProfile, cumulative seconds in trtattn functions)\n")
        for r in profiled:
            print(f"{r['model']}/{r['exporter']} ({r['profile']}):\n```\n" + "\n".join(r["profile_top"]) + "\n```\n")
    print(f"ORT optimizer model types: {', '.join(f'{k}={v}' for k, v in ORT_MODEL_TYPE.items())}.")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
