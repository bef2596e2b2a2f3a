"""The TOSA backend behind `qconvert.backends`' interface: options, conversion, writer. Light to import (the
CLI reads the options' help): the lowering loads when first used.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING

from qconvert.options import check_choice

if TYPE_CHECKING:
    from collections.abc import Callable

    from onnx import ModelProto

    from qconvert.ir.dialects.builtin import ModuleOp

    from .check import TosaCheckRunner

    Lift = Callable[[ModelProto], ModuleOp]

from .options import ENGINE_NAMES, TosaOptions


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
