"""The backends `qconvert check` runs, behind one small interface.

A backend runs per-node cases (`NodeCase`: a cut-out ONNX model and its feeds) and the whole model. When
it cannot lower or run something it says why (`NotRun`): the node or output is then "not run" with that
reason, never passed.

- `interpreter`: the lifted IR on qconvert's own interpreter (`qconvert.interpret`): every case side by
  side in one module (one lift, one run; lifting a few hundred one-node models costs more than running
  them); should that module fail, each case runs alone and says why.
- every backend of `qconvert.backends` with engines (`stablehlo`: the lifted IR converted to StableHLO,
  `--form`, `--semantics`, run on jaxlib's reference interpreter or XLA:CPU, `--engine`): its
  `check_runner`, which lives beside the backend (backends/stablehlo/check.py). Check owns judging;
  the backends own running.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from onnx import ModelProto

from qconvert.check.nodes import NodeCase
from qconvert.check.report import (
    BUG_MARKER,
    EVALUATED_BY_FOLDING,
    EVALUATED_BY_NUMERICS,
    EVALUATED_BY_REFERENCE,
    LayerResult,
)
from qconvert.did_you_mean import did_you_mean
from qconvert.errors import InputError, QConvertError

if TYPE_CHECKING:
    from qconvert.ir.dialects.builtin import ModuleOp

INTERPRETER = "interpreter"  # check's own runner: the lifted IR on qconvert.interpret


class NotRun(Exception):
    """The backend cannot lower or run a case or the model; the message says why."""


def lowered_or_not_run(lower: Callable[[], str]) -> str | NotRun:
    """A case's text as `lower()` converts it, or why the backend cannot lower it: an input error's message,
    or any other exception as a converter bug (never a pass, and the rest of the report still runs)."""
    try:
        return lower()
    except QConvertError as error:
        return NotRun(f"the backend cannot lower it: {error.message}")
    except Exception as error:
        return NotRun(f"the backend failed while lowering it {BUG_MARKER}: {type(error).__name__}: {error}")


@dataclass(frozen=True, slots=True)
class CaseRun:
    """What the backend computed for one case (outputs by ONNX name), and what evaluated it."""

    outputs: dict[str, np.ndarray]
    evaluated_by: str


class CheckBackend(Protocol):
    """What `check` needs from a backend."""

    @property
    def name(self) -> str: ...

    @property
    def engine(self) -> str | None: ...

    @property
    def form(self) -> str | None: ...

    @property
    def semantics(self) -> str | None: ...

    @property
    def feeds_weights(self) -> bool:
        """Whether a Q/DQ's constant data input is fed at run time (see nodes.cut_model)."""
        ...

    def fused_groups(self) -> bool:
        """Whether the per-node verdict covers fused `DequantizeLinear* -> op -> QuantizeLinear` groups."""
        ...

    def run_cases(
        self, cases: Sequence[NodeCase], advance: Callable[[int], None]
    ) -> dict[str, CaseRun | NotRun]:
        """Run every runnable case; a case that cannot run maps to `NotRun` (calls `advance` as it goes)."""
        ...

    def keep_case(self, case: NodeCase) -> bool:
        """Whether `case` belongs in the report (not a fused-group candidate the backend did not fuse);
        call after `run_cases`."""
        ...

    def predicted_mismatches(
        self, case: NodeCase, values: Mapping[str, np.ndarray]
    ) -> tuple[int, str] | None:
        """Where the rounding differs from ONNX's on purpose: the predicted mismatch count and why."""
        ...

    def prepare_model(self, model: ModelProto) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
        """The whole model (lifted with onnxruntime's types) made ready once; the callable runs it on one
        batch of feeds. Either raises `NotRun` when the backend cannot lower or run it."""
        ...

    def notes(self, cases: Sequence[NodeCase], layers: Mapping[str, LayerResult]) -> list[str]:
        """What the report should say about how the backend ran the cases, once `layers` are judged."""
        ...


@contextlib.contextmanager
def quiet_float_warnings() -> Iterator[None]:
    """Silence numpy on IEEE results (log(0) = -inf, a NaN cast): the values are compared, not warned of."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def evaluated_by_op(module: Any) -> dict[str, str]:
    """Side by side: case prefix (`c12/`) -> what evaluated the case (generic if any op of it is)."""
    from qconvert.ir.dialects.onnx import main_function, node_name

    found: dict[str, str] = {}
    for op in main_function(module, "to interpret").body.ops:
        text = node_name(op)
        if text is None or "/" not in text:
            continue
        prefix = text[: text.index("/") + 1]
        if op.name.startswith("onnx."):
            found[prefix] = EVALUATED_BY_REFERENCE
        else:
            found.setdefault(prefix, EVALUATED_BY_NUMERICS)
    return found


def evaluated_by(module: Any) -> str:
    """Whether the lifted node runs as quant-typed ops, or as a generic `onnx.*` op on onnx's reference."""
    from qconvert.ir.dialects.onnx import main_function

    generic = any(op.name.startswith("onnx.") for op in main_function(module, "to interpret").body.ops)
    return EVALUATED_BY_REFERENCE if generic else EVALUATED_BY_NUMERICS


