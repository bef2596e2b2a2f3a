"""The call graph of a lifted module: every quantization site as the AscendC API call that implements it.

| lifted op                                       | call                                                     |
|-------------------------------------------------|----------------------------------------------------------|
| `quant.qcast` (QuantizeLinear)                  | AscendQuant: `dst = cast(half(x)·half(1/s) + zp)`        |
| `qconvert.dynamic_quantize_linear`              | AscendQuant PER_TENSOR, scale / zp computed at run time  |
| `quant.dcast` of int32 (a bias, an accumulator) | AscendDequant: `float(src)·deqScale`                     |
| `quant.dcast` of int8 weights into a matmul     | Mmad int8 x int8 -> int32, then AscendDequant with       |
|  whose activation is a `quant.dcast` too        |  deqScale = s_x·s_w (the matmul it feeds is recorded)    |
| `quant.dcast` of int8 weights, float activation | AscendAntiQuant (`scale·(src + offset)`, offset = -zp)   |
|  (weight-only), or of an int8 activation        |  -> a half matmul / the float op                         |
| int8 constant -> `onnx.Cast` -> `onnx.Mul`      | AscendAntiQuant (onnxruntime's weight-only form)         |
| `MatMulInteger` / `ConvInteger`                 | Mmad int8 x int8 -> int32 (exact integer arithmetic)     |

A site the product cannot run is refused (products.py) with the node, the rule and a product that takes
it; a channel count that breaks an alignment rule is padded where the API allows it, and the padding is
recorded. The scales and offsets are given in the API's convention, as A1's numerics define it
(`qconvert.numerics.ascendc.quant_parameters_from_onnx`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from qconvert.errors import InputError
from qconvert.interpret import constant_array
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.onnx import main_function, node_name
from qconvert.ir.dialects.qconvert import (
    ConvIntegerOp,
    DynamicQuantizeLinearOp,
    MatMulIntegerOp,
    QOperatorOp,
)
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp, StorageCastOp
from qconvert.ir.quant_types import QuantizedType, uniform_params
from qconvert.ir.types import DYNAMIC, RankedTensorType, element_type_of
from qconvert.numerics import UniformParams

from .products import API_ANTIQUANT, API_DEQUANT, API_MMAD, API_QUANT, PRODUCTS, Product, refusal

__all__ = ["CallGraph", "Site", "build_call_graph"]

MATMULS = ("onnx.MatMul", "onnx.Gemm", "onnx.Conv")
INTEGER_MATMULS = (
    "onnx.MatMulInteger",
    "onnx.ConvInteger",
    "qconvert.matmul_integer",
    "qconvert.conv_integer",
)
# dtype name of a quant storage -> AscendC's C++ type of it
CPP_TYPES = {
    "float32": "float",
    "float16": "half",
    "bfloat16": "bfloat16_t",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int32": "int32_t",
    "float8_e4m3fn": "fp8_e4m3fn_t",
    "float8_e5m2": "fp8_e5m2_t",
    "int4": "int4b_t",
}
ALIGN_BYTES = 32  # every UB operand's length and address (section 5.2)
HALF_MAX = float(np.finfo(np.float16).max)
FLOAT8_SOURCES = ("float8_e4m3fn", "float8_e5m2")  # AscendAntiQuant's 950 fp8 sources (per tensor / channel)
ROUNDED_ROW_MAX = 1024  # PER_TENSOR as PER_TOKEN with a round mode: the longest row (8 rows fit any UB)
BFLOAT16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
BFLOAT16_ANTIQUANT = (
    "atlas-350",
    "atlas-a3",
    "atlas-a2",
)  # AscendAntiQuant dst bf16 (inference AI Core: half)


@dataclass(slots=True)
class Site:
    """One API call: what the kernel passes, with its parameters in the API's convention."""

    index: int
    api: str
    node: str
    mode: str | None
    src_type: str
    dst_type: str
    shape: tuple[int, ...]  # the ONNX tensor's shape (-1: dynamic)
    m: int | None
    n: int  # the row length the API sees (padded)
    k: int | None = None
    channels: int | None = None  # the channel count before padding (PER_CHANNEL), None otherwise
    scale: np.ndarray | None = None  # in the API's convention, as the kernel reads it
    offset: np.ndarray | None = None
    scale_type: str = "float"
    runtime_scale: bool = False  # DynamicQuantizeLinear: computed by the kernel
    storage_shift: int = 0  # uint8 storage from int8: the kernel adds this to the int8 codes' bits
    transpose: bool = False  # AscendAntiQuant isTranspose
    group_size: int | None = None
    k_dim: int | None = None
    axis: int | None = None  # the ONNX quantization axis (None: per tensor)
    feeds: str | None = None  # the matmul this call feeds, or the Mmad it follows
    padding: str | None = None
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # weights in storage type, bias
    note: str | None = None
    onnx_params: UniformParams | None = None  # the ONNX parameters (for the emulator and check)
    round_mode: str = "rint"
    op: Operation | None = None  # the lifted op whose value this call computes (None: part of an Mmad group)
    columns: int | None = None  # AscendAntiQuant: a row's real elements (before padding to n)
    matmul: Operation | None = None  # Mmad: the lifted Conv / MatMul / Gemm it computes
    x_params: UniformParams | None = (
        None  # Mmad: the activation's quantization (its zero point is subtracted)
    )

    @property
    def elements(self) -> int | None:
        return None if DYNAMIC in self.shape else math.prod(self.shape)

    def signature(self) -> tuple[object, ...]:
        """What makes two calls the same kernel (sizes come from the tiling at run time)."""
        return (
            self.api,
            self.mode,
            self.src_type,
            self.dst_type,
            self.scale_type,
            self.offset is not None,
            self.transpose,
            self.runtime_scale,
            self.storage_shift != 0,
            self.round_mode,
            self.k_dim,
        )

    def template_arguments(self) -> dict[str, Any]:
        if self.api == API_QUANT:
            arguments: dict[str, Any] = {"srcT": CPP_TYPES[self.src_type], "dstT": CPP_TYPES[self.dst_type]}
            arguments["isReuseSource"] = False
            if self.mode in ("PER_TOKEN", "PER_GROUP"):
                arguments["scaleT"] = self.scale_type
                arguments["config"] = {
                    "hasOffset": self.offset is not None,
                    "kDim": self.k_dim if self.k_dim is not None else 1,
                    "roundMode": f"CAST_{self.round_mode.upper()}",
                }
                arguments["policy"] = self.mode
            else:
                arguments["config"] = "ASCEND_QUANT_DEFAULT_CFG"
            return arguments
        if self.api == API_DEQUANT:
            return {
                "dstT": CPP_TYPES[self.dst_type],
                "scaleT": self.scale_type,
                "mode": "DEQUANT_WITH_MULTI_ROW",
            }
        if self.api == API_ANTIQUANT:
            return {
                "InputDataType": CPP_TYPES[self.src_type],
                "OutputDataType": CPP_TYPES[self.dst_type],
                "isTranspose": self.transpose,
            }
        return {"A": "int8_t", "B": "int8_t", "C": "int32_t"}

    def counts(self) -> dict[str, int | None]:
        total = None if self.m is None else self.m * self.n
        if self.api == API_QUANT:
            per_channel = self.mode == "PER_CHANNEL"
            return {
                "calCount": total,
                "scaleCount": self.n if per_channel else (1 if self.mode == "PER_TENSOR" else None),
                "offsetCount": self.n if per_channel else (1 if self.mode == "PER_TENSOR" else None),
                "m": self.m,
                "n": self.n,
                "groupSize": self.group_size,
            }
        if self.api == API_DEQUANT:
            return {"m": self.m, "n": self.n, "calCount": self.channels or self.n}
        return {"m": self.m, "n": self.n, "k": self.k}

    def to_json(self, kernel: str | None, tmp_bytes: int | None, files: dict[str, str]) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "site": self.index,
            "api": self.api,
            "node": self.node,
            "template": self.template_arguments(),
            "mode": self.mode,
            "counts": self.counts(),
            "shape": list(self.shape),
            "tmpBufferBytes": tmp_bytes,
            "kernel": kernel,
            "feeds": self.feeds,
            "roundMode": f"CAST_{self.round_mode.upper()}" if self.api == API_QUANT else None,
        }
        if self.scale is not None:
            entry["scale"] = _summary(self.scale, files.get("scale"))
        if self.offset is not None:
            entry["offset"] = _summary(self.offset, files.get("offset"))
        if self.runtime_scale:
            entry["scale"] = "computed by the kernel at run time (DynamicQuantizeLinear: ONNX's formula)"
        for name, array in self.constants.items():
            entry[name] = {"file": files.get(name), "dtype": str(array.dtype), "shape": list(array.shape)}
            if array.dtype.name in ("int4", "uint4"):
                entry[name]["packing"] = "two int4 per byte, the first in the low nibble (int4b_t)"
        if self.storage_shift:
            entry["storage"] = f"uint8 codes are the int8 codes + {self.storage_shift} (offset zp - 128)"
        for key in ("padding", "note"):
            if getattr(self, key):
                entry[key] = getattr(self, key)
        if self.group_size is not None:
            entry["groupSize"] = self.group_size
            entry["kDim"] = self.k_dim
        return entry


