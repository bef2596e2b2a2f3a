"""The tosa backend's check runner (`qconvert check MODEL --backend tosa [--engine reference|iree]`).

What `TosaBackend.check_runner` returns, behind check's `CheckBackend` interface; check judges what it
computes. TOSA (PRO-INT) has no float tensors: a converted function takes and returns storage integers. So
the per-node cases are the `DequantizeLinear* -> op -> QuantizeLinear` groups (each one tosa.rescale site,
or a pool / clamp / data movement on storage): each is lifted with the `lift` check gives it, converted
with `convert_to_tosa`, fed the storage onnxruntime gave its DequantizeLinear inputs, and run on the engine
(the TOSA reference model, or IREE on llvm-cpu) and on the numpy emulation (emulate.py). A lone
QuantizeLinear / DequantizeLinear (a float side) or a float node is not a case of its own here: those
are outside what a storage-typed TOSA function computes, and the model end to end covers them (`notes`
counts them).

Verdict per group, two rules at once: the engine's output equals the emulation's on every element; and
against onnxruntime, which requantizes a float32 value rounding half to even where TOSA rounds a
fixed-point product half up, every difference is one step at a near-tie of the value onnxruntime fed the
QuantizeLinear (within `NEAR_TIE` of a half step). `predicted_mismatches` returns the number of such
explained one-step differences of the emulation, which check compares with the engine's measured count;
an engine that differs from the emulation gets a prediction of -1 (never met: FAIL), with why.

End to end, the whole model's float inputs are quantized to each argument's `qconvert.quant_type` (ONNX's
QuantizeLinear rule, qconvert.numerics) and its storage results dequantized the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from onnx import ModelProto

from qconvert.check.backends import CaseRun, NotRun, lowered_or_not_run
from qconvert.check.nodes import NodeCase, node_scale
from qconvert.check.report import BUG_MARKER, LayerResult
from qconvert.errors import QConvertError

from .options import ENGINE_NAMES, TosaOptions

if TYPE_CHECKING:
    from qconvert.ir.dialects.builtin import ModuleOp

__all__ = ["ENGINE_TITLES", "NEAR_TIE", "TosaCheckRunner"]

Lift = Callable[[ModelProto], "ModuleOp"]

ENGINE_TITLES = {"reference": "the TOSA reference model", "iree": "IREE (llvm-cpu)"}
# A value this close to a half step (in steps) is a near-tie: float32 requantization and TOSA's fixed-point
# rescale may round it to different neighbours. Float32 products and sums drift by far less than this for
# the magnitudes one quantized layer produces.
NEAR_TIE = 1.0 / 64
QUANT_TYPE = "qconvert.quant_type"


@dataclass(slots=True)
class _CaseState:
    """What one case computed: the emulation's outputs, and where the engine differs from them."""

    emulated: dict[str, np.ndarray]
    engine_mismatches: int
    window: float  # how close to a half step a value must be for the two roundings to part (in steps)
    float_nodes: str = ""  # --allow-float: the ONNX nodes the case ran as float TOSA (its module's note)
    engine: dict[str, np.ndarray] | None = None  # a float case's engine outputs, when they differ from ours


