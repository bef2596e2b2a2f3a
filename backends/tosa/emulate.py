"""Run a TOSA 1.0 module in numpy, op by op: the emulation that `check --backend tosa` judges the engines by.

    from qconvert.backends.tosa import emulate_tosa
    (y,) = emulate_tosa(mlir_text, [x])    # TOSA MLIR text (tosa ops in the generic form) or a parsed module

Integer arithmetic follows the TOSA 1.0 pseudocode as tosa-tools 2026.8.0's reference model evaluates it;
every rounding, saturation and range rule is a call into `qconvert.numerics.tosa` (RESCALE, TABLE,
AVG_POOL2D's reciprocal) or `qconvert.numerics.tosa_arithmetic` (accumulators, MUL's shift, CAST). Tensors
are signless, as TOSA's: i8 -> int8, i16 -> int16, i32 -> int32, i48 -> int64 (the reference model's
containers); RESCALE's unsigned flags reinterpret the bits. A graph the spec leaves undefined raises
`TosaErrorIf` (the reference model says ERROR) or `TosaUnpredictable` (UNPREDICTABLE); an op this emulator
does not know is an InputError naming it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np

from qconvert.errors import InputError
from qconvert.ir.attributes import (
    Attribute,
    BoolAttr,
    DenseArrayAttr,
    DenseElementsAttr,
    DenseResourceAttr,
    FloatAttr,
    IntegerAttr,
    OpaqueAttr,
    StringAttr,
    TypeAttr,
)
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp
from qconvert.ir.parser import ParserOptions, parse_module
from qconvert.ir.types import FloatType, IntegerType, RankedTensorType, Type
from qconvert.numerics import tosa as tosa_numerics
from qconvert.numerics.integer_accumulation import exact_integer_matmul
from qconvert.numerics.tosa_arithmetic import (
    CONTAINERS,
    cast_integer,
    cast_to_boolean,
    float_to_integer,
    multiply,
    require_range,
    signed_range,
)

__all__ = ["FLOAT_ULPS", "SUPPORTED_OPS", "emulate_module", "emulate_tosa", "parse_tosa", "ulps_apart"]

_FLOAT_DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
}
_ROUNDING_NAMES = {
    "SINGLE_ROUND": tosa_numerics.TosaRounding.SINGLE,
    "DOUBLE_ROUND": tosa_numerics.TosaRounding.DOUBLE,
}

# A runtime value: a tensor, or the tuple of a `!tosa.shape` (const_shape's values).
RuntimeValue = np.ndarray | tuple[int, ...]
Handler = Callable[[Operation, list[RuntimeValue]], list[RuntimeValue]]


def parse_tosa(text: str, filename: str = "<tosa>") -> ModuleOp:
    """TOSA MLIR text (tosa ops in the generic form, as `tosa-opt --mlir-print-op-generic` prints them) as a
    module of our IR; the tosa dialect is not registered, so its ops stay generic ops."""
    return parse_module(text, filename, options=ParserOptions(allow_unregistered_dialect=True))


def emulate_tosa(
    module: str | ModuleOp, inputs: Sequence[np.ndarray], function: str = "main"
) -> tuple[np.ndarray, ...]:
    """The outputs of TOSA `module`'s `function` on `inputs` (numpy arrays of its argument types)."""
    parsed = parse_tosa(module) if isinstance(module, str) else module
    return emulate_module(parsed, inputs, function)


def emulate_module(
    module: ModuleOp, inputs: Sequence[np.ndarray], function: str = "main"
) -> tuple[np.ndarray, ...]:
    """`emulate_tosa` on a parsed module."""
    func = _find_function(module, function)
    block = func.regions[0].entry
    if len(inputs) != len(block.arguments):
        raise InputError(f"TOSA function @{function} takes {len(block.arguments)} inputs, got {len(inputs)}")
    values: dict[Value, RuntimeValue] = {}
    for index, (argument, given) in enumerate(zip(block.arguments, inputs, strict=True)):
        values[argument] = _check_input(np.asarray(given), argument.type, f"@{function} input {index}")
    for op in block.ops:
        if op.name in ("func.return", "tosa.yield"):
            return tuple(np.asarray(values[operand]) for operand in op.operands)
        handler = _HANDLERS.get(op.name)
        if handler is None:
            raise InputError(f"the TOSA emulator does not know '{op.name}' ({_where(op)})")
        results = handler(op, [values[operand] for operand in op.operands])
        for result, computed in zip(op.results, results, strict=True):
            values[result] = _check_result(computed, result.type, op)
    raise InputError(f"TOSA function @{function} has no return")


