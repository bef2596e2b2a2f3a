"""Cross-validation against onnxruntime: per quantization node bit-exact, end to end beside the noise floor.

Two verdicts, both in the `CheckReport`:

- **Per node (decides pass/fail).** onnxruntime runs the source model with graph optimizations
  disabled (the spec oracle), every intermediate tensor exposed as a graph output. Each quantization
  node (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinear*, *Integer, com.microsoft
  QLinear* / QGemm / DynamicQuantizeMatMul) is then cut out as a one-node model, fed the very inputs
  onnxruntime gave it (its initializers, Constant values and quantization parameters as initializers,
  the rest as graph inputs), lifted with `import_onnx` and run by the backend. Its outputs must be
  bit-exact. Q/DQ lift to `quant.qcast` / `quant.dcast`, and QLinear* / *Integer / QGemm ... to
  quant-typed `qconvert.*` ops; both run on `qconvert.numerics`. Nodes the frontend keeps generic
  (`onnx.*`, e.g. with run-time scales) run on onnx's reference implementation, and the report says so
  (`evaluated_by`). A node whose inputs onnxruntime's Python API cannot return (int4,
  bf16, float8 e5m2, ...), or that the backend cannot run, is "not run" with the reason, never passed.
- **End to end (reported; fails only with a tolerance).** The whole lifted module runs on the inputs;
  each graph output is compared with the oracle (elements, mismatches, max abs diff, max difference in
  quantization steps, SQNR, cosine), beside the noise floor: onnxruntime with default optimizations
  against itself with them disabled, same inputs, same metrics.

NOTE: `passed` is true when no per-node comparison and no tolerance failed, and something ran (a
quantization node, or the whole model end to end); "not run" nodes and outputs are listed and counted
but do not fail the check. An SQNR of
`inf` (no difference) is written to JSON as `null`.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from qconvert.errors import InputError

BACKENDS = ("interpreter",)
DEFAULT_DOMAINS = ("", "ai.onnx")
RANDOM_SEED = 0
DEFAULT_TOKEN_RANGE = 32

QUANTIZATION_OPS = frozenset(
    {
        ("", "QuantizeLinear"),
        ("", "DequantizeLinear"),
        ("", "DynamicQuantizeLinear"),
        ("", "QLinearConv"),
        ("", "QLinearMatMul"),
        ("", "MatMulInteger"),
        ("", "ConvInteger"),
        ("com.microsoft", "QLinearAdd"),
        ("com.microsoft", "QLinearMul"),
        ("com.microsoft", "QLinearConcat"),
        ("com.microsoft", "QLinearSigmoid"),
        ("com.microsoft", "QLinearLeakyRelu"),
        ("com.microsoft", "QLinearAveragePool"),
        ("com.microsoft", "QLinearGlobalAveragePool"),
        ("com.microsoft", "QLinearSoftmax"),
        ("com.microsoft", "QLinearReduceMean"),
        ("com.microsoft", "QGemm"),
        ("com.microsoft", "DynamicQuantizeMatMul"),
        ("com.microsoft", "MatMulIntegerToFloat"),
        ("com.microsoft", "QuantizeLinear"),
        ("com.microsoft", "DequantizeLinear"),
    }
)
Q_DQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})

# Element types onnxruntime's Python API returns; float8 e4m3fn comes back as its uint8 bits.
ORT_RETURNS = frozenset(
    {
        TensorProto.FLOAT,
        TensorProto.DOUBLE,
        TensorProto.FLOAT16,
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
        TensorProto.BOOL,
        TensorProto.FLOAT8E4M3FN,
    }
)

EVALUATED_BY_NUMERICS = "quant-typed ops (qconvert.numerics)"
EVALUATED_BY_REFERENCE = "onnx reference implementation (generic onnx.* op)"

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
METRICS = ("elements", "mismatches", "max_abs_diff", "max_lsb_diff", "sqnr_db", "cosine")


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerances:
    """End-to-end tolerances; each is off (None) unless the user sets it. Per-node checks are always exact."""

    atol: float | None = None
    rtol: float | None = None
    max_lsb: float | None = None
    max_mismatch_fraction: float | None = None
    min_sqnr: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """One tensor against its reference. `max_lsb_diff` is None where no quantization step applies."""

    elements: int
    mismatches: int
    max_abs_diff: float
    max_lsb_diff: float | None
    sqnr_db: float
    cosine: float
    within_tolerance: bool = True  # elementwise |ours - ref| <= atol + rtol |ref|, when those are set

    def to_json(self) -> dict[str, Any]:
        return {
            "elements": self.elements,
            "mismatches": self.mismatches,
            "max_abs_diff": _finite(self.max_abs_diff),
            "max_lsb_diff": None if self.max_lsb_diff is None else _finite(self.max_lsb_diff),
            "sqnr_db": _finite(self.sqnr_db),
            "cosine": _finite(self.cosine),
        }


@dataclass(slots=True, kw_only=True)
class LayerResult:
    """The per-node verdict of one quantization node (bit-exact or not)."""

    node: str
    op_type: str
    domain: str
    verdict: str
    evaluated_by: str | None = None
    elements: int = 0
    mismatches: int = 0
    max_lsb_diff: float | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "op_type": self.op_type if not self.domain else f"{self.domain}.{self.op_type}",
            "verdict": self.verdict,
            "evaluated_by": self.evaluated_by,
            "elements": self.elements,
            "mismatches": self.mismatches,
            "max_lsb_diff": self.max_lsb_diff,
            "reason": self.reason,
        }


@dataclass(slots=True, kw_only=True)
class OutputResult:
    """End to end, one graph output: ours against the oracle, beside the noise floor."""

    name: str
    ours: Comparison | None
    noise_floor: Comparison | None
    failed_tolerances: list[str] = field(default_factory=list)
    reason: str | None = None

    @property
    def verdict(self) -> str:
        if self.ours is None:
            return NOT_RUN
        return FAIL if self.failed_tolerances else PASS

    def to_json(self) -> dict[str, Any]:
        empty: dict[str, Any] = dict.fromkeys(METRICS)
        entry = self.ours.to_json() if self.ours is not None else empty
        entry["verdict"] = self.verdict
        entry["failed_tolerances"] = self.failed_tolerances
        entry["reason"] = self.reason
        entry["noise_floor"] = self.noise_floor.to_json() if self.noise_floor is not None else empty
        return entry


@dataclass(slots=True, kw_only=True)
class CheckReport:
    """Everything `qconvert check` found; `passed` decides the exit code (see the module NOTE)."""

    model: str
    backend: str
    tolerances: Tolerances
    layers: dict[str, LayerResult]
    outputs: dict[str, OutputResult]
    inputs_source: str
    notes: list[str] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(1 for layer in self.layers.values() if layer.verdict == verdict)

    @property
    def passed(self) -> bool:
        ran = self.count(PASS) > 0 or any(o.ours is not None for o in self.outputs.values())
        failed = self.count(FAIL) > 0 or any(o.failed_tolerances for o in self.outputs.values())
        return ran and not failed

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "backend": self.backend,
            "passed": self.passed,
            "inputs": self.inputs_source,
            "summary": {
                "layers_passed": self.count(PASS),
                "layers_failed": self.count(FAIL),
                "layers_not_run": self.count(NOT_RUN),
            },
            "tolerances": self.tolerances.to_json(),
            "layers": {name: layer.to_json() for name, layer in self.layers.items()},
            "outputs": {name: output.to_json() for name, output in self.outputs.items()},
            "notes": self.notes,
        }

    def write_json(self, path: str | os.PathLike[str]) -> None:
        """Write the JSON report atomically (a temporary file in the same folder, then a rename)."""
        folder = os.path.dirname(os.path.abspath(path))
        text = json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n"
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False, encoding="utf-8") as f:
            f.write(text)
        os.replace(f.name, path)


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


# Inputs --------------------------------------------------------------------------------------------
def graph_inputs(model: ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def _input_dtype(info: onnx.ValueInfoProto) -> np.dtype:
    elem_type = info.type.tensor_type.elem_type
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        raise InputError(f"graph input '{info.name}': element type {elem_type} is not supported") from None


def _input_dims(info: onnx.ValueInfoProto) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]


def load_inputs(model: ModelProto, path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of an `.npz`, one per graph input by name, checked against the model's inputs."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError) as error:
        raise InputError(f"{path}: not a readable .npz of input arrays ({error})") from None
    check_arrays(model, arrays, str(path))
    return arrays


def check_arrays(model: ModelProto, arrays: Mapping[str, np.ndarray], where: str = "inputs") -> None:
    """Every graph input given exactly once, with the model's dtype and a compatible shape."""
    path = where
    expected = graph_inputs(model)
    names = [i.name for i in expected]
    missing = [n for n in names if n not in arrays]
    extra = sorted(set(arrays) - set(names))
    if missing or extra:
        parts = [
            f"missing input(s) {missing}" if missing else "",
            f"unknown array(s) {extra}" if extra else "",
        ]
        raise InputError(f"{path}: {'; '.join(p for p in parts if p)}; the model takes {names}")
    for info in expected:
        array, dtype, dims = arrays[info.name], _input_dtype(info), _input_dims(info)
        if array.dtype != dtype:
            raise InputError(
                f"{path}: input '{info.name}' has dtype {array.dtype}; the model expects {dtype}"
            )
        if len(array.shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, array.shape)):
            shown = "x".join("?" if d is None else str(d) for d in dims)
            raise InputError(
                f"{path}: input '{info.name}' has shape {list(array.shape)}; the model expects [{shown}]"
            )


