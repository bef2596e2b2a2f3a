"""Reference executor of lifted modules: numpy + ml_dtypes, with ONNX semantics for every quant cast.

`interpret(module, inputs)` runs `func.func @main` op by op:

- `quant.qcast`: `numerics.quantize(x, params, Rounding.ONNX, saturate=...)`: `clamp(rne(x / s) + zp)`
  for integer storage, `x / s` in f32 as onnxruntime computes it (f16 / bf16 upcast first); float
  storage honours the op's `saturate` attribute (default true, as ONNX's);
- `quant.dcast`: `numerics.dequantize(q, params, Rounding.ONNX)`;
- `quant.scast` and `qconvert.storage_cast`: reinterpretation; the array is held in the storage
  container (`numerics.integer_storage_dtype`: uint8 for `u8`, ml_dtypes.int4 for `i4`, ...) while
  quantized, and returned as that container when cast back to the storage tensor;
- `arith.constant`: its dense array (`onnx.elem_type` restores an unsigned ONNX type the signless IR
  integer type does not carry);
- `qconvert.qlinear_*`, `qconvert.*_integer`, `qconvert.qgemm`, `qconvert.dynamic_quantize_*` (the
  QOperator ops of frontends/onnx/qoperator.py): onnxruntime's CPU kernels, exactly: exact int64
  accumulation wrapped to int32, then the requantization rule of `qconvert.numerics`
  (`requantize_mlas`, `qlinear_add_mlas`, `qlinear_mul_mlas`, `lookup_table_onnxruntime`, ...);
- `onnx.*` generic ops: the kernel `ONNX_KERNELS` names for the op when there is one, else onnx's
  reference implementation of the op (`onnx.reference.ReferenceEvaluator` on a one-node model at the
  module's `onnx.opset_import`). `ONNX_KERNELS` is the one place for per-op overrides: qconvert's own
  numpy kernels (qconvert/onnx_kernels.py) where the reference is wrong (BatchNormalization with a legacy
  `momentum`, uint8 Resize, GatherElements on long axes), slow (Conv, ConvInteger, MatMulInteger,
  ConvTranspose, pools, Erf) or an ulp away from onnxruntime (Tanh, Sigmoid). They are numpy, not
  one-node onnxruntime sessions, because `check --backend interpreter` judges this interpreter against
  onnxruntime node by node: a node run by onnxruntime would be compared with itself.

Integer accumulations (ConvInteger, MatMulInteger, QLinearConv, QLinearMatMul, QGemm) are exact int64
sums (`qconvert.numerics.integer_accumulation`: float64 BLAS while exact), wrapped to int32 as
onnxruntime's accumulators wrap. A whole-model run frees each value after its last use.

Inputs and outputs are keyed by the `onnx.name` of the function's arguments and results (`arg<i>` /
`result<i>` when a module carries none). Raises `InputError` for a missing input or an op it cannot run.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import ml_dtypes
import numpy as np

from qconvert import numerics
from qconvert.errors import InputError
from qconvert.interpret_integer_to_float import INTEGER_TO_FLOAT_KERNELS
from qconvert.interpret_recurrent import RECURRENT_KERNELS
from qconvert.ir.attributes import (
    BoolAttr,
    DenseElementsAttr,
    DenseResourceAttr,
)
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp, ReturnOp
from qconvert.ir.dialects.onnx import (
    DEFAULT_OPSET,
    ELEMENT_TYPES_BY_NAME,
    absent_positions,
    by_position,
    elem_type_name,
    main_function,
    node_label,
    op_domain,
    opset_imports,
    signature_names,
)
from qconvert.ir.dialects.qconvert import (
    STORAGE_CASTS,
    ConvIntegerOp,
    DynamicQuantizeLinearOp,
    DynamicQuantizeMatMulOp,
    MatMulIntegerOp,
    QGemmOp,
    QLinearAddOp,
    QLinearAveragePoolOp,
    QLinearBinaryOp,
    QLinearConcatOp,
    QLinearConvOp,
    QLinearGlobalAveragePoolOp,
    QLinearLeakyReluOp,
    QLinearMatMulOp,
    QLinearMulOp,
    QLinearSigmoidOp,
    QLinearSoftmaxOp,
    QLinearUnaryOp,
    QOperatorOp,
)
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp
from qconvert.ir.quant_types import (
    QuantizedType,
    uniform_params,
)
from qconvert.ir.types import element_type_of
from qconvert.numerics import (
    Rounding,
    UniformParams,
    broadcast_params,
    dequantize,
    quantize,
)
from qconvert.numerics.integer_accumulation import exact_integer_matmul
from qconvert.numerics.onnxruntime_kernels import (
    qgemm_multiplier_onnxruntime,
    qlinear_binary_swaps_inputs,
    qlinear_softmax_onnxruntime,
)
from qconvert.onnx_contrib_kernels import CONTRIB_KERNELS
from qconvert.onnx_kernels import KERNELS, OnnxKernel, attribute, integer_convolution, window
from qconvert.onnx_semantics import normalize_axis

# Per-op overrides of onnx's reference implementation for generic ops, by IR op name (`onnx.<Op>`,
# `onnx.<domain>.<Op>`). A kernel takes (op, inputs by ONNX position with None where absent, opset of
# the op's domain) and returns the outputs by ONNX position, or None to leave the node to the reference.
ONNX_KERNELS: dict[str, OnnxKernel] = dict(KERNELS)
# LSTM, GRU, com.microsoft DynamicQuantizeLSTM: qconvert/recurrent.py's semantics, onnxruntime's rules.
ONNX_KERNELS.update(RECURRENT_KERNELS)
# com.microsoft MatMulIntegerToFloat (onnxruntime's optimized dynamic models): onnxruntime's rule.
ONNX_KERNELS.update(INTEGER_TO_FLOAT_KERNELS)
# com.microsoft Gelu / SkipLayerNormalization / Attention ... of onnxruntime's transformer optimizer.
ONNX_KERNELS.update(CONTRIB_KERNELS)

# The unsigned types an `onnx.elem_type` restores on a constant, by ONNX name.
ONNX_DTYPES: dict[str, np.dtype] = {
    name: entry.dtype for name, entry in ELEMENT_TYPES_BY_NAME.items() if entry.is_unsigned_integer
}


def _names(function: FuncOp, kind: str, prefix: str) -> list[str]:
    """The arguments' / results' ONNX names, `<prefix><i>` where the module records none."""
    names = signature_names(function, kind)
    return [f"{prefix}{index}" if name is None else name for index, name in enumerate(names)]


def _main(module: ModuleOp) -> FuncOp:
    return main_function(module, "to interpret")


def input_names(module: ModuleOp) -> list[str]:
    function = _main(module)
    return _names(function, "inputs", "arg")


def output_names(module: ModuleOp) -> list[str]:
    function = _main(module)
    return _names(function, "outputs", "result")


class Interpreter:
    """Runs one module; keeps the per-op onnx reference evaluators so repeated calls stay cheap."""

    def __init__(self, module: ModuleOp) -> None:
        self.module = module
        self.function = _main(module)
        self.opsets: dict[str, int] = opset_imports(module)
        self._evaluators: dict[int, object] = {}
        self._input_names = input_names(module)
        self._output_names = output_names(module)
        self._schedule = _schedule(self.function)
        # which generic ops ran on qconvert's kernels and which on onnx's reference (for reports)
        self.kernel_ops: set[str] = set()
        self.reference_ops: set[str] = set()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = self._input_names
        missing = [n for n in names if n not in inputs]
        if missing:
            raise InputError(f"missing input(s) {missing}; the module takes {names}")
        env: dict[Value, np.ndarray] = {}
        for name, argument in zip(names, self.function.body.arguments):
            env[argument] = np.asarray(inputs[name])
        with one_blas_thread():
            return self._run_body(env)

    def _run_body(self, env: dict[Value, np.ndarray]) -> dict[str, np.ndarray]:
        for op, dead in self._schedule:
            if isinstance(op, ReturnOp):
                return dict(zip(self._output_names, (env[v] for v in op.operands)))
            results = self.execute(op, [env[v] for v in op.operands])
            env.update(zip(op.results, results))
            for value in dead:  # peak memory: the live values, not every intermediate of the model
                env.pop(value, None)
        raise InputError("func.func @main has no return")

    def execute(self, op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
        if isinstance(op, ConstantOp):
            return [constant_array(op)]
        if isinstance(op, QuantizeCastOp):
            quant_type = element_type_of(op.result.type)
            saturate = op.attributes.get("saturate")
            flag = saturate.value if isinstance(saturate, BoolAttr) else True
            return [quantize(operands[0], uniform_params(quant_type), Rounding.ONNX, saturate=flag)]  # type: ignore[arg-type]
        if isinstance(op, DequantizeCastOp):
            quant_type = element_type_of(op.input.type)
            return [dequantize(operands[0], uniform_params(quant_type), Rounding.ONNX)]  # type: ignore[arg-type]
        if isinstance(op, STORAGE_CASTS):
            return [reinterpret(operands[0], op)]
        kernel = QOPERATOR_KERNELS.get(type(op))  # type: ignore[arg-type]
        if kernel is not None:
            return kernel(op, operands)
        if op.name.startswith("onnx."):
            return self.run_onnx(op, operands)
        raise InputError(f"the interpreter cannot run '{op.name}'")

    # onnx.* ops --------------------------------------------------------------------------------
    def opset_of(self, op: Operation) -> int:
        """The opset version of the op's domain in the module's `onnx.opset_import` (DEFAULT_OPSET when
        absent)."""
        return self.opsets.get(op_domain(op), DEFAULT_OPSET)

    def run_onnx(self, op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
        kernel = ONNX_KERNELS.get(op.name)
        if kernel is not None:
            results = kernel(op, by_position(op, operands), self.opset_of(op))
            if results is not None:
                absent = absent_positions(op, "outputs")
                count = len(op.results) + len(absent)
                self.kernel_ops.add(op.name)
                return [np.asarray(results[p]) for p in range(count) if p not in absent]
        self.reference_ops.add(op.name)
        return self.run_reference(op, operands)

    def run_reference(self, op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
        """The op on onnx's reference implementation (one evaluator per op, built on first use)."""
        evaluator = self._evaluators.get(id(op))
        if evaluator is None:
            evaluator = self._evaluators[id(op)] = self.make_evaluator(op, operands)
        feeds = {f"in{i}": array for i, array in enumerate(operands)}
        try:
            results = evaluator.run(None, feeds)  # type: ignore[attr-defined]
        except Exception as error:  # the reference raises any exception type for bad inputs
            raise InputError(f"'{op.name}' ({node_label(op)}): onnx reference failed: {error}") from None
        return [np.asarray(r) for r in results]

    def make_evaluator(self, op: Operation, operands: list[np.ndarray]) -> object:
        import onnx
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        from qconvert.onnx_attributes import onnx_node

        output_names = [f"out{i}" for i in range(len(op.results))]
        node = onnx_node(op, [f"in{i}" for i in range(len(operands))], output_names)
        graph = helper.make_graph(
            [node],
            "single_op",
            [
                helper.make_tensor_value_info(
                    f"in{i}", helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)
                )
                for i, a in enumerate(operands)
            ],
            [onnx.ValueInfoProto(name=name) for name in output_names],
        )
        opsets = [helper.make_opsetid(d, v) for d, v in self.opsets.items()]
        opsets = opsets or [helper.make_opsetid("", DEFAULT_OPSET)]
        model = helper.make_model(graph, opset_imports=opsets)
        try:
            return ReferenceEvaluator(model)
        except Exception as error:
            raise InputError(
                f"'{op.name}' ({node_label(op)}): no onnx reference implementation ({error})"
            ) from None


