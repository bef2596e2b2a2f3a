"""SmoothQuant: move activation outliers of MatMul/Gemm inputs into the weights, on the float model.

For an input X (activation) multiplied by a constant weight W ([K, N], K = X's last axis), per input
channel j: s_j = max|X_j|**alpha / max|W_j|**(1 - alpha) (max over every consumer's row j when one X feeds
several MatMuls, Q/K/V). Then X·W = (X / s)·(s W): the rows of W are scaled by s before weight quantization,
and X / s is what gets quantized, its outlier channels shrunk. 1/s is folded into X's producer where that is
exact and X has no other consumer (LayerNormalization scale and bias; a preceding MatMul's columns are not
folded yet), else a Mul by 1/s is inserted before the consumers. The float model computes the same up
to float rounding.

The per-channel maxima come from `ChannelAbsMaxObserver` (max over every axis but the last: exact and
mergeable by max, so any split of the data gives the same maxima).

`search_alphas` picks alpha per input from a small grid (or no smoothing at all) by the relative error of
the product with both sides quantized (activation int8 over its min/max, weights int8 symmetric per
tensor or per output channel) on a sample of the input's rows: a local proxy, no model run per candidate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qconvert.errors import InputError

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
    folded_into: str  # the producer that absorbed 1/s, or "Mul" when one was inserted
    largest_scale: float


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
) -> tuple[onnx.ModelProto, list[SmoothedInput]]:
    """A copy of `model` with every smoothable input's channel maxima migrated into its weights; `alpha`
    one for all, or per input (`search_alphas`: None or absent leaves that input alone)."""
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
        weight_max = np.max([np.abs(r).max(axis=1) for r in rows], axis=0)
        scale = _scales(observer.maxima, weight_max, float(this_alpha))
        for node, row in zip(nodes, rows, strict=True):
            new = row * scale[:, None]
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            weights[node.input[1]].CopyFrom(numpy_helper.from_array(new.T if trans_b else new, node.input[1]))
        inverse = (1.0 / scale).astype(np.float32)
        producer = producers.get(tensor)
        sole_users = len(consumers.get(tensor, [])) == len(nodes) and tensor not in graph_outputs
        folded = _fold_into_producer(producer, inverse, weights, shared_weights) if sole_users else None
        if folded is None:
            divided = f"{tensor}_smoothed"
            factor = f"{tensor}_smooth_inverse"
            graph.initializer.append(numpy_helper.from_array(inverse, factor))
            mul = helper.make_node("Mul", [tensor, factor], [divided], name=f"{tensor}_smooth_mul")
            position = min(list(graph.node).index(node) for node in nodes)
            inserted.append((position, mul))
            for node in nodes:
                node.input[0] = divided
            folded = "Mul"
        done.append(SmoothedInput(tensor, tuple(n.name for n in nodes), folded, float(scale.max())))
    for position, mul in sorted(inserted, key=lambda item: item[0], reverse=True):
        graph.node.insert(position, mul)
    return smoothed, done


def _fold_into_producer(
    producer: onnx.NodeProto | None,
    inverse: np.ndarray,
    weights: dict[str, onnx.TensorProto],
    shared_weights: set[str],
) -> str | None:
    """Scale the producer's output channels by `inverse` where exact; its name, or None when it cannot."""
    if producer is None:
        return None
    if producer.op_type == "LayerNormalization":
        axis = next((a.i for a in producer.attribute if a.name == "axis"), -1)
        parameters = [name for name in producer.input[1:3] if name]
        if axis != -1 or not all(n in weights and n not in shared_weights for n in parameters):
            return None
        for name in parameters:
            values = numpy_helper.to_array(weights[name])
            if values.shape != inverse.shape:
                return None
        for name in parameters:
            values = numpy_helper.to_array(weights[name]) * inverse
            weights[name].CopyFrom(numpy_helper.from_array(values.astype(np.float32), name))
        return producer.name or "LayerNormalization"
    return None
