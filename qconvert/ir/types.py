"""Builtin MLIR types: integers, floats, index, none, tensors, functions, and opaque dialect types.

NOTE: types are immutable values; equality is structural. Printing lives in `printer.py`, parsing in
`parser.py`; each type's `__str__` defers to the printer so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qconvert.ir.attributes import Attribute

DYNAMIC = -1
"""A dynamic (`?`) dimension of a ranked tensor."""


class Type:
    """Base of every IR type."""

    __slots__ = ()

    def __str__(self) -> str:
        from qconvert.ir.printer import print_type

        return print_type(self)


class Signedness(Enum):
    SIGNLESS = ""
    SIGNED = "s"
    UNSIGNED = "u"


@dataclass(frozen=True, slots=True)
class IntegerType(Type):
    """`i8`, `si8`, `ui8`: an integer of `width` bits with MLIR's three signedness spellings."""

    width: int
    signedness: Signedness = Signedness.SIGNLESS

    @property
    def is_signless(self) -> bool:
        return self.signedness is Signedness.SIGNLESS

    @property
    def is_unsigned(self) -> bool:
        return self.signedness is Signedness.UNSIGNED


FLOAT_TYPE_NAMES = (
    "f16", "bf16", "f32", "f64", "f80", "f128", "tf32",
    "f8E5M2", "f8E4M3", "f8E4M3FN", "f8E5M2FNUZ", "f8E4M3FNUZ", "f8E4M3B11FNUZ", "f8E3M4", "f8E8M0FNU",
    "f6E2M3FN", "f6E3M2FN", "f4E2M1FN",
)  # fmt: skip
FLOAT_BIT_WIDTHS = {
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "f80": 80, "f128": 128, "tf32": 19,
    "f8E5M2": 8, "f8E4M3": 8, "f8E4M3FN": 8, "f8E5M2FNUZ": 8, "f8E4M3FNUZ": 8, "f8E4M3B11FNUZ": 8,
    "f8E3M4": 8, "f8E8M0FNU": 8, "f6E2M3FN": 6, "f6E3M2FN": 6, "f4E2M1FN": 4,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class FloatType(Type):
    """A builtin float type, named as MLIR spells it (`f32`, `bf16`, `f8E4M3FN`, ...)."""

    name: str

    def __post_init__(self) -> None:
        assert self.name in FLOAT_BIT_WIDTHS, self.name

    @property
    def width(self) -> int:
        return FLOAT_BIT_WIDTHS[self.name]


@dataclass(frozen=True, slots=True)
class IndexType(Type):
    """`index`."""


@dataclass(frozen=True, slots=True)
class NoneType(Type):
    """`none`."""


@dataclass(frozen=True, slots=True)
class RankedTensorType(Type):
    """`tensor<2x?x4xf32>`: `shape` holds DYNAMIC (-1) for `?`."""

    shape: tuple[int, ...]
    element_type: Type
    encoding: Attribute | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    def has_static_shape(self) -> bool:
        return DYNAMIC not in self.shape

    def with_element_type(self, element_type: Type) -> RankedTensorType:
        return RankedTensorType(self.shape, element_type, self.encoding)


@dataclass(frozen=True, slots=True)
class UnrankedTensorType(Type):
    """`tensor<*xf32>`."""

    element_type: Type

    def with_element_type(self, element_type: Type) -> UnrankedTensorType:
        return UnrankedTensorType(element_type)


TensorType = RankedTensorType | UnrankedTensorType


@dataclass(frozen=True, slots=True)
class VectorType(Type):
    """`vector<4xf32>`, kept so that generic ops using vectors round-trip."""

    shape: tuple[int, ...]
    element_type: Type
    scalable: tuple[bool, ...] = ()


@dataclass(frozen=True, slots=True)
class FunctionType(Type):
    """`(i8, f32) -> f32`."""

    inputs: tuple[Type, ...]
    results: tuple[Type, ...]


@dataclass(frozen=True, slots=True)
class OpaqueType(Type):
    """A type of an unregistered dialect, kept as text: `body` is everything after the `!`."""

    dialect: str
    body: str


def element_type_of(type_: Type) -> Type:
    """The element type of a tensor or vector, or the type itself for a scalar."""
    if isinstance(type_, RankedTensorType | UnrankedTensorType | VectorType):
        return type_.element_type
    return type_


def with_element_type(type_: Type, element_type: Type) -> Type:
    """`type_` with its element type replaced (the type itself when it is a scalar)."""
    if isinstance(type_, RankedTensorType):
        return RankedTensorType(type_.shape, element_type, type_.encoding)
    if isinstance(type_, UnrankedTensorType):
        return UnrankedTensorType(element_type)
    if isinstance(type_, VectorType):
        return VectorType(type_.shape, element_type, type_.scalable)
    return element_type


def is_tensor(type_: Type) -> bool:
    return isinstance(type_, RankedTensorType | UnrankedTensorType)


def is_signless_integer(type_: Type) -> bool:
    return isinstance(type_, IntegerType) and type_.signedness is Signedness.SIGNLESS


I1 = IntegerType(1)
I8 = IntegerType(8)
I32 = IntegerType(32)
I64 = IntegerType(64)
F16 = FloatType("f16")
BF16 = FloatType("bf16")
F32 = FloatType("f32")
F64 = FloatType("f64")
INDEX = IndexType()
