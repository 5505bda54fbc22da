"""What the benchmark measures and how: fused attention ops in a written model, memory, child processes."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "benchmarks" / "fusion_coverage.py"  # children run it in a worker mode

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


def mb(kb: float) -> float:
    return round(kb / 1024.0, 1)


def rss_kb(field: str = "VmRSS", pid: int | str = "self") -> int:
    """A process's resident memory (VmRSS) or its peak (VmHWM), in kB, from /proc.

    Read from /proc rather than getrusage: ru_maxrss of a process started by fork/vfork + exec also
    counts the parent's memory at the time of the exec (Linux keeps the pre-exec high-water mark),
    which here would be the benchmark's own process."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def file_bytes(path: Path) -> int:
    """Size of a model and of the external data files it names."""
    import onnx

    from trtattn.graph.external import all_tensors

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    locations = {e.value for t in all_tensors(model) for e in t.external_data if e.key == "location"}
    return path.stat().st_size + sum((path.parent / loc).stat().st_size for loc in locations
                                     if (path.parent / loc).exists())


def weight_bytes(path: Path) -> int:
    """Bytes of a model's weights, in the proto or in its data files."""
    from trtattn.graph import io

    return io.weights_size(io.load(path, load_external_data=False))


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


def run_child(argv: list[str], timeout: float, log: Path, mem_cap_mb: float | None = None) -> tuple[dict, float, int | None]:
    """Run fusion_coverage.py in a worker mode in a fresh process; returns (its JSON result, the highest
    resident memory seen, exit code). A child over `mem_cap_mb` is killed (so a tool that would need more
    memory than the machine has is measured as such instead of taking the machine down)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    cmd = [sys.executable, str(SCRIPT)] + argv + ["--result", result_path]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    seen, why = 0.0, None
    with open(log, "ab") as lf:
        lf.write(("\n$ " + " ".join(cmd) + "\n").encode())
        lf.flush()
        proc = subprocess.Popen(cmd, stdout=lf, stderr=lf, env=env, cwd=str(ROOT))
        deadline = time.monotonic() + timeout
        while True:
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            seen = max(seen, mb(rss_kb("VmRSS", proc.pid)))
            if time.monotonic() > deadline:
                why = f"timeout after {timeout:.0f} s"
            elif mem_cap_mb and seen > mem_cap_mb:
                why = f"killed at {seen / 1024:.1f} GB (memory cap {mem_cap_mb / 1024:.0f} GB)"
            if why:
                proc.kill()
                os.wait4(proc.pid, 0)
                os.unlink(result_path)
                return {"error": why}, seen, -9
            time.sleep(0.05)
        code = os.waitstatus_to_exitcode(status)
    try:
        res = json.loads(Path(result_path).read_text())
    except (OSError, ValueError):
        reason = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        res = {"error": f"the process died without a result ({reason}{', out of memory?' if code == -9 else ''})"}
    finally:
        if os.path.exists(result_path):
            os.unlink(result_path)
    return res, seen, code


def machine() -> dict:
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
