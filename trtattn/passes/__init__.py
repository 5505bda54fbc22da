"""onnx-graphsurgeon passes that normalise exported graphs to TensorRT's attention-fusion rules.

cleanup      constant folding and shape inference (Polygraphy), Identity / Dropout / no-op Cast removal
q_prescale   the softmax scale moves onto Q before the first MatMul (optionally into Q's weights)
mask_form    exactly one Where (boolean) or Add (float) between the first MatMul and the Softmax
fusability   per-site verdict against TensorRT's documented limits: implicit fusion, IAttention
quantize     ModelOpt FP8/INT8 Q/DQ around every attention
normalize    all of the above behind one call, verified against the original
"""
