"""The onnx-storage backend behind `qconvert.backends`' interface: a QDQ (or QOperator) ONNX model whose
quantized inputs and outputs are their storage integers, with the parameters in metadata and a sidecar.

Light to import (the CLI reads the options' help): the passes and the ONNX writer load on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from qconvert.errors import InputError
from qconvert.options import CHOICES, check_choice, flag, option, option_fields

if TYPE_CHECKING:
    from qconvert.ir.dialects.builtin import ModuleOp

    from .strip import StorageModel

FORMS = ("qdq", "qoperator")
ONNXRUNTIME_GROUPS = "onnxruntime"
QOPERATOR_GROUPS = (ONNXRUNTIME_GROUPS, "all")  # --form qoperator: which Q/DQ groups become QLinear ops


@dataclass(frozen=True, kw_only=True)
class StorageOptions:
    """`--form`, `--inputs`, `--outputs`."""

    form: str = option(
        "qdq", "inner ops: Q/DQ kept, or rewritten to QLinear* ops where onnxruntime has them", FORMS
    )
    inputs: str = option("all", "graph inputs to take as storage integers: all, none or NAME,NAME")
    outputs: str = option("all", "graph outputs to return as storage integers: all, none or NAME,NAME")
    qoperator_groups: str = option(
        ONNXRUNTIME_GROUPS,
        "--form qoperator rewrites the groups the installed onnxruntime fuses (bit-exact with it) or all",
        QOPERATOR_GROUPS,
    )

    def __post_init__(self) -> None:
        fields = option_fields(StorageOptions)
        for name in ("form", "qoperator_groups"):
            check_choice(flag(name), getattr(self, name), fields[name].metadata[CHOICES])
        if self.qoperator_groups != fields["qoperator_groups"].default and self.form != "qoperator":
            raise InputError(f"--qoperator-groups {self.qoperator_groups} takes --form qoperator")


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
