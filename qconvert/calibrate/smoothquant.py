"""SmoothQuant: move activation outliers of MatMul/Gemm inputs into the weights, on the float model.

For an input X (activation) multiplied by a constant weight W ([K, N], K = X's last axis), per input
channel j: s_j = max|X_j|**alpha / max|W_j|**(1 - alpha) (max over every consumer's row j when one X feeds
several MatMuls, Q/K/V). Then X·W = (X / s)·(s W): the rows of W are scaled by s before weight quantization,
and X / s is what gets quantized, its outlier channels shrunk. The float model computes the same up to
float rounding. Where 1/s goes (`_find_fold`), when X has no reader but the smoothed nodes:
- into X's producer: a LayerNormalization's scale and bias, or a MatMul/Gemm's constant weight columns
  (and Gemm's bias), also through ops that carry each channel to one place: Add of a constant (the bias is
  scaled too), Reshape, Transpose, Identity, Relu (s > 0), and the right side of a MatMul whose left is
  not constant (Softmax·V). BERT's attention output dense reads Reshape(Transpose(Softmax·V)), so its
  1/s lands in the value projection's columns and bias. The channel mapping is not assumed: the
  producer's column index is carried forward through the same ops as the data (a Reshape's extents from
  its constant shape or onnx's shape inference), and the fold is made only when it
  arrives at X as a permutation of the columns on X's last axis;
- else a Mul by 1/s is inserted before the consumers; except after a Reshape/Transpose (also
  Squeeze/Unsqueeze/Flatten): onnxruntime 1.32's Q/DQ propagation at opset 21 (which int16 activations
  need) cannot load int8 DequantizeLinear -> Reshape/Transpose -> an op without Q/DQ (it builds a
  QuantizeLinear whose output_dtype and zero point disagree), so that input is left unsmoothed.
`smoothing_notes` says per input which it was.

The per-channel maxima come from `ChannelAbsMaxObserver` (max over every axis but the last: exact and
mergeable by max, so any split of the data gives the same maxima).

`search_alphas` picks alpha per input from a small grid (or no smoothing at all) by the relative error of
the product with both sides quantized (activation int8 over its min/max, weights int8 symmetric per
tensor or per output channel) on a sample of the input's rows: a local proxy, no model run per candidate.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qconvert.errors import InputError

Override = TypeVar("Override")  # an --overrides entry, carried as it is
SMALLEST_SCALE = 1e-5  # keeps s away from zero for channels that never fire
ALPHA_GRID = (0.3, 0.5, 0.7, 0.8, 0.9)
SAMPLE_ROWS = 512  # rows of each input kept for the alpha search (the first ones, in data order)


@dataclass
class ChannelAbsMaxObserver:
    """max |x| per last-axis channel, over every batch (merge = elementwise max)."""

    maxima: np.ndarray | None = None

    def observe(self, values: np.ndarray) -> None:
        array = np.abs(np.asarray(values, dtype=np.float32))
        found = array.reshape(-1, array.shape[-1]).max(axis=0) if array.size else None
        if found is not None:
            self.merge(ChannelAbsMaxObserver(found))

    def merge(self, other: ChannelAbsMaxObserver) -> None:
        if other.maxima is None:
            return
        self.maxima = other.maxima.copy() if self.maxima is None else np.maximum(self.maxima, other.maxima)


@dataclass(frozen=True)
class SmoothedInput:
    tensor: str  # the activation that is now divided by s
    consumers: tuple[str, ...]  # the MatMul/Gemm nodes whose weight rows took s
    folded_into: str  # the producer that absorbed 1/s, "Mul" when one was inserted, or NOT_SMOOTHED
    largest_scale: float
    through: tuple[str, ...] = ()  # the op types between the producer and the tensor


def smoothable_inputs(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """Activation -> the MatMul / Gemm nodes (no transA; transB allowed) multiplying it by a 2-D constant."""
    constants = {t.name for t in model.graph.initializer}
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attributes.get("transA", 0) or node.input[1] not in constants or node.input[0] in constants:
            continue
        found.setdefault(node.input[0], []).append(node)
    weights = {t.name: t for t in model.graph.initializer}
    return {
        name: nodes for name, nodes in found.items() if all(len(weights[n.input[1]].dims) == 2 for n in nodes)
    }


def observe_channel_maxima(
    model: onnx.ModelProto,
    batches: Iterable[Mapping[str, np.ndarray]],
    tensors: Iterable[str],
    samples: dict[str, np.ndarray] | None = None,
) -> dict[str, ChannelAbsMaxObserver]:
    """Run the float model on the batches (onnxruntime, optimizations off) and observe each tensor; with
    `samples`, also keep its first SAMPLE_ROWS rows there (for `search_alphas`)."""
    import onnxruntime as ort

    names = list(tensors)
    if not names:  # nothing to observe (no MatMul/Gemm with a constant weight); run([]) would fetch all
        return {}
    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    outputs = {o.name for o in augmented.graph.output}
    augmented.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in outputs)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(augmented.SerializeToString(), options, providers=["CPUExecutionProvider"])
    inputs = [i.name for i in session.get_inputs()]
    observers = {name: ChannelAbsMaxObserver() for name in names}
    for batch in batches:
        for name, values in zip(names, session.run(names, {k: batch[k] for k in inputs}), strict=True):
            observers[name].observe(values)
            if samples is not None and values.size:
                rows = values.reshape(-1, values.shape[-1]).astype(np.float32)
                kept = samples.get(name)
                if kept is None or kept.shape[0] < SAMPLE_ROWS:
                    joined = rows if kept is None else np.concatenate([kept, rows])
                    samples[name] = joined[:SAMPLE_ROWS]
    return observers


def _weight_rows(tensor: onnx.TensorProto, node: onnx.NodeProto) -> np.ndarray:
    """The weight as [K, N] (rows = input channels), undoing Gemm's transB."""
    weight = numpy_helper.to_array(tensor)
    trans_b = any(a.name == "transB" and a.i for a in node.attribute)
    return weight.T if trans_b else weight


