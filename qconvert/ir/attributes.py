"""Builtin attributes: numbers, strings, arrays, dictionaries, dense tensors, affine maps, opaque text.

NOTE: dense values are numpy arrays, never Python lists; a 100M-element constant stays one buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qconvert.ir.types import Type


class Attribute:
    """Base of every attribute."""

    __slots__ = ()

    def __str__(self) -> str:
        from qconvert.ir.printer import print_attribute

        return print_attribute(self)


@dataclass(frozen=True, slots=True)
class UnitAttr(Attribute):
    """A present-or-absent flag (`{u}`)."""


@dataclass(frozen=True, slots=True)
class BoolAttr(Attribute):
    """`true` / `false` (an i1 integer attribute)."""

    value: bool


@dataclass(frozen=True, slots=True)
class IntegerAttr(Attribute):
    """`10 : i8`, `0 : index`."""

    value: int
    type: Type


@dataclass(frozen=True, slots=True)
class FloatAttr(Attribute):
    """`2.000000e+00 : f32`; `value` is already rounded to `type`."""

    value: float
    type: Type


@dataclass(frozen=True, slots=True)
class StringAttr(Attribute):
    """`"text"`."""

    value: str


@dataclass(frozen=True, slots=True)
class TypeAttr(Attribute):
    """A type used as an attribute (`function_type`, `t = i32`)."""

    value: Type


@dataclass(frozen=True, slots=True)
class SymbolRefAttr(Attribute):
    """`@callee` (nested references `@a::@b` keep their parts)."""

    root: str
    nested: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ArrayAttr(Attribute):
    """`[a, b, c]`."""

    elements: tuple[Attribute, ...]


@dataclass(frozen=True, slots=True)
class DictionaryAttr(Attribute):
    """`{a = 1 : i64, b}`: entries print sorted by name, as MLIR's DictionaryAttr stores them."""

    entries: tuple[tuple[str, Attribute], ...]


@dataclass(frozen=True, slots=True)
class DenseArrayAttr(Attribute):
    """`array<i64: 1, 2>`."""

    element_type: Type
    values: tuple[int | float, ...]


@dataclass(frozen=True, slots=True, eq=False)
class DenseElementsAttr(Attribute):
    """`dense<[1, 2]> : tensor<2xi8>`: a numpy array (read-only) and its tensor type.

    `is_splat` is True when every element is equal and the text form is `dense<v>`.
    """

    array: np.ndarray
    type: Type

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, DenseElementsAttr)
            and self.type == other.type
            and self.array.shape == other.array.shape
            and np.array_equal(self.array, other.array, equal_nan=self.array.dtype.kind == "f")
        )

    def __hash__(self) -> int:
        return hash((self.type, self.array.shape))

    @property
    def is_splat(self) -> bool:
        flat = self.array.reshape(-1)
        return flat.size > 0 and bool(
            np.all(flat.view(np.uint8).reshape(flat.size, -1) == flat[:1].view(np.uint8))
        )


@dataclass(frozen=True, slots=True, eq=False)
class LazyElements:
    """Shape and dtype known without touching the bytes; `load()` reads them on first use (P5)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    load: Callable[[], np.ndarray]
    _cache: list[np.ndarray] = field(default_factory=list, repr=False)

    def get(self) -> np.ndarray:
        if not self._cache:
            array = self.load()
            array.setflags(write=False)
            self._cache.append(array)
        return self._cache[0]


@dataclass(frozen=True, slots=True, eq=False)
class DenseResourceAttr(Attribute):
    """`dense_resource<name> : tensor<...>`: a large constant kept in the resource section."""

    name: str
    type: Type
    elements: LazyElements | None = None


@dataclass(frozen=True, slots=True)
class AffineMapAttr(Attribute):
    """`affine_map<(d0, d1) -> (d1)>`, kept as its canonical text (dims, symbols, result expressions)."""

    num_dims: int
    num_symbols: int
    results: tuple[str, ...]

    @property
    def text(self) -> str:
        dims = ", ".join(f"d{i}" for i in range(self.num_dims))
        symbols = f"[{', '.join(f's{i}' for i in range(self.num_symbols))}]" if self.num_symbols else ""
        return f"affine_map<({dims}){symbols} -> ({', '.join(self.results)})>"


@dataclass(frozen=True, slots=True)
class OpaqueAttr(Attribute):
    """An attribute of a dialect we do not model (`#linalg.iterator_type<parallel>`), kept as text."""

    text: str