def _token_range(model: ModelProto, name: str) -> int:
    """Ids feeding a Gather's indices range over its table (initializer or a DQ of one), else [0, 32)."""
    initializers = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[1] != name:
            continue
        table = node.input[0]
        producer = producers.get(table)
        if producer is not None and producer.op_type == "DequantizeLinear":
            table = producer.input[0]
        if table in initializers:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            dims = initializers[table].dims
            return int(dims[axis]) if dims else DEFAULT_TOKEN_RANGE
    return DEFAULT_TOKEN_RANGE


def random_inputs(model: ModelProto, seed: int = RANDOM_SEED) -> dict[str, np.ndarray]:
    """Seeded inputs: floats ~ N(0, 1), integer ids in the Gather table's range ([0, 32) by default)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for info in graph_inputs(model):
        dims = _input_dims(info)
        if any(d is None for d in dims):
            raise InputError(
                f"graph input '{info.name}' has dynamic dims; "
                f"give --input-shape {info.name}=D0xD1... or --data"
            )
        shape = tuple(int(d) for d in dims)  # type: ignore[arg-type]
        dtype = _input_dtype(info)
        if dtype.kind == "f":
            arrays[info.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            arrays[info.name] = rng.integers(0, _token_range(model, info.name), shape).astype(dtype)
        elif dtype.kind == "b":
            arrays[info.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            raise InputError(f"graph input '{info.name}': cannot generate random {dtype} values; give --data")
    return arrays


# onnxruntime ---------------------------------------------------------------------------------------
def _session(model: ModelProto, optimized: bool) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types for any invalid model
        raise InputError(f"onnxruntime cannot load the model: {error}") from None


def _run(session: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    try:
        return dict(zip(names, session.run(names, dict(inputs))))
    except Exception as error:
        raise InputError(f"onnxruntime cannot run the model on these inputs: {error}") from None


def element_types(model: ModelProto) -> dict[str, int]:
    """The ONNX element type of every value shape inference (or the graph) knows."""
    types = {t.name: t.data_type for t in model.graph.initializer}
    for info in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types.setdefault(info.name, info.type.tensor_type.elem_type)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            types.setdefault(node.output[0], node.attribute[0].t.data_type)
    return types


def _type_name(elem_type: int) -> str:
    return helper.tensor_dtype_to_string(elem_type).removeprefix("TensorProto.").lower()


def run_oracle(
    model: ModelProto, inputs: Mapping[str, np.ndarray], types: Mapping[str, int]
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """onnxruntime, optimizations disabled, every node output exposed: values, and why some are absent."""
    exposed = ModelProto()
    exposed.CopyFrom(model)
    outputs = {o.name for o in exposed.graph.output}
    unreturnable: dict[str, str] = {}
    for node in exposed.graph.node:
        for name in node.output:
            if not name or name in outputs:
                continue
            elem_type = types.get(name)
            if elem_type is not None and elem_type not in ORT_RETURNS:
                unreturnable[name] = (
                    f"onnxruntime's Python API does not return {_type_name(elem_type)} "
                    f"tensors (value '{name}')"
                )
                continue
            exposed.graph.output.append(onnx.ValueInfoProto(name=name))
            outputs.add(name)
    return _float8_views(_run(_session(exposed, optimized=False), inputs), types), unreturnable


def _float8_views(values: dict[str, np.ndarray], types: Mapping[str, int]) -> dict[str, np.ndarray]:
    """onnxruntime returns float8 e4m3fn tensors as their uint8 bits: view them as what they are."""
    for name, array in list(values.items()):
        if types.get(name) == TensorProto.FLOAT8E4M3FN and array.dtype == np.uint8:
            values[name] = array.view(ml_dtypes.float8_e4m3fn)
    return values


# Comparison ----------------------------------------------------------------------------------------
def _equal_mask(reference: np.ndarray, ours: np.ndarray) -> np.ndarray:
    if reference.dtype.kind in "iub":
        return reference == ours
    bits = np.dtype(f"u{reference.dtype.itemsize}")
    same_bits = reference.view(bits) == ours.view(bits)
    both_nan = np.isnan(reference.astype(np.float64)) & np.isnan(ours.astype(np.float64))
    return same_bits | both_nan


def compare(
    reference: np.ndarray,
    ours: np.ndarray,
    lsb_unit: np.ndarray | None = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> Comparison:
    """Bitwise mismatches (NaN equals NaN), abs and LSB differences, SQNR and cosine of `ours` vs `reference`.

    `max_lsb_diff` is the integer difference for integer tensors, `|diff| / lsb_unit` for dequantized
    ones (`lsb_unit`: the scale, broadcast to the tensor), None otherwise.
    """
    reference, ours = np.asarray(reference), np.asarray(ours)
    elements = int(reference.size)
    if reference.shape != ours.shape or reference.dtype != ours.dtype:
        return Comparison(
            elements=elements,
            mismatches=elements,
            max_abs_diff=math.inf,
            max_lsb_diff=math.inf,
            sqnr_db=-math.inf,
            cosine=math.nan,
            within_tolerance=False,
        )
    mismatches = elements - int(np.count_nonzero(_equal_mask(reference, ours)))
    ref64, ours64 = reference.astype(np.float64), ours.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(ref64 - ours64)
    diff = np.where(np.isnan(ref64) & np.isnan(ours64), 0.0, diff)
    diff = np.where(np.isnan(diff), math.inf, diff)
    max_abs = float(diff.max()) if elements else 0.0
    if reference.dtype.kind in "iu":
        max_lsb: float | None = max_abs
    elif lsb_unit is not None and elements:
        with np.errstate(divide="ignore", invalid="ignore"):
            max_lsb = float(np.rint(diff / np.abs(lsb_unit)).max())
    else:
        max_lsb = None
    finite = np.isfinite(ref64) & np.isfinite(ours64)
    signal = float(np.sum(ref64[finite] ** 2))
    noise = float(np.sum((ref64[finite] - ours64[finite]) ** 2))
    if noise == 0.0:
        sqnr = math.inf
    elif signal == 0.0:
        sqnr = -math.inf
    else:
        sqnr = 10.0 * math.log10(signal / noise)
    norms = float(np.linalg.norm(ref64[finite]) * np.linalg.norm(ours64[finite]))
    cosine = float(np.dot(ref64[finite], ours64[finite]) / norms) if norms else (1.0 if noise == 0 else 0.0)
    within = True
    if atol is not None or rtol is not None:
        bound = (atol or 0.0) + (rtol or 0.0) * np.abs(ref64)
        within = bool(np.all(diff <= bound))
    return Comparison(
        elements=elements,
        mismatches=mismatches,
        max_abs_diff=max_abs,
        max_lsb_diff=max_lsb,
        sqnr_db=sqnr,
        cosine=cosine,
        within_tolerance=within,
    )


def broadcast_scale(scale: np.ndarray, shape: Sequence[int], axis: int, block_size: int) -> np.ndarray:
    """A Q/DQ scale shaped to broadcast against its tensor (per-tensor, per-axis or blocked)."""
    scale = np.asarray(scale, dtype=np.float64)
    if scale.size == 1 or not shape:
        return scale.reshape(())
    axis = axis % len(shape)
    if block_size:
        return np.repeat(scale, block_size, axis=axis).take(range(shape[axis]), axis=axis)
    dims = [1] * len(shape)
    dims[axis] = shape[axis]
    return scale.reshape(dims)


def _attribute(node: NodeProto, name: str, default: int) -> int:
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else int(helper.get_attribute_value(found))


def dequantize_lsb(
    node: NodeProto, values: Mapping[str, np.ndarray], shape: Sequence[int]
) -> np.ndarray | None:
    """The quantization step of a DequantizeLinear's output (its scale, broadcast) when the scale is known."""
    if node.op_type != "DequantizeLinear" or len(node.input) < 2 or node.input[1] not in values:
        return None
    scale = values[node.input[1]]
    return broadcast_scale(scale, shape, _attribute(node, "axis", 1), _attribute(node, "block_size", 0))


