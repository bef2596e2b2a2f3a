"""`lower-quant-ops`: byte-identical to upstream MLIR, and the emitted arithmetic computes the right numbers.

Three kinds of test:
- differential: our output equals real upstream MLIR's (torch-mlir's Python bindings) on the upstream test
  file and on generated cases (every granularity, storage width, signedness, bounds, expressed type and
  dcast/qcast pairing), compared chunk by chunk;
- numerics: a small evaluator runs the lowered functions with numpy, op by op in the emitted order, and
  its results must equal `qconvert.numerics` (ONNX rule for `rounding=onnx`, MLIR_LOWERING otherwise);
- the pass interface: options, unsupported types, errors leaving the IR untouched.
"""

from __future__ import annotations

import itertools
import os
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import require_module

from qconvert.errors import InputError, VerifyError
from qconvert.ir import parse_module, print_module, verify
from qconvert.ir.attributes import BoolAttr, DenseElementsAttr, FloatAttr, IntegerAttr
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects import arith, linalg, math, quant, shape, tensor
from qconvert.ir.dialects.func import FuncOp, ReturnOp
from qconvert.ir.parser import numpy_dtype
from qconvert.ir.quant_types import (
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
    UniformQuantizedType,
    uniform_params,
)
from qconvert.ir.types import FloatType, IntegerType, NoneType, RankedTensorType, Type, element_type_of
from qconvert.numerics import (
    Rounding,
    UniformParams,
    broadcast_params,
    dequantize,
    quantize,
    round_half_to_even,
)
from qconvert.opt import parse_arguments, run_opt
from qconvert.passes import get_pass, lower_quant_ops
from qconvert.passes.lower_quant_ops import LowerQuantOpsPass

ROOT = Path(__file__).resolve().parents[2]
SPLIT = "\n\n// -----\n"


def conformance_dir() -> Path:
    """Where tests/conformance/lit.cfg.py finds the upstream files."""
    override = os.environ.get("QCONVERT_CONFORMANCE_DIR")
    return Path(override).resolve() if override else ROOT.parent / "shared" / "conformance"


# Generated cases -------------------------------------------------------------------------------------
PER_TENSOR = {
    "i8": "i8:f32, 5.000000e-01:-3",
    "u8_zp128": "u8:f32, 2.000000e-02:128",
    "u8_zp200": "u8:f32, 2.000000e+00:200",
    "u8_zp0": "u8:f32, 5.000000e-01",
    "i8_narrow": "i8<-127:127>:f32, 1.000000e-01",
    "u8_narrow": "u8<1:255>:f32, 2.000000e+00:128",
    "i4": "i4:f32, 2.500000e-01:-2",
    "u4": "u4:f32, 2.500000e-01:8",
    "i4_narrow": "i4<-7:7>:f32, 1.500000e+00",
    "i16": "i16:f32, 1.000000e-03:100",
    "u16": "u16:f32, 5.000000e-01:40000",
    "i32": "i32:f32, 2.000000e+00:5",
    "i8_f16": "i8:f16, 3.000000e-01:-3",
    "u8_bf16": "u8:bf16, 7.000000e-01:5",
    "i8_f64": "i8:f64, 1.000000e-03:7",
    "i1": "i1:f32, 1.000000e+00",
}
CONTAINERS = {"scalar": None, "0d": "", "ranked": "3x?x5x", "static": "4x6x", "unranked": "*x"}

PER_AXIS = {  # name -> (type, ranked container prefix); each also runs unranked
    "axis0": ("i8:f32:0, {2.000000e+00:10,3.000000e+00:-20}", "2x?x3x"),
    "axis_last": ("i8:f32:2, {2.000000e+00:10,3.000000e+00:20,4.000000e+00}", "?x4x3x"),
    "u8_zp200": ("u8:f32:1, {2.000000e+00:200,5.000000e-01:128}", "3x2x"),
    "zero_zps": ("i8:f32:1, {2.000000e+00,3.000000e+00}", "4x2x5x"),
    "splat_scales": ("i8:f32:0, {2.000000e+00:1,2.000000e+00:1}", "2x3x"),
    "narrow": ("u8<2:250>:f32:0, {2.000000e+00:10,3.000000e+00:20}", "2x?x"),
    "i4": ("i4:f32:1, {2.500000e-01:-8,5.000000e-01:7}", "3x2x"),
    "u4": ("u4:f32:1, {2.500000e-01:8,5.000000e-01:15}", "3x2x"),
    "i16_f16": ("i16:f16:0, {3.000000e-01:-3,6.000000e-01}", "2x3x"),
    "bf16": ("i8:bf16:1, {3.000000e-01:-3,0.69999999999999996}", "3x2x"),
    "u1": ("u1:f32:0, {1.000000e+00:1,2.000000e+00}", "2x3x"),
}

