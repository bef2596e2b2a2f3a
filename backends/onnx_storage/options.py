"""The onnx-storage backend's options: their own module, so that strip.py reads them without importing the
backend object, which imports strip.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from qconvert.errors import InputError
from qconvert.options import CHOICES, check_choice, flag, option, option_fields

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