def _find_function(module: ModuleOp, name: str) -> FuncOp:
    functions = [op for op in module.body.ops if isinstance(op, FuncOp)]
    for func in functions:
        if func.sym_name == name:
            return func
    if len(functions) == 1 and name == "main":  # one function, whatever its name, as @main is found elsewhere
        return functions[0]
    raise InputError(f"the TOSA module has no function @{name}")


def _where(op: Operation) -> str:
    location = op.location
    return f"at {location}" if location is not None else "in the TOSA module"


# Types ------------------------------------------------------------------------------------------------------


def element_type_name(type_: Type) -> str:
    """'i8', 'i16', 'i32', 'i48', 'i1', 'f32', ... of a tensor type or an element type."""
    element = type_.element_type if isinstance(type_, RankedTensorType) else type_
    if isinstance(element, IntegerType):
        return f"i{element.width}"
    if isinstance(element, FloatType):
        return element.name
    raise InputError(f"TOSA element type {element} is not supported by the emulator")


def _dtype(type_name: str) -> np.dtype:
    if type_name in CONTAINERS:
        return CONTAINERS[type_name]
    if type_name == "i1":
        return np.dtype(np.bool_)
    if type_name in _FLOAT_DTYPES:
        return _FLOAT_DTYPES[type_name]
    raise InputError(f"TOSA element type {type_name} is not supported by the emulator")


def _check_input(array: np.ndarray, type_: Type, what: str) -> np.ndarray:
    if not isinstance(type_, RankedTensorType):
        raise InputError(f"{what}: expected a ranked tensor type, the function declares {type_}")
    dtype = _dtype(element_type_name(type_))
    if array.dtype != dtype and not (array.dtype.kind in "iu" and array.dtype.itemsize == dtype.itemsize):
        raise InputError(f"{what}: expected {dtype} values for {type_}, got {array.dtype}")
    if tuple(array.shape) != tuple(type_.shape):
        raise InputError(f"{what}: expected shape {tuple(type_.shape)} for {type_}, got {tuple(array.shape)}")
    return array.view(dtype) if array.dtype != dtype else array


def _check_result(computed: RuntimeValue, type_: Type, op: Operation) -> RuntimeValue:
    """The op's result in its declared type; a shape or type we computed otherwise is the module's error."""
    if isinstance(computed, tuple):
        return computed
    if isinstance(type_, RankedTensorType):
        if tuple(computed.shape) != tuple(type_.shape):
            raise InputError(
                f"'{op.name}' ({_where(op)}) declares {type_}, but its operands give shape {computed.shape}"
            )
        return computed.astype(_dtype(element_type_name(type_)), copy=False)
    return computed


# Attributes -------------------------------------------------------------------------------------------------


def _attribute(op: Operation, name: str) -> Attribute:
    try:
        return op.attributes[name]
    except KeyError:
        raise InputError(f"'{op.name}' ({_where(op)}) has no attribute '{name}'") from None


def _ints(op: Operation, name: str) -> tuple[int, ...]:
    attribute = _attribute(op, name)
    if isinstance(attribute, DenseArrayAttr):
        return tuple(int(v) for v in attribute.values)
    raise InputError(f"'{op.name}' ({_where(op)}): attribute '{name}' must be an array<i64: ...>")


def _int(op: Operation, name: str) -> int:
    attribute = _attribute(op, name)
    if isinstance(attribute, IntegerAttr):
        return int(attribute.value)
    raise InputError(f"'{op.name}' ({_where(op)}): attribute '{name}' must be an integer")