SUB_CHANNEL = {  # name -> (type, container prefix)
    "two_blocked": (
        "i8:f32:{0:2, 1:3}, {{2.000000e+00:1, 3.000000e+00:2}, {4.000000e+00:3, 5.000000e+00:4}}",
        "4x6x",
    ),
    "last_blocked": ("u8:f32:{1:2}, {{2.000000e+00:200, 3.000000e+00:10}}", "?x4x"),
    "rank3_full_block": ("i8:f32:{0:1, 2:4}, {{{2.000000e+00:-1}}, {{3.000000e+00:1}}}", "2x?x4x"),
    "three_blocked": (
        "i4:f16:{0:1, 1:2, 2:2}, {{{1.000000e+00, 2.000000e+00}}, {{3.000000e+00:-8, 4.000000e+00:7}}}",
        "2x2x4x",
    ),
    "repeated_axis": ("i8:f32:{1:1, 1:2}, {{2.000000e+00, 3.000000e+00}}", "3x4x"),
    "narrow": ("i8<-8:7>:f32:{1:2}, {{2.000000e+00:1, 3.000000e+00:-1}}", "2x4x"),
}


def cast_function(name: str, cast: str, float_type: str, quantized_type: str) -> str:
    """One function doing one `quant.qcast` or `quant.dcast` between `float_type` and `quantized_type`."""
    source, result = (float_type, quantized_type) if cast == "qcast" else (quantized_type, float_type)
    return (
        f"func.func @{name}(%arg0: {source}) -> {result} {{\n"
        f"  %0 = quant.{cast} %arg0 : {source} to {result}\n"
        f"  return %0 : {result}\n"
        "}"
    )


def container(shape_prefix: str | None, element: str) -> str:
    return element if shape_prefix is None else f"tensor<{shape_prefix}{element}>"


def expressed_type_of(body: str) -> str:
    """The expressed type written in a `!quant.uniform<...>` body."""
    match = re.search(r":(bf16|f16|f32|f64)\b", body)
    assert match is not None, body
    return match[1]


def single_cast_cases() -> Iterator[tuple[str, str]]:
    """(name, function) for every per-tensor, per-axis and sub-channel type, both casts, each container."""
    for (type_name, body), (container_name, prefix) in itertools.product(
        PER_TENSOR.items(), CONTAINERS.items()
    ):
        expressed = expressed_type_of(body)
        quantized = f"!quant.uniform<{body}>"
        for cast in ("qcast", "dcast"):
            name = f"{cast}_per_tensor_{type_name}_{container_name}"
            yield name, cast_function(name, cast, container(prefix, expressed), container(prefix, quantized))
    for type_name, (body, prefix) in PER_AXIS.items():
        expressed = expressed_type_of(body)
        quantized = f"!quant.uniform<{body}>"
        for (container_name, shape_prefix), cast in itertools.product(
            (("ranked", prefix), ("unranked", "*x")), ("qcast", "dcast")
        ):
            name = f"{cast}_per_axis_{type_name}_{container_name}"
            yield (
                name,
                cast_function(
                    name, cast, container(shape_prefix, expressed), container(shape_prefix, quantized)
                ),
            )
    for type_name, (body, prefix) in SUB_CHANNEL.items():
        expressed = expressed_type_of(body)
        quantized = f"!quant.uniform<{body}>"
        for cast in ("qcast", "dcast"):
            name = f"{cast}_sub_channel_{type_name}"
            yield name, cast_function(name, cast, container(prefix, expressed), container(prefix, quantized))