def _scales(activation_max: np.ndarray, weight_max: np.ndarray, alpha: float) -> np.ndarray:
    activation_max, weight_max = activation_max.astype(np.float64), weight_max.astype(np.float64)
    scale = np.where(
        (activation_max > 0) & (weight_max > 0),
        activation_max**alpha / np.maximum(weight_max, 1e-12) ** (1.0 - alpha),
        1.0,
    )
    return np.maximum(scale, SMALLEST_SCALE).astype(np.float32)


def _product_error(rows: np.ndarray, weight: np.ndarray, scale: np.ndarray, per_channel: bool) -> float:
    """Relative squared error of rows @ weight with rows / scale and scale * weight both int8 Q/DQ."""
    from qconvert.numerics.calibration import (
        activation_params,
        quantize_per_channel,
        quantize_values,
        weight_params,
        weight_params_per_channel,
    )

    x = (rows / scale).astype(np.float32)
    w = (weight * scale[:, None]).astype(np.float32)
    p = activation_params(x.min(), x.max(), "int8")
    x_restored = (
        quantize_values(x, p.scale, p.zero_point, "int8").astype(np.float32) - p.zero_point
    ) * p.scale
    if per_channel:
        scales, zeros = weight_params_per_channel(w, 1, "int8", symmetric=True)
        restored = quantize_per_channel(w, 1, scales, zeros, "int8").astype(np.float32) * scales[None, :]
    else:
        q = weight_params(w, "int8", symmetric=True)
        restored = quantize_values(w, q.scale, q.zero_point, "int8").astype(np.float32) * q.scale
    exact = rows.astype(np.float64) @ weight.astype(np.float64)
    error = exact - x_restored.astype(np.float64) @ restored.astype(np.float64)
    return float((error**2).sum() / max((exact**2).sum(), 1e-30))


