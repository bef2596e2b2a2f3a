"""The onnx-storage backend behind `qconvert.backends`' interface: a QDQ (or QOperator) ONNX model whose
quantized inputs and outputs are their storage integers, with the parameters in metadata and a sidecar.

Light to import (the CLI reads the options' help): the passes and the ONNX writer load on first use.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING

from qconvert.errors import InputError

if TYPE_CHECKING:
    from qconvert.ir.dialects.builtin import ModuleOp

    from .strip import StorageModel

from .options import StorageOptions


class OnnxStorageBackend:
    """IR -> an ONNX model that takes and returns storage integers (`strip-func-quant-types` at the model's
    boundary); nothing of check's runs on it here (`qconvert check OUT --against MODEL` compares it)."""

    name = "onnx-storage"
    summary = "an ONNX model taking and returning storage integers; needs -o"
    Options = StorageOptions
    engines: tuple[str, ...] = ()
    default_engine = None

    def convert(self, module: ModuleOp, options: StorageOptions) -> StorageModel:
        from .strip import strip_to_storage

        return strip_to_storage(
            module,
            form=options.form,
            inputs=options.inputs,
            outputs=options.outputs,
            qoperator_groups=options.qoperator_groups,
        )

    def write(self, artifact: StorageModel, output: str | IO[str]) -> None:
        if not isinstance(output, str):
            raise InputError("--to onnx-storage writes a file (and its .quant.json sidecar): give -o PATH")
        from .strip import save_storage_model

        save_storage_model(artifact, output)

    def check_runner(self, options: StorageOptions, engine: str | None, lift: object) -> None:
        return None


BACKEND = OnnxStorageBackend()