Q8 = "!quant.uniform<i8:f32, 2.000000e+00:10>"
Q8_OTHER = "!quant.uniform<i8:f32, 3.000000e+00:10>"
QAXIS = "!quant.uniform<u8:f32:1, {2.000000e+00:10,3.000000e+00:20}>"
PAIR_CASES = {
    # Upstream folds dcast(qcast(x)) to x and qcast(dcast(x)) to x while it lowers the other cast.
    "qcast_dcast": f"""func.func @qcast_dcast(%arg0: f32) -> f32 {{
  %0 = quant.qcast %arg0 : f32 to {Q8}
  %1 = quant.dcast %0 : {Q8} to f32
  return %1 : f32
}}""",
    "dcast_qcast": f"""func.func @dcast_qcast(%arg0: {Q8}) -> {Q8} {{
  %0 = quant.dcast %arg0 : {Q8} to f32
  %1 = quant.qcast %0 : f32 to {Q8}
  return %1 : {Q8}
}}""",
    "dcast_qcast_other_type": f"""func.func @dcast_qcast_other_type(%arg0: {Q8}) -> {Q8_OTHER} {{
  %0 = quant.dcast %arg0 : {Q8} to f32
  %1 = quant.qcast %0 : f32 to {Q8_OTHER}
  return %1 : {Q8_OTHER}
}}""",
    "chain_dqd": f"""func.func @chain_dqd(%arg0: {Q8}) -> f32 {{
  %0 = quant.dcast %arg0 : {Q8} to f32
  %1 = quant.qcast %0 : f32 to {Q8}
  %2 = quant.dcast %1 : {Q8} to f32
  return %2 : f32
}}""",
    "chain_qdq": f"""func.func @chain_qdq(%arg0: f32) -> {Q8} {{
  %0 = quant.qcast %arg0 : f32 to {Q8}
  %1 = quant.dcast %0 : {Q8} to f32
  %2 = quant.qcast %1 : f32 to {Q8}
  return %2 : {Q8}
}}""",
    "qcast_two_uses": f"""func.func @qcast_two_uses(%arg0: tensor<?x2xf32>)
    -> (tensor<?x2xf32>, tensor<?x2x{QAXIS}>) {{
  %0 = quant.qcast %arg0 : tensor<?x2xf32> to tensor<?x2x{QAXIS}>
  %1 = quant.dcast %0 : tensor<?x2x{QAXIS}> to tensor<?x2xf32>
  %2 = arith.addf %1, %arg0 : tensor<?x2xf32>
  return %2, %0 : tensor<?x2xf32>, tensor<?x2x{QAXIS}>
}}""",
    "through_scast": f"""func.func @through_scast(%arg0: tensor<*xf32>) -> tensor<*xf32> {{
  %0 = quant.qcast %arg0 : tensor<*xf32> to tensor<*x{Q8}>
  %1 = quant.scast %0 : tensor<*x{Q8}> to tensor<*xi8>
  %2 = quant.scast %1 : tensor<*xi8> to tensor<*x{Q8_OTHER}>
  %3 = quant.dcast %2 : tensor<*x{Q8_OTHER}> to tensor<*xf32>
  return %3 : tensor<*xf32>
}}""",
    "inside_generic": f"""func.func @inside_generic(%arg0: tensor<4xf32>) -> tensor<4xf32> {{
  %0 = tensor.empty() : tensor<4xf32>
  %1 = linalg.generic {{indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                        iterator_types = ["parallel"]}}
      ins(%arg0 : tensor<4xf32>) outs(%0 : tensor<4xf32>) {{
  ^bb0(%in: f32, %out: f32):
    %2 = quant.qcast %in : f32 to {Q8}
    %3 = quant.dcast %2 : {Q8} to f32
    %4 = quant.qcast %out : f32 to {Q8}
    %5 = quant.scast %4 : {Q8} to i8
    %6 = quant.scast %5 : i8 to {Q8}
    %7 = quant.dcast %6 : {Q8} to f32
    %8 = arith.addf %3, %7 : f32
    linalg.yield %8 : f32
  }} -> tensor<4xf32>
  return %1 : tensor<4xf32>
}}""",
}


def extra_cases() -> dict[str, str]:
    """Name -> chunk: every single cast, the pairs, and one module holding several lowered functions."""
    cases = dict(single_cast_cases())
    cases.update(PAIR_CASES)
    # Several functions in one module: affine-map aliases are numbered across functions.
    cases["several_functions"] = "\n".join(
        cases[name]
        for name in (
            "qcast_per_axis_axis0_ranked",
            "dcast_sub_channel_two_blocked",
            "qcast_per_axis_axis_last_unranked",
            "qcast_per_tensor_i8_ranked",
        )
    )
    return cases


# Running both sides ---------------------------------------------------------------------------------
def oracle_outputs(chunks: list[str], *, lower: bool = True) -> list[str]:
    """Real upstream MLIR: each chunk parsed, verified, lowered by `func.func(lower-quant-ops)`, printed."""
    ir = require_module("torch_mlir.ir")
    passmanager = require_module("torch_mlir.passmanager")
    outputs = []
    context = ir.Context()  # one context for every chunk: creating one costs more than lowering a chunk
    context.allow_unregistered_dialects = True
    with context:
        pipeline = passmanager.PassManager.parse("builtin.module(func.func(lower-quant-ops))")
        for chunk in chunks:
            module = ir.Module.parse(chunk)
            if lower:
                pipeline.run(module.operation)
            outputs.append(str(module).rstrip("\n"))
    return outputs


def our_outputs(text: str, *flags: str) -> list[str]:
    result = run_opt(text, "input.mlir", parse_arguments(["input.mlir", "--split-input-file", *flags]))
    assert result.exit_code == 0, "\n".join(result.diagnostics)
    return result.output.rstrip("\n").split(SPLIT)


def split_chunks(text: str) -> list[str]:
    return re.split(r"^// -----.*$", text, flags=re.M)