def _bool(op: Operation, name: str, default: bool = False) -> bool:
    attribute = op.attributes.get(name)
    if attribute is None:
        return default
    if isinstance(attribute, BoolAttr):
        return attribute.value
    if isinstance(attribute, IntegerAttr):
        return bool(attribute.value)
    raise InputError(f"'{op.name}' ({_where(op)}): attribute '{name}' must be a boolean")


def _enum_text(attribute: Attribute) -> str:
    """`DOUBLE_ROUND` of `#tosa.rounding_mode<DOUBLE_ROUND>`, `#tosa<rounding_mode DOUBLE_ROUND>` or "..." """
    if isinstance(attribute, StringAttr):
        return attribute.value
    text = attribute.text if isinstance(attribute, OpaqueAttr) else str(attribute)
    match = re.search(r"([A-Z_]+)\s*>\s*$", text)
    return match.group(1) if match else text


def elements(attribute: Attribute, where: str) -> np.ndarray:
    """The numpy array of a `dense<...>` or `dense_resource<...>` constant."""
    if isinstance(attribute, DenseElementsAttr):
        return np.asarray(attribute.array)
    if isinstance(attribute, DenseResourceAttr) and attribute.elements is not None:
        return attribute.elements.get()
    raise InputError(f"{where}: a TOSA constant must be dense<...> or a dense_resource with its blob")


def _scalar(value: RuntimeValue, op: Operation, what: str) -> int:
    """A zero point or shift operand: a one-element tensor (TOSA 1.0 passes them as tensor<1xT>)."""
    array = np.asarray(value)
    if array.size != 1:
        raise InputError(f"'{op.name}' ({_where(op)}): {what} must have one element, got shape {array.shape}")
    return int(array.reshape(-1)[0])


def _result_type(op: Operation) -> str:
    return element_type_name(op.results[0].type)


def _operand_type(op: Operation, index: int) -> str:
    return element_type_name(op.operands[index].type)


# Ops --------------------------------------------------------------------------------------------------------