@functools.cache
def _blas_controller() -> Any:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy's BLAS limited to one thread while the interpreter runs (when threadpoolctl is installed).

    Why: one thread sums every matmul in one fixed order (float results do not depend on the machine's
    core count), and multithreaded OpenBLAS waits on busy cores: beside onnxruntime's spinning
    intra-op threads in `check`, or on a loaded machine, MiniLM's small matmuls took 10-50x longer
    (measured: a 2-layer MiniLM 1.53 s -> 0.11 s with 2 cores under load).
    """
    controller = _blas_controller()
    if controller is None:
        yield
        return
    with controller.limit(limits=1, user_api="blas"):
        yield


def _schedule(function: FuncOp) -> list[tuple[Operation, list[Value]]]:
    """Each op of the body with the values whose last use it is (its unused results included)."""
    ops = list(function.body.ops)
    last_use: dict[Value, int] = {}
    for index, op in enumerate(ops):
        for value in op.operands:
            last_use[value] = index
    dead: list[list[Value]] = [[] for _ in ops]
    for value, index in last_use.items():
        dead[index].append(value)
    for index, op in enumerate(ops):
        dead[index].extend(result for result in op.results if result not in last_use)
    return list(zip(ops, dead))


def constant_array(op: ConstantOp) -> np.ndarray:
    value = op.value
    if isinstance(value, DenseElementsAttr):
        array = np.asarray(value.array)
    elif isinstance(value, DenseResourceAttr) and value.elements is not None:
        array = value.elements.get()
    else:
        raise InputError(f"the interpreter cannot read constant {value} (elided or without data)")
    elem_type = elem_type_name(op)
    if elem_type in ONNX_DTYPES:
        array = _wrap(array, ONNX_DTYPES[elem_type])
    return array


def _wrap(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Two's-complement reinterpretation of integer values into `dtype` (int8 -56 -> uint8 200)."""
    if array.dtype == dtype:
        return array
    if array.dtype.kind in "iu" and np.dtype(dtype).kind in "iu" and array.dtype.itemsize == dtype.itemsize:
        return array.view(dtype)
    info = ml_dtypes.iinfo(dtype)
    values = array.astype(np.int64) & ((1 << info.bits) - 1)
    if info.min < 0:
        values = np.where(values > info.max, values - (1 << info.bits), values)
    return values.astype(dtype)


