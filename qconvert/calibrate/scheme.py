"""The quantization scheme `finalize` applies: storage types, symmetry, granularity, what to quantize.

NOTE: field names follow onnxruntime's `quantize_static` arguments and `extra_options` (reference §2.4),
and defaults are onnxruntime's but one: weights are per channel by default (`per_channel=True`: every
backend takes them, and they measured better on every model, issue 26: the real MiniLM's sentence
embedding 0.941 -> 0.979 mean cosine, digits top-1 agreement 0.977 -> 1.000). So
`Scheme(per_channel=False)` with MinMax ranges gives `quantize_static`'s default QDQ model. Storage kinds
are onnxruntime's QuantType names in lower case (QInt8 -> "int8", QFLOAT8E4M3FN -> "float8e4m3fn").
`Scheme.check()` refuses what onnxruntime refuses (§2.1) with a
message naming the option.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Collection
from dataclasses import dataclass, field, fields

from qconvert.calibrate.overrides import ORT_QUANT_TYPE_NAMES, TensorOverride, parse_overrides, storage_name
from qconvert.did_you_mean import did_you_mean
from qconvert.errors import InputError
from qconvert.numerics.calibration import FLOAT8, FLOAT8_SCALE_RULES, QUANT_TYPES, is_signed

# onnxruntime's default op list for QDQ: the QLinear and QDQ registry keys (quantize.py).
DEFAULT_OP_TYPES = frozenset(
    {
        "Add", "ArgMax", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv", "ConvTranspose",
        "CumSum", "EmbedLayerNormalization", "Flatten", "Gather", "GatherElements", "Gemm",
        "GlobalAveragePool", "InstanceNormalization", "LayerNormalization", "LeakyRelu", "MatMul",
        "MaxPool", "Mul", "Pad", "Relu", "Reshape", "Resize", "Sigmoid", "Slice", "Softmax", "Split",
        "Squeeze", "TopK", "Transpose", "Unsqueeze", "Where",
    }
)  # fmt: skip

# Storage kinds the ONNX Q/DQ ops accept only from opset 21 (below, onnxruntime switches to
# com.microsoft Q/DQ; we raise the opset instead, see finalize).
OPSET21_TYPES = frozenset({"int16", "uint16", "int4", "uint4"})


@dataclass(slots=True)
class Scheme:
    """How to quantize a calibrated model; every default is onnxruntime's `quantize_static` default but
    `per_channel` (True here: `--per-tensor-weights` / `per_channel=False` gives onnxruntime's).

    - `activation_type` / `weight_type`: storage of activations / of weights (constant inputs).
    - `activation_symmetric`: symmetric activation ranges (onnxruntime `ActivationSymmetric`).
    - `weight_symmetric`: None = onnxruntime's rule (True for int8/int16/int4/float8, False for unsigned).
    - `per_channel`: per-channel weights (Conv 0, ConvTranspose 1, Gemm transB ? 0 : 1, MatMul 1);
      `per_channel_axis` overrides the axis per op type (onnxruntime `QDQOpTypePerChannelSupportToAxis`,
      which onnxruntime applies to MatMul and normalization ops only).
    - `block_size`: > 0 quantizes rank-2 weights in blocks of that size along the channel axis (opset 21).
    - `reduce_range`: 7-bit weights (onnxruntime applies it to weights only).
    - `op_types_to_quantize`: None = onnxruntime's default list; `op_types_to_exclude` removes types.
    - `nodes_to_quantize` (None = all) / `nodes_to_exclude`: ONNX node names.
    - `keep_float`: tensor name -> reason; these tensors get no Q/DQ (sentinel guard or user choice).
    - `min_real_range`: onnxruntime `MinimumRealRange`; `quantize_bias`: int32 biases (`QuantizeBias`).
    - `keep_removable_activations`: keep Relu/Clip instead of folding them (`QDQKeepRemovableActivations`).
    - `adjust_weight_scale_for_int32_bias`: onnxruntime's default weight-scale increase (True).
    - `op_types_to_exclude_output_quantization`: onnxruntime `OpTypesToExcludeOutputQuantization`.
    - `force_quantize_no_input_check`: Direct8Bit ops quantized even when their input is not
      (onnxruntime's `quantize_static` turns this off by default; `quantize(...)` config turns it on).
    - `float8_scale`: how float8e4m3fn scales are chosen: "std" is onnxruntime's (std / std of every
      e4m3fn value; activations need Distribution's std; saturates data whose mean is far from 0, e.g.
      LayerNorm gammas), "max" is qconvert's (max|x| / 448 of the range: nothing inside it saturates;
      any method; float8 schemes only).
    - `tensor_overrides`: tensor name -> `TensorOverride` (onnxruntime `TensorQuantOverrides`, whose
      dict form is accepted too: overrides.py).
    """

    activation_type: str = "int8"
    weight_type: str = "int8"
    activation_symmetric: bool = False
    weight_symmetric: bool | None = None
    per_channel: bool = True
    per_channel_axis: dict[str, int] = field(default_factory=dict)
    block_size: int = 0
    reduce_range: bool = False
    op_types_to_quantize: frozenset[str] | None = None
    op_types_to_exclude: frozenset[str] = frozenset()
    nodes_to_quantize: frozenset[str] | None = None
    nodes_to_exclude: frozenset[str] = frozenset()
    keep_float: dict[str, str] = field(default_factory=dict)
    min_real_range: float | None = None
    quantize_bias: bool = True
    keep_removable_activations: bool = False
    adjust_weight_scale_for_int32_bias: bool = True
    op_types_to_exclude_output_quantization: frozenset[str] = frozenset()
    force_quantize_no_input_check: bool = False
    float8_scale: str = "std"
    tensor_overrides: dict[str, TensorOverride] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.activation_type = storage_name(self.activation_type)
        self.weight_type = storage_name(self.weight_type)
        self.tensor_overrides = parse_overrides(self.tensor_overrides)
        for name in ("op_types_to_quantize", "nodes_to_quantize"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, frozenset(value))
        for name in ("op_types_to_exclude", "nodes_to_exclude", "op_types_to_exclude_output_quantization"):
            setattr(self, name, frozenset(getattr(self, name)))
        self.keep_float = dict(self.keep_float)
        self.check()

    @property
    def weight_is_symmetric(self) -> bool:
        """onnxruntime's `is_weight_symmetric`: the explicit setting, else True for signed/float8 types."""
        return self.weight_symmetric_for(self.weight_type)

    def weight_symmetric_for(self, quant_type: str) -> bool:
        """`weight_is_symmetric` for a weight stored as `quant_type` (an override's type)."""
        return self.weight_symmetric if self.weight_symmetric is not None else is_signed(quant_type)

    @property
    def quantized_op_types(self) -> frozenset[str]:
        """The op types whose tensors are calibrated and quantized: the selection (default onnxruntime's
        list) without the excluded ones."""
        selected = DEFAULT_OP_TYPES if self.op_types_to_quantize is None else self.op_types_to_quantize
        return selected - self.op_types_to_exclude

    @property
    def storage_types(self) -> frozenset[str]:
        """Every storage kind the scheme may write: activations', weights' and the overrides'."""
        overridden = {o.quant_type for o in self.tensor_overrides.values() if o.quant_type is not None}
        return frozenset({self.activation_type, self.weight_type, *overridden})

    @property
    def needs_opset21(self) -> bool:
        """16-bit and 4-bit storage, and blocked weights, exist in ONNX Q/DQ from opset 21 on."""
        return self.block_size > 0 or bool(self.storage_types & OPSET21_TYPES)

    def activation_type_of(self, tensor: str) -> str:
        """The storage of activation `tensor`: its override's, else the scheme's."""
        override = self.tensor_overrides.get(tensor)
        return override.quant_type if override and override.quant_type else self.activation_type

    def activation_symmetric_of(self, tensor: str) -> bool:
        """Whether activation `tensor`'s range is symmetric: its override's setting, else the scheme's."""
        override = self.tensor_overrides.get(tensor)
        return (
            override.symmetric if override and override.symmetric is not None else self.activation_symmetric
        )

    def check(self) -> None:
        """Refuse unknown types and the combinations onnxruntime refuses, naming the option."""
        for name in ("activation_type", "weight_type"):
            value = getattr(self, name)
            if value not in QUANT_TYPES:
                raise InputError(
                    f"scheme: {name} '{value}' is not one of {', '.join(QUANT_TYPES)} "
                    f"(or onnxruntime's {', '.join(ORT_QUANT_TYPE_NAMES)})"
                    + did_you_mean(str(value), QUANT_TYPES)
                )
        if self.activation_type == "int8" and self.weight_type == "uint8":
            raise InputError(
                "scheme: int8 activations with uint8 weights are not supported (onnxruntime refuses "
                "QInt8 activations with QUInt8 weights); use uint8 or int8 for both, or int8 weights"
            )
        if (self.activation_type == FLOAT8) != (self.weight_type == FLOAT8):
            raise InputError(
                f"scheme: float8e4m3fn must be used for both activations and weights "
                f"(got activation_type={self.activation_type}, weight_type={self.weight_type})"
            )
        if self.block_size < 0:
            raise InputError(f"scheme: block_size must be 0 (off) or positive, got {self.block_size}")
        if self.block_size > 0 and self.weight_type == FLOAT8:
            raise InputError("scheme: blocked weights need an integer weight_type, not float8e4m3fn")
        if self.reduce_range and FLOAT8 in (self.activation_type, self.weight_type):
            raise InputError("scheme: reduce_range is not supported with float8e4m3fn")
        if self.float8_scale not in FLOAT8_SCALE_RULES:
            raise InputError(
                f"scheme: float8_scale '{self.float8_scale}' is not one of {', '.join(FLOAT8_SCALE_RULES)}"
                + did_you_mean(str(self.float8_scale), FLOAT8_SCALE_RULES)
            )
        if self.float8_scale != "std" and FLOAT8 not in (self.activation_type, self.weight_type):
            raise InputError(
                f"scheme: float8_scale '{self.float8_scale}' applies to float8e4m3fn storage only "
                f"(activation_type={self.activation_type}, weight_type={self.weight_type})"
            )
        if self.min_real_range is not None and not self.min_real_range >= 0:
            raise InputError(f"scheme: min_real_range must be >= 0, got {self.min_real_range}")

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready description (sets as sorted lists), e.g. for a report."""
        result: dict[str, object] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            result[item.name] = sorted(value) if isinstance(value, frozenset) else value
        result["tensor_overrides"] = {name: [o.to_json()] for name, o in self.tensor_overrides.items()}
        return result


# The Scheme fields that select nodes, and the `qconvert calibrate` option setting each.
SELECTORS = {
    "op_types_to_quantize": "--op-types",
    "op_types_to_exclude": "--exclude-op-types",
    "nodes_to_quantize": "--nodes",
    "nodes_to_exclude": "--exclude-nodes",
}


def check_selection(
    scheme: Scheme, node_names: Collection[str], op_types: Collection[str], model: str
) -> None:
    """Refuse selected node names the graph of `model` lacks, and op types that are neither in it nor ONNX's.

    A misspelt name would otherwise select nothing (or exclude nothing) without a word; the message names
    every unknown one with the closest existing name when there is one. An ONNX op type the model lacks
    stays accepted: op type lists are filters, reused across models (as onnxruntime's default list is)."""
    problems = []
    for name, option in SELECTORS.items():
        selected = getattr(scheme, name)
        if not selected:
            continue
        if name.startswith("op_types"):
            missing = set(selected) - set(op_types)  # ONNX's schemas are read only when some are
            unknown = sorted(missing - known_op_types()) if missing else []
            # Suggest the model's op types first: 'Matmul' is nearer its 'MatMul' than ONNX's 'MatMulInteger'.
            suggest = [_suggestion(item, op_types) or _suggestion(item, known_op_types()) for item in unknown]
            kind = "not an op type of the model or of ONNX"
        else:
            unknown = sorted(set(selected) - set(node_names))
            suggest = [_suggestion(item, node_names) for item in unknown]
            kind = "no node of that name in the model"
        if unknown:
            listed = ", ".join(f"'{item}'{hint}" for item, hint in zip(unknown, suggest, strict=True))
            problems.append(f"{option} ({name}): {listed}: {kind}")
    if problems:
        raise InputError(f"{model}: {'; '.join(problems)}")


def check_tensor_names(named: Collection[str], names: Collection[str], what: str, model: str) -> None:
    """InputError, before any calibration, for names in `named` (`what` says whose: "tensor overrides")
    that are no tensor of `model`'s graph, with the closest name (as `check_selection` does for nodes).
    Which tensors can take an override is known only after placement: finalize checks that."""
    unknown = sorted(set(named) - set(names))
    if unknown:
        listed = ", ".join(f"'{name}'{_suggestion(name, names)}" for name in unknown)
        raise InputError(f"{model}: {what} name no tensor of the model: {listed}")


@functools.cache
def known_op_types() -> frozenset[str]:
    """Every op type of ONNX's registered schemas, and onnxruntime's default list (com.microsoft's too)."""
    import onnx.defs

    return frozenset(schema.name for schema in onnx.defs.get_all_schemas()) | DEFAULT_OP_TYPES


def _suggestion(name: str, known: Collection[str]) -> str:
    """` (did you mean 'MatMul'?)`: a name differing only in case first, else difflib's closest, else ''."""
    by_lower = {item.lower(): item for item in sorted(known)}
    close = difflib.get_close_matches(name.lower(), by_lower, n=1)
    return f" (did you mean '{by_lower[close[0]]}'?)" if close else ""