def _const(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    array = elements(_attribute(op, "values"), f"'{op.name}' ({_where(op)})")
    result_type = op.results[0].type
    assert isinstance(result_type, RankedTensorType)
    return [np.broadcast_to(array, tuple(result_type.shape)).astype(_dtype(element_type_name(result_type)))]


def _const_shape(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    array = elements(_attribute(op, "values"), f"'{op.name}' ({_where(op)})")
    return [tuple(int(v) for v in np.asarray(array).reshape(-1))]


def _rescale(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    values, multiplier, shift, input_zp, output_zp = operands
    rounding_text = _enum_text(_attribute(op, "rounding_mode"))
    if rounding_text not in _ROUNDING_NAMES:
        raise InputError(
            f"'{op.name}' ({_where(op)}): rounding_mode {rounding_text} has no bit-exact rule to emulate "
            f"(expected one of {sorted(_ROUNDING_NAMES)})"
        )
    result = tosa_numerics.rescale(
        np.asarray(values),
        np.asarray(multiplier),
        np.asarray(shift),
        input_type=_operand_type(op, 0),
        output_type=_result_type(op),
        input_zp=_scalar(input_zp, op, "input_zp"),
        output_zp=_scalar(output_zp, op, "output_zp"),
        scale32=_bool(op, "scale32", True),
        rounding=_ROUNDING_NAMES[rounding_text],
        per_channel=_bool(op, "per_channel"),
        input_unsigned=_bool(op, "input_unsigned"),
        output_unsigned=_bool(op, "output_unsigned"),
    )
    return [result]


def _accumulator_type(op: Operation) -> str:
    attribute = op.attributes.get("acc_type")
    if isinstance(attribute, TypeAttr):
        return element_type_name(attribute.value)
    return _result_type(op)


def _zero_point_value(value: RuntimeValue, op: Operation, what: str, type_name: str) -> int:
    """Zero points of CONV / MATMUL: any value for i8, 0 for i16 (ERROR_IF)."""
    zero_point = _scalar(value, op, what)
    if type_name != "i8" and zero_point != 0:
        raise tosa_numerics.TosaErrorIf(f"{op.name}: {what} must be 0 for {type_name}, got {zero_point}")
    return zero_point


def _padded_windows(
    x: np.ndarray,
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    pad: Sequence[int],
    fill: int | float,
) -> np.ndarray:
    """`x` [N, H, W, C] padded with `fill` (pad: top, bottom, left, right), windows [N, OH, OW, KH, KW, C]."""
    top, bottom, left, right = pad
    padded = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=fill)
    kernel_h, kernel_w = kernel
    stride_h, stride_w = stride
    dilation_h, dilation_w = dilation
    extent_h = (kernel_h - 1) * dilation_h + 1
    extent_w = (kernel_w - 1) * dilation_w + 1
    for size, extent, step, axis in (
        (padded.shape[1], extent_h, stride_h, "height"),
        (padded.shape[2], extent_w, stride_w, "width"),
    ):
        if size < extent or (size - extent) % step:
            raise tosa_numerics.TosaErrorIf(
                f"the padded {axis} {size} minus the kernel's extent {extent} is not a multiple of the "
                f"stride {step}"
            )
    out_h = (padded.shape[1] - extent_h) // stride_h + 1
    out_w = (padded.shape[2] - extent_w) // stride_w + 1
    rows = (np.arange(out_h) * stride_h)[:, None] + np.arange(kernel_h) * dilation_h  # [OH, KH]
    columns = (np.arange(out_w) * stride_w)[:, None] + np.arange(kernel_w) * dilation_w  # [OW, KW]
    # [N, OH, KH, OW, KW, C] -> [N, OH, OW, KH, KW, C]
    windows = padded[:, rows[:, :, None, None], columns[None, None, :, :], :]
    return windows.transpose(0, 1, 3, 2, 4, 5)


def _bias(bias: RuntimeValue, channels: int, op: Operation) -> np.ndarray:
    array = np.asarray(bias, np.int64).reshape(-1)
    if array.size not in (1, channels):
        raise tosa_numerics.TosaErrorIf(f"{op.name}: bias has {array.size} entries for {channels} channels")
    return array


def _centred_windows(
    op: Operation, operands: list[RuntimeValue], kernel_axes: slice
) -> tuple[np.ndarray, np.ndarray, RuntimeValue]:
    """A convolution's padded input windows and its weight, each minus its zero point (int64: exact), and
    its bias; `kernel_axes`: where the weight's layout keeps KH, KW."""
    x, weight, bias, input_zp, weight_zp = operands
    input_type, weight_type = _operand_type(op, 0), _operand_type(op, 1)
    x_zero = _zero_point_value(input_zp, op, "input_zp", input_type)
    w_zero = _zero_point_value(weight_zp, op, "weight_zp", weight_type)
    weight64 = np.asarray(weight, np.int64) - w_zero
    windows = _padded_windows(
        np.asarray(x, np.int64) - x_zero,
        weight64.shape[kernel_axes],
        _ints(op, "stride"),
        _ints(op, "dilation"),
        _ints(op, "pad"),
        0,
    )
    return windows, weight64, bias


def _conv2d(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    windows, weight64, bias = _centred_windows(op, operands, slice(1, 3))  # weight [OC, KH, KW, IC]
    batch, out_h, out_w = windows.shape[:3]
    patches = windows.reshape(batch * out_h * out_w, -1)
    sums = exact_integer_matmul(patches, weight64.reshape(weight64.shape[0], -1).T)
    sums = sums.reshape(batch, out_h, out_w, -1) + _bias(bias, weight64.shape[0], op)
    return [require_range(sums, _accumulator_type(op), op.name)]


def _depthwise_conv2d(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    windows, weight64, bias = _centred_windows(op, operands, slice(0, 2))  # weight [KH, KW, C, M]
    sums = np.einsum("nhwyxc,yxcm->nhwcm", windows, weight64)  # int64: exact
    channels = weight64.shape[2] * weight64.shape[3]
    sums = sums.reshape(*sums.shape[:3], channels) + _bias(bias, channels, op)
    return [require_range(sums, _accumulator_type(op), op.name)]


def _matmul(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    a, b, a_zp, b_zp = operands
    a_zero = _zero_point_value(a_zp, op, "a_zp", _operand_type(op, 0))
    b_zero = _zero_point_value(b_zp, op, "b_zp", _operand_type(op, 1))
    sums = exact_integer_matmul(np.asarray(a, np.int64) - a_zero, np.asarray(b, np.int64) - b_zero)
    return [require_range(sums, _result_type(op), op.name)]


def _elementwise(name: str, operation: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Handler:
    def handler(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
        a, b = (np.asarray(v) for v in operands)
        if a.ndim != b.ndim:
            raise tosa_numerics.TosaErrorIf(f"{op.name}: operands of rank {a.ndim} and {b.ndim}")
        type_name = _result_type(op)
        if type_name in CONTAINERS:
            return [require_range(operation(a.astype(np.int64), b.astype(np.int64)), type_name, name)]
        return [operation(a, b)]

    return handler


def _mul(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    a, b = (np.asarray(v) for v in operands[:2])
    shift = _scalar(operands[2], op, "shift") if len(operands) > 2 else 0
    if a.ndim != b.ndim:
        raise tosa_numerics.TosaErrorIf(f"{op.name}: operands of rank {a.ndim} and {b.ndim}")
    type_name = _operand_type(op, 0)
    if type_name in CONTAINERS:
        return [multiply(a, b, shift, type_name)]
    with np.errstate(over="ignore"):  # IEEE: a float product too large is infinite, as on the engines
        return [a * b]


def _clamp_bound(attribute: Attribute) -> int | float:
    if isinstance(attribute, IntegerAttr | FloatAttr):
        return attribute.value
    raise InputError(f"clamp bound {attribute} must be an integer or float attribute")


def _clamp(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    low = _clamp_bound(_attribute(op, "min_val"))
    high = _clamp_bound(_attribute(op, "max_val"))
    if low > high:
        raise tosa_numerics.TosaErrorIf(f"{op.name}: min_val {low} > max_val {high}")
    array = np.asarray(operands[0])
    return [np.clip(array, low, high).astype(array.dtype)]


def _max_pool2d(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    x = np.asarray(operands[0])
    type_name = _result_type(op)
    fill = signed_range(type_name)[0] if type_name in CONTAINERS else -np.inf
    windows = _padded_windows(x, _ints(op, "kernel"), _ints(op, "stride"), (1, 1), _ints(op, "pad"), fill)
    return [windows.max(axis=(3, 4)).astype(x.dtype)]


def _avg_pool2d(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    x, input_zp, output_zp = operands
    type_name = _result_type(op)
    kernel, stride, pad = _ints(op, "kernel"), _ints(op, "stride"), _ints(op, "pad")
    if type_name not in CONTAINERS:
        raise InputError(f"'{op.name}' ({_where(op)}): only integer avg_pool2d is emulated, got {type_name}")
    x_zero = _zero_point_value(input_zp, op, "input_zp", type_name)
    y_zero = _zero_point_value(output_zp, op, "output_zp", type_name)
    x64 = np.asarray(x, np.int64)
    sums = _padded_windows(x64 - x_zero, kernel, stride, (1, 1), pad, 0).sum(axis=(3, 4))
    # Padding is not counted: each window's count is its number of in-bounds elements.
    inside = _padded_windows(np.ones((1, *x64.shape[1:3], 1), np.int64), kernel, stride, (1, 1), pad, 0)
    counts = inside.sum(axis=(3, 4))
    accumulator = require_range(sums, _accumulator_type(op), op.name)
    return [tosa_numerics.average_pool_output(accumulator, counts, y_zero, type_name)]


def _reshape(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    shape = operands[1] if len(operands) > 1 else _ints(op, "new_shape")
    return [np.asarray(operands[0]).reshape(tuple(shape))]


def _transpose(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    return [np.transpose(np.asarray(operands[0]), _ints(op, "perms"))]


def _slice(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    x, start, size = operands
    array = np.asarray(x)
    assert isinstance(start, tuple) and isinstance(size, tuple)
    for axis, (begin, length) in enumerate(zip(start, size, strict=True)):
        if begin < 0 or length < 1 or begin + length > array.shape[axis]:
            raise tosa_numerics.TosaErrorIf(f"{op.name}: start {begin} size {length} outside axis {axis}")
    return [array[tuple(slice(b, b + n) for b, n in zip(start, size, strict=True))]]


def _concat(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    return [np.concatenate([np.asarray(v) for v in operands], axis=_int(op, "axis"))]


def _pad(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    x, padding, pad_const = operands
    array = np.asarray(x)
    assert isinstance(padding, tuple)
    if any(p < 0 for p in padding):
        raise tosa_numerics.TosaErrorIf(f"{op.name}: negative padding {padding}")
    widths = [(padding[2 * axis], padding[2 * axis + 1]) for axis in range(array.ndim)]
    fill = np.asarray(pad_const).reshape(-1)[0]
    return [np.pad(array, widths, constant_values=fill)]


def _gather(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    values, indices = (np.asarray(v) for v in operands)
    count = values.shape[1]
    if np.any((indices < 0) | (indices >= count)):
        raise tosa_numerics.TosaUnpredictable(f"{op.name}: an index is outside [0, {count})")
    return [np.take_along_axis(values, indices.astype(np.int64)[:, :, None], axis=1)]


def _reduce(name: str, reduction: Callable[..., np.ndarray]) -> Handler:
    def handler(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
        array = np.asarray(operands[0])
        axis = _int(op, "axis")
        type_name = _result_type(op)
        if type_name in CONTAINERS:
            reduced = reduction(array.astype(np.int64), axis=axis, keepdims=True)
            return [require_range(reduced, type_name, name)]
        return [reduction(array, axis=axis, keepdims=True)]

    return handler


def _intdiv(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    a, b = (np.asarray(v) for v in operands)
    if a.ndim != b.ndim:
        raise tosa_numerics.TosaErrorIf(f"{op.name}: operands of rank {a.ndim} and {b.ndim}")
    return [tosa_numerics.intdiv(a, b)]


def _table(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    values, lookup = (np.asarray(v) for v in operands)
    return [tosa_numerics.table(values, lookup)]


def _cast(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    array = np.asarray(operands[0])
    input_type, output_type = _operand_type(op, 0), _result_type(op)
    if output_type in CONTAINERS:
        if input_type in _FLOAT_DTYPES:
            return [float_to_integer(array, output_type)]
        return [cast_integer(array, output_type)]
    if output_type == "i1" and input_type in CONTAINERS:
        return [cast_to_boolean(array)]
    if output_type in _FLOAT_DTYPES and input_type in CONTAINERS:
        return [array.astype(np.float64).astype(_FLOAT_DTYPES[output_type])]
    raise InputError(f"'{op.name}' ({_where(op)}): cast from {input_type} to {output_type} is not emulated")


def _identity(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    return [np.asarray(operands[0])]


_HANDLERS: dict[str, Handler] = {
    "tosa.const": _const,
    "tosa.const_shape": _const_shape,
    "tosa.rescale": _rescale,
    "tosa.conv2d": _conv2d,
    "tosa.depthwise_conv2d": _depthwise_conv2d,
    "tosa.matmul": _matmul,
    "tosa.add": _elementwise("add", np.add),
    "tosa.sub": _elementwise("sub", np.subtract),
    "tosa.maximum": _elementwise("maximum", np.maximum),
    "tosa.minimum": _elementwise("minimum", np.minimum),
    "tosa.mul": _mul,
    "tosa.intdiv": _intdiv,
    "tosa.clamp": _clamp,
    "tosa.max_pool2d": _max_pool2d,
    "tosa.avg_pool2d": _avg_pool2d,
    "tosa.reshape": _reshape,
    "tosa.transpose": _transpose,
    "tosa.slice": _slice,
    "tosa.concat": _concat,
    "tosa.pad": _pad,
    "tosa.gather": _gather,
    "tosa.reduce_sum": _reduce("reduce_sum", np.sum),
    "tosa.reduce_max": _reduce("reduce_max", np.max),
    "tosa.reduce_min": _reduce("reduce_min", np.min),
    "tosa.table": _table,
    "tosa.cast": _cast,
    "tosa.identity": _identity,
}


FLOAT_ULPS = 3
"""TOSA's float functions are not bit-exact across implementations (the spec bounds their error): the
emulation computes exp / log / tanh / sigmoid / erf / pow and float matmul in float64, rounded once to
float32, and tosa-tools 2026.8.0's reference model is within this many float32 ulps of it (measured on the
sample graphs: exp 0, erf / log / sigmoid 1, matmul 2, pow / tanh 3). A quantize after them shows such a
difference only at a near-tie."""


def ulps_apart(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many float32 values lie between a and b, elementwise (-0.0 and 0.0: none)."""

    def ordered(x: np.ndarray) -> np.ndarray:
        bits = np.asarray(x, np.float32).view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    return np.abs(ordered(a) - ordered(b))


# Float functions (--allow-float islands, PRO-FP) and comparisons / select (token-id wraps).
def _float_function(function: Callable[[np.ndarray], np.ndarray], wide: bool = True) -> Handler:
    def handler(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
        array = np.asarray(operands[0])
        if _result_type(op) not in _FLOAT_DTYPES:
            raise InputError(f"'{op.name}' ({_where(op)}): only float {op.name} is emulated")
        with np.errstate(all="ignore"):
            computed = function(array.astype(np.float64 if wide else np.float32))
        return [np.asarray(computed).astype(array.dtype)]

    return handler


def _pow(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    base, exponent = (np.asarray(v, np.float64) for v in operands)
    with np.errstate(all="ignore"):
        return [np.power(base, exponent).astype(np.float32)]


def _compare(function: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Handler:
    def handler(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
        a, b = (np.asarray(v) for v in operands)
        if a.ndim != b.ndim:
            raise tosa_numerics.TosaErrorIf(f"{op.name}: operands of rank {a.ndim} and {b.ndim}")
        return [function(a, b)]

    return handler


def _select(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    condition, on_true, on_false = (np.asarray(v) for v in operands)
    return [np.where(condition.astype(bool), on_true, on_false).astype(on_true.dtype)]


def _float_erf(array: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(array.astype(np.float64))


_integer_matmul = _HANDLERS["tosa.matmul"]


def _any_matmul(op: Operation, operands: list[RuntimeValue]) -> list[RuntimeValue]:
    """Float matmul (f32 products and sums, as the reference model's float32 accumulator), else integer."""
    if _result_type(op) not in _FLOAT_DTYPES:
        return _integer_matmul(op, operands)
    a, b = (np.asarray(v, np.float64) for v in operands[:2])
    return [np.matmul(a, b).astype(np.float32)]


_HANDLERS.update(
    {
        "tosa.exp": _float_function(np.exp),
        "tosa.log": _float_function(np.log),
        "tosa.rsqrt": _float_function(lambda x: np.float32(1.0) / np.sqrt(x), wide=False),
        "tosa.reciprocal": _float_function(lambda x: np.float32(1.0) / x, wide=False),
        "tosa.tanh": _float_function(np.tanh),
        "tosa.sigmoid": _float_function(lambda x: 1.0 / (1.0 + np.exp(-x))),
        "tosa.erf": _float_function(_float_erf),
        "tosa.abs": _float_function(np.abs, wide=False),
        "tosa.floor": _float_function(np.floor, wide=False),
        "tosa.ceil": _float_function(np.ceil, wide=False),
        "tosa.pow": _pow,
        "tosa.equal": _compare(np.equal),
        "tosa.greater": _compare(np.greater),
        "tosa.greater_equal": _compare(np.greater_equal),
        "tosa.logical_not": lambda op, operands: [np.logical_not(np.asarray(operands[0]))],
        "tosa.logical_and": _compare(np.logical_and),
        "tosa.select": _select,
        "tosa.matmul": _any_matmul,
    }
)

SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(_HANDLERS))
