"""The StableHLO backend behind `qconvert.backends`' interface: options, conversion, writer, check runner.

Light to import (the CLI reads the options' help): the converter, jaxlib's runner and the check runner
load when first used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from qconvert.errors import InputError
from qconvert.options import CHOICES, check_choice, flag, option, option_fields

from .forms import DEFAULT_ENGINE, ENGINE_NAMES, Form, Semantics

if TYPE_CHECKING:
    from qconvert.ir.dialects.builtin import ModuleOp

    from .check import Lift, StableHLOCheckRunner

# `check` judges quantized ops and their integer expansion; the qdq form's float ops between the casts
# are the source model's own, which the per-node check of the interpreter backend already judges.
CHECKED_FORMS = (Form.QUANTIZED.value, Form.INTEGER.value)
# What only `convert` writes: `check` converts its cases itself, weights as arguments.
CONVERT_ONLY = ("inline_weights", "elide_weights")


@dataclass(frozen=True, kw_only=True)
class StableHLOOptions:
    """`--form`, `--semantics`, `--fuse-arithmetic`, `--inline-weights`, `--elide-weights`."""

    form: str = option(Form.QUANTIZED.value, "the StableHLO form", [f.value for f in Form])
    semantics: str = option(
        Semantics.ONNX.value, "quantize rounding (onnx: exact)", [s.value for s in Semantics]
    )
    fuse_arithmetic: bool = option(False, "quantized form: also fuse add, dot_general, convolution")
    inline_weights: bool = option(False, 'weights inline as dense<"0x..."> (XLA refuses dense_resource)')
    elide_weights: bool = option(False, "weights as dense_resource<__elided__> (no data)")

    def __post_init__(self) -> None:
        for name in ("form", "semantics"):
            check_choice(
                flag(name), getattr(self, name), option_fields(StableHLOOptions)[name].metadata[CHOICES]
            )
        if self.elide_weights and self.inline_weights:
            raise InputError("--elide-weights and --inline-weights exclude each other")
        if self.fuse_arithmetic and self.form != Form.QUANTIZED:
            raise InputError(
                f"--fuse-arithmetic fuses quantized ops: it takes the quantized form, not --form {self.form}"
            )


class StableHLOBackend:
    """IR -> StableHLO text (quantized, integer or qdq form), run on jaxlib's interpreter or XLA:CPU."""

    name = "stablehlo"
    summary = "StableHLO MLIR text"
    Options = StableHLOOptions
    engines = tuple(ENGINE_NAMES)
    default_engine = DEFAULT_ENGINE

    def convert(self, module: ModuleOp, options: StableHLOOptions) -> ModuleOp:
        from .convert import convert_to_stablehlo, elide_weights

        converted = convert_to_stablehlo(
            module,
            options.form,
            options.semantics,
            inline_weights=options.inline_weights,
            fuse_arithmetic=options.fuse_arithmetic,
        )
        if options.elide_weights:
            elide_weights(converted)
        return converted

    def write(self, artifact: ModuleOp, output: str | IO[str]) -> None:
        from .convert import write_stablehlo

        write_stablehlo(artifact, output)

    def check_runner(self, options: StableHLOOptions, engine: str | None, lift: Lift) -> StableHLOCheckRunner:
        """Cases lifted by `lift` (check's ONNX frontend), converted in `options.form` /
        `options.semantics` and run on `engine` (default xla)."""
        engine = check_choice("--engine", engine or self.default_engine, self.engines)
        check_choice("--form", options.form, CHECKED_FORMS)
        given = [flag(name) for name in CONVERT_ONLY if getattr(options, name)]
        if given:
            raise InputError(f"{', '.join(given)}: convert only (check feeds weights as arguments)")
        from .check import StableHLOCheckRunner

        return StableHLOCheckRunner(
            lift=lift,
            engine=engine,
            form=str(options.form),
            semantics=str(options.semantics),
            fuse_arithmetic=options.fuse_arithmetic,
        )


BACKEND = StableHLOBackend()
