"""Finalize a calibrated module: `!quant.calibrated` ranges become `!quant.uniform` Q/DQ, weights quantized.

NOTE: `finalize(module, scheme)` takes the lifted float IR with calibrated qcast/dcast pairs
(attach.attach_ranges) and rewrites it in place into the QDQ form the ONNX frontend lifts a QDQ model
into, following onnxruntime's `quantize_static` (QDQ format) decisions and numbers:
- placement.py decides which tensors get Q/DQ (onnxruntime's op quantizers, graph order);
- a chosen activation keeps its pair, the calibrated type replaced by the `!quant.uniform` type of
  onnxruntime's scale and zero point (qconvert.numerics.calibration); unchosen pairs are removed;
- a folded Relu/Clip disappears and its producer's output is quantized with the Relu's range;
- a chosen constant (weight, or a constant input of a generic op) becomes `arith.constant` of storage
  values, `quant.scast` and `quant.dcast`, per-tensor, per-channel or blocked; a bias becomes int32
  `beta * C` with scale `s_in * s_w` (Gemm's beta then reset to 1; onnxruntime stores C with scale
  `s_in * s_w * beta`, which adds C), after onnxruntime's weight-scale increase for int32 biases;
- the module's opset is raised to what the Q/DQ need: 13 per-axis, 19 float8, 21 for 16-bit, 4-bit
  and blocked (onnxruntime switches to com.microsoft Q/DQ below 21 instead; we raise the opset), the
  other ops converted to it (opset_raise.py: ReduceMean's `axes` attribute becomes an input, ...).
Every value written keeps ONNX names (`onnx.node_name` `<t>_QuantizeLinear` / `<t>_DequantizeLinear`,
`onnx.name` `<w>_quantized`) so the ONNX writer can name nodes as onnxruntime does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from qconvert.calibrate import opset_raise, placement
from qconvert.calibrate.attach import STD_ATTR, calibrated_type, insert_calibrated_pair
from qconvert.calibrate.block_edit import BlockEdit
from qconvert.calibrate.overrides import TensorOverride
from qconvert.calibrate.placement import Bias, Graph, Plan
from qconvert.calibrate.ranges import TensorRange
from qconvert.calibrate.scheme import OPSET21_TYPES, Scheme
from qconvert.calibrate.tensor_names import CONSTANT_NAME_ATTR, TENSOR_NAME_ATTR
from qconvert.errors import InputError
from qconvert.interpret import constant_array
from qconvert.ir.attributes import DenseElementsAttr, FloatAttr, IntegerAttr, StringAttr
from qconvert.ir.core import GenericOp, Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.onnx import ELEM_TYPE, FLOAT16, NODE_NAME, recorded_default_opset
from qconvert.ir.dialects.qconvert import FloatStorageCastOp
from qconvert.ir.dialects.quant import DequantizeCastOp, StorageCastOp
from qconvert.ir.quant_types import (
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedType,
    blocked_type,
    float_dtype,
)
from qconvert.ir.types import (
    F32,
    I64,
    FloatType,
    IntegerType,
    RankedTensorType,
    Type,
    element_type_of,
    with_element_type,
)
from qconvert.ir.verify import verify
from qconvert.numerics import calibration as numerics

_STORAGE_WIDTHS = {"int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int4": 4, "uint4": 4}


@dataclass
class Params:
    """Scale and zero point of one tensor: 0-d (per tensor), 1-d with `axis`, or blocked along `axis`."""

    quant_type: str
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None = None
    block_size: int = 0


def finalize(
    module: ModuleOp,
    scheme: Scheme,
    notes: list[str] | None = None,
    value_names: Mapping[Value, str] | None = None,
) -> ModuleOp:
    """Turn the calibrated module into a QDQ module (in place; returned for chaining).

    `notes` (if given) receives one line per decision a user may want to know about: tensors left in
    float and why, per-channel fallbacks. `value_names` names values the module does not (intermediate
    tensors without a range) in messages. Raises InputError naming the tensor for a quantized tensor
    without a range.
    """
    scheme.check()
    graph, plan = placement.plan_quantization(module, scheme, value_names)
    _check_overrides(graph, plan, scheme)
    finalizer = _Finalizer(graph, plan, scheme)
    finalizer.run()
    _raise_opset(module, scheme, finalizer.uses_per_axis)
    verify(module)
    if notes is not None:
        notes.extend(plan.notes)
        notes.extend(f"tensor '{name}' left in float: {reason}" for name, reason in scheme.keep_float.items())
    return module


class _Finalizer:
    def __init__(self, graph: Graph, plan: Plan, scheme: Scheme) -> None:
        self.graph = graph
        self.plan = plan
        self.scheme = scheme
        self.initializer_params: dict[Value, Params] = {}
        self.activation_cache: dict[Value, Params] = {}
        self.uses_per_axis = False
        self.edit = BlockEdit(graph.block)

    # Parameters ----------------------------------------------------------------------------------
    def activation_params(self, value: Value) -> Params | None:
        """onnxruntime's `calc_quant_params` from the (adjusted) range and the tensor's overrides; None
        without a range."""
        if value in self.activation_cache:
            return self.activation_cache[value]
        found = self.plan.ranges.get(value)
        if found is None:
            return None
        dtype = _expressed_dtype(value)
        name = self.graph.name(value)
        override = self.scheme.tensor_overrides.get(name)
        quant_type = self.scheme.activation_type_of(name)
        if override is not None and override.scale is not None:
            scale = _override_scale(name, override.scale, dtype)
            self.activation_cache[value] = Params(quant_type, scale, np.asarray(override.zero_point))
            return self.activation_cache[value]
        if override is not None:  # onnxruntime casts the bounds to the tensor's float type
            found = (
                dtype.type(found[0] if override.rmin is None else override.rmin),
                dtype.type(found[1] if override.rmax is None else override.rmax),
            )
        std = self._std(value)
        std_rule = self.scheme.activation_type == numerics.FLOAT8 and self.scheme.float8_scale == "std"
        if std_rule and std is None:
            raise InputError(
                f"tensor '{self.graph.name(value)}': onnxruntime's float8e4m3fn scales need the standard "
                f"deviation of the tensor; calibrate with --method distribution, or use --float8-scale max"
            )
        try:
            pair = self._activation_pair(
                found, std, dtype, quant_type, self.scheme.activation_symmetric_of(name)
            )
        except ValueError as error:
            raise InputError(
                f"tensor '{self.graph.name(value)}': {error}; leave it in float (keep_float) or calibrate it "
                f"with a method that clips outliers"
            ) from None
        params = Params(quant_type, np.asarray(pair.scale), np.asarray(pair.zero_point))
        self._note_vanishing(name, params, np.max(np.abs(found)), dtype)
        if std_rule:
            limit = numerics.float8_limit() * float(pair.scale)
            if max(-float(found[0]), float(found[1])) > 2 * limit:  # far past: not a tail, the bulk
                self.plan.notes.append(
                    f"tensor '{self.graph.name(value)}': onnxruntime's float8 scale (from the standard "
                    f"deviation) saturates at ±{limit:.4g}, its range is [{found[0]:.4g}, {found[1]:.4g}] "
                    f"(--float8-scale max does not saturate)"
                )
        self.activation_cache[value] = params
        return params

    def _note_vanishing(self, name: str, params: Params, magnitudes: np.ndarray, dtype: np.dtype) -> None:
        """A note when onnxruntime's scale 1 (its answer to a scale below `dtype`'s smallest) quantizes a
        tensor, or some of its channels (`magnitudes`: max |x| per scale), to the zero point: a float16
        tensor of magnitude 3e-6 is all zeros then."""
        # Above the smallest subnormal: an all-zero range is widened to it (attach), which needs no note.
        smallest = float(np.finfo(np.float32).smallest_subnormal)
        vanishing = (params.scale == 1) & (magnitudes > smallest) & (magnitudes < 0.5)
        if params.quant_type == numerics.FLOAT8 or not vanishing.any():
            return
        if params.axis is None:
            self.plan.notes.append(
                f"tensor '{name}': its scale would be below {dtype}'s smallest (max |x| "
                f"{float(magnitudes):.3g}): onnxruntime's scale 1 quantizes every value to the zero point; "
                f"keep it in float"
            )
        else:
            self.plan.notes.append(
                f"weight '{name}': {int(vanishing.sum())} of its {vanishing.size} channels have scales below "
                f"{dtype}'s smallest: onnxruntime's scale 1 quantizes them to zero"
            )

    def _activation_pair(
        self,
        found: tuple[np.floating, np.floating],
        std: float | None,
        dtype: np.dtype,
        quant_type: str,
        symmetric: bool,
    ) -> numerics.ScaleZeroPoint:
        return numerics.activation_params(
            found[0],
            found[1],
            quant_type,
            symmetric=symmetric,
            min_real_range=self.scheme.min_real_range,
            std=std,
            dtype=dtype,
            float8_scale=self.scheme.float8_scale,
        )

    def _std(self, value: Value) -> float | None:
        quantize = self.graph.pairs.get(value)
        attribute = quantize.attributes.get(STD_ATTR) if quantize is not None else None
        return attribute.value if isinstance(attribute, FloatAttr) else None

    def compute_initializer_params(self) -> None:
        """onnxruntime's `_calc_initializer_quant_params` for every marked constant."""
        scheme = self.scheme
        for value, mark in self.plan.marks.items():
            if not self.graph.is_initializer(value) or mark.provider is not None:
                continue
            data = constant_array(value.owner_op())  # type: ignore[arg-type]
            if not np.isfinite(data).all():  # no scale holds it (onnxruntime fails on it)
                self.plan.notes.append(
                    f"initializer '{self.graph.name(value)}' left in float: it holds "
                    f"{np.count_nonzero(~np.isfinite(data))} Inf/NaN value(s)"
                )
                continue
            override = scheme.tensor_overrides.get(self.graph.name(value), TensorOverride())
            quant_type = override.quant_type or (
                scheme.weight_type if mark.is_weight else scheme.activation_type
            )
            if override.scale is not None:  # onnxruntime takes them as given, in the weight's float type
                scale = _override_scale(self.graph.name(value), override.scale, data.dtype)
                self.initializer_params[value] = Params(quant_type, scale, np.asarray(override.zero_point))
                continue
            symmetric = mark.axis is not None or (
                scheme.weight_symmetric_for(quant_type) if mark.is_weight else scheme.activation_symmetric
            )
            symmetric = symmetric if override.symmetric is None else override.symmetric
            reduce_range = scheme.reduce_range if override.reduce_range is None else override.reduce_range
            if mark.is_weight and scheme.block_size > 0:
                axis = mark.axis if mark.axis is not None else 0
                if data.ndim == 2:
                    self.initializer_params[value] = self._blocked(
                        value, data, axis % 2, quant_type, symmetric
                    )
                    continue
                self.plan.notes.append(
                    f"weight '{self.graph.name(value)}' has rank {data.ndim}: blocked quantization needs "
                    f"rank 2, quantized {'per channel' if mark.axis is not None else 'per tensor'} instead"
                )
            if mark.axis is None:
                pair = numerics.weight_params(
                    data.reshape(-1),
                    quant_type,
                    symmetric,
                    reduce_range,
                    scheme.min_real_range,
                    scheme.float8_scale,
                    rmin=override.rmin,
                    rmax=override.rmax,
                )
                params = Params(quant_type, np.asarray(pair.scale), np.asarray(pair.zero_point))
                self._note_vanishing(self.graph.name(value), params, np.abs(data).max(), data.dtype)
            else:
                scales, zero_points = numerics.weight_params_per_channel(
                    data,
                    mark.axis,
                    quant_type,
                    symmetric,
                    reduce_range,
                    scheme.min_real_range,
                    scheme.float8_scale,
                )
                params = Params(quant_type, scales, zero_points, axis=mark.axis)
                channels = np.moveaxis(data, mark.axis, 0).reshape(data.shape[mark.axis], -1)
                self._note_vanishing(self.graph.name(value), params, np.abs(channels).max(axis=1), data.dtype)
            if quant_type == numerics.FLOAT8 and scheme.float8_scale == "std":
                saturated = numerics.float8_saturated_fraction(data, params.scale, params.axis)
                if saturated >= 0.01:  # a few tail values saturate under any std-based scale
                    self.plan.notes.append(
                        f"initializer '{self.graph.name(value)}': onnxruntime's float8 scale (from the "
                        f"standard deviation) saturates {saturated:.1%} of its values (--float8-scale max "
                        f"does not saturate)"
                    )
            self.initializer_params[value] = params

    def _blocked(self, value: Value, data: np.ndarray, axis: int, quant_type: str, symmetric: bool) -> Params:
        # One block longer than the axis is the same quantization as a block of exactly the axis length,
        # which the IR's sub-channel type can hold (it has no ragged last block).
        block_size = min(self.scheme.block_size, data.shape[axis])
        if data.shape[axis] % block_size:
            raise InputError(
                f"weight '{self.graph.name(value)}': block_size {block_size} does not divide its dimension "
                f"{axis} of size {data.shape[axis]} (a ragged last block is not supported yet)"
            )
        scales, zero_points = numerics.weight_params_blocked(data, axis, block_size, quant_type, symmetric)
        return Params(quant_type, scales, zero_points, axis=axis, block_size=block_size)

    def keep_nonfinite_biases_float(self) -> None:
        """A bias holding Inf/NaN has no int32 form, nor a scale to adjust its weight's for: it stays float
        (as an initializer holding them does, `compute_initializer_params`)."""
        finite = []
        for bias in self.plan.biases:
            if np.isfinite(constant_array(bias.value.owner_op())).all():  # type: ignore[arg-type]
                finite.append(bias)
            else:
                self.plan.notes.append(
                    f"bias '{self.graph.name(bias.value)}' left in float: it holds Inf/NaN values "
                    f"(int32 has none)"
                )
        self.plan.biases = finite

    def adjust_weights_for_biases(self) -> None:
        """onnxruntime's `_adjust_weight_quant_params_for_bias_tensors` (symmetric int8/int16 weights)."""
        if not self.scheme.adjust_weight_scale_for_int32_bias:
            return
        for bias in self.plan.biases:
            mark = self.plan.marks.get(bias.input)
            weight = self.initializer_params.get(bias.weight)
            if mark is None or bias.input not in self.plan.ranges or weight is None:
                continue
            if weight.quant_type not in ("int8", "int16") or weight.zero_point.any() or weight.block_size:
                continue
            added = _added_bias(bias)
            if _channel_mismatch(added, weight):
                continue  # stays float (quantize_bias says why)
            input_params = self.activation_params(bias.input)
            assert input_params is not None
            adjusted = numerics.adjust_weight_scale_for_int32_bias(
                input_params.scale, weight.scale, added, weight.axis is not None
            )
            if adjusted is not None:
                weight.scale = adjusted

    def effective(self, value: Value, seen: frozenset[Value] = frozenset()) -> Params | None:
        """The parameters a tensor's Q/DQ uses: shared from its provider, an initializer's, or its range's."""
        mark = self.plan.marks.get(value)
        if mark is None or value in seen:
            return None
        if mark.provider is not None:
            return self.effective(mark.provider, seen | {value})
        if self.graph.is_initializer(value):
            return self.initializer_params.get(value)
        return self.activation_params(value)

    # Rewriting ----------------------------------------------------------------------------------
    def run(self) -> None:
        self.compute_initializer_params()
        self.keep_nonfinite_biases_float()
        self.adjust_weights_for_biases()
        missing = [
            self.graph.name(v)
            for v, mark in self.plan.marks.items()
            if mark.provider is None and not self.graph.is_initializer(v) and v not in self.plan.ranges
        ]
        if missing:
            raise InputError(
                f"no calibrated range for {len(missing)} tensor(s) that must be quantized: "
                f"{', '.join(repr(n) for n in missing[:10])}{' ...' if len(missing) > 10 else ''}"
            )
        for node, upstream, output in self.plan.removed:
            output.replace_all_uses_with(upstream)
            self.edit.erase(node.op)
        self.rewrite_activations()
        for value, params in self.initializer_params.items():
            self.quantize_constant(value, params)
        if self.scheme.quantize_bias:
            for bias in self.plan.biases:
                self.quantize_bias(bias)
        self.edit.commit()

    def rewrite_activations(self) -> None:
        graph = self.graph
        for value, quantize in list(graph.pairs.items()):
            params = self.effective(value)
            if params is None:
                if value in self.plan.marks:
                    self.plan.notes.append(self._unshared_note(value))
                dequantize = next(iter(quantize.result.uses))[0]
                dequantize.result.replace_all_uses_with(quantize.input)
                self.edit.erase(dequantize)
                self.edit.erase(quantize)
                del graph.pairs[value]
                continue
            quantize.result.type = with_element_type(value.type, self.uniform_type(value, params))
        for value in list(self.plan.marks):
            if value in graph.pairs or graph.is_initializer(value):
                continue
            params = self.effective(value)
            if params is None:
                self.plan.notes.append(self._unshared_note(value))
                continue
            # A range onnxruntime sets without observing it (Softmax outputs): add the pair now.
            low, high = self.plan.ranges.get(value, (0.0, 1.0))
            name = graph.name(value)
            expressed = element_type_of(value.type)
            assert isinstance(expressed, FloatType)
            quantize = insert_calibrated_pair(
                value,
                calibrated_type(expressed, TensorRange(name, float(low), float(high))),
                name,
                self.edit,
            )
            quantize.result.type = with_element_type(value.type, self.uniform_type(value, params))
            graph.pairs[value] = quantize  # type: ignore[assignment]

    def _unshared_note(self, value: Value) -> str:
        return (
            f"tensor '{self.graph.name(value)}' left in float: the tensor it shares parameters with is "
            f"not quantized"
        )

    def uniform_type(self, value: Value, params: Params) -> QuantizedType:
        expressed = element_type_of(value.type)
        assert isinstance(expressed, FloatType)
        return quant_type_for(params, expressed, getattr(value.type, "shape", ()), self)

    def quantize_constant(self, value: Value, params: Params) -> None:
        """The weight's storage constant, scast and dcast; every user of the float constant rerouted."""
        producer = value.owner_op()
        assert isinstance(producer, ConstantOp)
        data = constant_array(producer)
        if params.block_size:
            assert params.axis is not None  # blocked parameters always name their axis
            stored = numerics.quantize_blocked(
                data, params.axis, params.block_size, params.scale, params.zero_point, params.quant_type
            )
        elif params.axis is not None:
            stored = numerics.quantize_per_channel(
                data, params.axis, params.scale, params.zero_point, params.quant_type
            )
        else:
            stored = numerics.quantize_values(data, params.scale, params.zero_point, params.quant_type)
        name = self.graph.name(value)
        result = self.emit_dequantized(producer, value, stored, self.uniform_type(value, params), name)
        value.replace_all_uses_with(result)
        if not value.has_uses:
            self.edit.erase(producer)

    def emit_dequantized(
        self,
        anchor: Operation,
        value: Value,
        stored: np.ndarray,
        quant_type: QuantizedType,
        name: str,
        result_type: Type | None = None,
    ) -> Value:
        """`arith.constant` (storage) -> storage cast -> `quant.dcast`, inserted after `anchor`."""
        storage_type = quant_type.storage_type
        array = np.array(stored, order="C")  # (ascontiguousarray would make a 0-d constant 1-d)
        array.setflags(write=False)
        constant = ConstantOp.create(DenseElementsAttr(array, RankedTensorType(array.shape, storage_type)))
        constant.attributes[CONSTANT_NAME_ATTR] = StringAttr(f"{name}_quantized")
        if isinstance(storage_type, IntegerType) and not quant_type.is_signed:
            constant.attributes[ELEM_TYPE] = StringAttr(f"uint{storage_type.width}")
        quantized_type = with_element_type(value.type, quant_type)
        if isinstance(storage_type, FloatType):
            cast: Operation = FloatStorageCastOp(constant.result, quantized_type)
        else:
            cast = StorageCastOp(constant.result, quantized_type)
        dequantize = DequantizeCastOp(
            cast.results[0],
            result_type or value.type,
            attributes={
                NODE_NAME: StringAttr(f"{name}_DequantizeLinear"),
                TENSOR_NAME_ATTR: StringAttr(name),
            },
        )
        self.edit.insert_after(anchor, constant, cast, dequantize)
        return dequantize.result

    def _normalization_bias_too_coarse(
        self, bias: Bias, input_params: Params, weight_params: Params
    ) -> str | None:
        """Why a normalization's int32 bias would be coarser than its output's Q/DQ step, or None. Its step
        is onnxruntime's `s_in * s_gamma`, but the bias is added after normalizing, where the input's scale
        does not apply: an input of magnitude 3000 made the step 27 output steps (cosine 0.976)."""
        if bias.node.op_type not in placement.NORMALIZATION:
            return None
        # A Relu/Clip folded into the normalization hands it its output's Q/DQ.
        folded = {upstream: output for _, upstream, output in self.plan.removed}
        output = self.effective(folded.get(bias.node.outputs[0], bias.node.outputs[0]))
        step = float(np.max(np.asarray(input_params.scale, np.float64) * np.asarray(weight_params.scale)))
        if output is None or step <= float(np.min(output.scale)):
            return None
        return (
            f"its int32 step s_in * s_gamma = {step:.4g} is coarser than its output's step "
            f"{float(np.min(output.scale)):.4g} (a normalization adds its bias after normalizing, where the "
            f"input's scale does not apply; onnxruntime quantizes it anyway)"
        )

    def quantize_bias(self, bias: Bias) -> None:
        """int32 bias `beta * C` with scale `s_in * s_w` for the one node that uses it (Gemm's beta is then
        reset to 1). onnxruntime stores C with scale `s_in * s_w * beta`, which adds C instead of beta * C
        where it runs the Q/DQ as written, and C again where it fuses them into QGemm (whose int32 bias is
        in units of `s_in * s_w`): its int8 Gemm at beta 2 has cosine 0.77 to float. Same for beta = 1."""
        graph = self.graph
        input_params = self.effective(bias.input)
        weight_params = self.effective(bias.weight)
        added = _added_bias(bias)
        reason = None
        if input_params is None or weight_params is None:
            reason = "its input or weight is not quantized"
        elif weight_params.block_size:
            reason = "its weight is quantized in blocks (a bias scale per block has no ONNX form)"
        elif numerics.FLOAT8 in (input_params.quant_type, weight_params.quant_type):
            reason = "float8 schemes keep biases in float (onnxruntime casts them)"
        elif (coarse := self._normalization_bias_too_coarse(bias, input_params, weight_params)) is not None:
            reason = coarse
        elif _channel_mismatch(added, weight_params):
            reason = (
                f"its weight has {weight_params.scale.size} per-channel scales and it has shape "
                f"{list(added.shape)}: an int32 bias needs one scale per entry (onnxruntime fails on it)"
            )
        if reason is not None:
            self.plan.notes.append(f"bias '{graph.name(bias.value)}' left in float: {reason}")
            return
        assert input_params is not None and weight_params is not None
        scale = numerics.bias_scale_onnxruntime(input_params.scale, weight_params.scale, 1.0, added)
        stored = numerics.quantize_bias(added, scale)
        flat = scale.reshape(-1)
        if flat.size > 1:
            params = Params("int32", flat, np.zeros(flat.size, np.int64), axis=0)
        else:
            params = Params("int32", flat[0], np.asarray(0))
        name = graph.name(bias.value)
        # An f16 bias whose f16 scale would vanish or clip dequantizes in f32, then casts (onnxruntime).
        widened = scale.dtype != added.dtype
        expressed = F32 if widened else element_type_of(bias.value.type)
        quant_type = quant_type_for(params, expressed, (), self)  # type: ignore[arg-type]
        result_type = with_element_type(bias.value.type, F32) if widened else None
        producer = bias.value.owner_op()
        assert isinstance(producer, ConstantOp)
        result = self.emit_dequantized(producer, bias.value, stored, quant_type, name, result_type)
        if widened:
            cast = GenericOp(
                "onnx.Cast",
                [result],
                [bias.value.type],
                {"to": IntegerAttr(FLOAT16, I64), NODE_NAME: StringAttr(f"{name}_Cast")},
            )
            self.edit.insert_after(result.owner_op(), cast)
            result = cast.results[0]
        bias.node.op.set_operand(bias.index, result)
        if bias.beta != 1.0:
            bias.node.op.attributes["beta"] = FloatAttr(1.0, F32)
        if not bias.value.has_uses:
            self.edit.erase(producer)