def _summary(array: np.ndarray, file: str | None) -> dict[str, Any]:
    values = np.asarray(array)
    summary: dict[str, Any] = {"dtype": str(values.dtype), "shape": list(values.shape), "file": file}
    if values.size <= 8:
        summary["values"] = [float(v) for v in values.reshape(-1)]
    return summary


@dataclass(slots=True)
class CallGraph:
    """The sites of a module for one product, in program order."""

    product: Product
    round_mode: str
    sites: list[Site]
    module: ModuleOp | None = None  # the module the sites' ops belong to (QOperator sources: the QDQ form)


# Building --------------------------------------------------------------------------------------------


def build_call_graph(module: ModuleOp, product: str = "atlas-a2", round_mode: str = "rint") -> CallGraph:
    """Every quantization site of `module` as its API call on `product`; InputError listing every site the
    product cannot run (the node, the rule, a product that would take it)."""
    chosen = PRODUCTS[product]
    module = _as_qdq(module)
    function = main_function(module, "to convert to AscendC")
    builder = _Builder(chosen, round_mode)
    for op in function.body.ops:
        builder.visit(op)
    if builder.refusals:
        if builder.sixteen_bit:  # qconvert calibrate's defaults write these: say how to keep them 8-bit
            builder.refusals.append(SIXTEEN_BIT_HINT)
        listed = "\n".join(f"  - {line}" for line in builder.refusals)
        raise InputError(
            f"--to ascendc --product {product}: {len(builder.refusals)} site(s) cannot run:\n{listed}"
        )
    return CallGraph(chosen, round_mode, builder.sites, module)


