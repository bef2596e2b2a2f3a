"""qconvert: quantized ONNX models through MLIR's quant dialect, every number checked on a real engine."""
