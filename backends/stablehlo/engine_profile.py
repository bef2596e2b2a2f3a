"""What the engines that will run a StableHLO module cannot run as the spec says, so the lowering writes it
otherwise: an engine profile, owned beside the jaxlib runner (run.py) and consulted by the lowering.

`convert_to_stablehlo(..., engine_profile=JAXLIB)` (the default, and what every output so far was made with)
writes out, as plain arithmetic, the quantizations jaxlib 0.10.2's `stablehlo-legalize-quant-to-math` gets
wrong, and guards ONNX's divisions against XLA:CPU's reciprocal rewrite. `engine_profile=None` gives the pure
quantized form: `!quant.uniform` types wherever StableHLO has one (what a TOSA legalizer consumes), and no
barriers. Light to import: no jax.
"""

from __future__ import annotations

from dataclasses import dataclass

from qconvert.ir.core import Block, Builder, Operation
from qconvert.ir.quant_types import QuantizedType, UniformQuantizedPerAxisType
from qconvert.ir.types import F32, RankedTensorType, Type

from .ops import EXACT_DIVIDE, optimization_barrier

__all__ = [
    "JAXLIB",
    "NOTE_AXIS",
    "NOTE_EXPRESSED",
    "NOTE_UNSIGNED",
    "EngineProfile",
    "apply_division_guards",
]

NOTE_EXPRESSED = "written out: stablehlo-legalize-quant-to-math accepts f32 expressed types only"
NOTE_UNSIGNED = (
    "written out: stablehlo-legalize-quant-to-math reads u8 storage as signed (measured, jaxlib 0.10.2)"
)
NOTE_AXIS = (
    "written out: stablehlo-legalize-quant-to-math fails on a per-axis type whose axis is not the last "
    "(chlo broadcast_dimensions not prefix-padded, measured, jaxlib 0.10.2)"
)


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Each field one thing the engines get wrong, with the workaround the lowering applies for it."""

    name: str
    f32_expressed_only: bool = False  # quantizations of f16 / bf16 expressed types written out
    signed_storage_only: bool = False  # u8 storage written out (read as signed)
    per_axis_last_dim_only: bool = False  # per-axis types whose axis is not the last written out
    guard_divisions: bool = False  # an optimization_barrier on the divisor of ONNX's divisions

    def limitation(self, quant_type: QuantizedType, type_: Type) -> str | None:
        """Why these engines cannot run uniform_quantize / uniform_dequantize of `quant_type` (a type
        StableHLO has) in `type_` as the spec says, or None."""
        if self.f32_expressed_only and quant_type.expressed_type != F32:
            return NOTE_EXPRESSED
        if self.signed_storage_only and not quant_type.is_signed:
            return NOTE_UNSIGNED
        is_per_axis = isinstance(quant_type, UniformQuantizedPerAxisType) and isinstance(
            type_, RankedTensorType
        )
        if self.per_axis_last_dim_only and is_per_axis and quant_type.quantized_dimension != type_.rank - 1:  # type: ignore[union-attr]
            return NOTE_AXIS
        return None


JAXLIB = EngineProfile(
    "jaxlib 0.10.2 (StableHLO interpreter, XLA:CPU)",
    f32_expressed_only=True,
    signed_storage_only=True,
    per_axis_last_dim_only=True,
    guard_divisions=True,
)
"""run.py's engines: quant-to-math reads u8 as signed (llvm/llvm-project#185952), fails on a per-axis type
whose axis is not the last, accepts f32 expressed types only; XLA:CPU's simplifier turns `x / c` into
`x * (1 / c)`, an ulp off for many elements."""


def apply_division_guards(root: Operation, profile: EngineProfile | None) -> None:
    """Settle the divisions `ops.exact_divide` marked: under a profile that guards them, the divisor goes
    through an `optimization_barrier` inserted just before the divide; the mark is removed either way."""
    guard = profile is not None and profile.guard_divisions
    for op in list(root.walk()):
        for region in op.regions:
            for block in region.blocks:
                _settle_divisions(block, guard)


def _settle_divisions(block: Block, guard: bool) -> None:
    index = 0
    while index < len(block.ops):
        op = block.ops[index]
        if EXACT_DIVIDE in op.attributes:
            del op.attributes[EXACT_DIVIDE]
            if guard:
                op.set_operand(1, optimization_barrier(Builder(block, index), op.operands[1]))
                index += 1  # the barrier now sits where the divide was
        index += 1
