"""--explore-ort: every plausible ONNX Runtime optimizer model type, opt level and num_heads/hidden_size
source on every export (in this process, untimed), and the attention ops each leaves in its output."""

from __future__ import annotations

from .bench import Bench, ort_kwargs
from .measure import count_attention

ORT_CANDIDATES = {
    "bart": ["bart", "bert"], "whisper": ["bart", "bert"], "whisper-decoder-cache": ["bart", "bert"],
    "t5": ["t5", "bert"], "swin": ["swin", "vit", "bert"], "vit": ["vit", "bert"], "bert": ["bert"],
    "gpt2": ["gpt2", "bert"], "llama": ["gpt_neox", "phi", "qwen3", "gpt2", "bert"],
    "llama-cache": ["gpt_neox", "phi", "qwen3", "gpt2", "bert"], "gemma3": ["gpt_neox", "phi", "qwen3", "gpt2", "bert"],
}


def explore_ort(bench: Bench, names: list[str], exporters: list[str]) -> dict:
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
            cfg_kw = ort_kwargs(entry.family, entry.config())
            for mt in ORT_CANDIDATES.get(entry.family, ["bert"]):
                for heads in ("config", "auto"):
                    for level in (None, 0, 2):
                        kw = {"model_type": mt, "opt_level": level,
                              "num_heads": cfg_kw["num_heads"] if heads == "config" else 0,
                              "hidden_size": cfg_kw["hidden_size"] if heads == "config" else 0}
                        try:
                            n = sum(count_attention(optimize_model(str(path), **kw).model).values())
                        except Exception as e:
                            n = f"error {type(e).__name__}"
                        results.setdefault((entry.family, mt, heads, level), []).append((name, exporter, n))
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
