"""Bias correction: each layer's bias absorbs the mean shift its weight's quantization causes.

NOTE: why and how. Quantizing a weight W to W_q changes a layer's output by x · (W_q - W); averaged over
the data that is E[x] · (W_q - W), a per-output-channel shift that every sample carries (Nagel et al.,
"Data-Free Quantization", 2019, empirical bias correction). Where the layer's output gets a constant bias,
that bias can take it back: b += E[x] · (W - W_q). Here:
1. the layers (`correctable_layers`): MatMul with a constant 2-D weight whose only reader is an Add of a
   constant (the bias, read by nothing else, with one entry per output column), Gemm with a constant B
   and C (C += alpha / beta · E[a] · ΔB', transA/transB honoured), Conv with constant W and B (each
   output channel summed over its group's input channels and the kernel: zero padding at the borders is
   not modelled);
2. E[x]: the per-input-channel mean of each layer's float input on the first whole batches covering
   `OUTLIER_SAMPLES` calibration samples (the batches the outlier-channel statistics use), in one float
   run of the model (`input_means`);
3. W_q exactly as the written model holds it: the calibrated model is finalized once more with the same
   scheme (per-channel or not, the weight type, overrides, onnxruntime's weight-scale increase for int32
   biases) and each weight's DequantizeLinear is evaluated (`qconvert.numerics.dequantize`), so no
   rounding rule is re-derived here. The bias is changed by a tiny amount, so the weight scales it
   could move (onnxruntime's increase when b / (s_in · s_w) overflows int32) stay the same in practice;
4. the corrected float bias replaces the constant in the lifted module before the real finalize, which
   then quantizes it (int32 for Gemm/Conv, the Add's own Q/DQ for MatMul + Add) as any bias.
Each corrected layer gets a note (the summary, `--json`'s notes) and an entry in `--json`'s
`bias_correction`.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from qconvert.calibrate.channel_spread import OUTLIER_SAMPLES
from qconvert.errors import InputError

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

    from qconvert.calibrate.dataset import Dataset
    from qconvert.calibrate.ranges import CalibrationRanges
    from qconvert.calibrate.scheme import Scheme
    from qconvert.frontends.onnx.load import LoadedModel
    from qconvert.ir.core import Value
    from qconvert.ir.dialects.builtin import ModuleOp

BIAS_CORRECTION_POLICIES = ("on", "off")
DEFAULT_BIAS_CORRECTION = "off"  # measured: see the README's table (it does not help everywhere)
LAYER_TYPES = ("MatMul", "Gemm", "Conv")


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer whose bias can absorb its weight's quantization shift."""

    node: str
    op_type: str
    input: str  # the activation whose per-channel mean E[x] is taken
    weight: str
    bias: str  # the initializer corrected
    channel_axis: int  # the axis of `input` the weight sums over (its channels)
    factor: float = 1.0  # Gemm's alpha / beta: what C must change by per unit of A'·ΔB'
    transposed_weight: bool = False  # Gemm's transB
    group: int = 1  # Conv's groups


def check_policy(policy: str | bool) -> str:
    """The policy, on or off (True/False accepted), else InputError."""
    if isinstance(policy, bool):
        return "on" if policy else "off"
    if policy not in BIAS_CORRECTION_POLICIES:
        from qconvert.did_you_mean import did_you_mean

        raise InputError(
            f"--bias-correction {policy}: expected one of {', '.join(BIAS_CORRECTION_POLICIES)}"
            + did_you_mean(str(policy), BIAS_CORRECTION_POLICIES)
        )
    return policy


def _attribute(node: NodeProto, name: str, default: float | int) -> float | int:
    from onnx import helper

    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)  # type: ignore[no-any-return]
    return default