def search_alphas(
    model: onnx.ModelProto,
    maxima: Mapping[str, ChannelAbsMaxObserver],
    samples: Mapping[str, np.ndarray],
    per_channel: bool,
    grid: Iterable[float] = ALPHA_GRID,
) -> dict[str, float | None]:
    """Per smoothable input: the alpha of `grid` with the least product error on its sample, or None when
    leaving it unsmoothed is better."""
    weights = {t.name: t for t in model.graph.initializer}
    chosen: dict[str, float | None] = {}
    for tensor, nodes in smoothable_inputs(model).items():
        observer, rows = maxima.get(tensor), samples.get(tensor)
        if observer is None or observer.maxima is None or rows is None:
            continue
        weight = np.concatenate([_weight_rows(weights[n.input[1]], n) for n in nodes], axis=1)
        if weight.shape[0] != observer.maxima.size:
            continue
        weight_max = np.abs(weight).max(axis=1)
        best: tuple[float, float | None] = (
            _product_error(rows, weight, np.ones_like(weight_max), per_channel),
            None,
        )
        for alpha in grid:
            error = _product_error(rows, weight, _scales(observer.maxima, weight_max, alpha), per_channel)
            if error < best[0]:
                best = (error, alpha)
        chosen[tensor] = best[1]
    return chosen


