"""TOSA's own conformance tests for RESCALE and TABLE, from a suite we did not write, through our emulation.

tosa-tools 2026.8.0 ships TOSA's conformance generator (`tosa_verif_conformance_generator`, which drives
`tosa_verif_build_tests` with the conformance selection of cts-config_v1.0.json). The fixture generates every
positive RESCALE and TABLE test of profile PRO-INT with extensions EXT-INT16 and EXT-DOUBLEROUND for TOSA
1.0.2 (302 RESCALE and 22 TABLE tests, about a minute) with `qconvert.backends.tosa.generate_conformance`:
each graph's expected result comes from the reference model (the Python binding; its command-line runner for
graphs with an i48 input, which the binding refuses), and each flatbuffer's operator, attributes and
constants are decoded (the generator keeps multipliers, shifts, zero points, tables and some inputs as
constants). `qconvert.numerics.tosa.rescale` / `table` must give the same integers for every test.

Cases we do not run: RESCALE with INEXACT_ROUND (extension EXT-INEXACTROUND, not requested): its result is any
value within an error bound, not a rule to emulate bit for bit, and the reference model's RESCALE refuses that
rounding mode. Negative (ERROR_IF) tests: they check that an implementation refuses invalid graphs, which our
test_tosa_numerics.py covers case by case against the same model. Every generated positive test passes.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_tosa_python

from qconvert.numerics.tosa import TosaRounding, rescale, table

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TYPES = {"INT8": "i8", "INT16": "i16", "INT32": "i32", "INT48": "i48"}
ROUNDING = {1: TosaRounding.SINGLE, 3: TosaRounding.DOUBLE}  # tosa.RoundingMode: SINGLE_ROUND, DOUBLE_ROUND


@pytest.fixture(scope="module")
def conformance(tmp_path_factory: pytest.TempPathFactory) -> list:
    require_tosa_python()
    from qconvert.backends.tosa import generate_conformance

    return generate_conformance(["rescale", "table"], tmp_path_factory.mktemp("tosa_conformance"))


def emulate(case) -> np.ndarray:  # a ConformanceCase
    """Our numerics on the case's one operator, its operands read from placeholders or constants."""
    operator = case.operator
    operands = [case.operand(name) for name in operator["inputs"]]
    if operator["op"] == "TABLE":
        values, lookup = operands
        return table(values, lookup)
    assert operator["op"] == "RESCALE", operator["op"]
    fields = operator["fields"]
    values, multiplier, shift, input_zp, output_zp = operands
    return rescale(
        values,
        multiplier,
        shift,
        input_type=TYPES[case.graph.tensors[operator["inputs"][0]]["type"]],
        output_type=TYPES[case.graph.tensors[operator["outputs"][0]]["type"]],
        input_zp=int(input_zp.reshape(-1)[0]),
        output_zp=int(output_zp.reshape(-1)[0]),
        scale32=bool(fields["Scale32"]),
        rounding=ROUNDING[fields["RoundingMode"]],
        per_channel=bool(fields["PerChannel"]),
        input_unsigned=bool(fields["InputUnsigned"]),
        output_unsigned=bool(fields["OutputUnsigned"]),
    )


@pytest.mark.parametrize("operator", ["rescale", "table"])
def test_every_generated_conformance_test_passes(conformance: list, operator: str) -> None:
    chosen = [case for case in conformance if case.name.startswith(operator + "_")]
    assert len(chosen) >= {"rescale": 300, "table": 20}[operator], f"only {len(chosen)} {operator} tests"
    failures, values = [], 0
    for case in chosen:
        ours = emulate(case)
        (expected,) = case.expected
        if ours.shape != expected.shape or not np.array_equal(
            ours.astype(np.int64), expected.astype(np.int64)
        ):
            failures.append(case.name)
        values += ours.size
    assert not failures, f"{len(failures)} of {len(chosen)} {operator} tests differ: {failures[:10]}"
    assert values > 1000