def correctable_layers(model: ModelProto, op_types: frozenset[str] | None = None) -> list[Layer]:
    """The MatMul/Gemm/Conv nodes (of `op_types`, None: all) with a constant weight and a constant bias
    that only they use, in graph order."""
    graph = model.graph
    shapes = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer}
    readers: Counter[str] = Counter(name for node in graph.node for name in node.input if name)
    consumers: dict[str, list[NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {output.name for output in graph.output}
    layers = []
    for node in graph.node:
        if node.op_type not in LAYER_TYPES or (op_types is not None and node.op_type not in op_types):
            continue
        inputs = list(node.input)
        if len(inputs) < 2 or inputs[0] in shapes or inputs[1] not in shapes:
            continue
        weight_shape = shapes[inputs[1]]
        if node.op_type == "MatMul":
            layer = _matmul_layer(node, weight_shape, shapes, readers, consumers, outputs)
        elif len(inputs) < 3 or inputs[2] not in shapes or readers[inputs[2]] != 1:
            continue
        elif node.op_type == "Gemm":
            layer = _gemm_layer(node, weight_shape, shapes[inputs[2]])
        else:
            layer = _conv_layer(node, weight_shape, shapes[inputs[2]])
        if layer is not None:
            layers.append(layer)
    return layers


def _matmul_layer(
    node: NodeProto,
    weight_shape: tuple[int, ...],
    shapes: Mapping[str, tuple[int, ...]],
    readers: Counter[str],
    consumers: Mapping[str, list[NodeProto]],
    outputs: set[str],
) -> Layer | None:
    """MatMul(x, W[K, N]) read only by Add(·, b) with b constant, read once, of N entries on its last axis."""
    output = node.output[0]
    readers_of_output = consumers.get(output, [])
    if len(weight_shape) != 2 or output in outputs or len(readers_of_output) != 1:
        return None
    add = readers_of_output[0]
    if add.op_type != "Add" or len(add.input) != 2:
        return None
    bias = next((name for name in add.input if name != output), None)
    if bias is None or bias not in shapes or readers[bias] != 1:
        return None
    bias_shape = shapes[bias]
    if not bias_shape or bias_shape[-1] != weight_shape[1] or int(np.prod(bias_shape)) != weight_shape[1]:
        return None
    return Layer(node.name, "MatMul", node.input[0], node.input[1], bias, channel_axis=-1)


def _gemm_layer(node: NodeProto, weight_shape: tuple[int, ...], bias_shape: tuple[int, ...]) -> Layer | None:
    alpha = float(_attribute(node, "alpha", 1.0))
    beta = float(_attribute(node, "beta", 1.0))
    trans_a, trans_b = bool(_attribute(node, "transA", 0)), bool(_attribute(node, "transB", 0))
    if beta == 0.0 or len(weight_shape) != 2:
        return None
    columns = weight_shape[0] if trans_b else weight_shape[1]
    if not bias_shape or bias_shape[-1] != columns:  # a scalar C cannot carry a shift per column
        return None
    inputs = list(node.input)
    axis = 0 if trans_a else 1
    return Layer(node.name, "Gemm", inputs[0], inputs[1], inputs[2], axis, alpha / beta, trans_b)


def _conv_layer(node: NodeProto, weight_shape: tuple[int, ...], bias_shape: tuple[int, ...]) -> Layer | None:
    if len(weight_shape) < 3 or bias_shape != (weight_shape[0],):
        return None
    inputs = list(node.input)
    group = int(_attribute(node, "group", 1))
    return Layer(node.name, "Conv", inputs[0], inputs[1], inputs[2], channel_axis=1, group=group)


# E[x] -------------------------------------------------------------------------------------------------
def input_means(
    loaded: LoadedModel, layers: list[Layer], dataset: Dataset, samples: int = OUTLIER_SAMPLES
) -> dict[str, np.ndarray]:
    """Each layer input's per-channel mean (float64) over the first whole batches covering `samples`, in
    one float run of the model (optimizations off, as calibration's session)."""
    from qconvert.calibrate.collect import augment_model, calibration_tensors, make_session

    axes = {layer.input: layer.channel_axis for layer in layers}
    graph_inputs = {tensor.name for tensor in loaded.model.graph.input}
    known = calibration_tensors(loaded.model)
    exposed = [name for name in axes if name not in graph_inputs and name in known]
    session = make_session(augment_model(loaded, exposed), threads=0) if exposed else None
    sums: dict[str, np.ndarray] = {}
    counts: Counter[str] = Counter()
    done = 0
    for batch in dataset.batches():
        if done >= samples:
            break
        values = dict(batch.arrays)
        if session is not None:
            values.update(zip(exposed, session.run(exposed, batch.arrays)))
        for name, axis in axes.items():
            array = values.get(name)
            if array is None or np.ndim(array) < 2:
                continue
            moved = np.moveaxis(np.asarray(array, dtype=np.float64), axis, -1)
            flat = moved.reshape(-1, moved.shape[-1])
            total = flat.sum(axis=0)
            if name in sums and sums[name].shape != total.shape:
                continue  # a channel count that changes between batches: no single mean
            sums[name] = sums[name] + total if name in sums else total
            counts[name] += flat.shape[0]
        done += batch.size
    return {name: sums[name] / counts[name] for name in sums if counts[name]}


# W_q as finalize writes it ------------------------------------------------------------------------
def written_weights(
    model: object, loaded: LoadedModel, ranges: CalibrationRanges, scheme: Scheme, names: set[str]
) -> dict[str, np.ndarray]:
    """weight name -> its dequantized values in the model finalize writes with `scheme` (a throwaway
    finalize of another lift of `model`), for the `names` that get a weight Q/DQ."""
    from qconvert.calibrate.attach import attach_ranges
    from qconvert.calibrate.finalize import finalize
    from qconvert.calibrate.tensor_names import TENSOR_NAME_ATTR, tensor_values
    from qconvert.frontends.onnx import import_onnx
    from qconvert.interpret import constant_array, reinterpret
    from qconvert.ir.attributes import StringAttr
    from qconvert.ir.dialects.arith import ConstantOp
    from qconvert.ir.dialects.quant import DequantizeCastOp
    from qconvert.ir.quant_types import QuantizedType, uniform_params
    from qconvert.ir.types import element_type_of
    from qconvert.numerics import Rounding, dequantize

    module = import_onnx(model, map_file=True)  # type: ignore[arg-type]
    values = tensor_values(module, loaded.model)
    attach_ranges(module, ranges, values=values)
    finalize(module, copy.deepcopy(scheme), [], value_names={value: name for name, value in values.items()})
    found: dict[str, np.ndarray] = {}
    for op in module.walk():
        if not isinstance(op, DequantizeCastOp):
            continue
        label = op.attributes.get(TENSOR_NAME_ATTR)
        name = label.value if isinstance(label, StringAttr) else None
        cast = op.input.owner_op()
        constant = cast.operands[0].owner_op() if cast is not None and cast.operands else None
        if name not in names or not isinstance(constant, ConstantOp):
            continue
        quant_type = element_type_of(op.input.type)
        if not isinstance(quant_type, QuantizedType):
            continue
        stored = reinterpret(constant_array(constant), cast)  # type: ignore[arg-type]
        found[name] = np.asarray(dequantize(stored, uniform_params(quant_type), Rounding.ONNX))
    return found


# The correction -----------------------------------------------------------------------------------
def bias_shift(layer: Layer, weight: np.ndarray, written: np.ndarray, mean: np.ndarray) -> np.ndarray | None:
    """E[x] · (W - W_q) per output channel (what the bias must gain), float64; None on a shape mismatch."""
    delta = np.asarray(weight, np.float64) - np.asarray(written, np.float64)
    if layer.op_type in ("MatMul", "Gemm"):
        if layer.transposed_weight:
            delta = delta.T
        if mean.shape != (delta.shape[0],):
            return None
        return layer.factor * (mean @ delta)
    output_channels, per_group = delta.shape[0], delta.shape[1]
    if mean.shape != (per_group * layer.group,) or output_channels % layer.group:
        return None
    summed = delta.reshape(output_channels, per_group, -1).sum(axis=2)  # [M, C / group]
    group_of = np.arange(output_channels) // (output_channels // layer.group)  # each output channel's group
    means = mean.reshape(layer.group, per_group)[group_of]
    return (summed * means).sum(axis=1)


def correct_biases(
    module: ModuleOp,
    values: Mapping[str, Value],
    layers: list[Layer],
    means: Mapping[str, np.ndarray],
    written: Mapping[str, np.ndarray],
    notes: list[str],
) -> dict[str, dict[str, object]]:
    """Add each layer's shift to its bias constant in `module` (before finalize); bias name -> what was
    done (for `--json`). A note per corrected layer."""
    from qconvert.interpret import constant_array
    from qconvert.ir.attributes import DenseElementsAttr
    from qconvert.ir.dialects.arith import ConstantOp

    done: dict[str, dict[str, object]] = {}
    for layer in layers:
        weight_value, bias_value = values.get(layer.weight), values.get(layer.bias)
        mean, quantized = means.get(layer.input), written.get(layer.weight)
        if weight_value is None or bias_value is None or mean is None or quantized is None:
            continue
        weight_op, bias_op = weight_value.owner_op(), bias_value.owner_op()
        if not isinstance(weight_op, ConstantOp) or not isinstance(bias_op, ConstantOp):
            continue
        shift = bias_shift(layer, constant_array(weight_op), quantized, mean)
        bias = constant_array(bias_op)
        if shift is None or not np.issubdtype(bias.dtype, np.floating) or not np.isfinite(shift).all():
            continue
        corrected = (bias.astype(np.float64) + shift.reshape(-1)).astype(bias.dtype).reshape(bias.shape)
        bias_op.attributes["value"] = DenseElementsAttr(np.ascontiguousarray(corrected), bias_value.type)  # type: ignore[arg-type]
        largest = float(np.abs(shift).max()) if shift.size else 0.0
        scale = float(np.abs(bias).max()) if bias.size else 0.0
        done[layer.bias] = {
            "node": layer.node,
            "op_type": layer.op_type,
            "input": layer.input,
            "weight": layer.weight,
            "max_abs_shift": largest,
            "max_abs_bias": scale,
        }
        notes.append(
            f"bias '{layer.bias}' of {layer.op_type} '{layer.node}': corrected by E[x]·(W - W_q) "
            f"(largest shift {largest:.3g}, against its largest |b| {scale:.3g})"
        )
    return done


__all__ = [
    "BIAS_CORRECTION_POLICIES",
    "DEFAULT_BIAS_CORRECTION",
    "Layer",
    "bias_shift",
    "check_policy",
    "correct_biases",
    "correctable_layers",
    "input_means",
    "written_weights",
]
