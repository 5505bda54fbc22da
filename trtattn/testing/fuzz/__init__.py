"""The attention mutation fuzzer (issue 10): rewrites around each attention site of zoo exports and
hand-built graphs, each kind declaring whether it keeps the meaning, and an oracle that runs
`trtattn.fuse` on every mutant and decides, independently of trtattn's own verification, whether the
case was fused, listed as not fused, missed, crashed or written wrong.

    sources    the models (zoo exports, trtattn/testing/graphs.py builders), their inputs, ONNX Runtime helpers
    sites      an independent locator of attention-like softmaxes, the anchors mutations work on, and
               what the source computes there (shapes, small constants)
    graphops   the kind registry (one decorated function per kind) and the onnx-graphsurgeon helpers
    preserving meaning-preserving kinds            changing  meaning-changing kinds
    oracle     one case: mutate, validate, fuse under a guard, classify
    runner     planning, parallel jobs, the tables; benchmarks/fuzz_attention.py is the command
"""
