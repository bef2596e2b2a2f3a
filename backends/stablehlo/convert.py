"""The StableHLO backend's entry points: a lifted IR module -> a StableHLO module (or its text).

    from qconvert.backends.stablehlo.convert import convert_to_stablehlo
    stablehlo_module = convert_to_stablehlo(module, form="quantized", semantics="onnx")

`convert_to_stablehlo` lowers `func.func @main` op by op (the table `stablehlo_lowerings()` builds: quant
casts in lower_quant.py, ONNX ops in the `onnx_*.py` modules it lists), then, in the `quantized` form, fuses
`uniform_dequantize -> op -> quantize` where that is exact (the `stablehlo-legalize-qdq-to-quantized-op`
pass), and erases dead ops (`dce`). The result is our IR, printed by our printer (`print_module` /
`write_module`); jaxlib parses that text.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import IO, NamedTuple

from qconvert.ir.attributes import DenseElementsAttr, DenseResourceAttr, OpaqueAttr
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.printer import print_module, write_module_to
from qconvert.passes.dce import erase_unused

from . import onnx_fold
from .engine_profile import JAXLIB, EngineProfile, apply_division_guards
from .legalize_qdq_to_quantized_op import QdqSources, legalize_qdq_to_quantized_op
from .lowering import Form, LoweringTable, Semantics, find_main, lower_module

LOWERING_MODULES = (
    "lower_quant",
    "onnx_contrib",
    "onnx_einsum",
    "onnx_elementwise",
    "onnx_fold",
    "onnx_grid_sample",
    "onnx_index",
    "onnx_integer",
    "onnx_integer_to_float",
    "onnx_layout",
    "onnx_logic",
    "onnx_math",
    "onnx_misc",
    "onnx_nn",
    "onnx_norm",
    "onnx_pool_indices",
    "onnx_qoperator",
    "onnx_quantized_transformer",
    "onnx_recurrent",
    "onnx_reduce",
    "onnx_reduce_more",
    "onnx_resize",
    "onnx_shape",
    "onnx_spectral",
)
"""The modules of this package whose `@lowers` / `@lowers_folding` functions make the StableHLO table (a
new lowering module is one line here; a test checks that every `onnx_*.py` is listed)."""


def stablehlo_lowerings() -> LoweringTable:
    """A new table of every StableHLO lowering (quant casts, ONNX ops), folding by `onnx_fold.fold`."""
    table = LoweringTable(folder=onnx_fold.fold)
    for name in LOWERING_MODULES:
        table.add_module(importlib.import_module(f"{__package__}.{name}"))
    return table


@dataclass(frozen=True, slots=True)
class ConversionStats:
    """What the conversion did, for reports: ops fused in the quantized form, ops erased as dead."""

    fused_ops: int
    erased_ops: int


class Conversion(NamedTuple):
    """`convert_with_stats`'s result: the StableHLO module and what the conversion did (unpacks as a pair)."""

    module: ModuleOp
    stats: ConversionStats


def convert_to_stablehlo(
    module: ModuleOp,
    form: Form | str = Form.QUANTIZED,
    semantics: Semantics | str = Semantics.ONNX,
    *,
    inline_weights: bool = False,
    fuse_arithmetic: bool = False,
    lowerings: LoweringTable | None = None,
    engine_profile: EngineProfile | None = JAXLIB,
) -> ModuleOp:
    """A new module holding `@main` as `stablehlo.*` ops in `form` (quantized, integer, qdq).

    `semantics="onnx"` (default) keeps every quantize ONNX-exact; `"stablehlo"` uses uniform_quantize
    everywhere. `inline_weights=True` writes `dense_resource` weights inline as `dense<"0x...">`, which
    the engines need (XLA refuses dense_resource; the interpreter misreads blobs parsed from text).
    `fuse_arithmetic=True` (quantized form) also fuses add / dot_general / convolution.
    `lowerings` is the table to lower with (default: `stablehlo_lowerings()`). `engine_profile` says what
    the engines that will run the module get wrong (default: jaxlib's, whose write-outs and division
    guards every output so far has); None gives the pure form (`!quant.uniform` wherever StableHLO has
    the type, no barriers), which a TOSA legalizer consumes.
    Raises InputError listing every op that cannot be lowered.
    """
    converted, _ = convert_with_stats(
        module,
        form,
        semantics,
        inline_weights=inline_weights,
        fuse_arithmetic=fuse_arithmetic,
        lowerings=lowerings,
        engine_profile=engine_profile,
    )
    return converted


def convert_with_stats(
    module: ModuleOp,
    form: Form | str = Form.QUANTIZED,
    semantics: Semantics | str = Semantics.ONNX,
    *,
    inline_weights: bool = False,
    fuse_arithmetic: bool = False,
    lowerings: LoweringTable | None = None,
    engine_profile: EngineProfile | None = JAXLIB,
) -> Conversion:
    """`convert_to_stablehlo` and what it did."""
    form, semantics = Form(form), Semantics(semantics)
    table = lowerings if lowerings is not None else stablehlo_lowerings()
    converted, context = lower_module(
        module, table, form, semantics, inline_weights=inline_weights, engine_profile=engine_profile
    )
    apply_division_guards(converted, engine_profile)  # before dce: its count includes dead barriers
    body = find_main(converted).body
    fused = 0
    if form is Form.QUANTIZED:
        sources = QdqSources.of(context)
        fused = legalize_qdq_to_quantized_op(body, sources, fuse_arithmetic=fuse_arithmetic)
    erased = erase_unused(body, lambda op: True)  # every op a lowering emits is pure
    return Conversion(converted, ConversionStats(fused, erased))


def stablehlo_text(
    module: ModuleOp,
    form: Form | str = Form.QUANTIZED,
    semantics: Semantics | str = Semantics.ONNX,
    *,
    inline_weights: bool = False,
    fuse_arithmetic: bool = False,
    lowerings: LoweringTable | None = None,
    engine_profile: EngineProfile | None = JAXLIB,
) -> str:
    """The MLIR text of `convert_to_stablehlo(...)` (weights as a `dense_resource` section unless inlined)."""
    converted = convert_to_stablehlo(
        module,
        form,
        semantics,
        inline_weights=inline_weights,
        fuse_arithmetic=fuse_arithmetic,
        lowerings=lowerings,
        engine_profile=engine_profile,
    )
    return print_module(converted)


ELIDED = "__elided__"


def elide_weights(module: ModuleOp, threshold: int = 16) -> int:
    """Replace `stablehlo.constant`s of more than `threshold` elements (and every `dense_resource`) by
    `dense_resource<__elided__>`, as MLIR prints elided resources; returns how many."""
    elided = 0
    for op in module.walk():
        if op.name != "stablehlo.constant":
            continue
        value = op.attributes["value"]
        is_large = isinstance(value, DenseElementsAttr) and value.array.size > threshold
        if is_large or isinstance(value, DenseResourceAttr | OpaqueAttr):
            op.attributes["value"] = DenseResourceAttr(ELIDED, op.result.type)
            elided += 1
    return elided


def write_stablehlo(converted: ModuleOp, output: str | IO[str]) -> None:
    """Write a converted module to a stream, or to a path atomically (temporary file, then rename)."""
    write_module_to(converted, output)
