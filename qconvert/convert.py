"""`qconvert.convert`: an ONNX model (or a lifted IR module) -> a backend's artifact, and its atomic write.

    from qconvert.convert import convert, write
    module = convert("models/digits_cnn.qdq.onnx", to="stablehlo", form="integer")
    write(module, "digits.mlir")

The CLI verb `qconvert convert` is a thin layer over these two functions; both read the backend registry
(`qconvert.backends`): the backend named by `to` parses its options, converts and writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from qconvert.backends import backend_names, get_backend, parse_options
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.options import check_choice
from qconvert.public_api import make_callable


def convert(
    model: str | object | ModuleOp,
    *,
    to: str = "stablehlo",
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    **options: Any,
) -> Any:
    """Lift `model` (ONNX path or ModelProto; a ModuleOp is used as it is) and convert it with backend `to`.

    `options` are the backend's (`qconvert.backends`; None or False: not given), e.g. StableHLO's `form`
    quantized | integer | qdq, `semantics` onnx | stablehlo (see backends/stablehlo/lower_quant.py),
    `elide_weights` (weights printed as `dense_resource<__elided__>`), `inline_weights` (written as
    `dense<"0x...">`, what the engines need), `fuse_arithmetic` (quantized form: add / dot_general /
    convolution fused too, backends/stablehlo/legalize_qdq_to_quantized_op.py). ONNX (`to="onnx"`)
    takes none: the lifted module itself, which `write(module, path, to="onnx")` saves as a QDQ model.
    onnx-storage (`to="onnx-storage"`) takes `inputs` / `outputs` (all, none or NAME,NAME) and `form` qdq |
    qoperator: a model whose quantized inputs and outputs are storage integers, its parameters in its
    metadata and a sidecar (backends/onnx_storage/, qconvert/storage_metadata.py).
    Raises InputError on bad options (before the model is read) and when ops cannot be converted (all
    listed).
    """
    backend = get_backend(check_choice("--to", to, backend_names()))
    parsed = parse_options(backend, options)
    if isinstance(model, ModuleOp):
        module = model
    else:
        from qconvert.frontends.onnx import import_onnx

        module = import_onnx(model, dict(input_shapes) if input_shapes else None)  # type: ignore[arg-type]
    return backend.convert(module, parsed)


def write(artifact: Any, output: str | IO[str], *, to: str = "stablehlo") -> None:
    """Write what `convert(..., to=to)` returned: to a stream, or to a path atomically (no partial file on
    failure); InputError when the backend cannot write there (`to="onnx"` writes a path only)."""
    get_backend(check_choice("--to", to, backend_names())).write(artifact, output)


# `qconvert.convert(...)` runs convert() (qconvert/public_api.py: this module shares the verb's name)
make_callable(__name__, __name__, "convert", "convert")
