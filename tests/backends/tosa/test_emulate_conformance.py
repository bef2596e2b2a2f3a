"""TOSA's own conformance tests, from a suite we did not write, through the graph emulation (emulate.py).

`qconvert.backends.tosa.generate_conformance` runs tosa-tools' `tosa_verif_conformance_generator` for the
operators below (profile PRO-INT, TOSA 1.0.2, positive tests), the reference model giving each graph's
expected outputs; each graph (`case.mlir()`: `tosa-opt --tosa-deserialize`, generic form) runs on
`emulate_tosa` with the generated placeholders, and must give the same integers, shapes and types.

Not covered here: RESCALE and TABLE (tests/numerics/test_tosa_conformance.py runs them on the numerics), and
the EXT-INT16 tests: with an i16 CONV2D / DEPTHWISE_CONV2D the generated bias is an i48 placeholder, which the
conformance helper cannot yet run on the reference model (it reports RUN_FAILED for those graphs).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_tosa_python

from qconvert.backends.tosa import emulate_tosa

pytestmark = [pytest.mark.engine, pytest.mark.slow]

OPERATORS = (
    "conv2d", "depthwise_conv2d", "matmul", "add", "sub", "mul", "avg_pool2d", "max_pool2d", "clamp", "cast",
    "reduce_sum", "maximum", "minimum", "reduce_max", "reduce_min", "reshape", "transpose", "slice", "concat",
    "pad", "gather",
)  # fmt: skip


@pytest.fixture(scope="module")
def conformance(tmp_path_factory: pytest.TempPathFactory) -> list:
    require_tosa_python()
    from qconvert.backends.tosa import generate_conformance

    return generate_conformance(
        list(OPERATORS), tmp_path_factory.mktemp("tosa_conformance_ops"), extensions=("tosa-ext-doubleround",)
    )


def _same(ours: np.ndarray, expected: np.ndarray) -> bool:
    if ours.shape != expected.shape:
        return False
    if expected.dtype.kind in "iub":
        return np.array_equal(ours.astype(np.int64), expected.astype(np.int64))
    return np.array_equal(ours, expected, equal_nan=True)


@pytest.mark.parametrize("operator", OPERATORS)
def test_every_generated_test_runs_bit_exact_on_the_emulation(conformance: list, operator: str) -> None:
    chosen = [case for case in conformance if case.name.startswith(operator + "_")]
    assert chosen, f"the generator made no {operator} test"
    failures, values = [], 0
    for case in chosen:
        ours = emulate_tosa(case.mlir(), list(case.inputs.values()))
        if len(ours) != len(case.expected) or not all(
            _same(a, b) for a, b in zip(ours, case.expected, strict=True)
        ):
            failures.append(case.name)
        values += sum(a.size for a in ours)
    assert not failures, f"{len(failures)} of {len(chosen)} {operator} tests differ: {failures[:10]}"
    assert values > 0
