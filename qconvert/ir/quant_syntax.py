"""Parses the bodies of `!quant.*` types (upstream TypeParser.cpp); printing is in `printer.py`.

Each function's docstring carries its production; messages and their order are upstream's, including the
two-diagnostic failures (`expected ':'` then `calibrated values must be present`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from qconvert.errors import ParseError, VerifyError
from qconvert.ir.float_format import round_to_float_type
from qconvert.ir.lexer import integer_width
from qconvert.ir.quant_types import (
    MAX_STORAGE_BITS,
    QUANT_FLOAT_STORAGE_TYPES,
    AnyQuantizedType,
    CalibratedQuantizedType,
    DenseParameters,
    QuantileQuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
    UniformQuantizedType,
    check_scale_in_expressed_range,
    default_storage_range,
    float_dtype,
    wrap_to_width,
)
from qconvert.ir.types import FloatType, IntegerType, Signedness, Type

if TYPE_CHECKING:
    from qconvert.ir.parser import Parser

UNSIGNED_KEYWORD = re.compile(r"u([0-9]+)\Z")
INTEGER_TYPE = re.compile(r"(si|ui|i)([0-9]+)\Z")


def parse_quant_type(parser: Parser) -> Type:
    """quant-type ::= `uniform` ... | `any` ... | `calibrated` ... | `quantile` ..."""
    name_position = parser.token.start
    if parser.token.kind != "bare":
        raise parser.error("expected valid keyword")
    keyword = parser.advance().text
    parse = {
        "uniform": parse_uniform_type,
        "any": parse_any_type,
        "calibrated": parse_calibrated_type,
        "quantile": parse_quantile_type,
    }.get(keyword)
    if parse is None:
        raise parser.error(f"unknown quantized type {keyword}", name_position)
    try:
        return parse(parser)
    except VerifyError as error:  # getChecked: the type's invariants, reported at the type's name
        raise ParseError(error.message, parser.location(name_position)) from None


def parse_storage_type(parser: Parser) -> tuple[IntegerType | FloatType, bool]:
    """storage-type ::= (`i` | `si` | `ui` | `u`) integer-literal | small-float-type

    Returns the storage type and the signed flag (`u8` is signless i8 storage with the flag cleared).
    """
    token = parser.token
    if token.kind != "bare":
        raise parser.error("illegal storage type prefix")
    text = token.text
    storage: IntegerType | FloatType
    if (match := INTEGER_TYPE.match(text)) is not None:
        width = integer_width(match.group(2))
        if width > 16777215:
            raise parser.error("invalid integer width")
        signedness = {"i": Signedness.SIGNLESS, "si": Signedness.SIGNED, "ui": Signedness.UNSIGNED}[
            match.group(1)
        ]
        storage, is_signed = IntegerType(width, signedness), signedness is not Signedness.UNSIGNED
    elif (match := UNSIGNED_KEYWORD.match(text)) is not None:
        storage, is_signed = IntegerType(integer_width(match.group(1))), False
    elif text in QUANT_FLOAT_STORAGE_TYPES:
        storage, is_signed = FloatType(text), True
    else:
        raise parser.error("illegal storage type prefix")
    width = storage.width
    if isinstance(storage, IntegerType) and (width == 0 or width > MAX_STORAGE_BITS):
        raise parser.error(f"illegal storage type size: {width}")
    parser.advance()
    return storage, is_signed


def parse_storage_range(parser: Parser, storage: IntegerType | FloatType, is_signed: bool) -> tuple[int, int]:
    """storage-range ::= (`<` integer `:` integer `>`)?  (checked against the storage type's full range)"""
    default_min, default_max = default_storage_range(storage, is_signed)
    if not parser.try_consume("<"):
        return default_min, default_max
    min_position = parser.token.start
    storage_min = parser.parse_integer()
    parser.expect(":")
    max_position = parser.token.start
    storage_max = parser.parse_integer()
    parser.expect(">")
    if storage_min < default_min:
        raise parser.error(f"illegal storage type minimum: {storage_min}", min_position)
    if storage_max > default_max:
        raise parser.error(f"illegal storage type maximum: {storage_max}", max_position)
    return storage_min, storage_max


def parse_float_type(parser: Parser) -> FloatType:
    """A type that must be a float: anything else is `invalid kind of type specified`."""
    position = parser.token.start
    type_ = parser.parse_type()
    if not isinstance(type_, FloatType):
        raise parser.error("invalid kind of type specified", position)
    return type_


def parse_quant_params(parser: Parser, expressed_type: FloatType) -> tuple[float, int]:
    """scale-zero ::= float-literal (`:` integer-literal)?  (the scale is range-checked right away)"""
    scale = parser.parse_float()
    try:
        check_scale_in_expressed_range(scale, expressed_type)
    except VerifyError as error:
        raise parser.error(error.message) from None
    zero_point = parser.parse_integer() if parser.try_consume(":") else 0
    return scale, zero_point


def parse_uniform_type(parser: Parser) -> Type:
    """uniform ::= `<` storage-spec `:` expressed-type (`:` axis | `:` block-size-info)? `,` params `>`

    block-size-info ::= `{` (integer `:` integer (`,` integer `:` integer)*)? `}`
    params ::= scale-zero | `{` scale-zero-tensor `}`
    """
    parser.expect("<")
    storage, is_signed = parse_storage_type(parser)
    storage_min, storage_max = parse_storage_range(parser, storage, is_signed)
    parser.expect(":")
    expressed_type = parse_float_type(parser)
    quantized_dimension: int | None = None
    block_sizes: list[tuple[int, int]] | None = None
    if parser.try_consume(":"):
        if parser.try_consume("{"):
            block_sizes = []
            if not parser.try_consume("}"):
                while True:
                    axis = parser.parse_integer(bits=32)
                    parser.expect(":")
                    block_sizes.append((axis, parser.parse_integer()))
                    if not parser.try_consume(","):
                        break
                parser.expect("}")
        else:
            quantized_dimension = parser.parse_integer(bits=32)
    parser.expect(",")
    common = dict(
        storage_type=storage,
        expressed_type=expressed_type,
        is_signed=is_signed,
        storage_type_min=storage_min,
        storage_type_max=storage_max,
    )
    if quantized_dimension is None and block_sizes is None:
        scale, zero_point = parse_quant_params(parser, expressed_type)
        parser.expect(">")
        return UniformQuantizedType(scale=scale, zero_point=zero_point, **common)  # type: ignore[arg-type]
    parser.expect("{")
    scales: list[float] = []
    zero_points: list[int] = []
    dims = parse_quant_param_list(parser, expressed_type, scales, zero_points)
    parser.expect(">")
    if block_sizes is None:
        return UniformQuantizedPerAxisType(
            scales=tuple(scales),
            zero_points=tuple(zero_points),
            quantized_dimension=quantized_dimension,  # type: ignore[arg-type]
            **common,  # type: ignore[arg-type]
        )
    dtype = float_dtype(expressed_type)
    rounded = [round_to_float_type(s, expressed_type.name) for s in scales]
    return UniformQuantizedSubChannelType(
        scales=DenseParameters(np.array(rounded, dtype=np.float64).astype(dtype).reshape(dims)),
        zero_points=DenseParameters(
            wrap_to_width(np.array(zero_points, dtype=np.int64), storage.width).reshape(dims)
        ),
        quantized_dimensions=tuple(a for a, _ in block_sizes),
        block_sizes=tuple(b for _, b in block_sizes),
        **common,  # type: ignore[arg-type]
    )


def parse_quant_param_list(
    parser: Parser, expressed_type: FloatType, scales: list[float], zero_points: list[int]
) -> list[int]:
    """scale-zero-tensor ::= scale-zero-list | `{` scale-zero-tensor (`,` scale-zero-tensor)* `}`

    Called after the opening `{`; returns the dimensions of the nested list.
    """
    inner: list[int] | None = None
    size = 0
    while True:
        if parser.try_consume("{"):
            parser.enter_nesting()
            try:
                these = parse_quant_param_list(parser, expressed_type, scales, zero_points)
            finally:
                parser.exit_nesting()
        else:
            scale, zero_point = parse_quant_params(parser, expressed_type)
            scales.append(scale)
            zero_points.append(zero_point)
            these = []
        size += 1
        if inner is None:
            inner = these
        elif inner != these:
            raise parser.error("tensor literal is invalid; ranks are not consistent between elements")
        if not parser.try_consume(","):
            break
    parser.expect("}")
    return [size, *(inner or [])]


def parse_any_type(parser: Parser) -> Type:
    """any ::= `<` storage-spec (`:` expressed-type)? `>`"""
    parser.expect("<")
    storage, is_signed = parse_storage_type(parser)
    storage_min, storage_max = parse_storage_range(parser, storage, is_signed)
    expressed_type = parse_float_type(parser) if parser.try_consume(":") else None
    parser.expect(">")
    return AnyQuantizedType(
        storage_type=storage,
        expressed_type=expressed_type,
        is_signed=is_signed,
        storage_type_min=storage_min,
        storage_type_max=storage_max,
    )


def parse_calibrated_type(parser: Parser) -> Type:
    """calibrated ::= `<` expressed-type `<` float `:` float `>` `>`"""
    parser.expect("<")
    type_position = parser.token.start
    try:
        expressed_type = parse_float_type(parser)
    except ParseError as error:
        raise parser.error("expecting float expressed type", type_position, error.diagnostics()) from None
    try:
        parser.expect("<")
        minimum = parser.parse_float()
        parser.expect(":")
        maximum = parser.parse_float()
        parser.expect(">")
    except ParseError as error:
        raise parser.error("calibrated values must be present", type_position, error.diagnostics()) from None
    parser.expect(">")
    return CalibratedQuantizedType(expressed_type, minimum, maximum)


def parse_quantile_type(parser: Parser) -> Type:
    """quantile ::= `<` storage-type `:` quantile-type `,` `{` float (`,` float)* `}` bounds? `>`

    bounds ::= `,` `<` integer `:` integer `>`
    """
    parser.expect("<")
    storage = parser.parse_type()  # a builtin type: `u4` is not one, `ui4` is
    is_signed = not (isinstance(storage, IntegerType) and storage.is_unsigned)
    parser.expect(":")
    quantile_type = parser.parse_type()
    parser.expect(",")
    parser.expect("{")
    quantiles: list[float] = []
    if not parser.try_consume("}"):
        while True:
            quantiles.append(parser.parse_float())
            if not parser.try_consume(","):
                break
        parser.expect("}")
    bounds: dict[str, int] = {}
    if parser.try_consume(","):
        parser.expect("<")
        bounds["storage_type_min"] = parser.parse_integer()
        parser.expect(":")
        bounds["storage_type_max"] = parser.parse_integer()
        parser.expect(">")
    parser.expect(">")
    return QuantileQuantizedType(
        storage_type=storage,
        quantile_type=quantile_type,
        quantiles=tuple(quantiles),
        is_signed=is_signed,
        has_explicit_range=bool(bounds),
        **bounds,
    )