# Per node ------------------------------------------------------------------------------------------
def is_quantization_node(node: NodeProto) -> bool:
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    return (domain, node.op_type) in QUANTIZATION_OPS


def node_names(model: ModelProto) -> list[str]:
    """A unique display name per node: its name, `<op output 'y'>` when unnamed, `#2` on repeats."""
    names, seen = [], set()
    for node in model.graph.node:
        base = node.name or f"<{node.op_type} output '{node.output[0] if node.output else ''}'>"
        name, count = base, 1
        while name in seen:
            count += 1
            name = f"{base} #{count}"
        seen.add(name)
        names.append(name)
    return names


def _tensor(name: str, array: np.ndarray, elem_type: int | None) -> TensorProto:
    if elem_type == TensorProto.FLOAT8E4M3FN and array.dtype == np.uint8:
        array = array.view(ml_dtypes.float8_e4m3fn)
    return numpy_helper.from_array(array, name)


def one_node_model(
    model: ModelProto,
    node: NodeProto,
    values: Mapping[str, np.ndarray],
    types: Mapping[str, int],
    constants: set[str],
) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """`node` alone, fed what onnxruntime gave it: constants and Q/DQ parameters as initializers."""
    initializers = {t.name: t for t in model.graph.initializer}
    graph_inputs_, feeds, tensors = [], {}, []
    for position, name in enumerate(node.input):
        if not name or name in feeds or any(t.name == name for t in tensors):
            continue
        if name in initializers:
            tensors.append(initializers[name])
        elif name in constants or (node.op_type in Q_DQ_OPS and position > 0):
            tensors.append(_tensor(name, values[name], types.get(name)))
        else:
            array = values[name]
            elem_type = types.get(name) or helper.np_dtype_to_tensor_dtype(array.dtype)
            graph_inputs_.append(helper.make_tensor_value_info(name, elem_type, list(array.shape)))
            feeds[name] = array
    outputs = []
    for name in node.output:
        if not name:
            continue
        array = values[name]
        elem_type = types.get(name) or helper.np_dtype_to_tensor_dtype(array.dtype)
        outputs.append(helper.make_tensor_value_info(name, elem_type, list(array.shape)))
    graph = helper.make_graph([node], "check_node", graph_inputs_, outputs, initializer=tensors)
    single = helper.make_model(graph, opset_imports=list(model.opset_import))
    single.ir_version = model.ir_version
    return single, feeds


