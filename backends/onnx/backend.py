"""The ONNX backend behind `qconvert.backends`' interface: the lifted module, saved as a QDQ ONNX model."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from qconvert.errors import InputError

if TYPE_CHECKING:
    from qconvert.ir.dialects.builtin import ModuleOp


@dataclass(frozen=True, kw_only=True)
class OnnxOptions:
    """None yet: the module is written as it is (opset and external data are save_onnx's defaults)."""


class OnnxBackend:
    """IR -> a QDQ ONNX model (quant casts become Q/DQ nodes); nothing of check's runs on it yet."""

    name = "onnx"
    summary = "a QDQ model; needs -o"
    Options = OnnxOptions
    engines: tuple[str, ...] = ()
    default_engine = None

    def convert(self, module: ModuleOp, options: OnnxOptions) -> ModuleOp:
        return module  # the lifted module is the artifact: write() maps it to ONNX

    def write(self, artifact: ModuleOp, output: str | IO[str]) -> None:
        # A stream is text (convert without -o); `-o -` asks for the model's bytes, into a pipe or a file.
        if not isinstance(output, str) or (output == "-" and sys.stdout.isatty()):
            raise InputError("--to onnx writes a file: give -o PATH (or -o - into a pipe)")
        from .save import save_onnx

        save_onnx(artifact, output)

    def check_runner(self, options: OnnxOptions, engine: str | None, lift: object) -> None:
        return None


BACKEND = OnnxBackend()
