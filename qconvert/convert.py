"""`qconvert.convert`: an ONNX model (or a lifted IR module) -> a backend's module, and its atomic write.

    from qconvert.convert import convert, write
    module = convert("models/digits_cnn.qdq.onnx", to="stablehlo", form="integer")
    write(module, "digits.mlir")

The CLI verb `qconvert convert` is a thin layer over these two functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO

from qconvert.errors import InputError
from qconvert.ir.dialects.builtin import ModuleOp

TARGETS = ("stablehlo", "onnx")
FORMS = ("quantized", "integer", "qdq")
SEMANTICS = ("onnx", "stablehlo")


def _choice(option: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InputError(f"{option} {value!r}: expected one of {', '.join(choices)}")
    return value


def convert(
    model: str | object | ModuleOp,
    *,
    to: str = "stablehlo",
    form: str = "quantized",
    semantics: str = "onnx",
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    elide_weights: bool = False,
    inline_weights: bool = False,
    fuse_arithmetic: bool = False,
) -> ModuleOp:
    """Lift `model` (ONNX path or ModelProto; a ModuleOp is used as it is) and lower it to `to`.

    ONNX (`to="onnx"`): the lifted module itself, which `write(module, path, to="onnx")` saves as a QDQ
    model (backends/onnx; `form` / `semantics` do not apply). StableHLO: `form` quantized | integer |
    qdq, `semantics` onnx | stablehlo (see backends/stablehlo/quant.py). `elide_weights` prints weights
    as `dense_resource<__elided__>`; `inline_weights` writes them as `dense<"0x...">` (what the engines
    need). `fuse_arithmetic` (quantized form) also fuses add / dot_general / convolution
    (backends/stablehlo/quant_fusion.py). Raises InputError on bad
    options and when ops cannot be lowered (all of them listed).
    """
    _choice("--to", to, TARGETS)
    _choice("--form", form, FORMS)
    _choice("--semantics", semantics, SEMANTICS)
    if elide_weights and inline_weights:
        raise InputError("--elide-weights and --inline-weights exclude each other")
    if to == "onnx" and (elide_weights or inline_weights):
        raise InputError("--elide-weights / --inline-weights apply to --to stablehlo only")
    if isinstance(model, ModuleOp):
        module = model
    else:
        from qconvert.frontends.onnx import import_onnx

        module = import_onnx(model, dict(input_shapes) if input_shapes else None)  # type: ignore[arg-type]
    if to == "onnx":
        return module
    from qconvert.backends.stablehlo.convert import convert_to_stablehlo
    from qconvert.backends.stablehlo.convert import elide_weights as elide

    converted = convert_to_stablehlo(
        module, form, semantics, inline_weights=inline_weights, fuse_arithmetic=fuse_arithmetic
    )
    if elide_weights:
        elide(converted)
    return converted


def write(module: ModuleOp, output: str | IO[str], *, to: str = "stablehlo") -> None:
    """Write `module`'s text to a stream, or to a path atomically (no partial file on failure); `to="onnx"`
    saves an ONNX model to a path instead (save_onnx, atomic too)."""
    if to == "onnx":
        if not isinstance(output, str):
            raise InputError("--to onnx writes a file: give -o PATH")
        from qconvert.backends.onnx import save_onnx

        save_onnx(module, output)
        return
    from qconvert.backends.stablehlo.convert import write_stablehlo

    write_stablehlo(module, output)