@dataclass(slots=True)
class TosaCheckRunner:
    """Groups and the whole model converted to TOSA and run on the reference model or IREE and emulated."""

    lift: Lift
    options: TosaOptions = field(default_factory=TosaOptions)
    engine: str = "reference"
    name: str = "tosa"
    form: str | None = None
    feeds_weights: bool = False  # weights stay constants: TOSA folds their layout changes into them
    states: dict[str, _CaseState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.engine in ENGINE_NAMES, self.engine

    @property
    def semantics(self) -> str:
        return f"TOSA {self.options.rounding}-round rescale"

    @property
    def evaluated_by(self) -> str:
        return f"TOSA on {ENGINE_TITLES[self.engine]}, and its numpy emulation"

    def fused_groups(self) -> bool:
        return True

    def keep_case(self, case: NodeCase) -> bool:
        return case.group is not None or _is_qoperator(case)

    def notes(self, cases: Sequence[NodeCase], layers: Mapping[str, LayerResult]) -> list[str]:
        floated = [name for name, state in self.states.items() if state.float_nodes]
        notes = (
            [
                f"{len(floated)} groups ran float TOSA ops (--allow-float, PRO-FP), judged like the others "
                f"(engine = emulation, within a step of onnxruntime): {', '.join(floated)}"
            ]
            if floated
            else []
        )
        singles = [case for case in cases if not self.keep_case(case)]
        if not singles:
            return notes
        return [
            *notes,
            f"{len(singles)} single nodes (QuantizeLinear / DequantizeLinear with a float side, float "
            "ops) are not cases of their own: a TOSA (PRO-INT) function takes and returns storage integers, "
            "so each DequantizeLinear -> op -> QuantizeLinear group is a case, and the model end to end "
            "covers the rest",
        ]

    # Converting ----------------------------------------------------------------------------------------

    def _convert(self, model: ModelProto) -> str:
        from qconvert.ir.printer import print_module

        from .convert import convert_to_tosa

        return print_module(convert_to_tosa(self.lift(model), self.options))

    def _lower(self, case: NodeCase) -> str | NotRun:
        model = case.model
        assert model is not None
        return lowered_or_not_run(lambda: self._convert(_shapes_as_constants(model, case.feeds)))

    # Running -------------------------------------------------------------------------------------------

    def run_cases(
        self, cases: Sequence[NodeCase], advance: Callable[[int], None]
    ) -> dict[str, CaseRun | NotRun]:
        """Every group converted and emulated; on the reference model all in one worker process."""
        from .emulate import emulate_tosa

        runs: dict[str, CaseRun | NotRun] = {}
        prepared: list[tuple[NodeCase, str, list[np.ndarray], dict[str, np.ndarray]]] = []
        for case in cases:
            if not self.keep_case(case):
                advance(1)
                continue
            text = self._lower(case)
            if isinstance(text, NotRun):
                runs[case.name] = text
                advance(1)
                continue
            assert case.model is not None
            inputs = _storage_inputs(_shapes_as_constants(case.model, case.feeds), case.feeds)
            try:
                emulated = _named(case.model, emulate_tosa(text, inputs))
            except QConvertError as error:
                runs[case.name] = NotRun(f"the TOSA emulation cannot run it: {error.message}")
                advance(1)
                continue
            except ValueError as error:  # TosaErrorIf / TosaUnpredictable: the graph is not defined TOSA
                runs[case.name] = NotRun(f"the converted graph is not defined TOSA {BUG_MARKER}: {error}")
                advance(1)
                continue
            prepared.append((case, text, inputs, emulated))
        for (case, text, _, emulated), outputs in zip(prepared, self._run_engine(prepared), strict=True):
            if isinstance(outputs, NotRun):
                runs[case.name] = outputs
            else:
                mismatches = sum(int(np.count_nonzero(outputs[name] != emulated[name])) for name in emulated)
                floated = _float_nodes(text)
                self.states[case.name] = _CaseState(
                    emulated,
                    mismatches,
                    _near_tie_window(text),
                    floated,
                    dict(outputs) if floated and mismatches else None,
                )
                runs[case.name] = CaseRun(outputs, self.evaluated_by)
            advance(1)
        return runs

    def _run_engine(
        self, prepared: Sequence[tuple[NodeCase, str, list[np.ndarray], dict[str, np.ndarray]]]
    ) -> list[dict[str, np.ndarray] | NotRun]:
        if not prepared:
            return []
        title = ENGINE_TITLES[self.engine]
        if self.engine == "reference":
            from .run import ReferenceJob, run_reference_jobs

            try:
                results = run_reference_jobs(
                    [ReferenceJob(inputs=tuple(inputs), mlir=text) for _, text, inputs, _ in prepared]
                )
            except QConvertError as error:
                return [NotRun(f"{title} cannot run it: {error.message}") for _ in prepared]
            return [
                _named(case.model, result.outputs)  # type: ignore[arg-type]
                if result.status == "TOSA_VALID"
                else NotRun(f"{title} returned {result.status}: {result.messages.strip()[-500:]}")
                for (case, _, _, _), result in zip(prepared, results, strict=True)
            ]
        from .iree import run_iree

        found: list[dict[str, np.ndarray] | NotRun] = []
        for case, text, inputs, _ in prepared:
            assert case.model is not None
            try:
                found.append(_named(case.model, run_iree(text, inputs)))
            except QConvertError as error:
                found.append(NotRun(f"{title} cannot run it: {error.message}"))
        return found

    # Judging -------------------------------------------------------------------------------------------

    def predicted_mismatches(
        self, case: NodeCase, values: Mapping[str, np.ndarray]
    ) -> tuple[int, str] | None:
        """How many elements differ from onnxruntime by one step at a near-tie in the emulation (see the
        module's docstring); -1 when the engine differs from the emulation."""
        state = self.states.get(case.name)
        if state is None or (case.last.op_type != "QuantizeLinear" and not _is_qoperator(case)):
            return None
        title = ENGINE_TITLES[self.engine]
        output = case.last.output[0]
        emulated = state.emulated[output].astype(np.int64)
        agreement = f"{title} equals the emulation on all {emulated.size}"
        if state.engine_mismatches:
            ours = state.emulated[output].astype(np.int64)
            theirs = state.engine[output].astype(np.int64) if state.engine is not None else None
            if theirs is None or np.abs(theirs - ours).max() > 1:
                return -1, f"{title} differs from the TOSA emulation on {state.engine_mismatches} elements"
            # float islands: TOSA bounds its float functions' error, it does not fix their bits, so an
            # engine's ulps may move a near-tie by a step; the engine's own values are then the ones judged
            emulated = theirs
            agreement = (
                f"{title} differs from the emulation on {state.engine_mismatches} of {emulated.size} "
                "elements by one step (the float island's ulps), its values judged"
            )
        reference = np.asarray(values[output]).astype(np.int64)
        steps = _qoperator_steps(self.lift, case) if _is_qoperator(case) else _steps(case, values)
        distance = np.abs(steps - np.floor(steps) - 0.5)
        near = distance <= state.window
        differs = emulated != reference
        explained = differs & (np.abs(emulated - reference) == 1) & near
        unexplained = int(np.count_nonzero(differs & ~explained))
        rule = "half up" if self.options.rounding == "single" else "half up, moved 2**(30-shift) away from 0"
        why = (
            f"TOSA's rescale rounds a fixed-point product {rule}, onnxruntime a float32 value half to even: "
            f"{int(np.count_nonzero(explained))} of {int(np.count_nonzero(near))} near-ties (within "
            f"{state.window:.3g} of a half step) one step off; {agreement}"
        )
        if unexplained:
            why += f"; {unexplained} other elements differ (more than one step, or not at a near-tie)"
        if state.float_nodes:
            why += f"; ran as float TOSA (PRO-FP, --allow-float): {state.float_nodes}"
        return int(np.count_nonzero(explained)), why

    # The whole model -----------------------------------------------------------------------------------

    def prepare_model(self, model: ModelProto) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
        """The whole model converted once; float feeds quantized to the arguments' types, results
        dequantized from theirs (ONNX's rules), on the engine."""
        from qconvert.ir.dialects.builtin import ModuleOp

        from .convert import convert_to_tosa

        try:
            converted = convert_to_tosa(self.lift(model), self.options)
        except QConvertError as error:
            raise NotRun(f"the backend cannot lower the whole model: {error.message}") from None
        except Exception as error:  # a converter bug: reported, never a pass
            raise NotRun(
                f"the backend failed while lowering the model {BUG_MARKER}: {type(error).__name__}: {error}"
            ) from None
        assert isinstance(converted, ModuleOp)
        from qconvert.ir.printer import print_module

        text = print_module(converted)
        arguments, results = _boundary_types(converted)
        inputs = [
            i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}
        ]
        outputs = [o.name for o in model.graph.output]
        binary = None
        if self.engine == "iree":
            from .iree import compile_iree

            try:
                binary = compile_iree(text)
            except QConvertError as error:
                raise NotRun(f"IREE cannot compile the whole model: {error.message}") from None

        def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            given = [
                _enter(np.asarray(feeds[name]), quant) for name, quant in zip(inputs, arguments, strict=True)
            ]
            try:
                if binary is not None:
                    from .iree import run_iree

                    found = run_iree(binary, given)
                else:
                    from .run import run_reference

                    found = run_reference(text, given)
            except QConvertError as error:
                raise NotRun(
                    f"{ENGINE_TITLES[self.engine]} cannot run the whole model: {error.message}"
                ) from None
            named = _named(model, found)
            return {
                name: _leave(found[index], quant) if quant is not None else named[name]
                for index, (name, quant) in enumerate(zip(outputs, results, strict=True))
            }

        return run


