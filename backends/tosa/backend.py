"""The TOSA backend behind `qconvert.backends`' interface: options, conversion, writer. Light to import (the
CLI reads the options' help): the lowering loads when first used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from qconvert.numerics.tosa import TosaRounding
from qconvert.options import CHOICES, check_choice, flag, option, option_fields

if TYPE_CHECKING:
    from collections.abc import Callable

    from onnx import ModelProto

    from qconvert.ir.dialects.builtin import ModuleOp

    from .check import TosaCheckRunner

    Lift = Callable[[ModelProto], ModuleOp]

ENGINE_NAMES = ("reference", "iree")


@dataclass(frozen=True, kw_only=True)
class TosaOptions:
    """`--rounding`, `--allow-float`, `--float-boundary`."""

    rounding: str = option(
        TosaRounding.SINGLE.value,
        "tosa.rescale rounding (double needs TOSA's doubleround extension)",
        [r.value for r in TosaRounding],
    )
    allow_float: bool = option(False, "keep what cannot be integer as float TOSA ops (PRO-FP)")
    float_boundary: bool = option(False, "float inputs and outputs, quantized at the edges (PRO-FP)")

    def __post_init__(self) -> None:
        check_choice(
            flag("rounding"), self.rounding, option_fields(TosaOptions)["rounding"].metadata[CHOICES]
        )


class TosaBackend:
    """IR -> integer-only TOSA 1.0 (MLIR text, generic form), lowered from StableHLO's quantized form."""

    name = "tosa"
    summary = "integer-only TOSA 1.0 MLIR text (PRO-INT)"
    Options = TosaOptions
    engines = ENGINE_NAMES
    default_engine = "reference"

    def convert(self, module: ModuleOp, options: TosaOptions) -> ModuleOp:
        from .convert import convert_to_tosa

        return convert_to_tosa(module, options)

    def write(self, artifact: ModuleOp, output: str | IO[str]) -> None:
        from .convert import write_tosa

        write_tosa(artifact, output)

    def check_runner(self, options: TosaOptions, engine: str | None, lift: Lift) -> TosaCheckRunner:
        """`check --backend tosa [--engine reference|iree]`: the runner of check.py."""
        from .check import TosaCheckRunner

        return TosaCheckRunner(
            lift, options, check_choice("--engine", engine or self.default_engine, self.engines)
        )


BACKEND = TosaBackend()
