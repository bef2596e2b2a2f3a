"""`--normalize-quant-types` where upstream writes invalid IR (issue 23): a sub-channel type whose only
dimension of more than one scale has blocks of more than one element.

Upstream (torch-mlir's MLIR) writes one scale per block on a per-axis type, which its own verifier then
refuses; we write a type with the same values: per-tensor when the scales and zero points are all equal,
else per-axis with each block's parameters repeated over the block. Checked three ways: the output
verifies, the reference interpreter dequantizes every storage code to the same floats before and after,
and upstream's output for the same input fails verification (the oracle)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import require_module

from qconvert.interpret import interpret
from qconvert.ir.parser import parse_module
from qconvert.ir.printer import print_module
from qconvert.ir.verify import verify
from qconvert.opt import parse_arguments, run_opt


def dequantize_function(shape: str, element: str) -> str:
    return (
        f"func.func @f(%arg0: tensor<{shape}x{element}>) -> tensor<{shape}xf32> {{\n"
        f"  %0 = quant.dcast %arg0 : tensor<{shape}x{element}> to tensor<{shape}xf32>\n"
        f"  return %0 : tensor<{shape}xf32>\n"
        "}\n"
    )


# (tensor shape, sub-channel element type, what the normalized element type must be)
CASES = {
    "equal scales become per-tensor": (
        "4x2",
        "!quant.uniform<i4:f32:{0:2}, {{0.125},{0.125}}>",
        "!quant.uniform<i4:f32, 1.250000e-01>",
    ),
    "equal scales and zero points, blocks on axis 1": (
        "2x6",
        "!quant.uniform<i8:f32:{1:3}, {{0.5:3,0.5:3}}>",
        "!quant.uniform<i8:f32, 5.000000e-01:3>",
    ),
    "different scales are repeated per block": (
        "4x2",
        "!quant.uniform<i4:f32:{0:2}, {{0.125},{0.25}}>",
        "!quant.uniform<i4:f32:0, {1.250000e-01,1.250000e-01,2.500000e-01,2.500000e-01}>",
    ),
    "different zero points are repeated per block": (
        "3x4",
        "!quant.uniform<u8:f32:{1:2}, {{0.5:10,0.5:20}}>",
        "!quant.uniform<u8:f32:1, {5.000000e-01:10,5.000000e-01:10,5.000000e-01:20,5.000000e-01:20}>",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_blocked_single_axis_normalizes_to_a_valid_type_with_the_same_values(case: str) -> None:
    shape, element, expected = CASES[case]
    text = dequantize_function(shape, element)
    result = run_opt(text, "in.mlir", parse_arguments(["in.mlir", "--normalize-quant-types"]))
    assert result.exit_code == 0, result.diagnostics
    assert f"tensor<{shape}x{expected}>" in result.output and "{{" not in result.output
    normalized = parse_module(result.output)
    verify(normalized)  # the dcast checks the scale count against the dimension
    source = parse_module(text)
    dimensions = tuple(int(size) for size in shape.split("x"))
    unsigned = element.startswith("!quant.uniform<u")
    low, high = (0, 255) if unsigned else ((-8, 7) if "<i4" in element else (-128, 127))
    generator = np.random.default_rng(0)
    for _ in range(4):
        storage = generator.integers(low, high + 1, size=dimensions).astype(np.uint8 if unsigned else np.int8)
        before = interpret(source, {"arg0": storage})["result0"]
        after = interpret(normalized, {"arg0": storage})["result0"]
        np.testing.assert_array_equal(before, after)


def test_block_size_one_stays_upstreams_per_axis_type() -> None:
    text = dequantize_function("2x3", "!quant.uniform<i8:f32:{0:1}, {{0.5},{0.5}}>")
    result = run_opt(text, "in.mlir", parse_arguments(["in.mlir", "--normalize-quant-types"]))
    assert result.exit_code == 0, result.diagnostics
    assert "tensor<2x3x!quant.uniform<i8:f32:0, {5.000000e-01,5.000000e-01}>>" in result.output


def test_two_blocked_axes_stay_sub_channel() -> None:
    element = "!quant.uniform<i8:f32:{0:2,1:2}, {{0.5,0.25},{1.0,2.0}}>"
    text = dequantize_function("4x4", element)
    result = run_opt(text, "in.mlir", parse_arguments(["in.mlir", "--normalize-quant-types"]))
    assert result.exit_code == 0, result.diagnostics
    assert print_module(parse_module(text)).rstrip("\n") + "\n\n" == result.output


@pytest.mark.engine
@pytest.mark.parametrize("case", CASES)
def test_upstream_writes_invalid_ir_for_the_same_input(case: str) -> None:
    """The oracle: upstream's pass runs, and its result fails upstream's own verifier."""
    ir = require_module("torch_mlir.ir")
    passmanager = require_module("torch_mlir.passmanager")
    shape, element, _ = CASES[case]
    with ir.Context():
        module = ir.Module.parse(dequantize_function(shape, element))
        module.operation.verify()  # the input is valid
        pipeline = passmanager.PassManager.parse("builtin.module(func.func(normalize-quant-types))")
        pipeline.enable_verifier(False)
        pipeline.run(module.operation)
        written = module.operation.get_asm(assume_verified=True)
        assert "{{" not in written  # it did rewrite the type
        with pytest.raises(ir.MLIRError, match="quantized dimension size does not match number of scales"):
            module.operation.verify()


def test_huge_blocks_stay_sub_channel_rather_than_printing_a_huge_type() -> None:
    """Found by the fuzz run: blocks of 65,535 over two scales would repeat into 131,070 scales per use."""
    element = "!quant.uniform<i8:f32:{0:65535}, {{2.0:127}, {3.0:127}}>"
    text = dequantize_function("?x?", element)
    started = time.perf_counter()
    result = run_opt(text, "in.mlir", parse_arguments(["in.mlir", "--normalize-quant-types"]))
    assert time.perf_counter() - started < 5
    assert result.exit_code == 0, result.diagnostics
    assert "{0:65535}" in result.output