def evaluated_by(module: Any) -> str:
    """Whether the lifted node runs as quant-typed ops, or as a generic `onnx.*` op on onnx's reference."""
    from qconvert.interpret import _main

    generic = any(op.name.startswith("onnx.") for op in _main(module).body.ops)
    return EVALUATED_BY_REFERENCE if generic else EVALUATED_BY_NUMERICS


def check_node(
    model: ModelProto,
    node: NodeProto,
    name: str,
    values: Mapping[str, np.ndarray],
    types: Mapping[str, int],
    constants: set[str],
    unreturnable: Mapping[str, str],
) -> LayerResult:
    """One quantization node on the backend, on the inputs onnxruntime gave it: bit-exact or not."""
    from qconvert.frontends.onnx import import_onnx
    from qconvert.interpret import interpret

    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    result = LayerResult(node=name, op_type=node.op_type, domain=domain, verdict=NOT_RUN)
    for value in [*node.input, *node.output]:
        if value and value not in values:
            result.reason = unreturnable.get(value, f"onnxruntime gave no value for '{value}'")
            return result
    single, feeds = one_node_model(model, node, values, types, constants)
    try:
        module = import_onnx(single)
        result.evaluated_by = evaluated_by(module)
        ours = interpret(module, feeds)
    except InputError as error:
        result.reason = f"the backend cannot run it: {error.message}"
        return result
    mismatched = False
    for output in node.output:
        if not output:
            continue
        reference = values[output]
        lsb = dequantize_lsb(node, values, reference.shape)
        comparison = compare(reference, np.asarray(ours[output]), lsb)
        result.elements += comparison.elements
        result.mismatches += comparison.mismatches
        mismatched |= comparison.mismatches > 0
        if comparison.max_lsb_diff is not None:
            result.max_lsb_diff = max(result.max_lsb_diff or 0.0, comparison.max_lsb_diff)
    result.verdict = FAIL if mismatched else PASS
    return result