def quant_type_for(
    params: Params, expressed: FloatType, shape: tuple[int, ...], owner: _Finalizer
) -> QuantizedType:
    """The `!quant.uniform` type of `params` (full storage range: QuantizeLinear saturates to it)."""
    if params.quant_type == numerics.FLOAT8:
        storage: IntegerType | FloatType = FloatType("f8E4M3FN")
        is_signed = True
    elif params.quant_type == "int32":
        storage, is_signed = IntegerType(32), True
    else:
        storage = IntegerType(_STORAGE_WIDTHS[params.quant_type])
        is_signed = numerics.is_signed(params.quant_type)
    common = {"storage_type": storage, "expressed_type": expressed, "is_signed": is_signed}
    if params.block_size:
        owner.uses_per_axis = True
        assert params.axis is not None
        return blocked_type(
            storage_type=storage,
            expressed_type=expressed,
            is_signed=is_signed,
            scales=params.scale,
            zero_points=params.zero_point,
            tensor_shape=shape,
            axis=params.axis,
            block_size=params.block_size,
        )
    if params.axis is not None:
        owner.uses_per_axis = True
        return UniformQuantizedPerAxisType(
            **common,
            scales=tuple(float(s) for s in np.asarray(params.scale).astype(np.float64)),
            zero_points=tuple(int(z) for z in params.zero_point),
            quantized_dimension=params.axis,
        )
    return UniformQuantizedType(**common, scale=float(params.scale), zero_point=int(params.zero_point))


