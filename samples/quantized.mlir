// The quant casts of a small quantized fully connected layer, as qconvert lifts them from an ONNX
// QuantizeLinear/DequantizeLinear model: activations per tensor (u8, zero point 128), weights per output
// channel (i8, symmetric, narrow range [-127, 127]), accumulator output per tensor (i8).
// Try: qconvert opt samples/quantized.mlir --lower-quant-ops

!act = !quant.uniform<u8:f32, 0.023529411764705882:128>
!weight = !quant.uniform<i8<-127:127>:f32:0, {0.0125,0.0081,0.0157,0.0094}>
!out = !quant.uniform<i8:f32, 0.05:-3>

func.func @quantize_input(%x: tensor<1x8xf32>) -> tensor<1x8x!act> {
  %q = quant.qcast %x : tensor<1x8xf32> to tensor<1x8x!act>
  return %q : tensor<1x8x!act>
}

func.func @quantize_weight(%w: tensor<4x8xf32>) -> tensor<4x8x!weight> {
  %q = quant.qcast %w : tensor<4x8xf32> to tensor<4x8x!weight>
  return %q : tensor<4x8x!weight>
}

func.func @dequantize_weight(%q: tensor<4x8x!weight>) -> tensor<4x8xf32> {
  %w = quant.dcast %q : tensor<4x8x!weight> to tensor<4x8xf32>
  return %w : tensor<4x8xf32>
}

func.func @dequantize_output(%q: tensor<1x4x!out>) -> tensor<1x4xf32> {
  %y = quant.dcast %q : tensor<1x4x!out> to tensor<1x4xf32>
  return %y : tensor<1x4xf32>
}
