"""The ascendc backend's check runner (`qconvert check MODEL --backend ascendc`): every quantization site on
the emulator of its API, against onnxruntime.

Per node, each QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear / MatMulInteger / ConvInteger
node is cut out (check's cases), lifted, converted to its call graph (the same builder as `convert`, so a
node the product cannot run is "not run" with the refusal's reason) and run on the emulator
(qconvert/numerics/ascendc.py) tile by tile with the kernel's own tiling; the whole-tensor emulation must
give the same result (else the case fails). The verdict per site:

- AscendQuant (QuantizeLinear, DynamicQuantizeLinear's y): the half pipeline is not ONNX's float32
  division, so each element may be one step off where `predicted_mismatch` says so. The predicted count is
  that function's count; an element more than one step off, or a difference where it predicts none, makes
  the prediction -1 (FAIL), with why.
- AscendAntiQuant (an int8 DequantizeLinear): half arithmetic, so an element may differ from onnxruntime's
  float32 by the half roundings of the scale and the product (`half_bound`); the predicted count is the
  number of differing elements within that bound, -1 if any is outside it.
- AscendDequant (int32 DequantizeLinear): float32, exact: bit-exact.
- Mmad (MatMulInteger / ConvInteger): exact int8 x int8 -> int32 arithmetic, run on qconvert's interpreter.

Float nodes are not AscendC quantization calls: they are not cases here (`notes` counts them), and the
model end to end covers them: the lifted model runs on qconvert's interpreter with every site whose value
the call computes (AscendQuant, AscendAntiQuant, int32 AscendDequant) replaced by the emulator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np
from onnx import ModelProto, TensorProto, numpy_helper

from qconvert.check.backends import CaseRun, NotRun
from qconvert.check.nodes import NodeCase
from qconvert.check.report import BUG_MARKER, LayerResult
from qconvert.errors import QConvertError
from qconvert.interpret import Interpreter
from qconvert.ir.dialects.onnx import default_opset

from .options import AscendcOptions
from .products import API_ANTIQUANT, API_DEQUANT, API_MMAD, API_QUANT

if TYPE_CHECKING:
    from qconvert.ir.core import Operation
    from qconvert.ir.dialects.builtin import ModuleOp

    from .callgraph import Site

__all__ = ["SITE_OPS", "AscendcCheckRunner", "half_bound"]

Lift = Callable[[ModelProto], "ModuleOp"]
MMAD_OPS = ("Conv", "MatMul", "Gemm")
QOPERATOR_MMAD_OPS = ("QLinearConv", "QLinearMatMul", "QGemm")
QOPERATOR_ELEMENTWISE_OPS = (
    "QLinearAdd",
    "QLinearMul",
)  # AscendAntiQuant x2, float op, AscendQuant  # one node: the same calls, via their QDQ form
# Our exact accumulator and onnxruntime's float32 one are this close (in steps of the output's scale) for one
# layer's sums: a rounding boundary between them is a near-tie, where either side is a fair result.
GROUP_NEAR_TIE = 1.0 / 256
SITE_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger")
EVALUATED_BY = "the AscendC emulator (qconvert.numerics.ascendc), tile by tile as the kernel"
EVALUATED_BY_MMAD = "Mmad int8 x int8 -> int32: exact integer arithmetic on qconvert's interpreter"


@dataclass(slots=True)
class _SiteRun:
    site: Site
    source: np.ndarray
    emulated: np.ndarray
    tiled_differs: int  # elements where the tile-by-tile run differs from the whole-tensor one
    accumulated: np.ndarray | None = None  # a Mmad group: the float AscendDequant gave AscendQuant
    # QLinearAdd / QLinearMul: onnxruntime's float32 rule on the same inputs, and how far the half
    # AscendAntiQuant of the inputs may move our float value from it
    reference_float: np.ndarray | None = None
    reference_bound: np.ndarray | None = None


def half_bound(
    weight: np.ndarray, scale: np.ndarray, result: np.ndarray, dtype: np.dtype | type = np.float16
) -> np.ndarray:
    """How far AscendAntiQuant's half (or bf16) result may be from float32 `(w - zp)·s`: half a step of the
    scale in that type times |w - zp|, plus half a step of the result, plus a float32 step (the reference's
    own)."""
    weight = np.abs(np.asarray(weight, np.float64))
    scale_step = _step(np.asarray(scale, np.float64), dtype)
    result_step = _step(np.asarray(result, np.float64), dtype)
    reference_step = np.spacing(np.abs(np.asarray(result, np.float32))).astype(np.float64)
    return weight * scale_step / 2 + result_step / 2 + reference_step


def _step(values: np.ndarray, dtype: np.dtype | type) -> np.ndarray:
    """The spacing of `dtype` at each |value| (ml_dtypes' bfloat16 has no np.spacing: from its finfo)."""
    info = ml_dtypes.finfo(dtype)
    magnitude = np.maximum(np.abs(values), float(info.smallest_normal))
    exponent = np.floor(np.log2(magnitude))
    return np.exp2(exponent - info.nmant)


@dataclass(slots=True)
class AscendcCheckRunner:
    """Each quantization site on the emulator; the whole model with the sites emulated."""

    lift: Lift
    options: AscendcOptions = field(default_factory=AscendcOptions)
    name: str = "ascendc"
    engine: str = "emulator"
    form: str | None = None
    feeds_weights: bool = False
    runs: dict[str, _SiteRun] = field(default_factory=dict)
    groups: set[str] = field(default_factory=set)  # the fused groups that are Mmad groups (kept, judged)
    # onnxruntime's weight-only form: Cast outputs of int8 / uint8 constants (by value name: their storage),
    # and the Mul nodes after them judged as their AscendAntiQuant call
    weight_casts: dict[str, np.dtype] = field(default_factory=dict)
    weight_muls: set[str] = field(default_factory=set)
    elementwise: set[str] = field(default_factory=set)  # QLinearAdd / QLinearMul nodes run as their calls

    @property
    def semantics(self) -> str:
        return f"AscendC on {self.options.product}, CAST_{self.options.round_mode.upper()}"

    def fused_groups(self) -> bool:
        return True  # DequantizeLinear* -> Conv / MatMul / Gemm -> QuantizeLinear: Mmad + Dequant + Quant

    def keep_case(self, case: NodeCase) -> bool:
        if case.group is not None or case.op_type in QOPERATOR_MMAD_OPS:
            return case.name in self.groups
        if case.op_type in QOPERATOR_ELEMENTWISE_OPS:
            return case.name in self.elementwise
        return case.op_type in SITE_OPS or case.name in self.weight_muls

    def notes(self, cases: Sequence[NodeCase], layers: Mapping[str, LayerResult]) -> list[str]:
        others = [case for case in cases if case.group is None and not self.keep_case(case)]
        qoperator = [case for case in others if case.quantization]
        others = [case for case in others if not case.quantization]
        notes = []
        if qoperator:
            notes.append(
                f"{len(qoperator)} QOperator nodes ({', '.join(sorted({c.op_type for c in qoperator}))}) are "
                "converted through their QDQ form (qoperator-to-qdq) and judged end to end only"
            )
        if others:
            notes.append(
                f"{len(others)} float nodes are not AscendC quantization calls and not cases here; the model "
                "end to end covers them (the lifted model on qconvert's interpreter, every site emulated)"
            )
        groups = f"{len(self.groups)} DequantizeLinear -> Conv / MatMul / Gemm -> QuantizeLinear groups"
        notes.append(
            f"{groups} (or QLinearConv / QLinearMatMul / QGemm nodes) are judged as their calls (Mmad exact "
            "int32, AscendDequant with deqScale = s_x·s_w, AscendQuant); each DequantizeLinear is also "
            "judged as its own AscendAntiQuant / AscendDequant call"
        )
        if self.elementwise or self.weight_muls:
            notes.append(
                f"{len(self.elementwise)} QLinearAdd / QLinearMul nodes are judged as their calls "
                "(AscendAntiQuant of each input, the float op, AscendQuant) and "
                f"{len(self.weight_muls)} weight-only Cast -> Mul as AscendAntiQuant"
            )
        return notes

    # Running -------------------------------------------------------------------------------------------

    def run_cases(
        self, cases: Sequence[NodeCase], advance: Callable[[int], None]
    ) -> dict[str, CaseRun | NotRun]:
        found: dict[str, CaseRun | NotRun] = {}
        for case in cases:
            if case.group is not None or case.op_type in QOPERATOR_MMAD_OPS:
                if case.op_type in (*MMAD_OPS, *QOPERATOR_MMAD_OPS) and case.model is not None:
                    run = self._run_group(case)
                    if run is not None:
                        self.groups.add(case.name)
                        found[case.name] = run
            elif self.keep_case(case) and case.model is not None:
                found[case.name] = self._run_case(case)
            elif case.op_type in QOPERATOR_ELEMENTWISE_OPS and case.model is not None:
                run = self._run_elementwise(case)
                if run is not None:
                    self.elementwise.add(case.name)
                    found[case.name] = run
            elif case.op_type == "Cast" and case.model is not None:
                self._note_weight_cast(case)
            elif (
                case.op_type == "Mul" and case.model is not None and self._weight_only_scale(case) is not None
            ):
                found[case.name] = self._run_weight_only(case)
            advance(1)
        return found

    def _run_elementwise(self, case: NodeCase) -> CaseRun | NotRun | None:
        """A QLinearAdd / QLinearMul node as the calls of its QDQ form (AscendAntiQuant of each input, the
        float op, AscendQuant), run on the emulator; None when its form is not those calls."""
        from .callgraph import build_call_graph

        assert case.model is not None
        node = case.last
        try:
            graph = build_call_graph(self.lift(case.model), self.options.product, self.options.round_mode)
        except QConvertError as error:
            return NotRun(f"the backend cannot convert it: {error.message}")
        quant = [site for site in graph.sites if site.api == API_QUANT and site.op is not None]
        if len(quant) != 1 or graph.module is None:
            return None
        sites = {site.op: site for site in graph.sites if site.op is not None}
        interpreter = _CapturingInterpreter(graph.module, sites, quant[0].op)
        try:
            outputs = interpreter.run(case.feeds)
            reference, bound = _elementwise_reference(case)
        except QConvertError as error:
            return NotRun(f"the emulator cannot run it: {error.message}")
        except Exception as error:
            return NotRun(f"the emulator failed on it {BUG_MARKER}: {type(error).__name__}: {error}")
        ours = np.asarray(interpreter.captured, np.float32)
        emulated = np.asarray(outputs[next(iter(outputs))])
        run = _SiteRun(quant[0], ours, emulated, 0, accumulated=ours)
        run.reference_float, run.reference_bound = reference, bound
        self.runs[case.name] = run
        return CaseRun(
            {node.output[0]: emulated},
            f"AscendAntiQuant x2 + float {node.op_type[7:]} + AscendQuant on {EVALUATED_BY}",
        )

    def _note_weight_cast(self, case: NodeCase) -> None:
        """Remember a Cast of an int8 / uint8 constant to float: the first half of a weight-only site."""
        assert case.model is not None
        node = case.last
        constants = {tensor.name: tensor for tensor in case.model.graph.initializer}
        source = constants.get(node.input[0])
        to = next((attribute.i for attribute in node.attribute if attribute.name == "to"), None)
        storage = (TensorProto.INT8, TensorProto.UINT8)
        if source is not None and source.data_type in storage and to == TensorProto.FLOAT:
            self.weight_casts[node.output[0]] = np.dtype(
                np.int8 if source.data_type == TensorProto.INT8 else np.uint8
            )

    def _weight_only_scale(self, case: NodeCase) -> TensorProto | None:
        """The constant scale of a Mul whose other input is a remembered weight Cast, else None."""
        assert case.model is not None
        node = case.last
        constants = {tensor.name: tensor for tensor in case.model.graph.initializer}
        if len(node.input) != 2:
            return None
        for weights, scale in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
            if weights in self.weight_casts and weights in case.feeds and scale in constants:
                return constants[scale]
        return None

    def _run_weight_only(self, case: NodeCase) -> CaseRun | NotRun:
        """A weight-only Mul as its AscendAntiQuant call: the weights (onnxruntime's Cast output, integers)
        back in their storage type, rebuilt as Cast -> Mul, converted and emulated as the whole model's site
        is; judged as a quantization node (within the half rounding of scale and product, as predicted)."""
        from onnx import helper

        from .callgraph import build_call_graph

        node = case.last
        scale = self._weight_only_scale(case)
        assert scale is not None
        name = next(value for value in node.input if value in self.weight_casts)
        codes = np.asarray(case.feeds[name]).astype(self.weight_casts[name])
        scale_array = numpy_helper.to_array(scale)
        shape = np.broadcast_shapes(codes.shape, scale_array.shape)
        graph = helper.make_graph(
            [
                helper.make_node("Cast", ["w"], ["wf"], name=f"{case.name}_cast", to=TensorProto.FLOAT),
                helper.make_node("Mul", ["wf", "s"], ["y"], name=case.name),
            ],
            "weight_only",
            [],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
            [numpy_helper.from_array(codes, "w"), numpy_helper.from_array(scale_array, "s")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        try:
            sites = build_call_graph(self.lift(model), self.options.product, self.options.round_mode).sites
            (site,) = [site for site in sites if site.api == API_ANTIQUANT and "weight" in site.constants]
            run = self._emulate(
                case, site, site.constants["weight"].reshape(site.shape)
            )  # leading 1s dropped
        except QConvertError as error:
            return NotRun(f"the backend cannot convert it: {error.message}")
        except Exception as error:
            return NotRun(f"the emulator failed on it {BUG_MARKER}: {type(error).__name__}: {error}")
        case.quantization = True  # judged as its call: against the prediction, not a float32 bound
        self.weight_muls.add(case.name)
        output = node.output[0]
        return CaseRun({output: run.outputs[output].reshape(shape)}, run.evaluated_by)

    def _run_group(self, case: NodeCase) -> CaseRun | NotRun | None:
        """A `DequantizeLinear* -> Conv / MatMul / Gemm -> QuantizeLinear` group as its calls: Mmad (exact
        int32, qconvert's integer kernels), AscendDequant (deqScale = s_x·s_w) and AscendQuant, each on the
        emulator; None when the group is not a Mmad group (its weights not constant int8, ...)."""
        from .callgraph import build_call_graph
        from .emulate import emulate_site

        assert case.model is not None
        try:
            module = self.lift(case.model)
            graph = build_call_graph(module, self.options.product, self.options.round_mode)
        except QConvertError as error:
            return NotRun(f"the backend cannot convert it: {error.message}")
        except Exception as error:
            return NotRun(
                f"the backend failed while converting it {BUG_MARKER}: {type(error).__name__}: {error}"
            )
        mmad = next((site for site in graph.sites if site.api == API_MMAD and site.matmul is not None), None)
        quant = next((site for site in graph.sites if site.api == API_QUANT and site.op is not None), None)
        if mmad is None or quant is None:
            return None
        dequant = next(site for site in graph.sites if site.api == API_DEQUANT and site.feeds == mmad.node)
        try:
            accumulator = _mmad(case, mmad, default_opset(module))
            channels_last = (
                np.moveaxis(accumulator, 1, -1) if mmad.matmul.name == "onnx.Conv" else accumulator
            )
            rows = channels_last.reshape(-1, channels_last.shape[-1])
            dequant.m = rows.shape[0]
            values, _ = emulate_site(dequant, rows)
            values = values.reshape(channels_last.shape)
            if mmad.matmul.name == "onnx.Conv":
                values = np.moveaxis(values, -1, 1)
            run = self._emulate(case, quant, np.ascontiguousarray(values, np.float32))
        except QConvertError as error:
            return NotRun(f"the emulator cannot run it: {error.message}")
        except Exception as error:
            return NotRun(f"the emulator failed on it {BUG_MARKER}: {type(error).__name__}: {error}")
        self.runs[case.name].accumulated = np.asarray(values, np.float32)
        return CaseRun(run.outputs, f"Mmad (exact int32) + AscendDequant + AscendQuant on {EVALUATED_BY}")

    def _run_case(self, case: NodeCase) -> CaseRun | NotRun:
        from .callgraph import build_call_graph

        assert case.model is not None
        try:
            module = self.lift(case.model)
            graph = build_call_graph(module, self.options.product, self.options.round_mode)
        except QConvertError as error:
            return NotRun(f"the backend cannot convert it: {error.message}")
        except Exception as error:  # a converter bug: reported, never a pass
            return NotRun(
                f"the backend failed while converting it {BUG_MARKER}: {type(error).__name__}: {error}"
            )
        node = case.last
        if any(site.api == API_MMAD for site in graph.sites):
            try:
                outputs = Interpreter(module).run(case.feeds)
            except QConvertError as error:
                return NotRun(f"the interpreter cannot run the Mmad: {error.message}")
            return CaseRun(dict(outputs), EVALUATED_BY_MMAD)
        called = [site for site in graph.sites if site.op is not None]
        if len(called) != 1:
            return NotRun(f"the node became {len(called)} calls, not one {BUG_MARKER}")
        site = called[0]
        try:
            source = _input(case, node.input[0])
            return self._emulate(case, site, source)
        except QConvertError as error:
            return NotRun(f"the emulator cannot run it: {error.message}")
        except Exception as error:
            return NotRun(f"the emulator failed on it {BUG_MARKER}: {type(error).__name__}: {error}")

    def _emulate(self, case: NodeCase, site: Site, source: np.ndarray) -> CaseRun:
        from .emulate import emulate_site
        from .products import PRODUCTS
        from .tiling import tiling_for

        tiling = tiling_for(site, PRODUCTS[self.options.product]) if site.m is not None else None
        whole, extra = emulate_site(site, source)
        tiled = whole if tiling is None else emulate_site(site, source, tiling)[0]
        node = case.last
        outputs = {node.output[0]: tiled}
        if extra and len(node.output) > 2:
            outputs[node.output[1]] = extra["scale"]
            outputs[node.output[2]] = extra["zero_point"]
        self.runs[case.name] = _SiteRun(site, source, tiled, _differing(tiled, whole))
        return CaseRun(outputs, EVALUATED_BY)

    def prepare_model(self, model: ModelProto) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
        """The whole model lifted once, every site whose value its call computes run on the emulator."""
        from .callgraph import build_call_graph

        try:
            module = self.lift(model)
            graph = build_call_graph(module, self.options.product, self.options.round_mode)
        except QConvertError as error:
            raise NotRun(f"the backend cannot convert the whole model: {error.message}") from None
        assert graph.module is not None  # QOperator sources: their QDQ form, whose ops the sites are
        interpreter = EmulatedInterpreter(
            graph.module, {site.op: site for site in graph.sites if site.op is not None}
        )

        def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            from qconvert.check.backends import quiet_float_warnings

            try:
                with quiet_float_warnings():
                    return interpreter.run(feeds)
            except QConvertError as error:
                raise NotRun(f"the emulated model cannot run: {error.message}") from None

        return run

    # Judging -------------------------------------------------------------------------------------------

    def predicted_mismatches(
        self, case: NodeCase, values: Mapping[str, np.ndarray]
    ) -> tuple[int, str] | None:
        run = self.runs.get(case.name)
        if run is None:
            return None  # Mmad: exact
        output = case.last.output[0]
        reference = np.asarray(values[output])
        if run.tiled_differs:
            return (
                -1,
                f"the tile-by-tile run differs from the whole-tensor one on {run.tiled_differs} elements",
            )
        if run.accumulated is not None:
            return _group_prediction(run, reference, values, case)
        if run.site.api == API_QUANT:
            return self._quant_prediction(run, reference, values, case)
        if run.site.api == API_ANTIQUANT:  # a weight-only site's shape drops the leading 1-dims
            return _antiquant_prediction(run, reference.reshape(run.emulated.shape))
        assert run.site.api == API_DEQUANT
        return 0, "AscendDequant multiplies in float32 as ONNX does: bit-exact"

    def _quant_prediction(
        self, run: _SiteRun, reference: np.ndarray, values: Mapping[str, np.ndarray], case: NodeCase
    ) -> tuple[int, str]:
        from qconvert.numerics.ascendc import predicted_mismatch

        site = run.site
        if site.dst_type in ("float8_e4m3fn", "float8_e5m2"):
            return _float8_prediction(
                run, reference, _onnx_parameters(site, case, values, run.source.shape)[0]
            )
        if site.dst_type != "int8":
            return -1, f"no mismatch prediction for {site.dst_type} destinations"
        scale, zero_point = _onnx_parameters(site, case, values, run.source.shape)
        shift = site.storage_shift
        predicted = predicted_mismatch(
            run.source, scale, zero_point - shift, round_mode=site.round_mode, compute_dtype=_compute(site)
        )
        ours = run.emulated.astype(np.int64)
        theirs = reference.astype(np.int64)
        tally = _Tally.of(ours != theirs, np.abs(ours - theirs) > 1, predicted)
        why = (
            f"AscendQuant's half pipeline (half(x)·half(1/s) + half(zp), CAST_{site.round_mode.upper()}) "
            f"against ONNX's float32 x/s: {tally.measured} of {ours.size} elements one step off "
            f"({tally.share:.2f}%), predicted_mismatch gives {tally.count}; the tile-by-tile run equals the "
            "whole-tensor emulation"
        )
        return tally.verdict(why)


def _mmad(case: NodeCase, site: Site, opset: int) -> np.ndarray:
    """The group's int32 accumulator: (x - zx) * w (+ bias), exact, by qconvert's integer kernels."""
    from qconvert.numerics.integer_accumulation import exact_integer_matmul, wrap_int32
    from qconvert.onnx_kernels import attribute, conv_integer, matmul_integer

    op = site.matmul
    assert op is not None and site.x_params is not None
    if case.group is None:  # a QLinearConv / QLinearMatMul / QGemm node: its first input is x's storage
        x = _input(case, case.last.input[0]).astype(np.int64)
    else:
        node = case.nodes[-2]
        producer = next(n for n in case.nodes if node.input[0] in n.output)
        x = _input(case, producer.input[0]).astype(np.int64)
    zero = np.asarray(site.x_params.zero_point, np.int64).reshape(())
    weights = site.constants["weight"].astype(np.int64)
    bias = site.constants.get("bias")
    offset = site.constants.get("weight_offset")  # acc_j += c_j · Σ_k (x - zx): Mmad with an all-ones B

    def accumulate(b: np.ndarray) -> np.ndarray:
        if op.name == "onnx.Conv":
            found = conv_integer(op, [x, b, zero, None], opset)[0]
        elif op.name == "onnx.MatMul":
            found = matmul_integer(op, [x, b, zero, None], opset)[0]
        else:
            a = (x - zero).T if int(attribute(op, "transA", 0)) else x - zero  # type: ignore[arg-type]
            found = exact_integer_matmul(a, b.T if int(attribute(op, "transB", 0)) else b)  # type: ignore[arg-type]
        assert found is not None
        return found.astype(np.int64)

    if op.name == "onnx.Gemm" and (
        float(attribute(op, "alpha", 1.0)) != 1.0 or float(attribute(op, "beta", 1.0)) != 1.0  # type: ignore[arg-type]
    ):
        raise QConvertError("Gemm with alpha or beta other than 1 is not one Mmad")
    channel_shape = (1, -1, *([1] * (x.ndim - 2))) if op.name == "onnx.Conv" else (-1,)
    total = accumulate(weights)
    if offset is not None:  # int32 arithmetic wraps, so the correction is exact modulo 2^32 as on the chip
        total = total + offset.astype(np.int64).reshape(channel_shape) * accumulate(np.ones_like(weights))
    if bias is not None:
        total = total + bias.astype(np.int64).reshape(channel_shape)
    return wrap_int32(total)


def _group_prediction(
    run: _SiteRun, reference: np.ndarray, values: Mapping[str, np.ndarray], case: NodeCase
) -> tuple[int, str]:
    """A Mmad group against onnxruntime's DequantizeLinear -> float op -> QuantizeLinear: one step off where
    the half pipeline differs from ONNX's rule on our value (`predicted_mismatch`), or where our exact
    accumulator and onnxruntime's float32 one sit on either side of a rounding boundary (near-ties)."""
    from qconvert.numerics import Rounding, quantize
    from qconvert.numerics.ascendc import predicted_mismatch

    site = run.site
    params = site.onnx_params
    assert params is not None and run.accumulated is not None
    ours_float = run.accumulated
    from qconvert.numerics import broadcast_params

    scale, zero_point = broadcast_params(params, ours_float.shape)
    half = predicted_mismatch(
        ours_float,
        scale.astype(np.float32),
        zero_point - site.storage_shift,
        round_mode=site.round_mode,
        compute_dtype=_compute(site),
    )
    if run.reference_float is not None and run.reference_bound is not None:  # QLinearAdd / QLinearMul
        theirs_float = run.reference_float
        sides = quantize(ours_float, params, Rounding.ONNX) != quantize(theirs_float, params, Rounding.ONNX)
        apart = np.abs(ours_float.astype(np.float64) - theirs_float)
        near = sides & (apart <= run.reference_bound + GROUP_NEAR_TIE * scale)
        steps = ours_float.astype(np.float64) / scale  # and the kernel's own requantization's near-ties
        near |= np.abs(steps - np.floor(steps) - 0.5) <= GROUP_NEAR_TIE
    elif case.group is not None:  # onnxruntime's float32 op output: where the two sums straddle a boundary
        theirs_float = np.asarray(values[case.nodes[-2].output[0]], np.float32)
        sides = quantize(ours_float, params, Rounding.ONNX) != quantize(theirs_float, params, Rounding.ONNX)
        steps_apart = np.abs(ours_float.astype(np.float64) - theirs_float) / scale
        near = sides & (steps_apart <= GROUP_NEAR_TIE)
    else:  # a QOperator kernel requantizes internally: near-ties of our own value
        steps = ours_float.astype(np.float64) / scale
        near = np.abs(steps - np.floor(steps) - 0.5) <= GROUP_NEAR_TIE
    ours = run.emulated.astype(np.int64)
    theirs = reference.astype(np.int64)
    differs = ours != theirs
    explained = differs & (np.abs(ours - theirs) == 1) & (half | near)
    unexplained = int(np.count_nonzero(differs & ~explained))
    calls = (
        "AscendAntiQuant (half) of each input, the float op and AscendQuant's half pipeline"
        if run.reference_float is not None
        else "Mmad's exact int32, AscendDequant (float32) and AscendQuant's half pipeline"
    )
    why = (
        f"{calls} against onnxruntime: "
        f"{int(np.count_nonzero(differs))} of {ours.size} one step off; "
        f"{int(np.count_nonzero(differs & half))} where predicted_mismatch says the half pipeline parts from "
        f"ONNX's rule, {int(np.count_nonzero(differs & near & ~half))} at near-ties (within {GROUP_NEAR_TIE} "
        "of a step"
        + (", or within the half rounding of the inputs" if run.reference_float is not None else "")
        + ")"
    )
    if unexplained:
        return -1, why + f"; {unexplained} unexplained"
    return int(np.count_nonzero(explained)), why


def _antiquant_prediction(run: _SiteRun, reference: np.ndarray) -> tuple[int, str]:
    site = run.site
    params = site.onnx_params
    assert params is not None
    from qconvert.numerics import broadcast_params

    scale, zero_point = broadcast_params(params, run.source.shape)
    centred = run.source.astype(np.float64) - zero_point
    ours = run.emulated.astype(np.float64)
    theirs = reference.astype(np.float64)
    differs = ours != theirs
    dtype = ml_dtypes.bfloat16 if site.dst_type == "bfloat16" else np.float16
    with np.errstate(over="ignore", invalid="ignore"):
        bound = half_bound(centred, scale, theirs, dtype)
        outside = differs & ~(np.abs(ours - theirs) <= bound)  # an overflow (inf, NaN) is never within
    measured = int(np.count_nonzero(differs))
    within = measured - int(np.count_nonzero(outside))
    why = (
        f"AscendAntiQuant computes {_antiquant_formula(site.dst_type)}: {measured} of {ours.size} elements "
        f"differ from onnxruntime's float32 (w - zp)·s, {within} within the output type's rounding of the "
        "scale and product"
    )
    if np.any(outside):
        why += f"; {int(np.count_nonzero(outside))} beyond it"
        return -1, why
    return within, why


def _antiquant_formula(destination: str) -> str:
    if destination == "bfloat16":
        return "bf16(float32(w + offset)·float32(s)) with bf16 parameters"
    return "half(half(w + offset)·half(s))"


def _elementwise_reference(case: NodeCase) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime's QLinearAdd / QLinearMul before requantizing, as ONNX defines it (float32 (x - zp)·s of
    each input, then the op), and how far our half AscendAntiQuant inputs may move the float result: half's
    relative rounding (2^-11) of the scale and of the product, twice over for safety, per input."""
    assert case.model is not None
    node = case.last
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in case.model.graph.initializer}

    def value(name: str) -> np.ndarray:
        return np.asarray(case.feeds[name] if name in case.feeds else constants[name])

    def dequantized(index: int) -> np.ndarray:
        codes, scale, zero = (value(name) for name in node.input[index : index + 3])
        return (codes.astype(np.int32) - zero.astype(np.int32)).astype(np.float32) * scale.astype(np.float32)

    a, b = dequantized(0), dequantized(3)
    if node.op_type == "QLinearAdd":
        return a + b, 2.0**-9 * (np.abs(a) + np.abs(b)).astype(np.float64)
    return a * b, 2.0**-8 * np.abs(a * b).astype(np.float64)


def _float8_prediction(run: _SiteRun, reference: np.ndarray, scale: np.ndarray) -> tuple[int, str]:
    """An fp8 AscendQuant site against onnxruntime's fp8 QuantizeLinear: the differing elements must be
    exactly those `predicted_mismatch_float8` names, each one fp8 code (one grid step) away."""
    from qconvert.numerics.ascendc import predicted_mismatch_float8

    site = run.site
    predicted = predicted_mismatch_float8(run.source, scale, site.dst_type)  # fp8: float32 compute
    ours, theirs = np.asarray(run.emulated), reference.astype(run.emulated.dtype)
    same = ours.view(np.uint8) == theirs.view(np.uint8)
    same |= np.isnan(ours.astype(np.float32)) & np.isnan(theirs.astype(np.float32))
    differs = ~same
    tally = _Tally.of(differs, differs & (np.abs(_ordinal(ours) - _ordinal(theirs)) > 1), predicted)
    why = (
        f"AscendQuant to {site.dst_type} (float32 x·(1/s), CAST_RINT, saturating) against onnxruntime's "
        f"x/s: {tally.measured} of {ours.size} elements one fp8 step off ({tally.share:.2f}%), "
        f"predicted_mismatch_float8 gives {tally.count}"
    )
    return tally.verdict(why)


@dataclass(frozen=True, slots=True)
class _Tally:
    """Measured differences against the predicted ones, for a site's verdict."""

    measured: int  # elements that differ from onnxruntime
    share: float  # ... as a percentage of the elements
    count: int  # elements the prediction marks
    far: int  # elements more than one step off
    unpredicted: int  # differing where no difference was predicted
    missed: int  # predicted but equal

    @classmethod
    def of(cls, differs: np.ndarray, far: np.ndarray, predicted: np.ndarray) -> _Tally:
        measured = int(np.count_nonzero(differs))
        return cls(
            measured,
            100.0 * measured / max(differs.size, 1),
            int(np.count_nonzero(predicted)),
            int(np.count_nonzero(far)),
            int(np.count_nonzero(differs & ~predicted)),
            int(np.count_nonzero(predicted & ~differs)),
        )

    def verdict(self, why: str) -> tuple[int, str]:
        """(predicted count, why) when every difference is one predicted step, else (-1, why and what not)."""
        if self.far or self.unpredicted or self.missed:
            why += (
                f"; {self.far} more than one step off, {self.unpredicted} not predicted, "
                f"{self.missed} predicted but equal"
            )
            return -1, why
        return self.count, why


def _ordinal(codes: np.ndarray) -> np.ndarray:
    """fp8 codes as signed ordinals (sign-magnitude bits -> integers): adjacent values differ by 1."""
    bits = codes.view(np.uint8).astype(np.int64)
    return np.where(bits & 0x80, -(bits & 0x7F), bits)


def _compute(site: Site) -> type:
    """The type AscendQuant computes in (as the emulator): half for PER_TENSOR / PER_CHANNEL, the float
    scale's float32 for the 950's PER_TOKEN / PER_GROUP forms."""
    return np.float32 if site.mode in ("PER_TOKEN", "PER_GROUP") else np.float16


def _onnx_parameters(
    site: Site, case: NodeCase, values: Mapping[str, np.ndarray], shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX's scale and zero point broadcast against the source (DynamicQuantizeLinear: onnxruntime's)."""
    node = case.last
    if site.runtime_scale:
        return (
            np.asarray(values[node.output[1]], np.float32),
            np.asarray(values[node.output[2]]).astype(np.int64),
        )
    from qconvert.numerics import broadcast_params

    assert site.onnx_params is not None
    scale, zero_point = broadcast_params(site.onnx_params, shape)
    return np.asarray(scale, np.float32), np.asarray(zero_point).astype(np.int64)


def _differing(first: np.ndarray, second: np.ndarray) -> int:
    """Elements that differ (two NaNs are the same result)."""
    same = first == second
    if first.dtype.kind == "f":
        same |= np.isnan(first) & np.isnan(second)
    return int(np.count_nonzero(~same))


def _input(case: NodeCase, name: str) -> np.ndarray:
    if name in case.feeds:
        return np.asarray(case.feeds[name])
    assert case.model is not None
    for tensor in case.model.graph.initializer:
        if tensor.name == name:
            return numpy_helper.to_array(tensor)
    raise QConvertError(f"input '{name}' of the case is neither fed nor an initializer")


# The whole model -----------------------------------------------------------------------------------------


class _CapturingInterpreter(Interpreter):
    """The emulated interpreter that also keeps the float operand of one op (the AscendQuant's input)."""

    def __init__(self, module: ModuleOp, sites: dict[Operation, Site], watched: Operation) -> None:
        super().__init__(module)
        self.emulated = EmulatedInterpreter(module, sites)
        self.watched = watched
        self.captured: np.ndarray | None = None

    def execute(self, op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
        if op is self.watched:
            self.captured = np.asarray(operands[0])
        return self.emulated.execute(op, operands)


class EmulatedInterpreter(Interpreter):
    """qconvert's interpreter with each call-graph site's op computed by the emulator."""

    def __init__(self, module: ModuleOp, sites: dict[Operation, Site]) -> None:
        super().__init__(module)
        self.sites = sites

    def execute(self, op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
        site = self.sites.get(op)
        if site is None:
            return super().execute(op, operands)
        from .emulate import emulate_site

        if site.api == API_ANTIQUANT and "weight" in site.constants:
            source = site.constants["weight"]
        else:
            source = operands[0]
        result, extra = emulate_site(site, source)
        if extra:
            return [result, extra["scale"], extra["zero_point"]][: len(op.results)]
        return [result]
