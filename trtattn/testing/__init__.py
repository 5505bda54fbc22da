"""What tests and benchmarks share: hand-built attention graphs (graphs.py), the Llama writer up to 8B
(write_llama.py, also a command: python -m trtattn.testing.write_llama), TensorRT's documented pattern
checked by hand (patterns.py), attention forms written into existing models (edits.py), torch modules
exported in memory (exports.py), and the attention mutation fuzzer (fuzz/; benchmarks/fuzz_attention.py runs it).
Nothing of the product imports this package."""
