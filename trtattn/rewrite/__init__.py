"""The rewrites, side by side. Each takes an ONNX model and gives a verified ONNX model:

fuse        every attention site -> the standard ONNX Attention op (opset 23)
microsoft   com.microsoft Attention / MultiHeadAttention -> the standard op
quantize    ModelOpt Q/DQ (fp8, int8) on a model, or the model's own Q/DQ
precision   ModelOpt AutoCast to fp16/bf16, checked against the fp32 model
normalize   TensorRT's implicit-fusion form: Q pre-scaled, one Where/Add mask

The ways from a verified model to an engine are trtattn/routes.
"""
