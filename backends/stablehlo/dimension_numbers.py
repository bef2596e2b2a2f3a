"""StableHLO's dimension-number attributes as small frozen values: built and printed here, parsed back once.

    dot  ::= `#stablehlo.dot<` field (`,` field)* `>`     field ::= name `=` `[` (int (`,` int)*)? `]`
    conv ::= `#stablehlo.conv<` layout `x` layout `->` layout `>`   layout ::= `[` dim (`,` dim)* `]`
             dim ::= `b` | `f` | `i` | `o` | int   (batch, feature; kernel input / output feature; spatial)

The printed text is jaxlib's own (`stablehlo.dot_general` / `stablehlo.convolution` in generic form), kept
in the op as an `OpaqueAttr` (our printer prints it as it is); whoever needs the numbers (the fusion, a
TOSA legalizer) parses the attribute with `DotDimensionNumbers.parse` / `ConvDimensionNumbers.parse`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from qconvert.ir.attributes import Attribute, OpaqueAttr

__all__ = ["ConvDimensionNumbers", "DotDimensionNumbers"]

DOT_FIELDS = ("lhs_batching", "rhs_batching", "lhs_contracting", "rhs_contracting")
_DOT = re.compile(r"#stablehlo\.dot<(.*)>", re.DOTALL)
_DOT_FIELD = re.compile(r"\s*(\w+)_dimensions\s*=\s*\[([^\]]*)\]\s*(?:,|$)")
_CONV = re.compile(r"#stablehlo\.conv<\s*\[([^\]]*)\]\s*x\s*\[([^\]]*)\]\s*->\s*\[([^\]]*)\]\s*>")


def _listed(values: Sequence[int | str]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _opaque_text(attribute: Attribute, what: str) -> str:
    if not isinstance(attribute, OpaqueAttr):
        raise ValueError(f"expected a {what} attribute, got {attribute}")
    return attribute.text


@dataclass(frozen=True, slots=True)
class DotDimensionNumbers:
    """`#stablehlo.dot<...>`: the batching and contracting dims of each side of a dot_general."""

    lhs_batching: tuple[int, ...] = ()
    rhs_batching: tuple[int, ...] = ()
    lhs_contracting: tuple[int, ...] = ()
    rhs_contracting: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.lhs_batching) != len(self.rhs_batching):
            raise ValueError("lhs and rhs should have the same number of batching dimensions")
        if len(self.lhs_contracting) != len(self.rhs_contracting):
            raise ValueError("lhs and rhs should have the same number of contracting dimensions")

    def attribute(self) -> OpaqueAttr:
        """The text jaxlib prints: batching fields when there are any, contracting fields always."""
        parts = []
        if self.lhs_batching:
            parts.append(f"lhs_batching_dimensions = {_listed(self.lhs_batching)}")
            parts.append(f"rhs_batching_dimensions = {_listed(self.rhs_batching)}")
        parts.append(f"lhs_contracting_dimensions = {_listed(self.lhs_contracting)}")
        parts.append(f"rhs_contracting_dimensions = {_listed(self.rhs_contracting)}")
        return OpaqueAttr(f"#stablehlo.dot<{', '.join(parts)}>")

    @classmethod
    def parse(cls, attribute: Attribute) -> DotDimensionNumbers:
        """The numbers of a `#stablehlo.dot<...>` attribute (fields in any order, absent ones empty)."""
        text = _opaque_text(attribute, "#stablehlo.dot")
        match = _DOT.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"expected #stablehlo.dot<...>, got {text}")
        fields: dict[str, tuple[int, ...]] = {}
        body, position = match.group(1), 0
        while position < len(body.rstrip()):
            field = _DOT_FIELD.match(body, position)
            if field is None or field.group(1) not in DOT_FIELDS or field.group(1) in fields:
                raise ValueError(f"bad field in {text} at '{body[position:]}'")
            fields[field.group(1)] = tuple(int(v) for v in field.group(2).split(",") if v.strip())
            position = field.end()
        return cls(**fields)

    def rhs_free(self, rhs_rank: int) -> list[int]:
        """The rhs dims that are neither batching nor contracting (the result's last dims, in order)."""
        return [d for d in range(rhs_rank) if d not in self.rhs_batching + self.rhs_contracting]


Dim = int | str
"""One entry of a convolution layout: `b` / `f` (batch, feature), `i` / `o` (kernel features), or the
index of a spatial dim."""


@dataclass(frozen=True, slots=True)
class ConvDimensionNumbers:
    """`#stablehlo.conv<[input]x[kernel]->[output]>`: which dim of each operand is which."""

    input: tuple[Dim, ...]
    kernel: tuple[Dim, ...]
    output: tuple[Dim, ...]

    @classmethod
    def onnx(cls, spatial: int) -> ConvDimensionNumbers:
        """ONNX's layouts: input NC<spatial>, kernel OI<spatial>, output NC<spatial>."""
        dims = tuple(range(spatial))
        return cls(("b", "f", *dims), ("o", "i", *dims), ("b", "f", *dims))

    @classmethod
    def channels_last(cls, spatial: int) -> ConvDimensionNumbers:
        """NHWC input and output, HWIO kernel (what quant-to-math's per-axis kernels need)."""
        dims = tuple(range(spatial))
        return cls(("b", *dims, "f"), (*dims, "i", "o"), ("b", *dims, "f"))

    def attribute(self) -> OpaqueAttr:
        layouts = f"{_listed(self.input)}x{_listed(self.kernel)}->{_listed(self.output)}"
        return OpaqueAttr(f"#stablehlo.conv<{layouts}>")

    @classmethod
    def parse(cls, attribute: Attribute) -> ConvDimensionNumbers:
        text = _opaque_text(attribute, "#stablehlo.conv")
        match = _CONV.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"expected #stablehlo.conv<[...]x[...]->[...]>, got {text}")

        def layout(body: str) -> tuple[Dim, ...]:
            entries = [entry.strip() for entry in body.split(",")]
            return tuple(int(e) if e.lstrip("-").isdigit() else e for e in entries)

        return cls(layout(match.group(1)), layout(match.group(2)), layout(match.group(3)))