def _axis_in_range(override: TensorOverride, value: Value) -> bool:
    """Whether an override's axis names an axis of `value` (placement notes an axis out of range itself)."""
    rank = len(getattr(value.type, "shape", ()))
    return override.axis is not None and -rank <= override.axis < rank


def _override_scale(name: str, scale: float, dtype: np.dtype) -> np.ndarray:
    """An override's scale in the tensor's float type; InputError where that type cannot hold it."""
    with np.errstate(over="ignore", under="ignore"):
        stored = np.asarray(scale, dtype=dtype)
    if not (np.isfinite(stored) and stored > 0):
        raise InputError(
            f"tensor overrides: '{name}': scale {scale:g} is not a positive finite {dtype} value"
        )
    return stored


def _added_bias(bias: Bias) -> np.ndarray:
    """What the op adds: `beta * C` in the bias's float type, as the op multiplies it (the int32 form stores
    it, and the weight-scale adjustment must fit it)."""
    data = constant_array(bias.value.owner_op())  # type: ignore[arg-type]
    return data * data.dtype.type(bias.beta)


def _channel_mismatch(bias: np.ndarray, weight: Params) -> bool:
    """Whether a per-channel weight's scales do not pair one to one with a 1-D bias's entries."""
    return weight.axis is not None and (bias.ndim != 1 or bias.shape[0] != weight.scale.size)


