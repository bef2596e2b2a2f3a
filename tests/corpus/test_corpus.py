"""Every corpus model converts to StableHLO in each form and checks clean, on the interpreter and on XLA.

The corpus (models/corpus/) is real architectures exported by torch with dynamic axes and quantized the
ways users do (onnxruntime dynamic, static QDQ and QOperator, weight-only int8). For each entry and each
operation of models/corpus/corpus_checks.py: `convert --to stablehlo` (quantized, integer, qdq; shapes
from the inputs, as `--input-shape`), `check` on the interpreter and `check --backend stablehlo --engine
xla`, each with nothing "not run", nothing failed and every output within the noise floor.

EXPECTED_FAILURES lists what fails today, with the failure in short (from `models/corpus/status.py
--xfail-table`); those cases are strict xfails, so a fix that lands makes its case XPASS and fail until
its line is removed here. /work/notes/corpus_status.txt (and status.py's output) is the same matrix.
"""

from __future__ import annotations

import pytest
from conftest import require_module
from corpus_checks import OPERATIONS, judge_report, run_check, run_convert
from corpus_manifest import ENTRIES, CorpusEntry

EXPECTED_FAILURES: dict[tuple[str, str], str] = {}


def cases() -> list[object]:
    params = []
    for entry in ENTRIES:
        for operation in OPERATIONS:
            reason = EXPECTED_FAILURES.get((entry.name, operation))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            if operation == "check:xla":  # XLA compiles every per-node case: 4-100 s each
                marks.append(pytest.mark.slow)
            case_id = f"{entry.name}-{operation.replace(':', '-')}"
            params.append(pytest.param(entry, operation, id=case_id, marks=marks))
    return params


@pytest.mark.parametrize(("entry", "operation"), cases())
def test_corpus_model(corpus_dir, entry: CorpusEntry, operation: str) -> None:
    model, inputs = corpus_dir / entry.file, corpus_dir / entry.inputs_file
    kind, variant = operation.split(":")
    if kind == "convert":
        run_convert(model, inputs, variant)  # raises InputError naming what cannot be converted
        return
    if variant == "xla":
        require_module("jax")
    problem = judge_report(run_check(model, inputs, variant))
    assert not problem, problem


def test_expected_failures_name_real_cases() -> None:
    """A stale line in the table (a renamed entry or operation) would silently xfail nothing."""
    known = {(entry.name, operation) for entry in ENTRIES for operation in OPERATIONS}
    assert set(EXPECTED_FAILURES) <= known, sorted(set(EXPECTED_FAILURES) - known)
