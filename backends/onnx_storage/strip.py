"""Strip-to-storage: the lifted module's boundary quantizes and dequantizes go, its signature takes the
storage types, and the ONNX writer writes it with the parameters in `metadata_props` and a sidecar.

The data flow is passes on the IR (qconvert/passes/absorb_boundary_quant_casts.py):

1. `--form qoperator`: the ONNX backend's `qdq_to_qoperator` rewrites the inner Q/DQ groups first (those
   the installed onnxruntime fuses itself, or every one that qualifies), on the model as the source has it;
2. `absorb_boundary_quant_casts`: @main takes the quantized types its inputs are quantized to and returns
   the quantized values its outputs are dequantized from (what cannot be stripped stays float, with why);
3. `strip_storage_signature`: `strip-func-quant-types`' signature rewrite, storage types with
   `quant.scast` glue, which the ONNX writer writes as nothing: a stripped input feeds the model's
   DequantizeLinear (or QLinear op) directly, a stripped output is its last QuantizeLinear's output.

The metadata follows the contract of qconvert/storage_metadata.py.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from qconvert.errors import InputError
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.passes.absorb_boundary_quant_casts import (
    Boundary,
    absorb_boundary_quant_casts,
    strip_storage_signature,
)
from qconvert.storage_metadata import StorageEntry, StorageMetadata, sidecar_path

from .options import ONNXRUNTIME_GROUPS


@dataclass
class StorageModel:
    """The converted module (storage-typed signature) and the metadata written with it."""

    module: ModuleOp
    metadata: StorageMetadata
    boundary: Boundary
    notes: tuple[str, ...] = ()  # what a rewrite before the stripping did (--form qoperator)

    def summary_lines(self) -> list[str]:
        """What the CLI prints after writing: each stripped name with its type, each float one with why."""
        return [*self.notes, *self.boundary.lines()]


def rewrite_to_qoperator(module: ModuleOp, groups: str = ONNXRUNTIME_GROUPS) -> str:
    """`--form qoperator`: the ONNX backend's QDQ -> QOperator rewrite (backends/onnx/qoperator_fusion.py)
    of the groups the installed onnxruntime fuses itself on the model as it is (`groups="onnxruntime"`:
    the stripped model then computes bit for bit what onnxruntime computes on the source), or of every group
    that qualifies (`"all"`: onnxruntime's QLinearAdd / QLinearMul round ties unlike the float path it
    leaves on x86). Returns the summary line of what it did."""
    from qconvert.backends.onnx import qdq_to_qoperator

    record = qdq_to_qoperator(module, match_onnxruntime=groups == ONNXRUNTIME_GROUPS)
    rewritten = ", ".join(f"{count} {op_type}" for op_type, count in sorted(record.rewritten.items()))
    kept = f"; {len(record.kept)} group(s) kept as Q/DQ" if record.kept else ""
    return f"form qoperator ({groups} groups): {rewritten or 'no group rewritten'}{kept}"


def strip_to_storage(
    module: ModuleOp,
    *,
    form: str = "qdq",
    inputs: str = "all",
    outputs: str = "all",
    qoperator_groups: str = ONNXRUNTIME_GROUPS,
) -> StorageModel:
    """Strip `module` (a lifted ONNX model; changed in place) to storage at its boundary; see the module
    doc. InputError when nothing can be stripped (with each name's reason), or for `inputs` / `outputs`
    naming a value that does not exist or cannot be stripped."""
    notes = (rewrite_to_qoperator(module, qoperator_groups),) if form == "qoperator" else ()
    boundary = absorb_boundary_quant_casts(module, inputs, outputs)
    if not boundary:
        reasons = "; ".join(f"'{name}': {reason}" for name, reason in boundary.float_reasons.items())
        raise InputError(
            f"nothing to strip: no graph input is quantized on entry and no output dequantized on exit "
            f"({reasons or 'the model has no inputs or outputs'})"
        )
    strip_storage_signature(module)
    metadata = StorageMetadata(
        inputs={name: StorageEntry.of(type_) for name, type_ in boundary.inputs.items()},
        outputs={name: StorageEntry.of(type_) for name, type_ in boundary.outputs.items()},
        float_reasons=dict(boundary.float_reasons),
    )
    return StorageModel(module, metadata, boundary, notes)


def save_storage_model(model: StorageModel, path: str | os.PathLike[str]) -> Path:
    """Write the model to `path` and its sidecar (`OUT.quant.json`) beside it, atomically together."""
    from qconvert.atomic_file import output_place
    from qconvert.backends.onnx import save_onnx

    with contextlib.suppress(OSError):  # save_onnx names what is wrong with the path
        place = output_place(path)
        if place.kind == "atomic":  # a symlink's target: its sidecar beside it, under its name
            path = place.path
    sidecar = sidecar_path(path)
    return save_onnx(
        model.module,
        path,
        metadata_props=model.metadata.metadata_props(),
        companions={sidecar.name: model.metadata.sidecar_text()},
    )