def _check_overrides(graph: Graph, plan: Plan, scheme: Scheme) -> None:
    """InputError for an override naming no calibrated tensor or initializer (with a close name), an
    initializer-only key on an activation, or a bias (onnxruntime would quantize it as a weight); a note
    for an override that placement leaves without effect (onnxruntime drops those without a word)."""
    if not scheme.tensor_overrides:
        return
    by_name = {graph.name(value): value for value in graph.pairs}
    folded = {upstream: node for node, upstream, _ in plan.removed}
    for name in sorted(scheme.tensor_overrides.keys() & by_name.keys()):
        value = by_name[name]
        mark = plan.marks.get(value)
        if value in folded:
            why = (
                f"{folded[value].op_type} '{folded[value].name}' is folded into it: its output's Q/DQ is used"
            )
        elif mark is None:
            why = "it gets no Q/DQ (not selected, or its consumers are not quantized)"
        elif mark.provider is not None:
            why = f"it shares the Q/DQ parameters of '{graph.name(mark.provider)}'"
        else:
            continue
        plan.notes.append(f"override of '{name}' has no effect: {why}")
    constants = {graph.name(op.result): op.result for op in graph.block.ops if isinstance(op, ConstantOp)}
    biases = {graph.name(bias.value) for bias in plan.biases}
    for name in sorted(scheme.tensor_overrides.keys() & constants.keys()):
        mark = plan.marks.get(constants[name])
        if mark is None and name not in biases:
            plan.notes.append(f"override of '{name}' has no effect: the initializer gets no Q/DQ")
        elif (
            mark is not None
            and mark.axis is None
            and _axis_in_range(scheme.tensor_overrides[name], constants[name])
        ):
            plan.notes.append(
                f"override of '{name}': its 'axis' has no effect: per-channel quantization applies to the "
                f"weights of Conv, ConvTranspose, Gemm, MatMul and normalizations; quantized per tensor"
            )
    activations, initializers = set(by_name), set(constants)
    problems = []
    for name, override in scheme.tensor_overrides.items():
        if name not in activations | initializers:  # the model has it (api checked): not calibrated
            problems.append(
                f"'{name}': not a calibrated tensor (its nodes' op types are not quantized), nor an "
                f"initializer"
            )
        elif name in biases:
            problems.append(f"'{name}': a bias (int32 from its input's and weight's scales); not overridable")
        elif name not in initializers and (override.reduce_range is not None or override.axis is not None):
            problems.append(f"'{name}': 'reduce_range' and 'axis' apply to initializers only")
        if override.zero_point is not None:
            default = scheme.activation_type if name in activations else scheme.weight_type
            low, high = numerics.full_range(override.quant_type or default)
            if not low <= override.zero_point <= high:
                problems.append(
                    f"'{name}': zero_point {override.zero_point} is outside "
                    f"{override.quant_type or default}'s [{low}, {high}]"
                )
    if problems:
        raise InputError(f"tensor overrides: {'; '.join(problems)}")


