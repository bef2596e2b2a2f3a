"""`qconvert run ARTIFACT --data DATA`: run what qconvert emitted on the user's data, on a real engine.

NOTE: the artifact's kind comes from its file: `.onnx` (QDQ, QOperator or storage ONNX) runs on onnxruntime;
`.mlir` text runs on the engines of the backend whose ops it holds: StableHLO (`xla`, default, or the
StableHLO `interpreter`, via the stablehlo backend's runner) or TOSA (the TOSA `reference` model, default,
or `iree`, via the tosa backend's runners). Data is read as `check` reads it (qconvert/check/feeds.py: a
folder, an .npz, MODULE:FUNCTION; seeded random inputs without --data), bound by input name to the
artifact's inputs: an ONNX model's graph inputs, an MLIR @main's arguments by their `onnx.name`.
Quantized storage at the boundary (a storage ONNX model's `qconvert.storage` metadata, an MLIR argument's
`qconvert.quant_type`) takes the float values the source model took, quantized with ONNX's QuantizeLinear
rule (qconvert.numerics), and its storage results come back dequantized (DequantizeLinear), as the source
model's float outputs; the raw storage is kept beside them as `NAME.storage`. Runs of one batch each are
concatenated along axis 0.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper

from qconvert.errors import InputError
from qconvert.public_api import make_callable

ONNXRUNTIME = "onnxruntime"
ENGINES = {"onnx": (ONNXRUNTIME,), "stablehlo": ("xla", "interpreter"), "tosa": ("reference", "iree")}
STORAGE_SUFFIX = ".storage"  # the key of a quantized output's raw storage beside its dequantized values
_ELEMENT_TYPES = {
    "f16": TensorProto.FLOAT16,
    "bf16": TensorProto.BFLOAT16,
    "f32": TensorProto.FLOAT,
    "f64": TensorProto.DOUBLE,
    "i1": TensorProto.BOOL,
    "i8": TensorProto.INT8,
    "i16": TensorProto.INT16,
    "i32": TensorProto.INT32,
    "i64": TensorProto.INT64,
    "ui8": TensorProto.UINT8,
    "ui16": TensorProto.UINT16,
    "ui32": TensorProto.UINT32,
    "ui64": TensorProto.UINT64,
}
_MAIN = re.compile(
    r"func\.func\s+(?:public\s+)?@main\s*\((?P<args>.*?)\)\s*->\s*(?P<results>\(.*?\)|tensor<[^>]*>)\s*(?:attributes\s*\{.*?\}\s*)?\{",
    re.S,
)
_VALUE = re.compile(r"tensor<(?P<type>[^>]*)>\s*(?:\{(?P<attrs>[^}]*)\})?")
_ATTRIBUTE = re.compile(r'(?P<key>[\w.]+)\s*=\s*"(?P<value>[^"]*)"')


@dataclass(slots=True)
class _Boundary:
    """One argument or result of @main: its name, element type, dims (None: dynamic), quant type text."""

    name: str
    element: str
    dims: list[int | None]
    quant_type: str | None = None

    @property
    def params(self) -> Any:
        from qconvert.ir.parser import parse_type
        from qconvert.ir.quant_types import uniform_params

        return None if self.quant_type is None else uniform_params(parse_type(self.quant_type))  # type: ignore[arg-type]


@dataclass(slots=True)
class RunResult:
    """What `run` computed: the outputs by name (runs concatenated), and how."""

    artifact: str
    kind: str  # onnx | stablehlo | tosa
    engine: str
    outputs: dict[str, np.ndarray]
    inputs_source: str
    samples: int = 0
    runs: int = 0
    notes: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}: {a.dtype}{list(a.shape)}" for name, a in self.outputs.items())
        return f"RunResult({self.artifact} on {self.engine}, {self.samples} samples, {{{shown}}})"

    def to_json(self) -> dict[str, object]:
        def summary(array: np.ndarray) -> dict[str, object]:
            entry: dict[str, object] = {"dtype": str(array.dtype), "shape": list(array.shape)}
            if array.size and array.dtype.kind in "fiub":
                values = array.astype(np.float64)
                finite = values[np.isfinite(values)]
                if finite.size:
                    entry.update(min=float(finite.min()), max=float(finite.max()), mean=float(finite.mean()))
            return entry

        return {
            "artifact": self.artifact,
            "kind": self.kind,
            "engine": self.engine,
            "inputs": self.inputs_source,
            "samples": self.samples,
            "runs": self.runs,
            "outputs": {name: summary(array) for name, array in self.outputs.items()},
            "notes": self.notes,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """The outputs as an .npz (written whole, then moved into place; '-': stdout)."""
        import tempfile

        from qconvert.atomic_file import place_file, staging_folder

        with tempfile.TemporaryDirectory(dir=staging_folder(path), prefix=".qconvert.") as scratch:
            staged = Path(scratch) / "outputs.npz"
            np.savez(staged, **self.outputs)  # type: ignore[arg-type]
            place_file(staged, path)


def artifact_kind(path: str | os.PathLike[str], text: str | None = None) -> str:
    """onnx, stablehlo or tosa, from the file name and (MLIR) the ops it holds."""
    name = os.fspath(path)
    if name.endswith(".onnx"):
        return "onnx"
    if not name.endswith(".mlir"):
        raise InputError(
            f"{name}: not an artifact qconvert runs (expected .onnx, or .mlir StableHLO / TOSA text)"
        )
    assert text is not None
    if "tosa." in text:
        return "tosa"
    if "stablehlo." in text:
        return "stablehlo"
    raise InputError(
        f"{name}: holds neither StableHLO nor TOSA ops (the IR of `qconvert import` does not run)"
    )


def run(
    artifact: str | os.PathLike[str],
    data: Any = None,
    *,
    engine: str | None = None,
    max_samples: int | None = None,
    batch_size: int | None = None,
    show_progress: bool = False,
) -> RunResult:
    """Run `artifact` (an .onnx model, or StableHLO / TOSA .mlir text as `qconvert convert` wrote it) on
    `data` (a folder of .npz/.npy samples, one .npz, MODULE:FUNCTION, a list of {input: array} batches, or
    {input: array} for one run; None: seeded random inputs) with `engine` (onnx: onnxruntime; stablehlo:
    xla | interpreter; tosa: reference | iree; default the first). `max_samples` / `batch_size` as in
    `check`. InputError for a file that is not an artifact, an engine that does not run it, or data that
    does not fit its inputs."""
    from qconvert.check.feeds import model_feeds

    path = os.fspath(artifact)
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    text = None
    if path.endswith(".mlir"):
        text = Path(path).read_text(encoding="utf-8")
    kind = artifact_kind(path, text)
    choices = ENGINES[kind]
    chosen = choices[0] if engine is None else engine
    if chosen not in choices:
        from qconvert.did_you_mean import did_you_mean

        raise InputError(
            f"engine '{chosen}': a {kind} artifact runs on {' | '.join(choices)}"
            + did_you_mean(chosen, choices)
        )
    if kind == "onnx":
        header, runner = _onnx_runner(path)
    else:
        assert text is not None
        header, runner = _mlir_runner(path, text, kind, chosen)
    feeds, source, notes = model_feeds(header, data, max_samples, batch_size)
    if show_progress:
        from rich.progress import track

        feeds = iter(track(feeds, description="running", transient=True, console=None))
    runs: list[dict[str, np.ndarray]] = []
    samples = 0
    for feed in feeds:
        runs.append(runner(feed.arrays))
        samples += feed.samples
    if not runs:
        raise InputError(f"{source}: no samples to run")
    outputs: dict[str, np.ndarray] = {}
    for name in runs[0]:
        joined = _joined([run_[name] for run_ in runs])
        if joined is not None:
            outputs[name] = joined
            continue
        outputs.update({f"{name}.run{index}": run_[name] for index, run_ in enumerate(runs)})
        notes.append(
            f"output '{name}' differs in shape beyond axis 0 between runs: kept per run ({name}.runN)"
        )
    return RunResult(path, kind, chosen, outputs, source, samples, len(runs), notes)


def _joined(arrays: list[np.ndarray]) -> np.ndarray | None:
    """One output's runs as one array: concatenated along axis 0 (the batch), else stacked; None when
    their shapes differ beyond axis 0."""
    if len(arrays) == 1:
        return arrays[0]
    if all(a.ndim and a.shape[1:] == arrays[0].shape[1:] for a in arrays):
        return np.concatenate(arrays, axis=0)
    if all(a.shape == arrays[0].shape for a in arrays):
        return np.stack(arrays)
    return None


# onnxruntime ---------------------------------------------------------------------------------------------
def _onnx_runner(path: str) -> tuple[ModelProto, Any]:
    """The header data binds to (a storage model's stripped inputs as the floats they take) and the runner."""
    from qconvert.check.oracle import ort_session
    from qconvert.check.ort_values import run_values
    from qconvert.frontends.onnx.load import read_model
    from qconvert.storage import StorageBoundary
    from qconvert.storage_metadata import sidecar_path

    model, _ = read_model(Path(path))
    boundary = None
    props = {prop.key for prop in model.metadata_props}
    if any(key.startswith("qconvert.storage.") for key in props) or sidecar_path(path).is_file():
        boundary = StorageBoundary.of(path)  # a storage model: floats in and out, as its source
    session = ort_session(model, True, path)
    header = _graph_only(model)
    if boundary is not None:
        for info in header.graph.input:
            if info.name in boundary.metadata.inputs:
                info.type.tensor_type.elem_type = TensorProto.FLOAT  # the source model's float values

    def runner(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = dict(arrays) if boundary is None else boundary.quantize_inputs(arrays)
        results = run_values(session, feeds)
        if boundary is None:
            return results
        floats = boundary.dequantize_outputs(results)
        storage = {name + STORAGE_SUFFIX: results[name] for name in boundary.metadata.outputs}
        return {**floats, **storage}

    return header, runner


def _graph_only(model: ModelProto) -> ModelProto:
    """The model's graph inputs and outputs without its weights (a header to bind data to)."""
    header = ModelProto()
    header.ir_version = model.ir_version
    header.opset_import.extend(model.opset_import)
    header.graph.name = model.graph.name
    initializers = {t.name for t in model.graph.initializer}
    header.graph.input.extend(i for i in model.graph.input if i.name not in initializers)
    header.graph.output.extend(model.graph.output)
    return header


# MLIR ----------------------------------------------------------------------------------------------------
def _signature(path: str, text: str) -> tuple[list[_Boundary], list[_Boundary]]:
    """@main's arguments and results, as `qconvert convert` writes them (tensor types, `onnx.name`)."""
    found = _MAIN.search(text)
    if found is None:
        raise InputError(f"{path}: no func.func @main to run")

    def read(part: str, default: str) -> list[_Boundary]:
        values = []
        for index, match in enumerate(_VALUE.finditer(part)):
            *dims, element = match["type"].split("x")
            attributes = {m["key"]: m["value"] for m in _ATTRIBUTE.finditer(match["attrs"] or "")}
            if element not in _ELEMENT_TYPES:
                raise InputError(
                    f"{path}: @main's {default} {index} is tensor<{match['type']}>: "
                    f"no numpy type for {element}"
                )
            values.append(
                _Boundary(
                    attributes.get("onnx.name", f"{default}{index}"),
                    element,
                    [None if d == "?" else int(d) for d in dims],
                    attributes.get("qconvert.quant_type"),
                )
            )
        return values

    return read(found["args"], "arg"), read(found["results"], "result")


_RESOURCE_USE = re.compile(r"dense_resource<(?P<name>[^>]+)>")
_RESOURCE_BLOB = re.compile(r'^\s*"?(?P<name>[^":\s]+)"?\s*:\s*"0x(?P<hex>[0-9A-Fa-f]*)"', re.M)


def inline_resources(path: str, text: str) -> str:
    """`text` with each `dense_resource<NAME>` (the weights `qconvert convert` writes as blobs) replaced by
    `dense<"0x...">` of the blob's bytes, which the engines need (XLA refuses dense_resource, the StableHLO
    interpreter misreads blobs parsed from text). A blob is 4 bytes of alignment, then the data."""
    if "dense_resource<" not in text:
        return text
    body, marker, _ = text.rpartition("{-#")
    blobs = {m["name"]: m["hex"][8:] for m in _RESOURCE_BLOB.finditer(text[len(body) :])} if marker else {}

    def inlined(match: re.Match[str]) -> str:
        name = match["name"].strip('"')
        if name not in blobs:
            raise InputError(
                f"{path}: dense_resource<{name}> has no blob in the file (written with --elide-weights?): "
                "convert again without it to run the artifact"
            )
        return f'dense<"0x{blobs[name]}">'

    return _RESOURCE_USE.sub(inlined, body)


def _mlir_runner(path: str, text: str, kind: str, engine: str) -> tuple[ModelProto, Any]:
    from qconvert.numerics import dequantize, quantize

    arguments, results = _signature(path, text)
    text = inline_resources(path, text)
    inputs = [
        helper.make_tensor_value_info(
            a.name, TensorProto.FLOAT if a.quant_type else _ELEMENT_TYPES[a.element], a.dims
        )
        for a in arguments
    ]
    header = helper.make_model(helper.make_graph([], "main", inputs, []))
    execute = _engine(kind, engine, text)

    def runner(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        fed = []
        for argument in arguments:
            array = np.asarray(arrays[argument.name])
            if argument.quant_type is not None:
                array = quantize(array, argument.params)
            if array.dtype.kind == "u" and not argument.element.startswith("ui"):
                array = array.view(array.dtype.str.replace("u", "i"))  # TOSA holds unsigned storage signless
            fed.append(array)
        computed = execute(fed)
        named: dict[str, np.ndarray] = {}
        for result, value in zip(results, computed, strict=True):
            value = np.asarray(value)
            if result.quant_type is None:
                named[result.name] = value
                continue
            params = result.params
            named[result.name] = dequantize(value.view(params.storage_dtype), params)
            named[result.name + STORAGE_SUFFIX] = value.view(params.storage_dtype)
        return named

    return header, runner


def _engine(kind: str, engine: str, text: str) -> Any:
    """A function from the argument arrays to the result arrays, on the backends' own runners."""
    if kind == "stablehlo":
        from qconvert.backends.stablehlo import run_stablehlo

        return lambda fed: run_stablehlo(text, fed, engine=engine)
    if engine == "iree":
        from qconvert.backends.tosa import compile_iree, run_iree

        binary = compile_iree(text)  # once, for every run
        return lambda fed: run_iree(binary, fed)
    from qconvert.backends.tosa import run_reference

    return lambda fed: run_reference(text, fed)


__all__ = ["ENGINES", "RunResult", "artifact_kind", "run"]

# `qconvert.run(...)` runs run() (qconvert/public_api.py: this module shares the verb's name)
make_callable(__name__, __name__, "run", "run")
