"""The TensorRT side: the only package that imports tensorrt (compat.py, lazily) and cuda-python
(cuda.py). The builder receives the tensorrt module as a parameter (so tests can pass the real bindings
wrapped in a checker).

plan.py       what will be built: one record per IAttention / RotaryEmbedding / KV-cache update
cut.py        the ONNX graph TensorRT's OnnxParser parses: the lowered ops cut out
lower.py      each planned op as TensorRT layers (add_attention_v2, add_rotary_embedding, ...)
network.py    parse + lower + reconnect
config.py     builder config: profiles, timing cache, progress monitor
engine.py     build and write engines/NAME.engine with NAME.json
session.py    run an engine (cuda-python; cuda.py holds the checked CUDA calls)
runner.py     an engine as a Polygraphy runner, for verification
inspector.py  an engine's layer info through IEngineInspector (parsed by trtattn.inspect)
"""