# End to end ----------------------------------------------------------------------------------------
def tolerance_failures(comparison: Comparison, tolerances: Tolerances) -> list[str]:
    failures = []
    if not comparison.within_tolerance:
        failures.append(f"|diff| > atol + rtol*|ref| (atol={tolerances.atol}, rtol={tolerances.rtol})")
    if tolerances.max_lsb is not None and (comparison.max_lsb_diff or 0.0) > tolerances.max_lsb:
        failures.append(f"max_lsb_diff {comparison.max_lsb_diff} > {tolerances.max_lsb}")
    if tolerances.max_mismatch_fraction is not None and comparison.elements:
        fraction = comparison.mismatches / comparison.elements
        if fraction > tolerances.max_mismatch_fraction:
            failures.append(f"mismatch fraction {fraction:.4g} > {tolerances.max_mismatch_fraction}")
    if tolerances.min_sqnr is not None and comparison.sqnr_db < tolerances.min_sqnr:
        failures.append(f"sqnr {comparison.sqnr_db:.2f} dB < {tolerances.min_sqnr} dB")
    return failures


def typed_for_lift(
    model: ModelProto, values: Mapping[str, np.ndarray], types: Mapping[str, int]
) -> ModelProto:
    """The model with the type onnxruntime computed for every value shape inference left untyped
    (com.microsoft ops), so that DequantizeLinear after a QGemm knows its storage type."""
    typed = ModelProto()
    typed.CopyFrom(model)
    for node in typed.graph.node:
        for name in node.output:
            if name and name not in types and name in values:
                array = values[name]
                typed.graph.value_info.append(
                    helper.make_tensor_value_info(
                        name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
                    )
                )
    return typed


