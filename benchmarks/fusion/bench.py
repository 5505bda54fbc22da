"""The parent's side: zoo exports (cached by the zoo's code hash), one child process per tool run, the
fastest of --repeat runs, one row per model."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from .measure import PEERS, TOOLS, count_attention, file_bytes, run_child, weight_bytes

# ONNX Runtime transformers optimizer: model_type per zoo family. Chosen by trying every plausible model type
# and opt level on every export (--explore-ort) and keeping the best per family.
ORT_MODEL_TYPE = {
    "bart": "bart", "whisper": "bart", "whisper-decoder-cache": "bart", "t5": "t5", "swin": "swin",
    "vit": "vit", "bert": "bert", "gpt2": "gpt2", "llama": "gpt_neox", "llama-cache": "gpt_neox",
    "gemma3": "gpt_neox",
}
ORT_OPT_LEVEL: dict[str, int | None] = {}  # family -> opt_level (None: the model type's default)


def ort_kwargs(family: str, cfg) -> dict:
    """model_type, num_heads and hidden_size as ORT's optimizer asks for them (`cfg`: a transformers config
    or a dict with num_attention_heads and hidden_size)."""
    mt = ORT_MODEL_TYPE.get(family, "bert")
    d = cfg if isinstance(cfg, dict) else cfg.to_dict()
    heads = d.get("num_attention_heads") or d.get("encoder_attention_heads") or d.get("n_head") or d.get("num_heads")
    hidden = d.get("hidden_size") or d.get("d_model") or d.get("n_embd")
    if family == "swin":  # heads differ per stage ([2, 4]): one number would be wrong for a stage; auto-detect
        heads, hidden = 0, 0
    if family == "t5":
        hidden = d["num_heads"] * d["d_kv"]
    if d.get("head_dim") and heads and family == "gemma3":  # Gemma: heads x head_dim is the attention width
        hidden = heads * d["head_dim"]
    kw = {"model_type": mt, "num_heads": int(heads or 0), "hidden_size": int(hidden or 0)}
    if family in ORT_OPT_LEVEL:
        kw["opt_level"] = ORT_OPT_LEVEL[family]
    return kw


def zoo_hash() -> str:
    """Exports are reused only while the zoo's code (builders, exporter settings) is unchanged."""
    import trtattn.zoo

    h = hashlib.sha256()
    for f in sorted(Path(trtattn.zoo.__file__).parent.glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work_dir).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = self.work / "bench.log"
        self.timeout = args.timeout
        self.mem_cap_mb = args.mem_cap_gb * 1024 if args.mem_cap_gb else None

    def say(self, msg: str):
        print(msg, file=sys.stderr, flush=True)

    def export(self, base: str, exporter: str, name: str | None = None,
               overrides: dict | None = None) -> tuple[Path | None, dict]:
        name = name or base
        d = self.work / "models" / f"{name}.{exporter}"
        d.mkdir(parents=True, exist_ok=True)
        path, meta_path = d / "model.onnx", d / "export.json"
        if path.exists() and meta_path.exists():
            meta = json.loads(meta_path.read_text())
            if meta.get("overrides") == (overrides or {}) and meta.get("zoo_hash") == zoo_hash():
                return path, meta
        self.say(f"  exporting {name} ({exporter}) ...")
        argv = ["--_export", "--base", base, "--name", name, "--exporter", exporter, "--out", str(path)]
        if overrides:
            argv += ["--overrides", json.dumps(overrides)]
        res, peak, _ = run_child(argv, self.args.export_timeout, self.log)
        res.update(peak_mb=peak, overrides=overrides or {}, zoo_hash=zoo_hash())
        if res.get("error"):
            self.say(f"  export failed: {res['error']}")
            return None, res
        meta_path.write_text(json.dumps(res))
        return path, res

    def run_tool(self, tool: str, model: Path, family: str, kwargs: dict | None = None, profile: str | None = None,
                 keep: bool = True) -> dict:
        """One run of `tool` on `model` in a fresh process. keep=False deletes what it wrote (large models)."""
        out_dir = model.parent / "out"
        out_dir.mkdir(exist_ok=True)
        out = out_dir / f"{tool}.onnx"
        for old in out_dir.glob(f"{tool}.onnx*"):
            old.unlink()
        argv = ["--_worker", "--tool", tool, "--model", str(model), "--out", str(out), "--family", family]
        if tool == "ort_optimizer":
            argv += ["--ort-kwargs", json.dumps(kwargs or {})]
        if profile:
            argv += ["--profile", profile]
        res, seen, code = run_child(argv, self.timeout, self.log, self.mem_cap_mb)
        # the child's own high-water mark; the highest resident memory seen if it died before reporting
        res["peak_mb"] = res.get("peak_mb_self", seen)
        res["out"] = str(out)
        if code not in (0, None) and not res.get("error"):
            res["error"] = f"exit code {code}"
        if res.get("error"):
            res["fused"] = 0
        if not keep:
            for old in out_dir.glob(f"{tool}.onnx*"):
                old.unlink()
        return res

    def check_peer(self, model: Path, out: Path) -> dict:
        """Does the peer's output still compute the same thing? (not timed; trtattn verifies itself)"""
        res, _, _ = run_child(["--_check", "--model", str(model), "--out", str(out)], self.timeout, self.log)
        return res

    def run_best(self, tool: str, model: Path, family: str, kwargs, repeat: int | None = None, keep: bool = True) -> dict:
        """The fastest of --repeat runs (timings on a 2-core machine are noisy); the highest peak."""
        runs = [self.run_tool(tool, model, family, kwargs, keep=keep) for _ in range(max(1, repeat or self.args.repeat))]
        ok = [r for r in runs if not r.get("error")] or runs
        best = min(ok, key=lambda r: r.get("seconds", float("inf")))
        best["peak_mb"] = max(r["peak_mb"] for r in runs)
        best["all_seconds"] = [round(r.get("seconds", 0.0), 3) for r in runs]
        return best

    def row(self, name: str, exporter: str, path: Path, family: str, sites: int, kwargs, tools=TOOLS,
            check: bool = True, repeat: int | None = None, keep: bool = True) -> dict:
        import onnx

        pre = count_attention(onnx.load(str(path), load_external_data=False))
        row = {"model": name, "exporter": exporter, "sites": sites, "size_mb": round(file_bytes(path) / 2**20, 1),
               "weights_mb": round(weight_bytes(path) / 2**20, 1), "already_fused": sum(pre.values()), "fused": {},
               "seconds": {}, "peak_mb": {}, "errors": {}, "ops": {}, "details": {}}
        for tool in tools:
            r = self.run_best(tool, path, family, kwargs, repeat, keep=keep or (check and tool in PEERS))
            timed_out = (r.get("error") or "").startswith(("timeout", "killed"))
            row["seconds"][tool] = None if timed_out else round(r.get("seconds", 0.0), 3)
            row["peak_mb"][tool] = r["peak_mb"]
            if r.get("error"):
                row["errors"][tool] = r["error"]
            if tool == "floor":
                continue
            row["fused"][tool] = r.get("fused", 0)
            row["ops"][tool] = r.get("ops", {})
            det = {k: r[k] for k in ("claimed", "ort_kwargs", "verification", "fuse_seconds", "save_seconds",
                                     "traceback", "rss_after_imports_mb", "all_seconds") if k in r}
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
                if not keep:
                    for old in Path(r["out"]).parent.glob(Path(r["out"]).name + "*"):
                        old.unlink()
        self.say(f"  {name:28s} {exporter:11s} sites {sites:3d}  " + "  ".join(
            f"{t}={row['fused'].get(t, '-')}/{row['seconds'].get(t)}s" for t in tools if t != "floor")
            + f"  floor={row['seconds'].get('floor')}s")
        return row
