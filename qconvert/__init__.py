"""qconvert: quantized ONNX models through MLIR's quant dialect, with every number checked on a real engine."""
