"""The quant type family: construction API, invariants with upstream's messages, and text round trips."""

from __future__ import annotations

import numpy as np
import pytest

from qconvert.errors import ParseError, VerifyError
from qconvert.ir import parse_type
from qconvert.ir.quant_types import (
    AnyQuantizedType,
    CalibratedQuantizedType,
    DenseParameters,
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
    UniformQuantizedType,
)
from qconvert.ir.types import F16, F32, IntegerType, RankedTensorType, Signedness


def test_per_tensor_type_built_in_code_prints_like_mlir() -> None:
    type_ = UniformQuantizedType(storage_type=IntegerType(8), expressed_type=F32, scale=0.5, zero_point=-3)
    assert str(type_) == "!quant.uniform<i8:f32, 5.000000e-01:-3>"
    assert (type_.storage_type_min, type_.storage_type_max) == (-128, 127)
    assert not type_.has_storage_type_bounds


def test_unsigned_flag_on_signless_storage_prints_u() -> None:
    type_ = UniformQuantizedType(
        storage_type=IntegerType(8), is_signed=False, expressed_type=F32, scale=1.0, storage_type_min=1
    )
    assert str(type_) == "!quant.uniform<u8<1:255>:f32, 1.000000e+00>"


@pytest.mark.parametrize("spelling", ["i8", "u8", "si8", "ui8"])
def test_four_storage_spellings_round_trip(spelling: str) -> None:
    text = f"!quant.uniform<{spelling}:f32, 1.000000e+00>"
    assert str(parse_type(text)) == text


def test_per_axis_and_sub_channel_print_separators() -> None:
    per_axis = UniformQuantizedPerAxisType(
        storage_type=IntegerType(8),
        expressed_type=F32,
        scales=(200.0, 0.99872),
        zero_points=(-120, 127),
        quantized_dimension=1,
    )
    assert str(per_axis) == "!quant.uniform<i8:f32:1, {2.000000e+02:-120,9.987200e-01:127}>"
    sub_channel = UniformQuantizedSubChannelType(
        storage_type=IntegerType(8),
        expressed_type=F32,
        scales=DenseParameters(np.array([[2.0, 3.0], [4.0, 5.0]], dtype=np.float32)),
        zero_points=DenseParameters(np.array([[120, 127], [0, 0]], dtype=np.int64)),
        quantized_dimensions=(0, 1),
        block_sizes=(1, 2),
    )
    assert str(sub_channel) == (
        "!quant.uniform<i8:f32:{0:1, 1:2}, "
        "{{2.000000e+00:120, 3.000000e+00:127}, {4.000000e+00, 5.000000e+00}}>"
    )


def test_sub_channel_zero_point_wraps_to_storage_width_like_apint() -> None:
    type_ = parse_type("!quant.uniform<u8:f32:{0:1}, {{2.0:200}}>")
    assert isinstance(type_, UniformQuantizedSubChannelType)
    assert str(type_) == "!quant.uniform<u8:f32:{0:1}, {{2.000000e+00:-56}}>"


def test_sub_channel_scale_prints_in_expressed_type_precision() -> None:
    assert (
        str(parse_type("!quant.uniform<i8:f16:{0:1}, {{0.3}}>"))
        == "!quant.uniform<i8:f16:{0:1}, {{3.000490e-01}}>"
    )


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: UniformQuantizedType(storage_type=IntegerType(33), expressed_type=F32, scale=1.0),
            "illegal storage type size: 33",
        ),
        (
            lambda: UniformQuantizedType(
                storage_type=IntegerType(8),
                expressed_type=F32,
                scale=1.0,
                storage_type_min=2,
                storage_type_max=1,
            ),
            "illegal storage min and storage max: (2:1)",
        ),
        (
            lambda: UniformQuantizedType(storage_type=IntegerType(8), expressed_type=F32, scale=-1.0),
            "scale -1.000000e+00 out of expressed type range [1.401298e-45, 3.402823e+38]",
        ),
        (
            lambda: UniformQuantizedType(storage_type=IntegerType(8), expressed_type=F16, scale=6.6e4),
            "scale 6.600000e+04 out of expressed type range [5.960464e-08, 6.550400e+04]",
        ),
        (
            lambda: UniformQuantizedPerAxisType(
                storage_type=IntegerType(8),
                expressed_type=F32,
                scales=(1.0,),
                zero_points=(0, 1),
                quantized_dimension=0,
            ),
            "illegal number of scales and zeroPoints: 1, 2",
        ),
        (
            lambda: UniformQuantizedPerAxisType(
                storage_type=IntegerType(8),
                expressed_type=F32,
                scales=(1.0,),
                zero_points=(0,),
                quantized_dimension=-1,
            ),
            "illegal quantized dimension: -1",
        ),
        (
            lambda: CalibratedQuantizedType(F32, 1.0, -1.0),
            "illegal min and max: (1.000000e+00:-1.000000e+00)",
        ),
        (
            lambda: AnyQuantizedType(storage_type=IntegerType(8), expressed_type=IntegerType(8)),
            "expressed type must be floating point",
        ),
    ],
)
def test_invalid_types_cannot_be_built(build: object, message: str) -> None:
    with pytest.raises(VerifyError) as raised:
        build()  # type: ignore[operator]
    assert raised.value.message == message


def test_parse_error_names_line_and_column() -> None:
    with pytest.raises(ParseError) as raised:
        parse_type("!quant.uniform<i8<-4:3>:f32, 0.99872:127 23>")
    assert raised.value.message == "expected '>'"
    assert (raised.value.loc.line, raised.value.loc.column) == (1, 42)  # type: ignore[union-attr]


def test_types_are_structural_values() -> None:
    first = parse_type("tensor<2x?x!quant.uniform<i8:f32:0, {1.0,2.0}>>")
    second = parse_type("tensor<2x?x!quant.uniform<i8:f32:0, {1.0,2.0}>>")
    assert first == second and hash(first) == hash(second)
    assert isinstance(first, RankedTensorType) and first.shape == (2, -1)
    assert parse_type("si8") == IntegerType(8, Signedness.SIGNED)


def test_float_storage_default_bounds_are_the_finite_range() -> None:
    type_ = parse_type("!quant.uniform<f8E4M3FN:f32, 1.0>")
    assert (type_.storage_type_min, type_.storage_type_max) == (-448, 448)  # type: ignore[attr-defined]
    assert str(parse_type("!quant.uniform<f8E4M3FN<-100:100>:f32, 1.0>")) == (
        "!quant.uniform<f8E4M3FN<-100:100>:f32, 1.000000e+00>"
    )


def test_large_per_axis_type_keeps_scales_as_given() -> None:
    scales = tuple(float(s) for s in np.linspace(0.001, 1.0, 65536))
    type_ = UniformQuantizedPerAxisType(
        storage_type=IntegerType(8),
        expressed_type=F32,
        scales=scales,
        zero_points=(0,) * 65536,
        quantized_dimension=0,
    )
    assert parse_type(str(type_)) == type_