@pytest.mark.engine
def test_upstream_test_file_matches_oracle_byte_for_byte() -> None:
    path = conformance_dir() / "mlir-quant" / "lower-quant-ops.mlir"
    if not path.is_file():
        pytest.skip(f"upstream conformance file not found at {path} (set QCONVERT_CONFORMANCE_DIR)")
    text = path.read_text(encoding="utf-8")
    expected = oracle_outputs(split_chunks(text))
    ours = our_outputs(text, "--lower-quant-ops")
    assert len(expected) == 19
    assert ours == expected


@pytest.fixture(scope="module")
def extra_case_outputs() -> dict[str, tuple[str, str]]:
    """Case name -> (oracle output, our output), computed once for all generated cases."""
    cases = extra_cases()
    expected = oracle_outputs(list(cases.values()))
    ours = our_outputs(SPLIT.join(cases.values()), "--lower-quant-ops")
    assert len(ours) == len(expected) == len(cases)
    return dict(zip(cases, zip(expected, ours, strict=True), strict=True))


@pytest.mark.engine
@pytest.mark.parametrize("case", list(extra_cases()))
def test_generated_case_matches_oracle_byte_for_byte(
    extra_case_outputs: dict[str, tuple[str, str]], case: str
) -> None:
    expected, ours = extra_case_outputs[case]
    assert ours == expected


@pytest.mark.engine
def test_onnx_rounding_output_is_upstream_mlir_that_prints_back_identically() -> None:
    """What `rounding=onnx` adds (extf, roundeven, maxnumf, f64 bounds) parses, verifies, prints as ours."""
    ours = our_outputs(SPLIT.join(extra_cases().values()), "--lower-quant-ops=rounding=onnx")
    assert oracle_outputs(ours, lower=False) == ours


def test_generated_cases_cover_every_lowering_path() -> None:
    """Guards the differential test against a shrinking case list: each path of the pass is exercised."""
    text = SPLIT.join(extra_cases().values())
    ours = "\n".join(our_outputs(text, "--lower-quant-ops"))
    for op_name in (
        "shape.split_at",
        "shape.num_elements",
        "tensor.reshape",
        "tensor.splat",
        "tensor.dim",
        "linalg.generic",
        "arith.maxui",
        "arith.minsi",
        "arith.uitofp",
        "arith.fptoui",
        "floordiv 2",
        "arith.constant false",
        "arith.constant dense<[true, false]>",
    ):
        assert op_name in ours, op_name
    assert "quant.qcast" not in ours and "quant.dcast" not in ours


# A small evaluator of the lowered IR -----------------------------------------------------------------
# Integers are int64 arrays holding the bit pattern (0 <= v < 2**width); each op reads them as signed or
# unsigned, as arith does. Floats are arrays of the type's numpy dtype. Every value is an ndarray (0-d for
# scalars). An out-of-range fptosi/fptoui is poison in MLIR: the evaluator refuses it.
class Poison(Exception):
    pass


def bits(values: np.ndarray, width: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64) & ((1 << width) - 1)


def signed(values: np.ndarray, width: int) -> np.ndarray:
    return np.where(values >= 1 << (width - 1), values - (1 << width), values)


def width_of(type_: Type) -> int:
    element = element_type_of(type_)
    assert isinstance(element, IntegerType)
    return element.width


def float_dtype_of(type_: Type) -> np.dtype:
    return numpy_dtype(element_type_of(type_))


def to_integer(value: np.ndarray, result_type: Type, is_signed: bool) -> np.ndarray:
    width = width_of(result_type)
    low, high = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if is_signed else (0, (1 << width) - 1)
    truncated = np.trunc(value.astype(np.float64))
    if not np.all((truncated >= low) & (truncated <= high)):  # also catches NaN
        raise Poison(f"{value} does not fit {result_type}")
    return bits(truncated.astype(np.int64), width)


def affine_result(expression: str, indices: tuple[int, ...]) -> int:
    if expression.isdigit():
        return int(expression)
    match = re.fullmatch(r"d(\d+)(?: floordiv (\d+))?", expression)
    assert match is not None, expression
    return indices[int(match[1])] // int(match[2] or 1)


def evaluate_generic(op: linalg.GenericOp, operands: list[np.ndarray]) -> np.ndarray:
    maps = [m.results for m in op.attributes["indexing_maps"].elements]  # type: ignore[attr-defined]
    output = operands[-1].copy()
    body = op.regions[0].entry
    for indices in np.ndindex(*output.shape):
        arguments = [array[tuple(affine_result(e, indices) for e in m)] for array, m in zip(operands, maps)]
        values: dict[Value, np.ndarray] = {a: np.asarray(v) for a, v in zip(body.arguments, arguments)}
        for nested in body.ops:
            if isinstance(nested, linalg.YieldOp):
                output[indices] = values[nested.operands[0]]
                break
            values.update(zip(nested.results, evaluate_op(nested, [values[v] for v in nested.operands])))
    return output


