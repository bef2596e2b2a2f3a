"""The stablehlo backend's check runner (`qconvert check --backend stablehlo`): cases lifted, converted, run.

It is what `StableHLOBackend.check_runner` returns, behind check's `CheckBackend` interface; check judges
what it computes. Per node: every case (a quantization node, or a `DequantizeLinear* -> op ->
QuantizeLinear` group) is lifted with the `lift` check gives it (the ONNX frontend: backends do not
import frontends), converted with `convert_to_stablehlo(form, semantics)` and run on the chosen
engine (`interpreter`: `stablehlo.eval_module`; `xla`: XLA:CPU after quant-to-math) on the inputs
onnxruntime gave it. A group is kept in the report only when the `quantized` form fuses it into one
quantized StableHLO op (in the `integer` form the same groups run written out in integer ops). With
`fuse_arithmetic` (quantized form only) the conversion also fuses add / dot_general / convolution, so each
`DequantizeLinear(x, w, int32 bias) -> Conv/MatMul/Gemm/Add -> QuantizeLinear` group it fuses is a case too.

Compiling dominates a small XLA run, so the cases run side by side in one module: each case's values
renamed apart (`c12/x`), nothing shared, every case's outputs returned (measured on tiny_encoder's 184
Q/DQ nodes: 11.3 s of CPU compiling one module per case, 5.7 s for one module). The whole batch is
converted once first; only when that fails is each case lowered on its own, so one that cannot be
lowered is named with its reason, and the others run in one module (each alone if that fails too).

`--semantics stablehlo` keeps `uniform_quantize`, which adds the zero point before rounding: a
QuantizeLinear (or a fused group's final quantize) then differs from onnxruntime on ties when the zero
point is odd. The predicted count comes from the backend's own prediction (numerics' two rounding
rules applied to the value onnxruntime fed the quantize); the case passes when measured == predicted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from onnx import ModelProto

from qconvert.check.backends import CaseRun, NotRun, lowered_or_not_run
from qconvert.check.nodes import (
    CASE_BATCH_BYTES,
    INTEGER_WEIGHT_OPS,
    NodeCase,
    case_batches,
    integer_weights_as_inputs,
    side_by_side,
    split_outputs,
    weights_as_inputs,
)
from qconvert.check.report import BUG_MARKER, LayerResult
from qconvert.errors import QConvertError

from .forms import ENGINE_NAMES

if TYPE_CHECKING:
    from qconvert.ir.dialects.builtin import ModuleOp

Lift = Callable[[ModelProto], "ModuleOp"]

ARITHMETIC_OPS = frozenset({"Conv", "MatMul", "Gemm", "Add"})  # what --fuse-arithmetic fuses
SEMANTICS_EXPLANATION = (
    "StableHLO uniform_quantize adds the zero point before rounding (rne(x/s + zp)), ONNX after "
    "(rne(x/s) + zp): they differ on ties when the zero point is odd"
)
# Inputs per side-by-side module: an 82M-parameter model's 779 cases in one XLA module took 0.8 GB of
# buffers on top of the check's own (peak 1.94 GB); in modules of this size 1.74 GB, as fast (32 MB: 25%
# slower, one compile per module, and no lower peak: the whole-model run sets it then).
BATCH_BYTES = CASE_BATCH_BYTES


def _convert_counting(
    lift: Lift, model: ModelProto, form: str, semantics: str, fuse_arithmetic: bool = False
) -> tuple[str, int]:
    """`model` lifted and converted to StableHLO text that the engines run, and how many quantized ops
    the conversion fused (only the `quantized` form fuses). Weights are inline (`dense<...>`; the engines
    refuse or misread `dense_resource`: `lift` inlines them), which the small models `check` cuts out
    afford."""
    from qconvert.ir.printer import print_module

    from .convert import convert_with_stats

    converted, stats = convert_with_stats(lift(model), form, semantics, fuse_arithmetic=fuse_arithmetic)
    return print_module(converted), stats.fused_ops


@dataclass(slots=True)
class StableHLOCheckRunner:
    """Cases and the whole model converted to StableHLO and run on jaxlib's interpreter or XLA:CPU.

    `lift`: ONNX model -> lifted module with its weights inline (check passes the ONNX frontend's)."""

    lift: Lift
    engine: str = "xla"
    form: str = "quantized"
    semantics: str = "onnx"
    name: str = "stablehlo"
    feeds_weights: bool = True  # else XLA constant-folds every weight's dequantize (seconds per model)
    fuse_arithmetic: bool = False  # also fuse add / dot_general / convolution groups (quant_fusion.py)
    fused: dict[str, int] = field(default_factory=dict)  # group case -> ops the quantized form fuses

    @property
    def evaluated_by(self) -> str:
        return f"StableHLO ({self.form} form) on {ENGINE_NAMES[self.engine]}"

    def fused_groups(self) -> bool:
        return True

    def _convert(self, model: ModelProto) -> str:
        return _convert_counting(self.lift, model, self.form, self.semantics, self.fuse_arithmetic)[0]

    def _run_text(self, text: str, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        from .run import run

        return run(text, list(arrays), engine=self.engine)

    def _lower(self, case: NodeCase) -> str | NotRun:
        """The case's StableHLO text (integer weights as arguments: `_case_model`), or why it cannot be
        lowered."""
        assert case.model is not None
        return lowered_or_not_run(lambda: self._convert(_case_model(case)[0]))

    def _run_one(self, case: NodeCase, text: str) -> CaseRun | NotRun:
        assert case.model is not None
        model, feeds = _case_model(case)
        inputs = [i.name for i in model.graph.input]
        try:
            results = self._run_text(text, [feeds[name] for name in inputs])
        except QConvertError as error:
            return NotRun(f"{ENGINE_NAMES[self.engine]} cannot run it: {error.message}")
        names = [o.name for o in case.model.graph.output]
        return CaseRun(dict(zip(names, results)), self.evaluated_by)

    def _run_batch(self, cases: Sequence[NodeCase], text: str | None = None) -> dict[str, CaseRun] | None:
        """Every case in one module (converted here unless `text` is given), or None when the batch cannot
        be converted or run. Cases whose inputs exceed `BATCH_BYTES` together run in consecutive modules
        of about that size (`case_batches`), so that XLA's buffers for them stay bounded."""
        if text is None:
            chunks = case_batches(cases, BATCH_BYTES)
            if len(chunks) > 1:
                runs: dict[str, CaseRun] = {}
                for chunk in chunks:
                    chunk_runs = self._run_batch(chunk)
                    if chunk_runs is None:
                        return None
                    runs.update(chunk_runs)
                return runs
        model, feeds = side_by_side(cases)
        feeds.update(integer_weights_as_inputs(model))
        inputs = [i.name for i in model.graph.input]
        try:
            if text is None:
                text = self._convert(model)
            results = dict(
                zip([o.name for o in model.graph.output], self._run_text(text, [feeds[n] for n in inputs]))
            )
        except Exception:  # any failure: each case is lowered (and run) on its own next, and says why
            return None
        return {
            name: CaseRun(outputs, self.evaluated_by)
            for name, outputs in split_outputs(cases, results).items()
        }

    def run_cases(
        self, cases: Sequence[NodeCase], advance: Callable[[int], None]
    ) -> dict[str, CaseRun | NotRun]:
        """All cases in one module first (one conversion, one compile); should that fail, one conversion
        per op type, and case by case only within a type that fails (to name the cases that cannot be
        lowered, each with its reason); the rest run in one module, and should that fail too, each alone.
        A fused group is lowered on its own to count what the quantized form fuses."""
        runs: dict[str, CaseRun | NotRun] = {}
        texts: dict[str, str] = {}
        singles = []
        for case in cases:
            if case.group is None:
                singles.append(case)
                continue
            # In the quantized form, the conversion that counts the fused ops is the one to run.
            lowered, self.fused[case.name] = self._fused_op_count(case)
            if not self.fused[case.name]:
                advance(1)
                continue  # not fused: its nodes are checked one by one
            lowered = lowered if lowered is not None else self._lower(case)
            if isinstance(lowered, NotRun):
                runs[case.name] = lowered
                advance(1)
            else:
                texts[case.name] = lowered
        batch = self._run_batch(singles) if singles else {}
        lowerable: list[NodeCase] = []
        if batch is not None:
            runs.update(batch)
            advance(len(singles))
        else:
            # One conversion per op type finds the lowerable ones; only a type that fails is lowered case
            # by case, to name each case that cannot be lowered with its own reason.
            by_op: dict[tuple[str, str], list[NodeCase]] = {}
            for case in singles:
                by_op.setdefault((case.domain, case.op_type), []).append(case)
            for group in by_op.values():
                if len(group) > 1 and self._converts(group):
                    lowerable += group
                    continue
                for case in group:
                    lowered = self._lower(case)
                    if isinstance(lowered, NotRun):
                        runs[case.name] = lowered
                        advance(1)
                    else:
                        texts[case.name] = lowered
                        lowerable.append(case)
        chosen = {case.name for case in lowerable} | set(texts)
        runnable = [case for case in cases if case.name in chosen]
        rest = self._run_batch(runnable) if runnable else {}
        if rest is not None:
            runs.update(rest)
            advance(len(runnable))
            return runs
        for case in runnable:
            text = texts.get(case.name) or self._lower(case)
            runs[case.name] = text if isinstance(text, NotRun) else self._run_one(case, text)
            advance(1)
        return runs

    def _converts(self, cases: Sequence[NodeCase]) -> bool:
        """Whether `cases` side by side convert to StableHLO."""
        model, _ = side_by_side(cases)
        integer_weights_as_inputs(model)
        try:
            self._convert(model)
        except Exception:  # any failure: the cases are lowered one by one
            return False
        return True

    def _fused_op_count(self, case: NodeCase) -> tuple[str | None, int]:
        """The quantized ops the `quantized` form makes of a group (0: not fused, or not lowerable), and
        the text of that conversion when it is this check's form (else None)."""
        assert case.model is not None
        try:
            text, fused = _convert_counting(
                self.lift, case.model, "quantized", self.semantics, self.fuse_arithmetic
            )
        except Exception:  # not lowerable: nothing fused, and the end-to-end run says why
            return None, 0
        return (text if self.form == "quantized" else None), fused

    def keep_case(self, case: NodeCase) -> bool:
        return case.group is None or self.fused.get(case.name, 0) > 0

    def notes(self, cases: Sequence[NodeCase], layers: Mapping[str, LayerResult]) -> list[str]:
        """With `fuse_arithmetic`: how many arithmetic groups were fused and checked as layers, and how many
        were left unfused (their nodes are checked one by one)."""
        if not self.fuse_arithmetic:
            return []
        candidates = [case for case in cases if case.group is not None and case.op_type in ARITHMETIC_OPS]
        fused = [case for case in candidates if case.name in layers]
        note = (
            f"--fuse-arithmetic: {len(fused)} of {len(candidates)} DequantizeLinear -> Conv/MatMul/Gemm/Add"
            " -> QuantizeLinear groups fused and checked as layers (the others' nodes are checked one by one)"
        )
        if self.engine == "interpreter" and any(case.op_type == "Conv" for case in fused):
            note += (
                "; jaxlib's StableHLO interpreter wraps i8 convolutions (a known bug): fused Convs fail on it"
            )
        return [note]

    def predicted_mismatches(
        self, case: NodeCase, values: Mapping[str, np.ndarray]
    ) -> tuple[int, str] | None:
        if self.semantics != "stablehlo" or case.last.op_type != "QuantizeLinear":
            return None
        from qconvert.ir.dialects.quant import QuantizeCastOp
        from qconvert.ir.types import element_type_of

        from .lower_quant import predicted_mismatches

        assert case.model is not None
        quantizes = [op for op in self.lift(case.model).walk() if isinstance(op, QuantizeCastOp)]
        if not quantizes:
            return None  # kept a generic onnx op (run-time scale): nothing to predict from
        quant_type = element_type_of(quantizes[-1].results[0].type)
        count = predicted_mismatches(quant_type, values[case.last.input[0]])  # type: ignore[arg-type]
        return count, SEMANTICS_EXPLANATION

    def prepare_model(self, model: ModelProto) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
        """The whole model converted once, its weights fed as arguments (`weights_as_inputs`)."""
        weights = weights_as_inputs(model)
        weights.update(integer_weights_as_inputs(model))
        try:
            text = self._convert(model)
        except QConvertError as error:
            raise NotRun(f"the backend cannot lower the whole model: {error.message}") from None
        except Exception as error:  # a converter bug: reported, never a pass
            raise NotRun(
                f"the backend failed while lowering the model {BUG_MARKER}: {type(error).__name__}: {error}"
            ) from None
        outputs = [o.name for o in model.graph.output]
        arguments = [i.name for i in model.graph.input]

        def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            given = [
                feeds[name] if name in feeds else weights[name]
                for name in arguments
                if name in feeds or name in weights
            ]
            try:
                results = self._run_text(text, given)
            except QConvertError as error:
                raise NotRun(
                    f"{ENGINE_NAMES[self.engine]} cannot run the whole model: {error.message}"
                ) from None
            return dict(zip(outputs, results))

        return run


def _case_model(case: NodeCase) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """The case's model and feeds with its integer weights as inputs (a copy when any moves)."""
    assert case.model is not None
    if not any(node.op_type in INTEGER_WEIGHT_OPS for node in case.model.graph.node):
        return case.model, dict(case.feeds)
    model = ModelProto()
    model.CopyFrom(case.model)
    weights = integer_weights_as_inputs(model)
    return model, {**case.feeds, **weights}
