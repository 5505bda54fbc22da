"""The rewrites, side by side. Each takes an ONNX model and gives a verified ONNX model:

fuse        every attention site -> the standard ONNX Attention op (opset 23)
microsoft   com.microsoft Attention / MultiHeadAttention -> the standard op
forms       the fused model in the form an engine takes: padded, packed, kv-cache
normalize   TensorRT's implicit-fusion form: Q pre-scaled, one Where/Add mask
"""