def reinterpret(array: np.ndarray, op: Operation) -> np.ndarray:
    """A storage cast: into the quantized side, hold the values in the storage container."""
    result_element = element_type_of(op.results[0].type)
    if isinstance(result_element, QuantizedType):
        params = uniform_params(result_element)
        if params.has_float_storage:
            return array.astype(params.storage_dtype)
        return _wrap(array, params.storage_dtype)
    return array  # back to the storage tensor: the container already holds the ONNX-visible type


def interpret(module: ModuleOp, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute `module`'s `func.func @main` on numpy inputs (by argument `onnx.name`); outputs by name."""
    return Interpreter(module).run(inputs)


# QOperator ops (frontends/onnx/qoperator.py) ---------------------------------------------------------
Kernel = Callable[[Operation, list[np.ndarray]], list[np.ndarray]]


def _params(value: Value) -> UniformParams:
    element = element_type_of(value.type)
    if not isinstance(element, QuantizedType):
        raise InputError(f"expected a quantized operand, got {value.type}")
    return uniform_params(element)


def _scalar(params: UniformParams, what: str) -> tuple[float, int]:
    if params.scale.size != 1:
        raise InputError(f"{what} must be quantized per tensor")
    return float(params.scale.reshape(-1)[0]), int(params.zero_point.reshape(-1)[0])


def _centered(array: np.ndarray, params: UniformParams) -> np.ndarray:
    """`q - zp` as exact int64, the zero point broadcast per tensor or per axis."""
    _, zero_point = broadcast_params(params, array.shape)
    return array.astype(np.int64) - zero_point


def _int32(values: np.ndarray) -> np.ndarray:
    """Two's-complement wrap of exact int64 sums to int32, as onnxruntime's int32 accumulators wrap."""
    return values.astype(np.int64).astype(np.int32)


_attr = attribute  # the ONNX attribute reading of qconvert/onnx_kernels.py


def _result_params(op: Operation) -> UniformParams:
    return _params(op.results[0])


def _conv_accumulate(x: np.ndarray, w: np.ndarray, op: Operation) -> np.ndarray:
    """Exact integer N-D convolution of centered int64 `x` (N, C, ...) and `w` (M, C/group, ...)."""
    geometry = window(op, x.shape[2:], list(w.shape[2:]))
    return integer_convolution(x, w, geometry, int(_attr(op, "group", 1)))  # type: ignore[arg-type]


def _channel_vector(values: np.ndarray, rank: int, axis: int) -> np.ndarray:
    shape = [1] * rank
    shape[axis] = -1
    return values.reshape(shape) if values.size > 1 else values.reshape(())


def _qlinear_conv(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    assert isinstance(op, QLinearConvOp)
    px, pw, py = _params(op.x), _params(op.w), _result_params(op)
    x_scale, _ = _scalar(px, "QLinearConv input")
    y_scale, y_zero = _scalar(py, "QLinearConv output")
    accumulator = _conv_accumulate(_centered(operands[0], px), _centered(operands[1], pw), op)
    if len(operands) > 2:
        accumulator = accumulator + _channel_vector(operands[2].astype(np.int64), accumulator.ndim, 1)
    multiplier = numerics.requantize_scale_onnxruntime(x_scale, pw.scale, y_scale)
    multiplier = _channel_vector(multiplier, accumulator.ndim, 1)
    return [numerics.requantize_mlas(_int32(accumulator), multiplier, y_zero, py.storage_dtype)]


def _conv_integer(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    assert isinstance(op, ConvIntegerOp)
    px, pw = _params(op.x), _params(op.w)
    return [_int32(_conv_accumulate(_centered(operands[0], px), _centered(operands[1], pw), op))]


def _qlinear_matmul(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    assert isinstance(op, QLinearMatMulOp)
    pa, pb, py = _params(op.a), _params(op.b), _result_params(op)
    a_scale, _ = _scalar(pa, "QLinearMatMul input a")
    y_scale, y_zero = _scalar(py, "QLinearMatMul output")
    accumulator = exact_integer_matmul(_centered(operands[0], pa), _centered(operands[1], pb))
    multiplier = numerics.requantize_scale_onnxruntime(a_scale, pb.scale, y_scale)
    return [numerics.requantize_mlas(_int32(accumulator), multiplier, y_zero, py.storage_dtype)]


def _matmul_integer(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    assert isinstance(op, MatMulIntegerOp)
    pa, pb = _params(op.a), _params(op.b)
    return [_int32(exact_integer_matmul(_centered(operands[0], pa), _centered(operands[1], pb)))]


def _scalar_a_span(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> bool:
    """Whether onnxruntime's broadcaster runs A as the per-span scalar (it then swaps A and B)."""
    return qlinear_binary_swaps_inputs(a_shape, b_shape)


def _qlinear_binary(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    assert isinstance(op, QLinearBinaryOp)
    pa, pb, pc = _params(op.a), _params(op.b), _result_params(op)
    a_scale, a_zero = _scalar(pa, "input A")
    b_scale, b_zero = _scalar(pb, "input B")
    c_scale, c_zero = _scalar(pc, "output C")
    a, b = np.broadcast_arrays(operands[0], operands[1])
    if isinstance(op, QLinearMulOp):
        return [
            numerics.qlinear_mul_mlas(
                a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero, pc.storage_dtype
            )
        ]
    if _scalar_a_span(operands[0].shape, operands[1].shape):
        a, b, a_scale, a_zero, b_scale, b_zero = b, a, b_scale, b_zero, a_scale, a_zero
    return [
        numerics.qlinear_add_mlas(a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero, pc.storage_dtype)
    ]


def _lookup(
    op: Operation, operands: list[np.ndarray], function: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    assert isinstance(op, QLinearUnaryOp)
    px, py = _params(op.x), _result_params(op)
    x_scale, x_zero = _scalar(px, "input")
    y_scale, y_zero = _scalar(py, "output")
    table = numerics.lookup_table_onnxruntime(function, x_scale, x_zero, y_scale, y_zero, py.storage_dtype)
    return table[np.ascontiguousarray(operands[0]).view(np.uint8)]


def _qlinear_sigmoid(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    return [_lookup(op, operands, numerics.sigmoid_float32)]


def _qlinear_leaky_relu(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    alpha = np.float32(_attr(op, "alpha", 0.01))  # type: ignore[arg-type]
    return [_lookup(op, operands, lambda v: np.where(v >= 0, v, v * alpha).astype(np.float32))]


def _qlinear_softmax(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    assert isinstance(op, QLinearSoftmaxOp)
    px, py = _params(op.x), _result_params(op)
    x_scale, _ = _scalar(px, "input")
    y_scale, y_zero = _scalar(py, "output")
    axis, opset = int(_attr(op, "axis", -1)), int(_attr(op, "opset", 13))  # type: ignore[arg-type]
    return [qlinear_softmax_onnxruntime(operands[0], x_scale, y_scale, y_zero, py.storage_dtype, axis, opset)]


def _qlinear_concat(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    py = _result_params(op)
    y_scale, y_zero = _scalar(py, "output")
    parts = []
    for value, array in zip(op.operands, operands):
        px = _params(value)
        x_scale, x_zero = _scalar(px, "input")
        if np.float32(x_scale) == np.float32(y_scale) and x_zero == y_zero:
            parts.append(array.astype(py.storage_dtype))
            continue
        table = numerics.lookup_table_onnxruntime(
            lambda v: v, x_scale, x_zero, y_scale, y_zero, py.storage_dtype
        )
        parts.append(table[np.ascontiguousarray(array).view(np.uint8)])
    try:
        axis = normalize_axis(int(_attr(op, "axis", 0)), parts[0].ndim)  # type: ignore[arg-type]
    except ValueError as error:
        raise InputError(f"'{op.name}' ({node_label(op)}): {error}") from None
    return [np.concatenate(parts, axis=axis)]


def _qlinear_global_average_pool(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    assert isinstance(op, QLinearGlobalAveragePoolOp)
    px, py = _params(op.x), _result_params(op)
    x_scale, x_zero = _scalar(px, "input")
    y_scale, y_zero = _scalar(py, "output")
    x = operands[0]
    channels_last = bool(_attr(op, "channels_last", 0))
    axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    image_size = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    accumulator = x.astype(np.int64).sum(axis=axes, keepdims=True) - x_zero * image_size
    scale = numerics.global_average_pool_scale_mlas(x_scale, y_scale, image_size)
    return [numerics.requantize_mlas(_int32(accumulator), scale, y_zero, py.storage_dtype)]


def _qlinear_average_pool(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    assert isinstance(op, QLinearAveragePoolOp)
    px, py = _params(op.x), _result_params(op)
    x_scale, x_zero = _scalar(px, "input")
    y_scale, y_zero = _scalar(py, "output")
    x = operands[0]
    channels_last = bool(_attr(op, "channels_last", 0))
    if channels_last:
        x = np.moveaxis(x, -1, 1)
    if str(_attr(op, "auto_pad", "NOTSET")) not in ("NOTSET", "VALID"):
        raise InputError(f"{node_label(op)}: QLinearAveragePool auto_pad SAME_* is not supported yet")
    kernel = [int(k) for k in _attr(op, "kernel_shape", [])]  # type: ignore[union-attr]
    spatial = len(kernel)
    geometry = window(op, x.shape[2:], kernel, ceil_mode=bool(_attr(op, "ceil_mode", 0)))
    strides, pads, out_shape = geometry.strides, geometry.pads, geometry.output
    include_pad = bool(_attr(op, "count_include_pad", 0))
    real = (np.float32(x_scale) * (x.astype(np.int64) - x_zero).astype(np.float32)).astype(np.float32)
    sizes = x.shape[2:]
    starts = [np.arange(n) * s - p for n, s, p in zip(out_shape, strides, pads)]
    windows = []
    for offsets in itertools.product(*[range(k) for k in kernel]):
        index = [st + o for st, o in zip(starts, offsets)]
        valid = [(i >= 0) & (i < n) for i, n in zip(index, sizes)]
        gathered = real
        for axis, (i, v) in enumerate(zip(index, valid)):
            gathered = np.take(gathered, np.clip(i, 0, sizes[axis] - 1), axis=2 + axis)
            shape = [1] * gathered.ndim
            shape[2 + axis] = -1
            gathered = np.where(v.reshape(shape), gathered, np.float32(0))
        windows.append(gathered)
    if include_pad:
        count = np.float32(np.prod(kernel))
    else:
        counts = [np.minimum(st + k, n) - np.maximum(st, 0) for st, k, n in zip(starts, kernel, sizes)]
        count = np.ones((), np.int64)
        for axis, c in enumerate(counts):
            shape = [1] * spatial
            shape[axis] = -1
            count = count * c.reshape(shape)
    averaged = numerics.average_pool_float32(windows, count)
    y = numerics.quantize_pool_onnxruntime(averaged, y_scale, y_zero, py.storage_dtype)
    return [np.moveaxis(y, 1, -1) if channels_last else y]


def _qgemm(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    assert isinstance(op, QGemmOp)
    pa, pb = _params(op.a), _params(op.b)
    a_scale, _ = _scalar(pa, "QGemm input A")
    a = _centered(operands[0], pa)
    b = _centered(operands[1], pb)
    if int(_attr(op, "transA", 0)):  # type: ignore[arg-type]
        a = a.T
    if int(_attr(op, "transB", 0)):  # type: ignore[arg-type]
        b = b.T
    accumulator = exact_integer_matmul(a, b)
    if len(operands) > 2:
        accumulator = accumulator + operands[2].astype(np.int64)
    alpha = float(_attr(op, "alpha", 1.0))  # type: ignore[arg-type]
    element = element_type_of(op.results[0].type)
    if not isinstance(element, QuantizedType):
        multiplier = qgemm_multiplier_onnxruntime(alpha, a_scale, pb.scale, None)
        return [numerics.scale_output_mlas(_int32(accumulator), multiplier)]
    py = uniform_params(element)
    y_scale, y_zero = _scalar(py, "QGemm output")
    multiplier = qgemm_multiplier_onnxruntime(alpha, a_scale, pb.scale, y_scale)
    return [numerics.requantize_mlas(_int32(accumulator), multiplier, y_zero, py.storage_dtype)]


def _dynamic_quantize_linear(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    scale, zero_point = numerics.dynamic_quantize_parameters_onnxruntime(operands[0])
    y = numerics.quantize_linear_mlas(operands[0], float(scale), zero_point, np.dtype(np.uint8))
    return [y, np.array(scale, np.float32), np.array(zero_point, np.uint8)]


def _dynamic_quantize_matmul(op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
    assert isinstance(op, DynamicQuantizeMatMulOp)
    pb = _params(op.b)
    a_scale, a_zero = numerics.dynamic_quantize_parameters_onnxruntime(operands[0])
    a = numerics.quantize_linear_mlas(operands[0], float(a_scale), a_zero, np.dtype(np.uint8))
    accumulator = exact_integer_matmul(a.astype(np.int64) - a_zero, _centered(operands[1], pb))
    multiplier = (np.float32(a_scale) * pb.scale.astype(np.float32)).astype(np.float32)
    y = numerics.scale_output_mlas(_int32(accumulator), multiplier)
    if len(operands) > 2:
        y = (y + operands[2].astype(np.float32)).astype(np.float32)
    return [y]


# The kernel of each op of the qconvert dialect's QOperator ops, by op class.
QOPERATOR_KERNELS: dict[type[QOperatorOp], Kernel] = {
    QLinearConvOp: _qlinear_conv,
    ConvIntegerOp: _conv_integer,
    QLinearMatMulOp: _qlinear_matmul,
    MatMulIntegerOp: _matmul_integer,
    QLinearAddOp: _qlinear_binary,
    QLinearMulOp: _qlinear_binary,
    QLinearSigmoidOp: _qlinear_sigmoid,
    QLinearLeakyReluOp: _qlinear_leaky_relu,
    QLinearSoftmaxOp: _qlinear_softmax,
    QLinearConcatOp: _qlinear_concat,
    QLinearGlobalAveragePoolOp: _qlinear_global_average_pool,
    QLinearAveragePoolOp: _qlinear_average_pool,
    QGemmOp: _qgemm,
    DynamicQuantizeLinearOp: _dynamic_quantize_linear,
    DynamicQuantizeMatMulOp: _dynamic_quantize_matmul,
}


__all__ = ["Interpreter", "input_names", "interpret", "output_names", "uniform_params"]
