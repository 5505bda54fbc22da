"""The ways to an engine, side by side, both starting from one prepared plan:

prepare   the verified form (padded, packed, kv-cache) in its precision, its build plan, the parser's model
builder   the Python-builder route: TensorRT's network API lowers each planned site (`trtattn build`)
trt_ops   the TensorRT-ops route: each planned site written as TensorRT's ONNX ops, verified on CPU through
          plugins/, for `trtexec --onnx` (`trtattn fuse --ops trt`)
"""