# Helpers ---------------------------------------------------------------------------------------------------


def _shapes_as_constants(model: ModelProto, feeds: Mapping[str, np.ndarray]) -> ModelProto:
    """The case's model with its int32 / int64 inputs (a Reshape's shape, Gather's indices, computed upstream)
    as initializers: TOSA takes shapes as constants, and storage inputs are 8 or 16 bits. So is a scalar a
    DequantizeLinear reads (the quantized constant of MiniLM's GELU `erf(x) + 1`, a QuantizeLinear of an
    initializer in the model): converted as the constant it is there (constant_sums.py's table)."""
    from onnx import numpy_helper

    dequantized = {n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input}
    wide = [
        i
        for i in model.graph.input
        if i.name in feeds
        and (
            (np.asarray(feeds[i.name]).dtype.kind == "i" and np.asarray(feeds[i.name]).dtype.itemsize >= 4)
            or (i.name in dequantized and np.asarray(feeds[i.name]).size == 1)
        )
    ]
    if not wide:
        return model
    copy = ModelProto()
    copy.CopyFrom(model)
    names = {i.name for i in wide}
    kept = [i for i in copy.graph.input if i.name not in names]
    del copy.graph.input[:]
    copy.graph.input.extend(kept)
    copy.graph.initializer.extend(numpy_helper.from_array(np.asarray(feeds[name]), name) for name in names)
    return copy


