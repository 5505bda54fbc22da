"""The pieces of benchmarks/fusion_coverage.py (trtattn against ONNX Runtime's transformers optimizer and
onnxscript's rewriter: coverage, cost and scale):

    measure.py   what is measured: fused attention ops in a written model, peak memory, child processes
                 (each tool runs in a fresh one, killed past a memory cap)
    worker.py    what runs inside a child: one tool on one model, a peer's output checked, a zoo export
    bench.py     the parent's side: exports, runs per tool (the fastest of --repeat), one row per model
    explore.py   --explore-ort: which ONNX Runtime optimizer model type suits each zoo family
    large.py     Llama-shaped models written by trtattn/testing/write_llama.py: the per-layer cost from 2 to 32
                 layers, the 2.2 GB model and the 8B-parameter one
    tables.py    the printed tables
"""