def check(
    model_path: str | os.PathLike[str],
    inputs: str | os.PathLike[str] | Mapping[str, np.ndarray] | None = None,
    backend: str = "interpreter",
    tolerances: Tolerances = Tolerances(),
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    show_progress: bool = False,
) -> CheckReport:
    """Check `model_path` against onnxruntime, per quantization node (bit-exact) and end to end.

    `inputs`: an `.npz` path, a dict of arrays by graph input name, or None for seeded random inputs.
    `show_progress` draws a progress bar on stderr over the nodes. Raises `InputError` for a bad model,
    bad inputs or an unknown backend.
    """
    from qconvert.frontends.onnx import import_onnx
    from qconvert.frontends.onnx.load import load
    from qconvert.interpret import interpret

    if backend not in BACKENDS:
        raise InputError(f"unknown backend '{backend}'; available: {', '.join(BACKENDS)}")
    model, inference_error = load(model_path, input_shapes)
    if isinstance(inputs, (str, os.PathLike)):
        feeds, inputs_source = load_inputs(model, inputs), str(inputs)
    elif inputs is not None:
        feeds, inputs_source = {k: np.asarray(v) for k, v in inputs.items()}, "arrays given"
        check_arrays(model, feeds)
    else:
        feeds, inputs_source = random_inputs(model), f"random (seed {RANDOM_SEED})"
    types = element_types(model)
    values, unreturnable = run_oracle(model, feeds, types)
    values.update(feeds)
    values.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
    constants = {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    report = CheckReport(
        model=str(model_path),
        backend=backend,
        tolerances=tolerances,
        layers={},
        outputs={},
        inputs_source=inputs_source,
    )
    if inference_error is not None:
        report.notes.append(
            f"onnx shape inference failed ({inference_error.message}); types from onnxruntime"
        )

    nodes = [(n, name) for n, name in zip(model.graph.node, node_names(model)) if is_quantization_node(n)]
    with _progress(show_progress) as bar:
        task = bar.add_task("per node", total=len(nodes))
        for node, name in nodes:
            report.layers[name] = check_node(model, node, name, values, types, constants, unreturnable)
            bar.advance(task)
    if not nodes:
        report.notes.append("the model has no quantization node: nothing was checked per node")

    producers = {o: n for n in model.graph.node for o in n.output}
    optimized = _float8_views(_run(_session(model, optimized=True), feeds), types)
    module = import_onnx(typed_for_lift(model, values, types))
    try:
        ours: dict[str, np.ndarray] | None = interpret(module, feeds)
        reason = None
    except InputError as error:
        ours, reason = None, f"the backend cannot run the whole model: {error.message}"
    for output in model.graph.output:
        reference = values[output.name]
        producer = producers.get(output.name)
        lsb = dequantize_lsb(producer, values, reference.shape) if producer is not None else None
        floor = compare(reference, optimized[output.name], lsb)
        if ours is None:
            report.outputs[output.name] = OutputResult(
                name=output.name, ours=None, noise_floor=floor, reason=reason
            )
            continue
        comparison = compare(reference, np.asarray(ours[output.name]), lsb, tolerances.atol, tolerances.rtol)
        report.outputs[output.name] = OutputResult(
            name=output.name,
            ours=comparison,
            noise_floor=floor,
            failed_tolerances=tolerance_failures(comparison, tolerances),
        )
    return report


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
        disable=not enabled,
    )


__all__ = [
    "CheckReport",
    "Comparison",
    "LayerResult",
    "OutputResult",
    "Tolerances",
    "check",
    "compare",
    "is_quantization_node",
    "load_inputs",
    "random_inputs",
]
