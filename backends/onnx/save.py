"""Writing the ONNX model to disk: atomically, with external data beside the file when it is large.

The model and its data file are written into a temporary folder next to `path`, checked there, then
renamed into place (data first, the model last): a failure leaves no partial file behind, and a reader
never sees a model whose data is missing. A symlink's target is replaced (the link kept); `-`, a FIFO or
a device is written through (qconvert/atomic_file.py), for a model with nothing beside it. Weights are
streamed from the IR's arrays by onnx_ir (memory-mapped `dense_resource` weights are read once, while
written), never gathered into one proto.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import onnx_ir as ir

from qconvert.atomic_file import output_place, place_file, staging_folder
from qconvert.errors import InputError
from qconvert.ir.dialects.builtin import ModuleOp

from .write import PROTOBUF_LIMIT, build_model, check_proto, initializer_bytes

EXTERNAL_DATA_THRESHOLD = PROTOBUF_LIMIT - 64 * 2**20  # room for the graph itself


def save_onnx(
    module: ModuleOp,
    path: str | os.PathLike[str],
    *,
    opset: int | None = None,
    external_data: bool | None = None,
    check: bool = True,
    metadata_props: Mapping[str, str] | None = None,
    companions: Mapping[str, str] | None = None,
) -> Path:
    """Write `module` to `path` as ONNX (see `write_onnx`); returns the path.

    `external_data`: True writes every initializer of 256 bytes or more to `<name>.data` beside the
    model, False never does, None (default) does when the weights approach protobuf's 2 GiB limit.
    `metadata_props` go into the model's metadata; `companions` (file name -> text) are written beside
    the model, renamed into place before it, so they appear with the model or not at all (the
    onnx-storage backend's sidecar).
    Raises InputError for a module ONNX cannot express, a missing folder, or a failed check.
    """
    given = Path(path)
    try:  # a symlink's target is written (the link kept); '-', FIFOs and devices through
        place = output_place(path)
    except OSError as error:
        raise InputError(f"cannot write '{given}': {error.strerror or error}") from None
    target = Path(place.path) if place.kind == "atomic" else given
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"cannot write '{target}': folder '{folder}' does not exist")
    model = build_model(module, opset=opset, metadata_props=metadata_props)
    if external_data is None:
        external_data = initializer_bytes(model) >= EXTERNAL_DATA_THRESHOLD
    if place.kind != "atomic" and (external_data or companions):
        beside = "external data" if external_data else ", ".join(companions or {})
        raise InputError(
            f"cannot write '{given}': the model needs files beside it ({beside}); give a regular file path"
        )
    if place.kind != "atomic":
        folder = Path(staging_folder(path))
    data_name = f"{target.name}.data"
    try:
        with tempfile.TemporaryDirectory(dir=folder, prefix=f".{target.name}.") as scratch:
            scratch_model = Path(scratch) / target.name
            try:
                if external_data:
                    ir.save(model, scratch_model, external_data=data_name)
                else:
                    ir.save(model, scratch_model)
            except ValueError as error:
                raise InputError(f"cannot write '{target}': {error}") from None
            if check:
                check_proto(str(scratch_model))
            for name, text in (companions or {}).items():
                (Path(scratch) / name).write_text(text, encoding="utf-8")
            moved: list[Path] = []
            try:
                for name in companions or {}:
                    os.replace(Path(scratch) / name, folder / name)
                    moved.append(folder / name)
                if external_data:
                    os.replace(Path(scratch) / data_name, folder / data_name)
                place_file(scratch_model, given)
            except OSError:
                for path in moved:  # a companion must not outlive the model it describes
                    path.unlink(missing_ok=True)
                raise
    except OSError as error:  # an unwritable folder, a full disk, a directory in the way
        raise InputError(f"cannot write '{target}': {error}") from None
    return target