FLOAT_BINARY: dict[type[Operation], Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    arith.AddFOp: np.add,
    arith.SubFOp: np.subtract,
    arith.MulFOp: np.multiply,
    arith.DivFOp: np.divide,
    arith.MaxNumFOp: np.fmax,
    arith.MinNumFOp: np.fmin,
}


def evaluate_op(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    """The results of one op of the lowered IR."""
    result_type: Type = op.results[0].type if op.results else NoneType()
    match op:
        case arith.ConstantOp():
            value = op.value
            if isinstance(value, BoolAttr):
                return [np.asarray(int(value.value))]
            if isinstance(value, IntegerAttr):
                return [
                    np.asarray(value.value)
                    if not isinstance(value.type, IntegerType)
                    else bits(np.asarray(value.value), value.type.width)
                ]
            if isinstance(value, FloatAttr):
                return [np.asarray(value.value, dtype=np.float64).astype(float_dtype_of(value.type))]
            assert isinstance(value, DenseElementsAttr)
            if isinstance(element_type_of(value.type), IntegerType):
                return [bits(value.array.astype(np.int64), width_of(value.type))]
            return [value.array]
        case arith.SIToFPOp() | arith.UIToFPOp():
            width = width_of(op.operands[0].type)
            integer = signed(operands[0], width) if isinstance(op, arith.SIToFPOp) else operands[0]
            return [integer.astype(np.float64).astype(float_dtype_of(result_type))]  # exact up to 32 bits
        case arith.FPToSIOp() | arith.FPToUIOp():
            return [to_integer(operands[0], result_type, isinstance(op, arith.FPToSIOp))]
        case arith.ExtFOp():
            return [operands[0].astype(float_dtype_of(result_type))]
        case math.RoundEvenOp():
            return [round_half_to_even(operands[0])]
        case arith.MaxSIOp() | arith.MinSIOp() | arith.MaxUIOp() | arith.MinUIOp():
            width = width_of(result_type)
            read = (
                (lambda v: signed(v, width))
                if isinstance(op, arith.MaxSIOp | arith.MinSIOp)
                else (lambda v: v)
            )
            pick = np.maximum if isinstance(op, arith.MaxSIOp | arith.MaxUIOp) else np.minimum
            return [bits(pick(read(operands[0]), read(operands[1])), width)]
        case tensor.SplatOp():
            assert isinstance(result_type, RankedTensorType)
            sizes = iter(int(s) for s in operands[1:])
            shape_ = tuple(next(sizes) if d < 0 else d for d in result_type.shape)
            return [np.full(shape_, operands[0], dtype=operands[0].dtype)]
        case tensor.DimOp():
            return [np.asarray(operands[0].shape[int(operands[1])])]
        case tensor.EmptyOp():
            assert isinstance(result_type, RankedTensorType)
            sizes = iter(int(s) for s in operands)
            shape_ = tuple(next(sizes) if d < 0 else d for d in result_type.shape)
            element = element_type_of(result_type)
            dtype = np.int64 if isinstance(element, IntegerType) else float_dtype_of(result_type)
            return [np.zeros(shape_, dtype=dtype)]
        case tensor.FromElementsOp():
            return [np.asarray([int(v) for v in operands], dtype=np.int64)]
        case tensor.ReshapeOp():
            return [operands[0].reshape(tuple(int(v) for v in operands[1]))]
        case shape.ShapeOfOp():
            return [np.asarray(operands[0].shape, dtype=np.int64)]
        case shape.NumElementsOp():
            return [np.asarray(int(np.prod(operands[0])))]
        case shape.SplitAtOp():
            index = int(operands[1])
            return [operands[0][:index], operands[0][index:]]
        case quant.StorageCastOp():
            return [operands[0]]
        case linalg.GenericOp():
            return [evaluate_generic(op, operands)]
    binary = FLOAT_BINARY.get(type(op))
    assert binary is not None, f"the evaluator has no rule for {op.name}"
    return [binary(operands[0], operands[1])]


def evaluate(function: FuncOp, arguments: list[np.ndarray]) -> list[np.ndarray]:
    values: dict[Value, np.ndarray] = dict(zip(function.body.arguments, arguments))
    for op in function.body.ops:
        if isinstance(op, ReturnOp):
            return [values[v] for v in op.operands]
        values.update(zip(op.results, evaluate_op(op, [values[v] for v in op.operands])))
    raise AssertionError("no return")


# Numerics -------------------------------------------------------------------------------------------
def lowered_function(chunk: str, rounding: str) -> tuple[FuncOp, Type]:
    """The lowered (verified) function of a one-cast chunk, and the quantized type of its cast."""
    module = parse_module(chunk)
    verify(module)
    function = module.body.ops[0]
    assert isinstance(function, FuncOp)
    cast = function.body.ops[0]
    assert isinstance(cast, quant.QuantizeCastOp | quant.DequantizeCastOp)
    quantized = element_type_of(
        cast.result.type if isinstance(cast, quant.QuantizeCastOp) else cast.input.type
    )
    get_pass("lower-quant-ops", {"rounding": rounding}).run(module)
    verify(module)
    return function, quantized


def quantize_samples(params: UniformParams, shape_: tuple[int, ...], *, in_range_only: bool) -> np.ndarray:
    """Inputs around storage values: exact, ±quarter, ties; unless in range only, also NaN, ±inf, huge."""
    rng = np.random.default_rng(0)
    low, high = int(params.storage_type_min), int(params.storage_type_max)
    scale, zero_point = (p.reshape(-1) for p in broadcast_params(params, shape_))
    size = int(np.prod(shape_))
    stored = (
        rng.integers(low, high + 1, size=size)
        if in_range_only
        else rng.integers(low - 3, high + 4, size=size)
    )
    fractions = rng.choice([0.0, 0.25, 0.5, -0.5, 0.75, -0.25, 0.49, 0.51], size=size)
    if in_range_only:  # stay clear of the bounds and of rounding across them: upstream is poison there
        stored = np.clip(stored, low + 1, high - 1)
    values = (stored - zero_point + fractions) * scale
    if not in_range_only:
        values[: min(size, 4)] = [np.nan, np.inf, -np.inf, -1e30][: min(size, 4)]
    with np.errstate(over="ignore"):  # -1e30 is -inf in f16 and bf16, as intended
        return values.reshape(shape_).astype(params.expressed_dtype)


NUMERIC_CASES = {  # name -> (quantized type, concrete shape or None for a scalar, float type)
    "i8_scalar": (PER_TENSOR["i8"], None),
    "u8_zp128": (PER_TENSOR["u8_zp128"], (3, 7, 5)),
    "u8_zp200": (PER_TENSOR["u8_zp200"], (64,)),
    "i8_narrow": (PER_TENSOR["i8_narrow"], (4, 6)),
    "u8_narrow": (PER_TENSOR["u8_narrow"], (4, 6)),
    "i4": (PER_TENSOR["i4"], (40,)),
    "u4": (PER_TENSOR["u4"], (40,)),
    "i16": (PER_TENSOR["i16"], (50,)),
    "u16": (PER_TENSOR["u16"], (50,)),
    "i32": (PER_TENSOR["i32"], (50,)),
    "i8_f16": (PER_TENSOR["i8_f16"], (64,)),
    "u8_bf16": (PER_TENSOR["u8_bf16"], (64,)),
    "i8_f64": (PER_TENSOR["i8_f64"], (64,)),
    "per_axis_u8": (PER_AXIS["u8_zp200"][0], (3, 2)),
    "per_axis_i16_f16": (PER_AXIS["i16_f16"][0], (2, 3)),
    "per_axis_narrow": (PER_AXIS["narrow"][0], (2, 3)),
    "sub_channel_two_blocked": (SUB_CHANNEL["two_blocked"][0], (4, 6)),
    "sub_channel_u8": (SUB_CHANNEL["last_blocked"][0], (3, 4)),
    "sub_channel_f16": (SUB_CHANNEL["three_blocked"][0], (2, 2, 4)),
}


def numeric_chunk(cast: str, body: str, shape_: tuple[int, ...] | None, unranked: bool = False) -> str:
    expressed = expressed_type_of(body)
    prefix = None if shape_ is None else ("*x" if unranked else "".join(f"{d}x" for d in shape_))
    return cast_function(
        "f", cast, container(prefix, expressed), container(prefix, f"!quant.uniform<{body}>")
    )


@pytest.mark.parametrize("case", list(NUMERIC_CASES))
def test_onnx_rounding_computes_onnx_quantize_linear(case: str) -> None:
    """rounding=onnx: the lowered ops give `numerics.quantize(..., Rounding.ONNX)`, NaN and ±inf included."""
    body, shape_ = NUMERIC_CASES[case]
    function, quantized_type = lowered_function(numeric_chunk("qcast", body, shape_), "onnx")
    params = uniform_params(quantized_type)
    x = quantize_samples(params, shape_ or (), in_range_only=False)
    (stored,) = evaluate(function, [x])
    expected = quantize(x, params, Rounding.ONNX).astype(np.int64)
    read = signed(stored, params_width(quantized_type)) if params.storage_type_min < 0 else stored
    np.testing.assert_array_equal(read, expected)


def params_width(quantized_type: Type) -> int:
    assert isinstance(
        quantized_type, UniformQuantizedType | UniformQuantizedPerAxisType | UniformQuantizedSubChannelType
    )
    return quantized_type.storage_type.width


@pytest.mark.parametrize("case", list(NUMERIC_CASES))
def test_mlir_rounding_computes_upstream_truncation(case: str) -> None:
    """rounding=mlir: `numerics.quantize(..., Rounding.MLIR_LOWERING)` wherever upstream's is defined."""
    body, shape_ = NUMERIC_CASES[case]
    function, quantized_type = lowered_function(numeric_chunk("qcast", body, shape_), "mlir")
    params = uniform_params(quantized_type)
    x = quantize_samples(params, shape_ or (), in_range_only=True)
    (stored,) = evaluate(function, [x])
    expected = quantize(x, params, Rounding.MLIR_LOWERING).astype(np.int64)
    read = signed(stored, params_width(quantized_type)) if params.storage_type_min < 0 else stored
    np.testing.assert_array_equal(read, expected)


@pytest.mark.parametrize("case", list(NUMERIC_CASES))
def test_dequantize_computes_upstream_dequantize(case: str) -> None:
    body, shape_ = NUMERIC_CASES[case]
    function, quantized_type = lowered_function(numeric_chunk("dcast", body, shape_), "onnx")
    params = uniform_params(quantized_type)
    rng = np.random.default_rng(1)
    stored = rng.integers(int(params.storage_type_min), int(params.storage_type_max) + 1, size=shape_ or ())
    (result,) = evaluate(function, [bits(stored, params_width(quantized_type))])
    expected = dequantize(stored.astype(params.storage_dtype), params, Rounding.MLIR_LOWERING)
    assert result.dtype == expected.dtype
    np.testing.assert_array_equal(result, expected)


def test_onnx_rounding_differs_from_upstream_where_the_rules_differ() -> None:
    """The two rules really are different code: 1.75 * scale truncates to 1 but rounds to 2."""
    body = PER_TENSOR["i8"]  # scale 0.5, zero point -3
    x = np.asarray([0.875, -0.875, 0.75], dtype=np.float32)  # x / s = 1.75, -1.75, 1.5 (a tie, to even: 2)
    (mlir,) = evaluate(lowered_function(numeric_chunk("qcast", body, (3,)), "mlir")[0], [x])
    (onnx,) = evaluate(lowered_function(numeric_chunk("qcast", body, (3,)), "onnx")[0], [x])
    assert signed(mlir, 8).tolist() == [-1, -4, -1]  # trunc(1.75 - 3), trunc(-1.75 - 3), trunc(1.5 - 3)
    assert signed(onnx, 8).tolist() == [-1, -5, -1]  # rne(1.75) - 3, rne(-1.75) - 3, rne(1.5) - 3


def test_unranked_lowering_computes_the_same_numbers() -> None:
    body, shape_ = NUMERIC_CASES["per_axis_u8"]
    ranked, quantized_type = lowered_function(numeric_chunk("qcast", body, shape_), "onnx")
    unranked, _ = lowered_function(numeric_chunk("qcast", body, shape_, unranked=True), "onnx")
    x = quantize_samples(uniform_params(quantized_type), shape_, in_range_only=False)
    np.testing.assert_array_equal(evaluate(ranked, [x])[0], evaluate(unranked, [x])[0])


# The ONNX sequence, structurally --------------------------------------------------------------------
def lowered_ops(chunk: str, rounding: str) -> list[Operation]:
    function, _ = lowered_function(chunk, rounding)
    return list(function.walk())


def test_onnx_rounding_clamps_in_float_to_the_storage_bounds() -> None:
    ops = lowered_ops(numeric_chunk("qcast", PER_TENSOR["u8_narrow"], (4,)), "onnx")
    names = [op.name for op in ops]
    assert names.index("arith.divf") < names.index("math.roundeven") < names.index("arith.addf")
    assert names.index("arith.addf") < names.index("arith.maxnumf") < names.index("arith.minnumf")
    assert names.index("arith.minnumf") < names.index("arith.fptoui")
    assert "arith.maxui" not in names and "arith.minui" not in names  # the float clamp already saturates
    float_constants = [
        op.value for op in ops if isinstance(op, arith.ConstantOp) and isinstance(op.value, FloatAttr)
    ]
    assert [(c.value, str(c.type)) for c in float_constants] == [(2.0, "f32"), (1.0, "f32"), (255.0, "f32")]


def test_onnx_rounding_divides_f16_in_f32_as_onnxruntime_does() -> None:
    ops = lowered_ops(numeric_chunk("qcast", PER_TENSOR["i8_f16"], None), "onnx")
    extf = next(op for op in ops if isinstance(op, arith.ExtFOp))
    assert (str(extf.operands[0].type), str(extf.result.type)) == ("f16", "f32")
    divf = next(op for op in ops if isinstance(op, arith.DivFOp))
    assert str(divf.result.type) == "f32"


def test_onnx_rounding_clamps_32_bit_storage_in_f64() -> None:
    """2**31 - 1 has no f32 value: the sum and the clamp move to f64, so the bound is exact."""
    ops = lowered_ops(numeric_chunk("qcast", PER_TENSOR["i32"], None), "onnx")
    maxnumf = next(op for op in ops if isinstance(op, arith.MaxNumFOp))
    assert str(maxnumf.result.type) == "f64"
    assert any(
        isinstance(op, arith.ConstantOp) and op.value == FloatAttr(2147483647.0, FloatType("f64"))
        for op in ops
    )


def test_onnx_rounding_leaves_dequantize_as_upstream() -> None:
    chunk = numeric_chunk("dcast", PER_TENSOR["u8_zp128"], (3,))
    assert [op.name for op in lowered_ops(chunk, "onnx")] == [op.name for op in lowered_ops(chunk, "mlir")]


def test_onnx_rounding_option_through_the_command_line() -> None:
    chunk = numeric_chunk("qcast", PER_TENSOR["i8"], None)
    (text,) = our_outputs(chunk, "--lower-quant-ops=rounding=onnx")
    assert "math.roundeven" in text and "arith.maxnumf" in text
    (text,) = our_outputs(chunk, "--lower-quant-ops")
    assert "math.roundeven" not in text


# The pass interface ---------------------------------------------------------------------------------
def test_pass_is_registered_with_its_rounding_option() -> None:
    lowering = get_pass("lower-quant-ops", {"rounding": "onnx"})
    assert isinstance(lowering, LowerQuantOpsPass)
    assert lowering.rounding is Rounding.ONNX
    default = get_pass("lower-quant-ops")
    assert isinstance(default, LowerQuantOpsPass) and default.rounding is Rounding.MLIR_LOWERING


@pytest.mark.parametrize("rounding", ["stablehlo", "nearest"])
def test_unsupported_rounding_is_an_input_error(rounding: str) -> None:
    with pytest.raises(InputError, match=r"rounding|bad value"):
        get_pass("lower-quant-ops", {"rounding": rounding})


@pytest.mark.parametrize("storage", ["si8", "ui8", "f8E5M2"])
def test_storage_that_is_not_signless_integer_is_an_error_at_the_cast(storage: str) -> None:
    chunk = cast_function("f", "qcast", "f32", f"!quant.uniform<{storage}:f32, 2.0>")
    module = parse_module(chunk)
    with pytest.raises(VerifyError, match=f"storage type {storage} is not a signless integer type") as raised:
        LowerQuantOpsPass().run(module)
    assert raised.value.loc is not None and raised.value.loc.line == 2


def test_failed_conversion_leaves_the_function_unchanged() -> None:
    """Like MLIR's conversion rollback: the casts lowered before the failing one are restored."""
    chunk = """func.func @f(%arg0: f32) -> (!quant.uniform<i8:f32, 2.0>, !quant.uniform<si8:f32, 2.0>) {
  %0 = quant.qcast %arg0 : f32 to !quant.uniform<i8:f32, 2.0>
  %1 = quant.qcast %arg0 : f32 to !quant.uniform<si8:f32, 2.0>
  return %0, %1 : !quant.uniform<i8:f32, 2.0>, !quant.uniform<si8:f32, 2.0>
}"""
    module = parse_module(chunk)
    before = print_module(module)
    with pytest.raises(VerifyError):
        LowerQuantOpsPass().run(module)
    assert print_module(module) == before
    verify(module)


def test_pass_reports_whether_it_changed_anything() -> None:
    untouched = parse_module("func.func @f(%arg0: f32) -> f32 {\n  return %arg0 : f32\n}")
    assert not LowerQuantOpsPass().run(untouched).changed
    lowered = parse_module(numeric_chunk("dcast", PER_TENSOR["i8"], None))
    assert LowerQuantOpsPass().run(lowered).changed


def test_module_documentation_examples_are_what_the_pass_prints() -> None:
    """The before/after examples in the pass's module docstring are real output, in both modes."""
    doc = lower_quant_ops.__doc__ or ""
    before = textwrap.dedent(
        doc.split("Example (`qconvert opt --lower-quant-ops`):\n")[1].split("\nbecomes")[0]
    )
    after_mlir = textwrap.dedent(doc.split("\nbecomes\n")[1].split("\nand with")[0]).strip("\n")
    after_onnx_body = textwrap.dedent(doc.split("the body becomes\n")[1]).strip("\n")
    (mlir,) = our_outputs(before, "--lower-quant-ops")
    assert mlir == "module {\n" + textwrap.indent(after_mlir, "  ") + "\n}"
    (onnx,) = our_outputs(before, "--lower-quant-ops=rounding=onnx")
    body = [line.strip() for line in onnx.split("\n")[2:-3]]  # between the func header and `return`
    assert body == after_onnx_body.split("\n")