# 16-bit Q/DQ storage, which AscendQuant/AscendAntiQuant lack; qconvert calibrate's defaults widen outlier
# channels to int16 (and its accuracy search widens more), so the refusal names the calibrate flags.
SIXTEEN_BIT = frozenset({"int16", "uint16"})
SIXTEEN_BIT_HINT = (
    "16-bit activations have no AscendC form: calibrate for ascendc with --outlier-channels off (the "
    "default widens outlier channels to int16) and without --target-cosine/--target-metric or 16-bit "
    "--overrides"
)

# QOperator ops with calls of their own: the integer ops (Mmad) and DynamicQuantizeLinear (AscendQuant).
OWN_CALLS = (DynamicQuantizeLinearOp, MatMulIntegerOp, ConvIntegerOp)


def _as_qdq(module: ModuleOp) -> ModuleOp:
    """A copy of `module` whose QLinear* / QGemm ops are the QDQ form of their ONNX definitions (the pass
    qoperator-to-qdq, as the TOSA backend reads them); without such ops, `module` itself. What the pass
    cannot rewrite stays a QOperator op, which the builder refuses with the pass's reason."""
    from qconvert.passes.inline import clone_op
    from qconvert.passes.qoperator_to_qdq import qoperator_to_qdq

    if not any(isinstance(op, QOperatorOp) and not isinstance(op, OWN_CALLS) for op in module.walk()):
        return module
    copied = clone_op(module, {})
    assert isinstance(copied, ModuleOp)
    qoperator_to_qdq(copied)
    return copied


def _label(op: Operation) -> str:
    return node_name(op) or op.name


def _shape(value: Value) -> tuple[int, ...]:
    value_type = value.type
    if not isinstance(value_type, RankedTensorType):
        raise InputError(f"AscendC needs ranked tensors; {value_type} has no rank")
    return tuple(value_type.shape)


def _dtype_name(value: Value) -> str:
    from qconvert.ir.quant_types import float_dtype
    from qconvert.ir.types import FloatType

    element = element_type_of(value.type)
    if isinstance(element, FloatType):
        return str(float_dtype(element))
    return str(element)


def _storage_name(params: UniformParams) -> str:
    return (
        str(np.dtype(params.storage_dtype).name)
        if params.storage_dtype.kind != "V"
        else str(params.storage_dtype)
    )


def _users(value: Value) -> list[Operation]:
    return list(dict.fromkeys(owner for owner, _ in value.uses))


def _constant_source(value: Value) -> np.ndarray | None:
    """The storage array behind `quant.scast(arith.constant)` (or a plain constant), None otherwise."""
    owner = value.owner_op()
    if isinstance(owner, StorageCastOp):
        owner = owner.operands[0].owner_op()
    if isinstance(owner, ConstantOp):
        try:
            return constant_array(owner)
        except InputError:
            return None
    return None