def _expressed_dtype(value: Value) -> np.dtype:
    expressed = element_type_of(value.type)
    return float_dtype(expressed) if isinstance(expressed, FloatType) else np.dtype(np.float32)


def required_opset(scheme: Scheme, uses_per_axis: bool) -> int:
    """The lowest ai.onnx opset whose Q/DQ hold this scheme (reference §1.1/§1.2)."""
    needed = 13 if uses_per_axis else 10
    if numerics.FLOAT8 in (scheme.activation_type, scheme.weight_type):
        needed = 19
    if scheme.needs_opset21:
        needed = 21
    return needed


def _raise_opset(module: ModuleOp, scheme: Scheme, uses_per_axis: bool) -> None:
    """Raise the module's opset to what the Q/DQ need, converting the other ops on the way (opset_raise)."""
    version = recorded_default_opset(module) or 0
    needed = max(required_opset(scheme, uses_per_axis), 11 if version < 10 else version)
    if needed != version:
        opset_raise.raise_opset(module, needed, _opset_reason(scheme, uses_per_axis, needed))


def _opset_reason(scheme: Scheme, uses_per_axis: bool, needed: int) -> str:
    """Why the opset rises to `needed`, for the error of an op that cannot be converted."""
    if scheme.needs_opset21:
        types = [
            t
            for t in (scheme.activation_type, scheme.weight_type, *sorted(scheme.storage_types))
            if t in OPSET21_TYPES
        ]
        what = [f"{t} storage" for t in dict.fromkeys(types)]
        if scheme.block_size:
            what.append(f"blocked weights (block size {scheme.block_size})")
        return f"Q/DQ nodes with {' and '.join(what)} need opset {needed}"
    if needed == 19:
        return "float8 Q/DQ nodes need opset 19"
    if uses_per_axis and needed == 13:
        return "per-channel Q/DQ nodes need opset 13"
    return f"Q/DQ nodes need opset 10 or newer; the model is raised to opset {needed}"