def _storage_inputs(model: ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The case's graph inputs in order, unsigned storage as the signless bits TOSA tensors hold."""
    initializers = {t.name for t in model.graph.initializer}
    return [_signless(np.asarray(feeds[i.name])) for i in model.graph.input if i.name not in initializers]


def _signless(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind == "u" and array.dtype.itemsize in (1, 2):
        return array.view(np.dtype(f"int{8 * array.dtype.itemsize}"))
    return array


def _named(model: ModelProto | None, arrays: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """The function's results by the case's ONNX output names, read as the ONNX element type (u8 bits)."""
    from onnx import helper

    assert model is not None
    named = {}
    for output, array in zip(model.graph.output, arrays, strict=True):
        dtype = helper.tensor_dtype_to_np_dtype(output.type.tensor_type.elem_type)
        array = np.asarray(array)
        named[output.name] = (
            array.view(dtype) if array.dtype.itemsize == dtype.itemsize else array.astype(dtype)
        )
    return named


def _near_tie_window(text: str) -> float:
    """`NEAR_TIE`, plus the largest shift of the threshold DOUBLE_ROUND makes in the case's rescales: with
    shift > 31 it adds 2**30 toward away from zero to the rounding term, 2**(30 - shift) of a step."""
    from qconvert.ir.attributes import OpaqueAttr

    from .emulate import elements, parse_tosa

    widest = 0.0
    for op in parse_tosa(text).walk():
        if op.name != "tosa.rescale":
            continue
        mode = op.attributes.get("rounding_mode")
        if not (isinstance(mode, OpaqueAttr) and "DOUBLE_ROUND" in mode.text):
            continue
        producer = op.operands[2].owner_op()
        if producer is None or "values" not in producer.attributes:
            return 0.5  # a shift known only at run time: every difference of one step is explainable
        shifts = elements(producer.attributes["values"], "rescale shift").astype(np.int64)
        doubled = shifts[shifts > 31]
        if doubled.size:
            widest = max(widest, float(2.0 ** (30 - int(doubled.min()))))
    return NEAR_TIE + widest


def _float_nodes(text: str) -> str:
    """The ONNX nodes a converted case computes in float TOSA, from its module's note ('' when none)."""
    import re

    found = re.search(r'qconvert\.note = "needs PRO-INT \+ PRO-FP: [^:]*: ([^";]*)', text.split("\n", 1)[0])
    return found.group(1) if found else ""


def _steps(case: NodeCase, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """The value onnxruntime fed the group's QuantizeLinear, in steps of its scale (float64)."""
    node = case.last
    fed = np.asarray(values[node.input[0]], np.float64)
    scale = node_scale(node, np.asarray(values[node.input[1]], np.float64), fed.shape)
    return fed / scale


def _is_qoperator(case: NodeCase) -> bool:
    """A single QOperator node the TOSA route converts (through qoperator-to-qdq): storage in and out, so
    a case of its own, as a DequantizeLinear -> op -> QuantizeLinear group is."""
    from qconvert.passes.qoperator_to_qdq import FLOAT_OPS

    return (
        case.group is None
        and case.quantization  # a QGemm with a float result is a float node, judged as one
        and case.model is not None
        and len(case.nodes) == 1
        and case.last.op_type in {op.ONNX_OP_TYPE for op in FLOAT_OPS}
        and case.last.domain in ("", "ai.onnx", "com.microsoft")
    )


def _qoperator_steps(lift: Lift, case: NodeCase) -> np.ndarray:
    """The value a QOperator case's QDQ form quantizes (its ONNX definition, qoperator-to-qdq, run by the
    interpreter in float32 on the case's storage feeds), in steps of the result's scale (float64)."""
    from qconvert.interpret import interpret
    from qconvert.ir.dialects.func import ReturnOp
    from qconvert.ir.dialects.onnx import main_function
    from qconvert.ir.dialects.quant import QuantizeCastOp, StorageCastOp
    from qconvert.ir.quant_types import uniform_params
    from qconvert.ir.types import FunctionType
    from qconvert.passes.qoperator_to_qdq import qoperator_to_qdq

    assert case.model is not None
    module = lift(case.model)
    qoperator_to_qdq(module)
    function = main_function(module, "to judge")
    terminator = function.body.terminator
    assert isinstance(terminator, ReturnOp) and len(terminator.operands) == 1
    storage = terminator.operands[0].owner_op()
    quantize = storage.operands[0].owner_op() if isinstance(storage, StorageCastOp) else None
    if not isinstance(quantize, QuantizeCastOp):
        return np.full(1, np.nan)  # a float result: no step to be near
    scale = float(uniform_params(quantize.result.type.element_type).scale.reshape(-1)[0])  # type: ignore[attr-defined]
    terminator.set_operand(0, quantize.input)
    function.function_type = FunctionType(function.function_type.inputs, (quantize.input.type,))
    (value,) = interpret(module, case.feeds).values()
    return np.asarray(value, np.float64) / scale


def _boundary_types(module: ModuleOp) -> tuple[list[object | None], list[object | None]]:
    """The quant type recorded on each argument and result of @main (None: not quantized storage)."""
    from qconvert.ir.attributes import ArrayAttr, DictionaryAttr, StringAttr
    from qconvert.ir.dialects.onnx import main_function
    from qconvert.ir.parser import parse_type
    from qconvert.ir.types import FunctionType

    function = main_function(module, "to run")
    function_type = function.function_type
    assert isinstance(function_type, FunctionType)

    def read(key: str, count: int) -> list[object | None]:
        found: list[object | None] = [None] * count
        entries = function.attributes.get(key)
        if isinstance(entries, ArrayAttr):
            for index, entry in enumerate(entries.elements):
                if isinstance(entry, DictionaryAttr):
                    text = dict(entry.entries).get(QUANT_TYPE)
                    if isinstance(text, StringAttr):
                        found[index] = parse_type(text.value)
        return found

    return read("arg_attrs", len(function_type.inputs)), read("res_attrs", len(function_type.results))


def _enter(feed: np.ndarray, quant: object | None) -> np.ndarray:
    """A float feed quantized to the argument's storage (ONNX QuantizeLinear's rule); others as they are."""
    from qconvert.ir.quant_types import uniform_params
    from qconvert.numerics import quantize

    if feed.dtype == np.int64:  # TOSA has no i64: the function takes token ids as i32 (index_ops.py)
        return feed.astype(np.int32)
    if quant is None or feed.dtype.kind != "f":
        return _signless(feed)
    return _signless(quantize(feed, uniform_params(quant)))  # type: ignore[arg-type]


def _leave(value: np.ndarray, quant: object) -> np.ndarray:
    """A storage result dequantized to the model's float output (ONNX DequantizeLinear's rule)."""
    from qconvert.ir.quant_types import uniform_params
    from qconvert.numerics import dequantize

    params = uniform_params(quant)  # type: ignore[arg-type]
    storage = np.asarray(value).view(params.storage_dtype)
    return dequantize(storage, params)