class _Builder:
    def __init__(self, product: Product, round_mode: str) -> None:
        self.product = product
        self.round_mode = round_mode
        self.sites: list[Site] = []
        self.refusals: list[str] = []
        self.sixteen_bit = False  # a refusal is a 16-bit Q/DQ (SIXTEEN_BIT_HINT)

    def add(self, site: Site) -> None:
        why = refusal(self.product, site.api, site.mode, site.dst_type if site.api == API_QUANT else None)
        if why is not None:
            self.refusals.append(f"node '{site.node}': {why}")
            return
        if site.api == API_QUANT and self.round_mode != "rint" and site.mode in ("PER_TENSOR", "PER_CHANNEL"):
            self.refusals.append(
                f"node '{site.node}': --round-mode {self.round_mode}: AscendQuant's {site.mode} form casts "
                "with CAST_RINT; a round mode is a config of the PER_TOKEN / PER_GROUP forms (atlas-350), "
                "which static quantizations are rewritten to; not a run-time scale (DynamicQuantizeLinear)"
            )
            return
        site.index = len(self.sites)
        site.round_mode = "rint"
        if site.api == API_QUANT:  # the mode the cast applies: an unsupported one falls back (section 5.2)
            from qconvert.numerics.ascendc import effective_round_mode

            site.round_mode = effective_round_mode(_numpy_name(site.dst_type), self.round_mode).value
        self.sites.append(site)

    def refuse(self, op: Operation, rule: str) -> None:
        self.refusals.append(f"node '{_label(op)}': {rule}")

    def visit(self, op: Operation) -> None:
        if isinstance(op, QuantizeCastOp):
            self.quantize(op)
        elif isinstance(op, DequantizeCastOp):
            self.dequantize(op)
        elif isinstance(op, DynamicQuantizeLinearOp):
            self.dynamic_quantize(op)
        elif op.name in INTEGER_MATMULS:
            self.mmad(op, None)
        elif op.name == "onnx.Cast":
            self.weight_only_cast(op)
        elif isinstance(op, QOperatorOp):
            from qconvert.passes.qoperator_to_qdq import why_not_rewritten

            why = why_not_rewritten(op) or "no AscendC call graph for it"
            self.refuse(op, f"QOperator op '{op.name}' stays one ({why}); convert its QDQ form")

    # AscendQuant ------------------------------------------------------------------------------------

    def quantize(self, op: QuantizeCastOp) -> None:
        quant_type = element_type_of(op.result.type)
        assert isinstance(quant_type, QuantizedType)
        params = uniform_params(quant_type)
        shape = _shape(op.result)
        source = _dtype_name(op.operands[0])
        storage = _storage_name(params)
        shift = 0
        destination = storage
        if storage == "uint8":
            destination, shift = "int8", 128
        if destination not in ("int8", "float8_e4m3fn", "float8_e5m2"):
            self.sixteen_bit |= storage in SIXTEEN_BIT
            self.refuse(
                op, f"AscendQuant has no {storage} destination (dstT int8; fp8 / hifloat8 / fp4 on atlas-350)"
            )
            return
        if source not in ("float32", "float16", "bfloat16"):
            self.refuse(op, f"AscendQuant takes half / float / bfloat16 sources, not {source}")
            return
        site = Site(
            0,
            API_QUANT,
            _label(op),
            "PER_TENSOR",
            source,
            destination,
            shape,
            None,
            0,
            onnx_params=params,
            storage_shift=shift,
        )
        if not self.layout(op, site, params, shape):
            return
        rounded = self.round_mode != "rint" and site.mode in ("PER_TENSOR", "PER_CHANNEL")
        if rounded and not self.rounded_form(op, site, shape):
            return
        widest = _represented_range(params)
        if widest > HALF_MAX:
            self.refuse(
                op,
                f"AscendQuant computes in half: the values scale {float(np.max(params.scale)):.4g} "
                f"represents reach {widest:.4g}, beyond half's {HALF_MAX:g} (x saturates, 1/s loses its "
                "bits); no product's generated form takes it (atlas-350's PER_TOKEN form computes in a float "
                "scale)",
            )
            return
        try:
            self.parameters(site, params)
        except ValueError as error:  # 1/s beyond half's range: the half pipeline cannot hold it
            self.refuse(op, f"{error}; no product's generated form takes it")
            return
        site.op = op
        self.add(site)

    def layout(self, op: Operation, site: Site, params: UniformParams, shape: tuple[int, ...]) -> bool:
        """The mode, [m, n] and padding of a quantize site; False when refused."""
        total = None if DYNAMIC in shape else math.prod(shape)
        if params.block_sizes:
            return self.grouped(op, site, params, shape)
        if params.quantized_dimension is None:
            site.mode = "PER_TENSOR"
            site.n = _round_up(total, ALIGN_BYTES) if total is not None else ALIGN_BYTES
            site.m = 1 if total is not None else None
            if total is not None and site.n != total:
                site.padding = f"{total} elements padded to {site.n} (32-byte aligned tail, discarded)"
            return True
        axis = params.quantized_dimension
        site.axis = axis
        channels = shape[axis]
        trailing = math.prod(shape[axis + 1 :])
        if trailing != 1:
            if "PER_TOKEN" not in self.product.quant_modes:
                self.refuse(
                    op,
                    f"per-axis quantization on axis {axis} with {trailing} elements after it: "
                    "PER_CHANNEL recycles its scales along the last axis only, and the per-row form is "
                    f"PER_TOKEN, which {self.product.title} lacks; a product that takes it: atlas-350",
                )
                return False
            site.mode = "PER_TOKEN"
            site.n = trailing
            site.m = None if DYNAMIC in shape else math.prod(shape[: axis + 1])
            site.channels = channels
            if (trailing * np.dtype(_numpy_name(site.src_type)).itemsize) % ALIGN_BYTES:
                self.refuse(
                    op,
                    f"PER_TOKEN needs n·sizeof(srcT) 32-byte aligned; n = {trailing} cannot be padded "
                    "without moving the rows' elements",
                )
                return False
            return True
        site.mode = "PER_CHANNEL"
        site.channels = channels
        site.n = _round_up(channels, ALIGN_BYTES)  # scaleCount % 32 == 0
        site.m = None if DYNAMIC in shape else math.prod(shape[:axis])
        if site.n != channels:
            site.padding = f"{channels} channels padded to {site.n} (scaleCount % 32 == 0): scale 0, offset 0"
        return True

    def rounded_form(self, op: Operation, site: Site, shape: tuple[int, ...]) -> bool:
        """A PER_TENSOR / PER_CHANNEL site with a round mode other than rint, as the 950's form that takes
        `AscendQuantConfig::roundMode` (the A2/A3 forms cast with CAST_RINT): PER_TENSOR as PER_TOKEN over
        rows of n elements (every row the same scale), PER_CHANNEL (last axis) as PER_GROUP with kDim 0 and
        groupSize 32 (every group of rows the same [n] scales). Those forms compute in float32, not half.
        False (refused) when the product lacks them or no row length meets their alignment rules."""
        if "PER_TOKEN" not in self.product.quant_modes:
            return True  # add() refuses it by name (the products whose forms take a round mode)
        unit = ALIGN_BYTES // np.dtype(_numpy_name(site.src_type)).itemsize  # n·sizeof(srcT) % 32 == 0
        if DYNAMIC in shape:
            self.refuse(
                op,
                f"--round-mode {self.round_mode}: {site.mode} with dynamic dimensions has no "
                "PER_TOKEN / PER_GROUP row layout",
            )
            return False
        total = math.prod(shape)
        note = (
            f"--round-mode {self.round_mode}: {site.mode} written as the 950's {{}} form, whose config "
            "takes the round mode (the PER_TENSOR / PER_CHANNEL forms cast with CAST_RINT); computed "
            "in float32 (scaleT float)"
        )
        if site.mode == "PER_TENSOR":
            lengths = [n for n in range(unit, min(total, ROUNDED_ROW_MAX) + 1, unit) if total % n == 0]
            if not lengths:
                self.refuse(
                    op,
                    f"--round-mode {self.round_mode}: PER_TENSOR goes as PER_TOKEN rows of n "
                    f"elements (n·sizeof({site.src_type}) 32-byte aligned), and {total} elements "
                    f"have no such row length up to {ROUNDED_ROW_MAX}",
                )
                return False
            site.mode, site.n, site.m, site.channels = "PER_TOKEN", lengths[-1], total // lengths[-1], 1
            site.padding, site.note = None, note.format("PER_TOKEN")
            return True
        channels = site.channels or 0
        if channels % unit:
            self.refuse(
                op,
                f"--round-mode {self.round_mode}: PER_CHANNEL goes as PER_GROUP (kDim 0), whose "
                f"rows of {channels} channels are not 32-byte aligned ({site.src_type}) and cannot be "
                "padded there",
            )
            return False
        site.mode, site.group_size, site.k_dim = "PER_GROUP", ALIGN_BYTES, 0
        site.n, site.m = channels, total // channels
        site.padding, site.note = None, note.format(f"PER_GROUP (kDim 0, groupSize {ALIGN_BYTES})")
        return True

    def grouped(self, op: Operation, site: Site, params: UniformParams, shape: tuple[int, ...]) -> bool:
        blocked = [(axis, size) for axis, size in params.block_sizes if size != 1]
        axis, size = blocked[0] if len(blocked) == 1 else (None, 0)
        if axis is None or len(shape) != 2:
            self.refuse(op, "PER_GROUP takes a 2-D [m, n] source grouped along one axis")
            return False
        if size % 32:
            self.refuse(
                op,
                f"PER_GROUP groupSize must be a positive multiple of 32, not {size}; padding would "
                "regroup the elements",
            )
            return False
        site.mode = "PER_GROUP"
        site.group_size = size
        site.k_dim = 0 if axis == 0 else 1
        site.m, site.n = shape
        site.axis = axis
        return True

    def parameters(self, site: Site, params: UniformParams) -> None:
        """The API's scale (1/s) and offset (zp), padded to the site's row, through A1's conversion."""
        from qconvert.numerics.ascendc import quant_parameters_from_onnx

        scale, offset = quant_parameters_from_onnx(
            params.scale,
            params.zero_point - site.storage_shift,
            src_dtype=np.dtype(_numpy_name(site.src_type)),
        )
        scale = np.asarray(scale, np.float32)
        offset = np.asarray(offset, np.float32)
        if site.mode == "PER_CHANNEL" and site.channels is not None and site.n != site.channels:
            scale = np.pad(scale.reshape(-1), (0, site.n - site.channels))
            offset = np.pad(
                np.broadcast_to(offset, (site.channels,)).reshape(-1), (0, site.n - site.channels)
            )
        if site.mode == "PER_GROUP" and site.k_dim == 0 and scale.ndim <= 1 and site.m is not None:
            groups = -(-site.m // (site.group_size or 1))  # PER_CHANNEL as PER_GROUP: [ceil(m/G), n]
            scale = np.tile(np.broadcast_to(scale.reshape(-1), (site.n,)), (groups, 1))
            offset = np.tile(np.broadcast_to(offset.reshape(-1), (site.n,)), (groups, 1))
        if site.mode == "PER_TOKEN" and site.m is not None and site.channels:  # one scale per row [m]
            repeat = site.m // site.channels
            scale = np.tile(scale.reshape(-1), repeat)
            offset = np.tile(np.broadcast_to(offset, (site.channels,)).reshape(-1), repeat)
        site.scale, site.offset = scale, offset

    def dynamic_quantize(self, op: DynamicQuantizeLinearOp) -> None:
        shape = _shape(op.operands[0])
        site = Site(
            0,
            API_QUANT,
            _label(op),
            "PER_TENSOR",
            _dtype_name(op.operands[0]),
            "int8",
            shape,
            None,
            0,
            runtime_scale=True,
        )
        site.storage_shift = 128  # ONNX's DynamicQuantizeLinear is uint8 only: int8 codes + 128
        self.layout(op, site, _PER_TENSOR, shape)
        site.note = (
            "scale and zero point computed on the vector unit by ONNX's DynamicQuantizeLinear formula "
            "(ReduceMax / ReduceMin, float32), then AscendQuant PER_TENSOR with half(1/scale)"
        )
        site.op = op
        self.add(site)

    # AscendDequant / AscendAntiQuant / Mmad ---------------------------------------------------------

    def dequantize(self, op: DequantizeCastOp) -> None:
        quant_type = element_type_of(op.operands[0].type)
        assert isinstance(quant_type, QuantizedType)
        params = uniform_params(quant_type)
        storage = _storage_name(params)
        shape = _shape(op.operands[0])
        weights = _constant_source(op.operands[0])
        users = _users(op.result)
        matmul = next((u for u in users if u.name in MATMULS), None)
        if storage == "int32":
            if np.any(params.zero_point != 0):
                self.refuse(op, "AscendDequant has no offset: an int32 zero point other than 0")
                return
            if matmul is not None and weights is not None:
                return  # a bias: added to the Mmad's int32 accumulator (recorded on the Mmad site)
            self.dequant(op, params, shape, None, feeds=None)
            return
        if storage in FLOAT8_SOURCES:  # AscendAntiQuant takes fp8 sources on the 950 parts (section 5.4)
            if storage not in self.product.quant_destinations:
                self.refuse(
                    op,
                    f"AscendAntiQuant of {storage} is not available on {self.product.title}; a product that "
                    "takes it: atlas-350",
                )
                return
            self.antiquant(op, params, shape, weights, feeds=_label(matmul) if matmul is not None else None)
            return
        if storage not in ("int8", "uint8", "int4"):
            self.sixteen_bit |= storage in SIXTEEN_BIT
            self.refuse(op, f"no AscendC dequantization of {storage} storage (int8 / int4 / fp8 / int32)")
            return
        if matmul is not None and weights is not None:
            activation = matmul.operands[0]
            if isinstance(activation.owner_op(), DequantizeCastOp):
                self.mmad(matmul, op)
                return
            self.antiquant(op, params, shape, weights, feeds=_label(matmul))
            return
        if matmul is not None and matmul.operands[0] is op.result:
            other = matmul.operands[1].owner_op() if len(matmul.operands) > 1 else None
            if isinstance(other, DequantizeCastOp) and _constant_source(other.operands[0]) is not None:
                return  # the int8 activation goes into the Mmad as it is (recorded there)
        self.antiquant(op, params, shape, weights, feeds=None)

    def dequant(
        self,
        op: Operation,
        params: UniformParams,
        shape: tuple[int, ...],
        deq_scale: np.ndarray | None,
        feeds: str | None,
        channels_axis_last: bool = True,
    ) -> Site:
        columns = shape[-1] if shape else 1
        rows = None if DYNAMIC in shape else (math.prod(shape[:-1]) if shape else 1)
        padded = _round_up(columns, ALIGN_BYTES // 4)  # n·sizeof(int32) % 32 == 0
        scale = np.asarray(params.scale if deq_scale is None else deq_scale, np.float32)
        axis = params.quantized_dimension
        if deq_scale is None and axis is not None and axis != len(shape) - 1:
            self.refuse(op, "AscendDequant scales columns: an int32 per-axis scale not on the last axis")
        vector = (
            np.broadcast_to(scale.reshape(-1) if scale.size > 1 else scale.reshape(1), (columns,))
            if scale.size in (1, columns)
            else scale.reshape(-1)
        )
        site = Site(
            0,
            API_DEQUANT,
            _label(op),
            "PER_CHANNEL" if scale.size > 1 else "PER_TENSOR",
            "int32",
            "float32",
            shape,
            rows,
            padded,
            channels=columns,
            onnx_params=params,
            feeds=feeds,
        )
        site.scale = np.pad(np.asarray(vector, np.float32), (0, padded - columns))
        if padded != columns:
            site.padding = f"rows of {columns} int32 padded to {padded} (n·4 % 32 == 0); calCount = {columns}"
        if deq_scale is None:
            site.op = op
        self.add(site)
        return site

    def antiquant(
        self,
        op: Operation,
        params: UniformParams,
        shape: tuple[int, ...],
        weights: np.ndarray | None,
        feeds: str | None,
    ) -> None:
        source = _storage_name(params)
        site = Site(
            0,
            API_ANTIQUANT,
            _label(op),
            "PER_TENSOR",
            "int8" if source == "uint8" else source,
            "float16",
            shape,
            None,
            0,
            onnx_params=params,
            feeds=feeds,
        )
        if source == "uint8":
            site.storage_shift = -128
        rows, columns = _as_matrix(shape)
        site.m, site.n, site.k = rows, columns, rows
        axis = params.quantized_dimension
        if params.block_sizes:
            self.refuse(op, "AscendAntiQuant of blocked int8 weights (PER_GROUP b8) is not generated here")
            return
        repeat = 1  # how often the per-row parameters repeat ([L, C, T] as [L·C, T] rows)
        if axis is not None:
            site.axis = axis
            site.mode = "PER_CHANNEL"
            if DYNAMIC in shape:
                self.refuse(op, "AscendAntiQuant PER_CHANNEL of a tensor with dynamic dimensions")
                return
            site.transpose = axis != len(shape) - 1  # [N, K]: one scale per row
            rows = math.prod(shape[: axis + 1]) if site.transpose else math.prod(shape[:-1])
            columns = math.prod(shape[axis + 1 :]) if site.transpose else shape[-1]
            repeat = math.prod(shape[:axis]) if site.transpose else 1
            site.m, site.k = rows, rows
        site.columns = columns
        from qconvert.numerics.ascendc import antiquant_parameters_from_onnx

        widest = _represented_range(params)
        if widest > BFLOAT16_MAX:
            self.refuse(
                op,
                f"AscendAntiQuant overflows: the values reach {widest:.4g}, beyond half's {HALF_MAX:g} and "
                f"bfloat16's {BFLOAT16_MAX:.4g} (its outputs); no product takes it",
            )
            return
        if widest > HALF_MAX:
            if self.product.name not in BFLOAT16_ANTIQUANT:
                self.refuse(
                    op,
                    f"AscendAntiQuant to half overflows: the values reach {widest:.4g} (half: {HALF_MAX:g}), "
                    f"and {self.product.title} has no bfloat16 output; a product that takes it: "
                    + ", ".join(BFLOAT16_ANTIQUANT),
                )
                return
            site.dst_type = "bfloat16"
            site.note = f"bfloat16 output: the values reach {widest:.4g}, beyond half's {HALF_MAX:g}"
        # offset = -zp; uint8 codes are read as int8 (the code - 128), so the offset becomes 128 - zp
        parameter_type = ml_dtypes.bfloat16 if site.dst_type == "bfloat16" else np.float16
        scale, offset = antiquant_parameters_from_onnx(
            np.tile(np.asarray(params.scale).reshape(-1), repeat) if repeat > 1 else params.scale,
            np.tile(np.asarray(params.zero_point).reshape(-1), repeat) + site.storage_shift
            if repeat > 1
            else params.zero_point + site.storage_shift,
            dst_dtype=parameter_type,
        )
        site.scale_type = "bfloat16_t" if site.dst_type == "bfloat16" else "half"
        aligned = ALIGN_BYTES * (2 if source == "int4" else 1)  # src rows 32-byte aligned (int4: 64 elements)
        if site.transpose:
            site.channels = rows
            padded = _round_up(columns, aligned) if columns is not None else None
            if padded is not None and padded != columns:
                site.padding = f"K = {columns} padded to {padded} (isTranspose needs K 32-byte aligned)"
            site.n = padded or 0
        else:
            site.channels = columns
            padded = _round_up(columns, aligned)
            if padded != columns:
                site.padding = f"N = {columns} padded to {padded} (32-byte aligned rows): scale 1, offset 0"
            site.n = padded
        scale = np.asarray(scale).reshape(-1 if site.mode == "PER_CHANNEL" else ())
        offset = np.asarray(offset).reshape(-1 if site.mode == "PER_CHANNEL" else ())
        if site.mode == "PER_CHANNEL" and not site.transpose and site.n != scale.size:
            scale = np.pad(scale, (0, site.n - scale.size), constant_values=1)
            offset = np.pad(offset, (0, site.n - offset.size))
        site.scale, site.offset = scale, offset
        if site.mode == "PER_TENSOR":  # one scale: laid out flat, in rows of 32 (any split is the same call)
            total = None if DYNAMIC in shape else max(math.prod(shape), 1)
            site.n, site.channels = ALIGN_BYTES, None
            site.m = None if total is None else _round_up(total, ALIGN_BYTES) // ALIGN_BYTES
            site.k = site.m
            if total is not None and total % ALIGN_BYTES:
                padded_total = _round_up(total, ALIGN_BYTES)
                site.padding = f"{total} elements padded to {padded_total} (32-byte aligned tail, discarded)"
            else:
                site.padding = None
        if weights is not None:
            site.constants["weight"] = _storage_array(weights, params)
        site.op = op
        self.add(site)

    def mmad(self, matmul: Operation, weight_dequantize: DequantizeCastOp | None) -> None:
        """Mmad (int8 x int8 -> int32) of `matmul`; for a QDQ matmul also the AscendDequant it feeds."""
        label = _label(matmul)
        output = _shape(matmul.results[0])
        a_shape = _shape(matmul.operands[0])
        b_shape = _shape(matmul.operands[1])
        m, n, k = _matmul_dims(matmul, a_shape, b_shape, output)
        site = Site(0, API_MMAD, label, None, "int8", "int32", output, m, n, k=k)
        site.matmul = matmul
        if weight_dequantize is not None:
            weight_type = element_type_of(weight_dequantize.operands[0].type)
            activation = matmul.operands[0].owner_op()
            assert isinstance(weight_type, QuantizedType) and isinstance(activation, DequantizeCastOp)
            activation_type = element_type_of(activation.operands[0].type)
            assert isinstance(activation_type, QuantizedType)
            x_params = uniform_params(activation_type)
            site.x_params = x_params
            w_params = uniform_params(weight_type)
            weights = _constant_source(weight_dequantize.operands[0])
            assert weights is not None
            site.constants["weight"] = _storage_array(weights, w_params)
            if len(matmul.operands) > 2:
                bias_source = matmul.operands[2].owner_op()
                bias = _constant_source(
                    bias_source.operands[0]
                    if isinstance(bias_source, DequantizeCastOp)
                    else matmul.operands[2]
                )
                if bias is not None:
                    site.constants["bias"] = np.asarray(bias, np.int32)
            weight_note = self.weight_zero_points(weight_dequantize, site, w_params, matmul)
            if weight_note is None:
                return
            site.note = (
                f"A = '{_label(activation)}' int8 (zero point {_first(x_params.zero_point)}"
                f" subtracted on the cube unit's input), B = {weight_note}, bias int32"
            )
            self.add(site)
            from qconvert.numerics.ascendc import dequant_scale_from_onnx

            deq_scale = dequant_scale_from_onnx(x_params.scale, w_params.scale)
            # the accumulator is [m, n] (a Conv's im2col rows), one deqScale per output channel
            accumulator = (DYNAMIC if m is None else m, n)
            self.dequant(weight_dequantize, w_params, accumulator, deq_scale, feeds=label)
            return
        self.add(site)

    def weight_zero_points(
        self, weight_dequantize: Operation, site: Site, w_params: UniformParams, matmul: Operation
    ) -> str | None:
        """The Mmad's int8 B for weights with zero points (what it says of them; None when refused):
        w - zw itself where every centred weight fits int8 (folded at compile time), otherwise the codes as
        int8 (uint8: code - 128) and an int32 correction per output channel, `weight_offset` c_j = 128 - zw_j
        (int8 storage: -zw_j), applied as acc_j += c_j · Σ_k (x - zx): the row sums are one more Mmad
        with an all-ones B (TOSA's PerChannelWeightZeroPoints does the same algebra)."""
        from qconvert.numerics import broadcast_params

        codes = site.constants["weight"].astype(np.int64)
        if not np.any(w_params.zero_point != 0):
            return "the int8 weights"
        shift = 128 if w_params.storage_dtype == np.uint8 else 0
        if shift and bool(np.all(w_params.zero_point == 128)):  # the int8 codes + 128: symmetric int8
            site.constants["weight"] = (codes - 128).astype(np.int8)
            return "the int8 weights (uint8 codes - 128, zero point 128)"
        _, zero_full = broadcast_params(w_params, codes.shape)
        centred = codes - zero_full.astype(np.int64)
        if centred.min() >= -128 and centred.max() <= 127:
            site.constants["weight"] = centred.astype(np.int8)
            return (
                "the int8 weights w - zw (the weight zero points folded at compile time: every one fits int8)"
            )
        output_axis = _output_channel_axis(matmul, codes.shape)
        axis = w_params.quantized_dimension
        if axis is not None and np.asarray(w_params.zero_point).size > 1 and axis != output_axis:
            self.refuse(
                weight_dequantize,
                f"Mmad: weight zero points vary along axis {axis}, a reduction axis of the matmul, and "
                "w - zw does not fit int8; only per-tensor or per-output-channel weight zero points take "
                "the accumulator correction",
            )
            return None
        channels = codes.shape[output_axis]
        per_channel = np.broadcast_to(np.asarray(w_params.zero_point, np.int64).reshape(-1), (channels,))
        site.constants["weight"] = (codes - shift).astype(np.int8)
        site.constants["weight_offset"] = (shift - per_channel).astype(np.int32)
        return (
            f"the weight codes as int8{' (uint8 code - 128)' if shift else ''}; the weight zero points "
            "do not fold into int8, so acc_j += weight_offset_j · Σ_k (x - zx) (int32, vector unit), "
            "the row sums from one more Mmad with an all-ones B"
        )

    def weight_only_cast(self, op: Operation) -> None:
        """int8 constant -> Cast(float) -> Mul(scale) [-> MatMul]: onnxruntime's weight-only form."""
        weights = _constant_source(op.operands[0])
        if weights is None or weights.dtype not in (np.int8, np.uint8):
            return
        users = _users(op.results[0])
        if len(users) != 1 or users[0].name != "onnx.Mul":
            return
        mul = users[0]
        other = mul.operands[1] if mul.operands[0] is op.results[0] else mul.operands[0]
        scale = _constant_source(other)
        if scale is None:
            return
        # the weights without leading 1-dims (a GRU / LSTM W [1, 3H, In]) and the scale's one varying axis
        shape = tuple(weights.shape)
        while len(shape) > 2 and shape[0] == 1:
            shape = shape[1:]
        scale = np.asarray(scale, np.float64)
        axis = None
        if scale.size > 1:
            aligned = (1,) * (len(shape) - scale.ndim) + tuple(scale.shape[-len(shape) :])
            varying = [index for index, size in enumerate(aligned) if size != 1]
            if len(varying) != 1 or aligned[varying[0]] != shape[varying[0]]:
                self.refuse(
                    mul, f"weight-only scale of shape {scale.shape} is not per tensor or per one axis"
                )
                return
            axis = varying[0]
        params = UniformParams(
            scale=scale.reshape(-1) if axis is not None else scale.reshape(()),
            zero_point=np.zeros(scale.size if axis is not None else (), np.int64),
            storage_dtype=weights.dtype,
            storage_type_min=int(np.iinfo(weights.dtype).min),
            storage_type_max=int(np.iinfo(weights.dtype).max),
            quantized_dimension=axis,
        )
        consumer = _users(mul.results[0])
        feeds = _label(consumer[0]) if consumer and consumer[0].name in MATMULS else None
        self.antiquant(mul, params, shape, weights, feeds)
        if self.sites and self.sites[-1].node == _label(mul):
            self.sites[
                -1
            ].note = f"onnxruntime's weight-only form: '{_label(op)}' (Cast) and '{_label(mul)}' (Mul)"


_PER_TENSOR = UniformParams(
    scale=np.array(1.0),
    zero_point=np.array(0),
    storage_dtype=np.dtype(np.int8),
    storage_type_min=-128,
    storage_type_max=127,
)


def _represented_range(params: UniformParams) -> float:
    """The largest |value| the quantization represents: s·max(|qmin - zp|, |qmax - zp|)."""
    zero = np.asarray(params.zero_point, np.float64)
    reach = np.maximum(np.abs(params.storage_type_min - zero), np.abs(params.storage_type_max - zero))
    return float(np.max(np.asarray(params.scale, np.float64) * reach))


def _first(values: np.ndarray) -> int:
    return int(np.asarray(values).reshape(-1)[0])


def _numpy_name(type_name: str) -> str:
    return type_name


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _as_matrix(shape: tuple[int, ...]) -> tuple[int | None, int]:
    """[rows, columns] of a weight: the last axis is the columns."""
    if not shape:
        return 1, 1
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) > 2:  # a Conv weight [Cout, Cin, kh, kw]: rows Cout
        return shape[0], math.prod(shape[1:])
    return shape[0], shape[1]


def _output_channel_axis(op: Operation, weight_shape: tuple[int, ...]) -> int:
    """The axis of a Conv / MatMul / Gemm weight that runs along the output channels (N)."""
    from qconvert.onnx_kernels import attribute

    if op.name == "onnx.Conv":
        return 0
    if op.name == "onnx.Gemm":
        return 0 if int(attribute(op, "transB", 0)) else 1  # type: ignore[arg-type]
    return len(weight_shape) - 1


def _storage_array(weights: np.ndarray, params: UniformParams) -> np.ndarray:
    return np.asarray(weights).astype(params.storage_dtype, copy=False)


def _matmul_dims(
    op: Operation, a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]
) -> tuple[int | None, int, int]:
    if op.name in ("onnx.Conv", "onnx.ConvInteger", "qconvert.conv_integer"):
        n = b[0]
        k = math.prod(b[1:])
        m = None if DYNAMIC in out else out[0] * math.prod(out[2:])
        return m, n, k
    k = a[-1]
    n = out[-1]
    m = None if DYNAMIC in out else math.prod(out[:-1])
    if op.name == "onnx.Gemm":
        k = b[-1] if out[-1] == b[0] and b[0] != b[-1] else b[0]
    return m, n, k