@dataclass(slots=True)
class InterpreterBackend:
    """The lifted IR on qconvert's numpy interpreter (one case at a time: lifting is cheap)."""

    name: str = "interpreter"
    engine: str | None = None
    form: str | None = None
    semantics: str | None = None
    feeds_weights: bool = False

    def fused_groups(self) -> bool:
        return False  # the interpreter runs the model's nodes as they are: nothing is fused

    def run_cases(
        self, cases: Sequence[NodeCase], advance: Callable[[int], None]
    ) -> dict[str, CaseRun | NotRun]:
        """The cases side by side in batches of bounded inputs (`case_batches`): one lift and run each."""
        from qconvert.check.nodes import case_batches

        runs: dict[str, CaseRun | NotRun] = {}
        for batch in case_batches(cases):
            runs.update(self._run_batch(batch, advance))
        return runs

    def _run_batch(
        self, cases: Sequence[NodeCase], advance: Callable[[int], None]
    ) -> dict[str, CaseRun | NotRun]:
        from qconvert.check.nodes import side_by_side, split_outputs
        from qconvert.frontends.onnx import import_onnx
        from qconvert.interpret import Interpreter

        if not cases:
            return {}
        try:
            model, feeds = side_by_side(cases)
            module = import_onnx(model)
            with quiet_float_warnings():
                results = Interpreter(module).run(feeds)
        except Exception:  # any failure: each case runs on its own next, and says why it fails
            return self._run_each(cases, advance)
        by = evaluated_by_op(module)
        runs: dict[str, CaseRun | NotRun] = {}
        for index, (name, outputs) in enumerate(split_outputs(cases, results).items()):
            runs[name] = CaseRun(outputs, by.get(f"c{index}/", EVALUATED_BY_FOLDING))
        advance(len(cases))
        return runs

    def _run_each(
        self, cases: Sequence[NodeCase], advance: Callable[[int], None]
    ) -> dict[str, CaseRun | NotRun]:
        from qconvert.frontends.onnx import import_onnx
        from qconvert.interpret import interpret

        runs: dict[str, CaseRun | NotRun] = {}
        for case in cases:
            assert case.model is not None
            try:
                module = import_onnx(case.model)
                with quiet_float_warnings():
                    outputs = interpret(module, case.feeds)
                runs[case.name] = CaseRun(outputs, evaluated_by(module))
            except InputError as error:
                runs[case.name] = NotRun(f"the backend cannot run it: {error.message}")
            except Exception as error:  # a bug of ours: never a pass, and the rest of the report still runs
                failure = f"{type(error).__name__}: {error}"
                runs[case.name] = NotRun(f"the backend failed on it {BUG_MARKER}: {failure}")
            advance(1)
        return runs

    def keep_case(self, case: NodeCase) -> bool:
        return True

    def notes(self, cases: Sequence[NodeCase], layers: Mapping[str, LayerResult]) -> list[str]:
        return []

    def predicted_mismatches(
        self, case: NodeCase, values: Mapping[str, np.ndarray]
    ) -> tuple[int, str] | None:
        return None

    def prepare_model(self, model: ModelProto) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
        from qconvert.frontends.onnx import import_onnx
        from qconvert.interpret import Interpreter

        try:
            interpreter = Interpreter(import_onnx(model))
        except InputError as error:
            raise NotRun(f"the backend cannot lift the whole model: {error.message}") from None

        def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            try:
                with quiet_float_warnings():
                    return interpreter.run(feeds)
            except InputError as error:
                raise NotRun(f"the backend cannot run the whole model: {error.message}") from None

        return run


def lift_inline(model: ModelProto) -> ModuleOp:
    """A case's model lifted with every weight inline (`dense<...>`): what a backend's runner converts."""
    from qconvert.frontends.onnx import import_onnx

    return import_onnx(model, resource_threshold=0)


def backend_choices() -> tuple[str, ...]:
    """What `check --backend` takes: the interpreter, and every registered backend that has engines."""
    from qconvert.backends import REGISTRY

    return (INTERPRETER, *(backend.name for backend in REGISTRY if backend.engines))


def make_backend(backend: str, engine: str | None = None, **options: Any) -> CheckBackend:
    """The check runner of `backend` on `engine` with the backend's `options` (None and False: not given);
    InputError for an unknown name or an option the backend does not take (its Options' rules too, e.g.
    `fuse_arithmetic` only in the stablehlo backend's quantized form)."""
    from qconvert.backends import described, get_backend, given_options, parse_options

    choices = backend_choices()
    if backend not in choices:
        raise InputError(
            f"unknown backend '{backend}'; available: {', '.join(choices)}{did_you_mean(backend, choices)}"
        )
    if backend == INTERPRETER:
        given = given_options({"engine": engine, **options})
        if given:
            from qconvert.backends import REGISTRY
            from qconvert.options import option_fields

            fields = {name.replace("-", "_") for name in given} - {"engine"}
            takers = [b.name for b in REGISTRY if b.engines and fields <= set(option_fields(b.Options))]
            raise InputError(f"{described(given)}: only the {' / '.join(takers)} backend takes these options")
        return InterpreterBackend()
    chosen = get_backend(backend)
    runner = chosen.check_runner(parse_options(chosen, options), engine, lift_inline)
    assert runner is not None, f"backend {backend} has engines but no check runner"
    return runner
