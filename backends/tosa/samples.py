"""One small TOSA 1.0 graph per op the emulator runs, in the generic form tosa-opt and IREE both parse, with
generated inputs that reach the edges (type limits, zero points at the limits, ties of the rounding shifts,
saturation, padding). The emulator's tests run each on the TOSA reference model and IREE, bit for bit.

    from qconvert.backends.tosa import sample_graphs
    for graph in sample_graphs():
        graph.name, graph.mlir, graph.inputs
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from qconvert.numerics import tosa as tosa_numerics

__all__ = ["SampleGraph", "const", "const_shape", "function_text", "sample_graphs", "tensor_type"]

_ELEMENT_NAMES = {
    np.dtype(np.int8): "i8",
    np.dtype(np.int16): "i16",
    np.dtype(np.int32): "i32",
    np.dtype(np.int64): "i48",
    np.dtype(np.bool_): "i1",
    np.dtype(np.float32): "f32",
}


@dataclass(frozen=True)
class SampleGraph:
    """A TOSA function `@main` and inputs for it; `engines` names the engines expected to run it."""

    name: str
    mlir: str
    inputs: tuple[np.ndarray, ...]
    engines: tuple[str, ...] = field(default=("reference", "iree"))


def tensor_type(shape: Sequence[int], element: str) -> str:
    dims = "x".join(str(d) for d in shape)
    return f"tensor<{dims}x{element}>" if dims else f"tensor<{element}>"


def _dense(array: np.ndarray) -> str:
    flat = array.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return f"dense<{json.dumps(flat[0].item())}>"
    return f"dense<{json.dumps(array.tolist())}>"


def const(name: str, values: np.ndarray | Sequence[int] | int, element: str) -> str:
    """`%name = "tosa.const"() ...` of `values` (a one-element tensor for a scalar)."""
    array = np.asarray(values)
    if array.ndim == 0:
        array = array.reshape(1)
    type_text = tensor_type(array.shape, element)
    return f'%{name} = "tosa.const"() <{{values = {_dense(array)} : {type_text}}}> : () -> {type_text}'


def const_shape(name: str, values: Sequence[int]) -> str:
    count = len(values)
    return (
        f'%{name} = "tosa.const_shape"() <{{values = dense<{list(values)}> : tensor<{count}xindex>}}> : '
        f"() -> !tosa.shape<{count}>"
    )


def function_text(
    inputs: Sequence[np.ndarray], body: Sequence[str], results: Sequence[tuple[str, str]]
) -> str:
    """`func.func @main(%arg0, ...)` over `inputs`' types: the `body` lines, then `results` (name, type)."""
    arguments = ", ".join(
        f"%arg{i}: {tensor_type(array.shape, _ELEMENT_NAMES[array.dtype])}" for i, array in enumerate(inputs)
    )
    result_types = ", ".join(t for _, t in results)
    lines = [f"func.func @main({arguments}) -> ({result_types}) {{"]
    lines += [f"  {line}" for line in body]
    lines.append(f'  "func.return"({", ".join("%" + n for n, _ in results)}) : ({result_types}) -> ()')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _op(
    result: str,
    name: str,
    operands: Sequence[str],
    attributes: str,
    operand_types: Sequence[str],
    result_type: str,
) -> str:
    attribute_text = f" <{{{attributes}}}>" if attributes else ""
    operand_text = ", ".join("%" + o for o in operands)
    types = ", ".join(operand_types)
    return f'%{result} = "tosa.{name}"({operand_text}){attribute_text} : ({types}) -> {result_type}'