def smooth_quant(
    model: onnx.ModelProto,
    maxima: Mapping[str, ChannelAbsMaxObserver],
    alpha: float | Mapping[str, float | None] = 0.5,
    quantized_op_types: Collection[str] = (),
) -> tuple[onnx.ModelProto, list[SmoothedInput]]:
    """A copy of `model` with every smoothable input's channel maxima migrated into its weights; `alpha`
    one for all, or per input (`search_alphas`: None or absent leaves that input alone).
    `quantized_op_types`: the op types calibration will quantize; an input whose producer is one of them
    and that no producer absorbs 1/s for is left alone (its outliers would be quantized at the producer's
    output before the Mul divides them)."""
    alphas = alpha if isinstance(alpha, Mapping) else None
    for value in alphas.values() if alphas is not None else [alpha]:
        if value is not None and not 0.0 <= float(value) <= 1.0:  # type: ignore[arg-type]
            raise InputError(f"--smooth-quant {value}: alpha must lie in [0, 1]")
    smoothed = onnx.ModelProto()
    smoothed.CopyFrom(model)
    graph = smoothed.graph
    weights = {t.name: t for t in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    producers: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
        for name in node.output:
            producers[name] = node
    graph_outputs = {o.name for o in graph.output}
    shared_weights = {name for name, users in consumers.items() if name in weights and len(users) > 1}
    constants = _constant_nodes(graph)
    graph_context = _Graph(
        weights, producers, consumers, graph_outputs, shared_weights, constants, _reshaped_extents(model)
    )
    done: list[SmoothedInput] = []
    inserted: list[tuple[int, onnx.NodeProto]] = []
    for tensor, nodes in smoothable_inputs(smoothed).items():
        observer = maxima.get(tensor)
        this_alpha = alphas.get(tensor) if alphas is not None else alpha
        if observer is None or observer.maxima is None or this_alpha is None:
            continue
        if any(node.input[1] in shared_weights for node in nodes):
            continue  # a weight another node also reads cannot take this input's scales
        rows = [_weight_rows(weights[node.input[1]], node) for node in nodes]
        if any(r.shape[0] != observer.maxima.size for r in rows):
            continue
        sole_users = len(consumers.get(tensor, [])) == len(nodes) and tensor not in graph_outputs
        fold = _find_fold(tensor, observer.maxima.size, graph_context) if sole_users else None
        producer = producers.get(tensor)
        if fold is None and producer is not None and producer.op_type in quantized_op_types:
            done.append(SmoothedInput(tensor, tuple(n.name for n in nodes), QUANTIZED_FIRST, 1.0))
            continue
        if fold is None and _after_layout_op(tensor, producers):
            # a Mul after a Reshape/Transpose of a Q/DQ'd tensor trips onnxruntime 1.32's Q/DQ propagation
            # at opset 21 (a QuantizeLinear of mismatched types: the model then fails to load)
            done.append(SmoothedInput(tensor, tuple(n.name for n in nodes), NOT_SMOOTHED, 1.0))
            continue
        weight_max = np.max([np.abs(r).max(axis=1) for r in rows], axis=0)
        scale = _scales(observer.maxima, weight_max, float(this_alpha))
        for node, row in zip(nodes, rows, strict=True):
            new = row * scale[:, None]
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            weights[node.input[1]].CopyFrom(numpy_helper.from_array(new.T if trans_b else new, node.input[1]))
        inverse = (1.0 / scale).astype(np.float32)
        if fold is not None:
            folded = fold.apply(inverse, weights)
        else:
            divided = f"{tensor}_smoothed"
            factor = f"{tensor}_smooth_inverse"
            graph.initializer.append(numpy_helper.from_array(inverse, factor))
            mul = helper.make_node("Mul", [tensor, factor], [divided], name=f"{tensor}_smooth_mul")
            position = min(list(graph.node).index(node) for node in nodes)
            inserted.append((position, mul))
            for node in nodes:
                node.input[0] = divided
            folded = "Mul"
        through = fold.path if fold is not None else ()
        done.append(SmoothedInput(tensor, tuple(n.name for n in nodes), folded, float(scale.max()), through))
    for position, mul in sorted(inserted, key=lambda item: item[0], reverse=True):
        graph.node.insert(position, mul)
    return smoothed, done


NOT_SMOOTHED = "not smoothed"
QUANTIZED_FIRST = "not smoothed: quantized first"
LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten")
SHAPE_READERS = ("Shape", "Size")  # read a tensor's shape, not its values: scaling it changes nothing there


def smoothing_notes(done: Iterable[SmoothedInput]) -> list[str]:
    """One line per smoothed MatMul/Gemm input: where its 1/s went (for the summary)."""
    notes = []
    if not done:
        notes.append("SmoothQuant: nothing smoothed (no MatMul/Gemm input times a constant weight gained)")
    for entry in done:
        if entry.folded_into == NOT_SMOOTHED:
            notes.append(
                f"SmoothQuant: '{entry.tensor}' not smoothed: no producer absorbs 1/s, and a Mul after its "
                "Reshape/Transpose would not load in onnxruntime 1.32 at opset 21"
            )
        elif entry.folded_into == QUANTIZED_FIRST:
            notes.append(
                f"SmoothQuant: '{entry.tensor}' not smoothed: nothing absorbs 1/s, and its producer's output "
                "is quantized (int8) before a Mul could divide it"
            )
        elif entry.folded_into == "Mul":
            notes.append(f"SmoothQuant: '{entry.tensor}' divided by s (a Mul inserted: nothing absorbs it)")
        else:
            through = f" through {' -> '.join(entry.through)}" if entry.through else ""
            notes.append(
                f"SmoothQuant: '{entry.tensor}' divided by s, 1/s folded into '{entry.folded_into}'{through}"
            )
    return notes


def carry_overrides(
    model: onnx.ModelProto,
    done: Iterable[SmoothedInput],
    overrides: Mapping[str, Override],
    quantized_op_types: Collection[str],
) -> dict[str, Override]:
    """`--overrides` entries of smoothed inputs given to what the MatMuls now read (X / s, the inserted Mul's
    output): moved there when nothing quantized reads X any more, else copied (X keeps its own)."""
    carried = dict(overrides)
    for entry in done:
        if entry.folded_into != "Mul" or entry.tensor not in overrides:
            continue
        readers = [
            node
            for node in model.graph.node
            if entry.tensor in node.input and node.name != f"{entry.tensor}_smooth_mul"
        ]
        carried[f"{entry.tensor}_smoothed"] = overrides[entry.tensor]
        if not any(node.op_type in quantized_op_types for node in readers):
            del carried[entry.tensor]
    return carried


def _after_layout_op(tensor: str, producers: Mapping[str, onnx.NodeProto]) -> bool:
    producer = producers.get(tensor)
    return producer is not None and producer.op_type in LAYOUT_OPS


@dataclass(frozen=True)
class _Graph:
    weights: dict[str, onnx.TensorProto]
    producers: dict[str, onnx.NodeProto]
    consumers: dict[str, list[onnx.NodeProto]]
    outputs: set[str]
    shared: set[str]
    constants: dict[str, np.ndarray]  # Constant nodes' outputs
    reshaped: dict[str, list[int]]  # a Reshape output -> its trailing extents whatever the input dims

    def constant(self, name: str) -> np.ndarray | None:
        if name in self.weights:
            return numpy_helper.to_array(self.weights[name])
        return self.constants.get(name)

    def own_weight(self, name: str) -> bool:
        """An initializer only this one node reads (so scaling it changes nothing else)."""
        return name in self.weights and name not in self.shared and len(self.consumers.get(name, [])) == 1


def _constant_nodes(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    found = {}
    for node in graph.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            for attribute in node.attribute:
                if attribute.name == "value":
                    found[node.output[0]] = numpy_helper.to_array(attribute.t)
                elif attribute.name in ("value_int", "value_ints"):
                    found[node.output[0]] = np.array(helper.get_attribute_value(attribute), dtype=np.int64)
    return found


@dataclass(frozen=True)
class _Fold:
    """Where 1/s goes: `producer`'s output columns (a constant-weight MatMul/Gemm, or a LayerNormalization),
    through `biases` (Add of a constant on the way, each with the producer's column index at that point) to
    the smoothed tensor, whose channel c is the producer's column `columns[c]`."""

    producer: onnx.NodeProto
    columns: np.ndarray  # [C]: the producer column feeding channel c of the smoothed tensor
    biases: tuple[tuple[str, np.ndarray], ...]  # (initializer, column index broadcast like it)
    path: tuple[str, ...]  # op types from the producer to the tensor, for the report

    def apply(self, inverse: np.ndarray, weights: dict[str, onnx.TensorProto]) -> str:
        column_factor = np.empty(self.columns.size, dtype=np.float32)
        column_factor[self.columns] = inverse
        producer = self.producer
        if producer.op_type == "LayerNormalization":
            for name in [n for n in producer.input[1:3] if n]:
                _scale_initializer(weights, name, column_factor)
        else:
            weight = producer.input[1]
            trans_b = any(a.name == "transB" and a.i for a in producer.attribute)
            _scale_initializer(weights, weight, column_factor[:, None] if trans_b else column_factor)
            if producer.op_type == "Gemm" and len(producer.input) > 2 and producer.input[2]:
                _scale_initializer(weights, producer.input[2], column_factor)
        for name, columns in self.biases:
            _scale_initializer(weights, name, column_factor[columns])
        return producer.name or producer.op_type


def _scale_initializer(weights: dict[str, onnx.TensorProto], name: str, factor: np.ndarray) -> None:
    values = numpy_helper.to_array(weights[name])
    scaled = (values * factor).astype(values.dtype)
    weights[name].CopyFrom(numpy_helper.from_array(scaled, name))


def _find_fold(tensor: str, channels: int, graph: _Graph) -> _Fold | None:
    """Walk back from `tensor` through ops that carry each channel to one place (Add of a constant, Reshape,
    Transpose, Identity, Relu, the right side of a MatMul whose left is not constant) to a producer that can
    scale its output columns; then follow the producer's column index forward along the same ops, so the
    channel mapping is computed as the data moves, not assumed. None when anything on the way is not exact."""
    path: list[tuple[onnx.NodeProto, int]] = []  # (node, which input the chain enters by), tensor-side first
    current = tensor
    while True:
        node = graph.producers.get(current)
        if node is None:
            return None
        readers = [n for n in graph.consumers.get(current, []) if n.op_type not in SHAPE_READERS]
        if current != tensor and (len(readers) != 1 or current in graph.outputs):
            return None  # another reader would see the scaled values
        if _producer_columns(node, graph) is not None:
            break
        entered = _channel_input(node, graph)
        if entered is None:
            return None
        path.append((node, entered))
        current = node.input[entered]
    width = _producer_columns(node, graph)
    assert width is not None
    index = np.arange(width)
    real = (True,)  # per axis of `index`: a real extent (False: broadcast over that axis)
    biases: list[tuple[str, np.ndarray]] = []
    for step, entered in reversed(path):
        moved = _carry_index(step, entered, index, real, graph)
        if moved is None:
            return None
        index, real, bias = moved
        if bias is not None:
            biases.append(bias)
    while index.ndim > 1 and not real[0] and index.shape[0] == 1:
        index, real = index[0], real[1:]
    if index.ndim != 1 or index.size != channels or width != channels:
        return None
    if not np.array_equal(np.sort(index), np.arange(width)):
        return None
    return _Fold(node, index, tuple(biases), tuple(step.op_type for step, _ in reversed(path)))


def _producer_columns(node: onnx.NodeProto, graph: _Graph) -> int | None:
    """The output width of a node whose output columns can take a per-column factor exactly, else None."""
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type in ("MatMul", "Gemm") and len(node.input) >= 2 and not attributes.get("transA", 0):
        weight = graph.constant(node.input[1])
        if weight is None or weight.ndim != 2 or not graph.own_weight(node.input[1]):
            return None
        if graph.constant(node.input[0]) is not None:
            return None
        bias = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 else ""
        if bias and not graph.own_weight(bias):
            return None
        return int(weight.shape[0] if attributes.get("transB", 0) else weight.shape[1])
    if node.op_type == "LayerNormalization" and attributes.get("axis", -1) == -1:
        parameters = [name for name in node.input[1:3] if name]
        if not all(graph.own_weight(name) for name in parameters):
            return None
        shapes = {graph.constant(name).shape for name in parameters}  # type: ignore[union-attr]
        if len(shapes) != 1 or len(next(iter(shapes))) != 1:
            return None
        return int(next(iter(shapes))[0])
    return None


def _channel_input(node: onnx.NodeProto, graph: _Graph) -> int | None:
    """Which input of `node` each output channel comes from unmixed (scaled along), else None."""
    if node.op_type in ("Identity", "Relu", "Transpose") and node.input:
        return 0
    if node.op_type == "Reshape" and len(node.input) == 2:
        return 0
    if node.op_type == "Add" and len(node.input) == 2:
        constant = [i for i, name in enumerate(node.input) if graph.own_weight(name)]
        return 1 - constant[0] if len(constant) == 1 else None
    if node.op_type == "MatMul" and len(node.input) == 2 and graph.constant(node.input[0]) is None:
        return 1  # A·B: output column n, batch b is B's column n, batch b scaled
    return None


def _carry_index(
    node: onnx.NodeProto, entered: int, index: np.ndarray, real: tuple[bool, ...], graph: _Graph
) -> tuple[np.ndarray, tuple[bool, ...], tuple[str, np.ndarray] | None] | None:
    """The producer-column index of `node`'s output, given that of its input `entered`; the Add's bias with
    the index it meets. Arrays broadcast from the right, as the data does."""
    op = node.op_type
    if op in ("Identity", "Relu"):
        return index, real, None
    if op == "Add":
        bias_name = node.input[1 - entered]
        bias = graph.constant(bias_name)
        lead = index.ndim - max(bias.ndim, 1)
        if bias.ndim > index.ndim or any(extent != 1 for extent in index.shape[:lead]):
            return None
        trimmed = index.reshape(index.shape[lead:])  # as many axes as the bias has (one for a scalar)
        if np.broadcast_shapes(bias.shape, trimmed.shape) != trimmed.shape:
            return None  # the bias has extents the index does not vary along: keep it simple and exact
        return index, real, (bias_name, trimmed)
    if op == "Transpose":
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        if perm is None or len(perm) < index.ndim:
            return None
        extra = len(perm) - index.ndim
        index = index.reshape((1,) * extra + index.shape)
        real = (False,) * extra + real
        return index.transpose(perm), tuple(real[p] for p in perm), None
    if op == "MatMul":
        if index.ndim < 2 or index.shape[-2] != 1 or real[-2]:
            return None  # the contracted axis must not carry channels (nor may B be a vector)
        return index, real, None
    if op == "Reshape":
        while index.ndim > 1 and not real[0] and index.shape[0] == 1:
            index, real = index[0], real[1:]
        if not all(real):
            return None  # a broadcast axis inside the channel block: the block's extent is not known
        target = _shape_suffix(node.input[1], graph)
        block = index.size
        product, suffix = 1, []
        for extent in reversed(target):
            if extent <= 0:
                return None  # 0 (copy an input extent) or -1 (inferred): not known here
            product *= extent
            suffix.insert(0, extent)
            if product >= block:
                break
        if product != block:
            return None
        # row-major: the input's trailing block of `block` elements is the output's trailing block
        return index.reshape(suffix), (True,) * len(suffix), None
    return None


def _shape_suffix(name: str, graph: _Graph) -> list[int]:
    """The known tail of a Reshape's output shape: its shape input when constant, else the trailing extents
    shape inference gives whatever the input dims (`_reshaped_extents`), else the constant trailing pieces
    of the Concat building it."""
    node = graph.producers.get(name)
    reshape = next((n for n in graph.consumers.get(name, []) if n.op_type == "Reshape"), None)
    if reshape is not None and reshape.output[0] in graph.reshaped:
        return graph.reshaped[reshape.output[0]]
    constant = graph.constant(name)
    if constant is not None:
        return [int(v) for v in constant.reshape(-1)]
    if node is None or node.op_type != "Concat":
        return []
    suffix: list[int] = []
    for piece in reversed(node.input):
        value = graph.constant(piece)
        if value is None:
            break
        suffix = [int(v) for v in value.reshape(-1)] + suffix
    return suffix


def _reshaped_extents(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Each Reshape output's trailing extents that onnx's shape inference (with data propagation) gives
    both with every symbolic input dim pinned to 2 and to 3: BERT's [b, 64, -1, 32] built from
    Shape/Gather/Concat is [2, 64, 12, 32] and [3, 64, 12, 32], so [64, 12, 32]. Extents that follow the
    input's dims differ between the two and are left out. {} when the inference fails."""
    stripped = _weights_as_inputs(model)
    outputs = {n.output[0] for n in model.graph.node if n.op_type == "Reshape" and n.output}
    runs: list[dict[str, list[int]]] = []
    for pinned in (2, 3):
        copy = onnx.ModelProto()
        copy.CopyFrom(stripped)
        for graph_input in copy.graph.input:
            for dim in graph_input.type.tensor_type.shape.dim:
                if not dim.HasField("dim_value"):
                    dim.dim_value = pinned
        try:
            inferred = onnx.shape_inference.infer_shapes(copy, data_prop=True)
        except Exception:  # any failure only means no fold through a dynamic Reshape
            return {}
        infos = [info for info in inferred.graph.value_info if info.name in outputs]
        runs.append({info.name: _known_tail(info) for info in infos})
    extents: dict[str, list[int]] = {}
    for name, first in runs[0].items():
        second = runs[1].get(name, [])
        common: list[int] = []
        for a, b in zip(reversed(first), reversed(second), strict=False):
            if a != b:
                break
            common.insert(0, a)
        extents[name] = common
    return extents


def _known_tail(info: onnx.ValueInfoProto) -> list[int]:
    tail: list[int] = []
    for dim in reversed(info.type.tensor_type.shape.dim):
        if not dim.HasField("dim_value") or dim.dim_value <= 0:
            break
        tail.insert(0, int(dim.dim_value))
    return tail


def _weights_as_inputs(model: onnx.ModelProto, largest: int = 64) -> onnx.ModelProto:
    """The graph with every initializer of more than `largest` elements made a graph input of its type and
    shape: shape inference needs only their shapes (MiniLM's 90 MB of weights are not copied)."""
    stripped = onnx.ModelProto()
    stripped.ir_version, stripped.producer_name = model.ir_version, model.producer_name
    stripped.opset_import.extend(model.opset_import)
    graph = stripped.graph
    graph.name = model.graph.name
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    declared = {i.name for i in model.graph.input}
    for tensor in model.graph.initializer:
        if int(np.prod(tensor.dims)) <= largest:
            graph.initializer.append(tensor)
        elif tensor.name not in declared:
            shape = list(tensor.dims)
            graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, shape))
    return stripped