def _narrow_i48(body: list[str], value: str, shape: Sequence[int], scale: float) -> tuple[str, str]:
    """Append a 16-bit-scale RESCALE of i48 `value` to i32 (`scale` a power of two, exact): the reference
    model's Python binding returns i48 outputs as empty arrays, so an i48 result is read through this."""
    multiplier, shift = tosa_numerics.compute_multiplier_and_shift(np.asarray([scale]), 16)
    out_type = tensor_type(shape, "i32")
    body += [
        const(f"{value}_m", multiplier, "i16"),
        const(f"{value}_s", shift, "i8"),
        const(f"{value}_zp", 0, "i48"),
        const(f"{value}_ozp", 0, "i32"),
        _op(
            f"{value}_i32",
            "rescale",
            [value, f"{value}_m", f"{value}_s", f"{value}_zp", f"{value}_ozp"],
            "input_unsigned = false, output_unsigned = false, per_channel = false, "
            "rounding_mode = #tosa.rounding_mode<SINGLE_ROUND>, scale32 = false",
            [tensor_type(shape, "i48"), "tensor<1xi16>", "tensor<1xi8>", "tensor<1xi48>", "tensor<1xi32>"],
            out_type,
        ),
    ]
    return f"{value}_i32", out_type


def _edges(dtype: np.dtype, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Random values of `dtype` whose first elements are the type's limits and small values around 0."""
    info = np.iinfo(dtype)
    values = rng.integers(info.min, int(info.max) + 1, size=shape, dtype=np.int64)
    flat = values.reshape(-1)
    edges = [info.min, info.max, 0, -1, 1, info.min + 1, info.max - 1]
    flat[: min(len(edges), flat.size)] = edges[: flat.size]
    return values.astype(dtype)


def _bit_pattern(value: int, element: str) -> int:
    """An unsigned zero point (200 for u8) as the signless constant holding its bits (-56 : i8)."""
    bits = int(element[1:])
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _rescale_graph(
    name: str,
    x: np.ndarray,
    output: str,
    scales: Sequence[float],
    input_zp: int,
    output_zp: int,
    *,
    rounding: str = "SINGLE_ROUND",
    input_unsigned: bool = False,
    output_unsigned: bool = False,
    scale32: bool = True,
) -> SampleGraph:
    in_element = _ELEMENT_NAMES[x.dtype]
    multiplier, shift = tosa_numerics.compute_multiplier_and_shift(np.asarray(scales), 32 if scale32 else 16)
    per_channel = len(scales) > 1
    out_type = tensor_type(x.shape, output)
    zp_in = "i8" if in_element == "i8" else in_element
    zp_out = "i8" if output == "i8" else output
    body = [
        const("m", multiplier, "i32" if scale32 else "i16"),
        const("s", shift, "i8"),
        const("izp", _bit_pattern(input_zp, zp_in), zp_in),
        const("ozp", _bit_pattern(output_zp, zp_out), zp_out),
        _op(
            "y",
            "rescale",
            ["arg0", "m", "s", "izp", "ozp"],
            f"input_unsigned = {str(input_unsigned).lower()}, "
            f"output_unsigned = {str(output_unsigned).lower()}, "
            f"per_channel = {str(per_channel).lower()}, rounding_mode = #tosa.rounding_mode<{rounding}>, "
            f"scale32 = {str(scale32).lower()}",
            [
                tensor_type(x.shape, in_element),
                tensor_type((len(scales),), "i32" if scale32 else "i16"),
                tensor_type((len(scales),), "i8"),
                tensor_type((1,), zp_in),
                tensor_type((1,), zp_out),
            ],
            out_type,
        ),
    ]
    return SampleGraph(name, function_text([x], body, [("y", out_type)]), (x,))


def _conv_graph(
    name: str,
    rng: np.random.Generator,
    *,
    depthwise: bool,
    input_zp: int,
    weight_zp: int,
    stride: tuple[int, int],
    dilation: tuple[int, int],
    pad: tuple[int, int, int, int],
    wide: bool = False,
) -> SampleGraph:
    dtype = np.dtype(np.int16) if wide else np.dtype(np.int8)
    element = _ELEMENT_NAMES[dtype]
    accumulator = "i48" if wide else "i32"
    channels, multiplier_or_out = 3, 2
    x = _edges(dtype, (1, 7, 6, channels), rng)
    if depthwise:
        weight = _edges(np.dtype(np.int8), (3, 2, channels, multiplier_or_out), rng)
        out_channels = channels * multiplier_or_out
    else:
        weight = _edges(np.dtype(np.int8), (4, 3, 2, channels), rng)
        out_channels = 4
    bias = rng.integers(-(2**20), 2**20, size=(out_channels,)).astype(np.int64 if wide else np.int32)
    kernel = weight.shape[0:2] if depthwise else weight.shape[1:3]
    out_h = (7 + pad[0] + pad[1] - (kernel[0] - 1) * dilation[0] - 1) // stride[0] + 1
    out_w = (6 + pad[2] + pad[3] - (kernel[1] - 1) * dilation[1] - 1) // stride[1] + 1
    out_type = tensor_type((1, out_h, out_w, out_channels), accumulator)
    # The reference model's binding takes no i48 inputs: a wide graph's bias is a constant.
    bias_name = "bias" if wide else "arg2"
    body = [
        const("izp", input_zp, element),
        const("wzp", weight_zp, "i8"),
        *([const("bias", bias, accumulator)] if wide else []),
        _op(
            "y",
            "depthwise_conv2d" if depthwise else "conv2d",
            ["arg0", "arg1", bias_name, "izp", "wzp"],
            f"acc_type = {accumulator}, dilation = array<i64: {dilation[0]}, {dilation[1]}>, "
            f"pad = array<i64: {', '.join(map(str, pad))}>, stride = array<i64: {stride[0]}, {stride[1]}>",
            [
                tensor_type(x.shape, element),
                tensor_type(weight.shape, "i8"),
                tensor_type(bias.shape, accumulator),
                tensor_type((1,), element),
                tensor_type((1,), "i8"),
            ],
            out_type,
        ),
    ]
    result = ("y", out_type)
    if wide:
        result = _narrow_i48(body, "y", (1, out_h, out_w, out_channels), 2.0**-4)
    inputs = (x, weight) if wide else (x, weight, bias)
    return SampleGraph(name, function_text(inputs, body, [result]), inputs)


def _binary_graph(
    name: str, op: str, a: np.ndarray, b: np.ndarray, result_element: str, shift: int | None = None
) -> SampleGraph:
    element = _ELEMENT_NAMES[a.dtype]
    shape = np.broadcast_shapes(a.shape, b.shape)
    out_type = tensor_type(shape, result_element)
    operands, types, body = (
        ["arg0", "arg1"],
        [tensor_type(a.shape, element), tensor_type(b.shape, element)],
        [],
    )
    if shift is not None:
        body.append(const("shift", shift, "i8"))
        operands.append("shift")
        types.append(tensor_type((1,), "i8"))
    body.append(_op("y", op, operands, "", types, out_type))
    return SampleGraph(name, function_text([a, b], body, [("y", out_type)]), (a, b))


def _unary_graph(
    name: str,
    x: np.ndarray,
    op: str,
    attributes: str,
    out_shape: Sequence[int],
    out_element: str | None = None,
    extra: Sequence[str] = (),
    extra_operands: Sequence[str] = (),
    extra_types: Sequence[str] = (),
) -> SampleGraph:
    element = _ELEMENT_NAMES[x.dtype]
    out_type = tensor_type(out_shape, out_element or element)
    body = [
        *extra,
        _op(
            "y",
            op,
            ["arg0", *extra_operands],
            attributes,
            [tensor_type(x.shape, element), *extra_types],
            out_type,
        ),
    ]
    return SampleGraph(name, function_text([x], body, [("y", out_type)]), (x,))


def sample_graphs(seed: int = 0) -> list[SampleGraph]:
    """Every emulated op at least once, with edge inputs (see the module's docstring)."""
    rng = np.random.default_rng(seed)
    graphs: list[SampleGraph] = []
    i8 = _edges(np.dtype(np.int8), (4, 64), rng)
    i16 = _edges(np.dtype(np.int16), (4, 64), rng)
    i32 = (rng.integers(-(2**20), 2**20, size=(4, 64))).astype(np.int32)
    i32[0, :8] = [0, 1, -1, 2**20, -(2**20), 3, -3, 7]

    # RESCALE: single and double round, ties (scale 0.5 on odd values), zero points at the limits, unsigned,
    # per channel, 16-bit scales, i32 -> i8 requantization with saturation.
    graphs.append(_rescale_graph("rescale_i8_single_tie", i8, "i8", [0.5], -128, 127))
    graphs.append(_rescale_graph("rescale_i8_double", i8, "i8", [0.37], 3, -5, rounding="DOUBLE_ROUND"))
    graphs.append(_rescale_graph("rescale_i32_to_i8", i32, "i8", [2.0**-13 * 1.37], 0, -7))
    graphs.append(
        _rescale_graph(
            "rescale_i32_to_i8_double", i32, "i8", [2.0**-13 * 1.37], 0, 11, rounding="DOUBLE_ROUND"
        )
    )
    graphs.append(_rescale_graph("rescale_u8_in", i8, "i8", [0.75], 128, -128, input_unsigned=True))
    graphs.append(_rescale_graph("rescale_u8_out", i8, "i8", [1.5], -3, 200, output_unsigned=True))
    graphs.append(_rescale_graph("rescale_i8_to_i32", i8, "i32", [1.0], 7, 0))
    graphs.append(_rescale_graph("rescale_i16_scale16", i16, "i16", [0.3], 0, 0, scale32=False))
    graphs.append(_rescale_graph("rescale_i16_to_i8", i16, "i8", [0.01], 0, 1))
    per_channel = rng.uniform(2.0**-12, 2.0**-8, size=64)
    graphs.append(_rescale_graph("rescale_per_channel", i32, "i8", list(per_channel), 0, -1))

    # CONV2D / DEPTHWISE_CONV2D: zero points, stride, dilation, padding, i16 with i48 accumulators.
    graphs.append(
        _conv_graph(
            "conv2d",
            rng,
            depthwise=False,
            input_zp=-128,
            weight_zp=0,
            stride=(1, 1),
            dilation=(1, 1),
            pad=(1, 1, 1, 0),
        )
    )
    graphs.append(
        _conv_graph(
            "conv2d_strided_dilated",
            rng,
            depthwise=False,
            input_zp=5,
            weight_zp=-3,
            stride=(2, 1),
            dilation=(1, 2),
            pad=(1, 1, 2, 1),
        )
    )
    graphs.append(
        _conv_graph(
            "conv2d_i16",
            rng,
            depthwise=False,
            input_zp=0,
            weight_zp=0,
            stride=(1, 2),
            dilation=(1, 1),
            pad=(1, 1, 1, 1),
            wide=True,
        )
    )
    graphs.append(
        _conv_graph(
            "depthwise_conv2d",
            rng,
            depthwise=True,
            input_zp=127,
            weight_zp=1,
            stride=(1, 1),
            dilation=(1, 1),
            pad=(1, 1, 0, 1),
        )
    )
    graphs.append(
        _conv_graph(
            "depthwise_conv2d_strided",
            rng,
            depthwise=True,
            input_zp=-1,
            weight_zp=0,
            stride=(2, 2),
            dilation=(2, 1),
            pad=(1, 1, 1, 1),
        )
    )

    # MATMUL: i8 with zero points, i16 with i48.
    a8, b8 = _edges(np.dtype(np.int8), (2, 5, 33), rng), _edges(np.dtype(np.int8), (2, 33, 7), rng)
    mm_type = tensor_type((2, 5, 7), "i32")
    graphs.append(
        SampleGraph(
            "matmul_i8",
            function_text(
                [a8, b8],
                [
                    const("azp", -128, "i8"),
                    const("bzp", 3, "i8"),
                    _op(
                        "y",
                        "matmul",
                        ["arg0", "arg1", "azp", "bzp"],
                        "",
                        [
                            tensor_type(a8.shape, "i8"),
                            tensor_type(b8.shape, "i8"),
                            "tensor<1xi8>",
                            "tensor<1xi8>",
                        ],
                        mm_type,
                    ),
                ],
                [("y", mm_type)],
            ),
            (a8, b8),
        )
    )
    a16, b16 = _edges(np.dtype(np.int16), (1, 4, 9), rng), _edges(np.dtype(np.int16), (1, 9, 3), rng)
    mm48 = tensor_type((1, 4, 3), "i48")
    body = [
        const("azp", 0, "i16"),
        const("bzp", 0, "i16"),
        _op(
            "y",
            "matmul",
            ["arg0", "arg1", "azp", "bzp"],
            "",
            [tensor_type(a16.shape, "i16"), tensor_type(b16.shape, "i16"), "tensor<1xi16>", "tensor<1xi16>"],
            mm48,
        ),
    ]
    narrowed = _narrow_i48(body, "y", (1, 4, 3), 2.0**-10)
    graphs.append(SampleGraph("matmul_i16", function_text([a16, b16], body, [narrowed]), (a16, b16)))

    # ADD / SUB (broadcast), MUL: i8 and i16 products, i32 with a rounding shift (ties).
    bias_row = i32[:1].copy()
    graphs.append(_binary_graph("add_i32_broadcast", "add", i32, bias_row, "i32"))
    graphs.append(_binary_graph("sub_i32", "sub", i32, i32[::-1].copy(), "i32"))
    graphs.append(_binary_graph("mul_i8", "mul", i8, i8[::-1].copy(), "i32", shift=0))
    graphs.append(_binary_graph("mul_i16", "mul", i16, i16[::-1].copy(), "i32", shift=0))
    small = (i32 >> 8).astype(np.int32)
    small[0, :6] = [3, -3, 5, -5, 1, -1]  # odd products: ties of the shift by 1
    limits = np.array([[2**31 - 1, -(2**31), 46341, -46341]], np.int32)
    graphs.append(_binary_graph("mul_i32_wraps", "mul", limits, limits[:, ::-1].copy(), "i32", shift=0))
    graphs.append(_binary_graph("mul_i32_shift1", "mul", small, np.full_like(small, 1), "i32", shift=1))
    graphs.append(_binary_graph("mul_i32_shift13", "mul", small, small[::-1].copy(), "i32", shift=13))

    # CLAMP, pools, data movement.
    graphs.append(_unary_graph("clamp_i8", i8, "clamp", "max_val = 100 : i8, min_val = -101 : i8", i8.shape))
    image = _edges(np.dtype(np.int8), (2, 7, 6, 3), rng)
    graphs.append(
        _unary_graph(
            "max_pool2d",
            image,
            "max_pool2d",
            "kernel = array<i64: 3, 2>, pad = array<i64: 1, 1, 0, 1>, stride = array<i64: 2, 1>",
            (2, 4, 6, 3),
        )
    )
    for name, input_zp, output_zp, pad, kernel, stride, out_hw in (
        ("avg_pool2d_padded", -128, 127, (1, 1, 1, 0), (3, 3), (2, 2), (4, 3)),
        ("avg_pool2d_zero_points", 7, -9, (0, 0, 0, 0), (2, 3), (1, 1), (6, 4)),
        ("avg_pool2d_global", 0, 0, (0, 0, 0, 0), (7, 6), (1, 1), (1, 1)),
    ):
        graphs.append(
            _unary_graph(
                name,
                image,
                "avg_pool2d",
                f"acc_type = i32, kernel = array<i64: {kernel[0]}, {kernel[1]}>, "
                f"pad = array<i64: {', '.join(map(str, pad))}>, "
                f"stride = array<i64: {stride[0]}, {stride[1]}>",
                (2, *out_hw, 3),
                extra=[const("izp", input_zp, "i8"), const("ozp", output_zp, "i8")],
                extra_operands=["izp", "ozp"],
                extra_types=["tensor<1xi8>", "tensor<1xi8>"],
            )
        )
    graphs.append(
        _unary_graph(
            "reshape",
            image,
            "reshape",
            "",
            (2, 42, 3),
            extra=[const_shape("shape", [2, 42, 3])],
            extra_operands=["shape"],
            extra_types=["!tosa.shape<3>"],
        )
    )
    graphs.append(
        _unary_graph("transpose", image, "transpose", "perms = array<i32: 0, 3, 1, 2>", (2, 3, 7, 6))
    )
    graphs.append(
        _unary_graph(
            "slice",
            image,
            "slice",
            "",
            (1, 3, 4, 2),
            extra=[const_shape("start", [1, 2, 1, 1]), const_shape("size", [1, 3, 4, 2])],
            extra_operands=["start", "size"],
            extra_types=["!tosa.shape<4>", "!tosa.shape<4>"],
        )
    )
    concat_type = tensor_type((2, 7, 6, 6), "i8")
    image_type = tensor_type(image.shape, "i8")
    graphs.append(
        SampleGraph(
            "concat",
            function_text(
                [image, image[::-1].copy()],
                [
                    _op(
                        "y",
                        "concat",
                        ["arg0", "arg1"],
                        "axis = 3 : i32",
                        [image_type, image_type],
                        concat_type,
                    ),
                ],
                [("y", concat_type)],
            ),
            (image, image[::-1].copy()),
        )
    )
    graphs.append(
        _unary_graph(
            "pad",
            image,
            "pad",
            "",
            (2, 8, 9, 3),
            extra=[const_shape("padding", [0, 0, 1, 0, 2, 1, 0, 0]), const("value", -128, "i8")],
            extra_operands=["padding", "value"],
            extra_types=["!tosa.shape<8>", "tensor<1xi8>"],
        )
    )
    values = _edges(np.dtype(np.int8), (2, 10, 4), rng)
    indices = rng.integers(0, 10, size=(2, 6)).astype(np.int32)
    indices[0, :2] = [0, 9]
    gather_type = tensor_type((2, 6, 4), "i8")
    graphs.append(
        SampleGraph(
            "gather",
            function_text(
                [values, indices],
                [
                    _op(
                        "y",
                        "gather",
                        ["arg0", "arg1"],
                        "",
                        [tensor_type(values.shape, "i8"), tensor_type(indices.shape, "i32")],
                        gather_type,
                    ),
                ],
                [("y", gather_type)],
            ),
            (values, indices),
        )
    )
    graphs.append(_unary_graph("reduce_sum_i32", i32, "reduce_sum", "axis = 1 : i32", (4, 1)))
    graphs.append(_unary_graph("reduce_max_i8", i8, "reduce_max", "axis = 0 : i32", (1, 64)))
    graphs.append(_unary_graph("reduce_min_i8", i8, "reduce_min", "axis = 1 : i32", (4, 1)))
    graphs.append(_binary_graph("maximum_i32", "maximum", i32, i32[::-1].copy(), "i32"))
    graphs.append(_binary_graph("minimum_i32", "minimum", i32, i32[:, ::-1].copy(), "i32"))
    # INTDIV truncates toward zero: negative dividends and divisors, never 0 (integer Softmax's division)
    signs = np.array([[1], [-1], [1], [-1]], np.int32)
    divisors = np.random.default_rng(seed + 1).integers(1, 3000, size=(4, 1)).astype(np.int32) * signs
    graphs.append(_binary_graph("intdiv_i32", "intdiv", i32, divisors, "i32"))
    graphs.append(_unary_graph("identity", i8, "identity", "", i8.shape))

    # TABLE: i8 (a quantized sigmoid) and i16 (interpolated tanh, edge inputs at the segment ends).
    sigmoid = tosa_numerics.build_table_i8(lambda v: 1 / (1 + np.exp(-v)), 0.05, -3, 1 / 256, -128)
    graphs.append(
        _unary_graph(
            "table_i8",
            i8,
            "table",
            "",
            i8.shape,
            extra=[const("table", sigmoid, "i8")],
            extra_operands=["table"],
            extra_types=["tensor<256xi8>"],
        )
    )
    tanh = tosa_numerics.build_table_i16(np.tanh, 4.0 / 32768, 0, 1.0 / 32768, 0)
    wide = i16.copy()
    wide[1, :6] = [-32768, -32641, 127, 128, 32767, 32640]
    graphs.append(
        _unary_graph(
            "table_i16",
            wide,
            "table",
            "",
            wide.shape,
            "i32",
            extra=[const("table", tanh, "i16")],
            extra_operands=["table"],
            extra_types=["tensor<513xi16>"],
        )
    )

    # CAST between integers: narrowing truncates, widening sign-extends.
    graphs.append(_unary_graph("cast_i32_to_i8", i32, "cast", "", i32.shape, "i8"))
    graphs.append(_unary_graph("cast_i8_to_i32", i8, "cast", "", i8.shape, "i32"))
    graphs.append(_unary_graph("cast_i16_to_i8", i16, "cast", "", i16.shape, "i8"))
    graphs += _float_and_logic_graphs(rng, i32)
    return graphs


def _float_and_logic_graphs(rng: np.random.Generator, i32: np.ndarray) -> list[SampleGraph]:
    """The float functions of --allow-float's islands (PRO-FP), and the comparisons / select of a token-id
    wrap: f32 inputs of both signs (positive for log / rsqrt / reciprocal / pow's base), i32 and i1."""
    graphs = []
    # IREE compiles each graph (about a second): it runs the functions the islands and the wrap emit (exp,
    # pow, reciprocal, erf, tanh, matmul, greater, select, logical_and); the rest the reference model alone
    real = (rng.standard_normal((4, 64)) * 3).astype(np.float32)
    real[0, :6] = [0.0, -0.0, 0.5, -0.5, 1.5, -2.5]  # rounding-function ties
    positive = (np.abs(real) + np.float32(0.01)).astype(np.float32)
    for op in ("exp", "tanh", "sigmoid", "erf", "abs", "floor", "ceil"):
        graphs.append(_unary_graph(f"{op}_f32", real, op, "", real.shape))
    for op in ("log", "rsqrt", "reciprocal"):
        graphs.append(_unary_graph(f"{op}_f32", positive, op, "", positive.shape))
    halves = np.full((1, 64), 0.5, np.float32)
    halves[0, :4] = [2.0, -1.0, 3.0, 0.25]
    graphs.append(_binary_graph("pow_f32", "pow", positive, halves, "f32"))
    graphs.append(_binary_graph("mul_f32", "mul", real, real[::-1].copy(), "f32", shift=0))
    for op in ("equal", "greater", "greater_equal"):
        graphs.append(_binary_graph(f"{op}_i32", op, i32, i32[:, ::-1].copy(), "i1"))
    mask = rng.integers(0, 2, size=(4, 64)).astype(np.bool_)
    graphs.append(_unary_graph("logical_not", mask, "logical_not", "", mask.shape))
    graphs.append(_binary_graph("logical_and", "logical_and", mask, mask[::-1].copy(), "i1"))
    select_types = [
        tensor_type(mask.shape, "i1"),
        tensor_type(i32.shape, "i32"),
        tensor_type(i32.shape, "i32"),
    ]
    graphs.append(
        SampleGraph(
            "select_i32",
            function_text(
                [mask, i32, i32[::-1].copy()],
                [_op("y", "select", ["arg0", "arg1", "arg2"], "", select_types, select_types[1])],
                [("y", select_types[1])],
            ),
            (mask, i32, i32[::-1].copy()),
        )
    )
    a = rng.standard_normal((2, 4, 8)).astype(np.float32)
    b = rng.standard_normal((2, 8, 3)).astype(np.float32)
    product_type = tensor_type((2, 4, 3), "f32")
    graphs.append(
        SampleGraph(
            "matmul_f32",
            function_text(
                [a, b],
                [
                    const("zero", np.zeros(1, np.float32), "f32"),
                    _op(
                        "y",
                        "matmul",
                        ["arg0", "arg1", "zero", "zero"],
                        "",
                        [
                            tensor_type(a.shape, "f32"),
                            tensor_type(b.shape, "f32"),
                            "tensor<1xf32>",
                            "tensor<1xf32>",
                        ],
                        product_type,
                    ),
                ],
                [("y", product_type)],
            ),
            (a, b),
        )
    )
    iree = {"exp_f32", "tanh_f32", "erf_f32", "reciprocal_f32", "pow_f32", "matmul_f32", "greater_i32"}
    iree |= {"select_i32", "logical_and"}
    return [
        graph if graph.name in iree else SampleGraph(graph.name, graph.mlir, graph.inputs, ("reference",))
        for graph in graphs
    ]
