"""TOSA's own conformance tests for RESCALE and TABLE, from a suite we did not write, through our emulation.

tosa-tools 2026.8.0 ships TOSA's conformance generator (`tosa_verif_conformance_generator`, which drives
`tosa_verif_build_tests` with the conformance selection of cts-config_v1.0.json). The fixture generates every
positive RESCALE and TABLE test of profile PRO-INT with extensions EXT-INT16 and EXT-DOUBLEROUND for TOSA
1.0.2 (302 RESCALE and 22 TABLE tests, about a minute), runs each graph on the reference model for its
expected result (the Python binding; its command-line runner for graphs with an i48 input, which the binding
refuses), decodes each flatbuffer's operator, attributes and constants (`describe_flatbuffers`: the generator
keeps multipliers, shifts, zero points, tables and some inputs as constants), and requires
`qconvert.numerics.tosa.rescale` / `table` to give the same integers for every test.

Cases we do not run: RESCALE with INEXACT_ROUND (extension EXT-INEXACTROUND, not requested): its result is any
value within an error bound, not a rule to emulate bit for bit, and the reference model's RESCALE refuses that
rounding mode. Negative (ERROR_IF) tests: they check that an implementation refuses invalid graphs, which our
test_tosa_numerics.py covers case by case against the same model. Every generated positive test passes.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import require_tosa_python

from qconvert.numerics.tosa import TosaRounding, rescale, table

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TYPES = {"INT8": "i8", "INT16": "i16", "INT32": "i32", "INT48": "i48"}
ROUNDING = {1: TosaRounding.SINGLE, 3: TosaRounding.DOUBLE}  # tosa.RoundingMode: SINGLE_ROUND, DOUBLE_ROUND


@dataclass
class ConformanceTest:
    name: str
    folder: Path
    flatbuffer: bytes
    inputs: dict[str, np.ndarray]  # the placeholders, by tensor name
    expected: np.ndarray | None = None


def generate(output: Path) -> list[ConformanceTest]:
    """Run TOSA's conformance generator for RESCALE and TABLE into `output`; the tests it wrote."""
    from qconvert.backends.tosa import require_tosa_python as tosa_python_path
    from qconvert.backends.tosa import tosa_tool

    python = tosa_python_path()
    packages = next((python.parent.parent / "lib").glob("python3*/site-packages"))
    environment = {**os.environ, "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [
        str(tosa_tool("tosa_verif_conformance_generator")),
        "--operators", "rescale", "table",
        "--profile", "tosa-pro-int",
        "--extension", "tosa-ext-int16", "tosa-ext-doubleround",
        "--test-type", "positive",
        "--tosa-version", "1.0.2",
        "--output-type", "binary",
        "--ref-model-path", str(tosa_tool("tosa_reference_model")),
        "--generate-lib-path", str(packages / "tosa_reference_model" / "libtosa_reference_generate_lib.so"),
        "--schema-path", str(packages / "bin" / "tosa.fbs"),
        "--flatc-path", str(tosa_tool("flatc")),
        "--output-directory", str(output),
        "-j", "2",
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=1200)
    assert completed.returncode == 0, completed.stderr[-4000:]
    tests = []
    for description_path in sorted(output.glob("operators/*/*/*/desc.json")):
        description = json.loads(description_path.read_text())
        folder = description_path.parent
        inputs = {
            name: np.load(folder / file)
            for name, file in zip(description["ifm_name"], description["ifm_file"], strict=True)
        }
        flatbuffer = (folder / description["tosa_file"]).read_bytes()
        tests.append(ConformanceTest(folder.name, folder, flatbuffer, inputs))
    return tests


def expected_by_command_line(test: ConformanceTest) -> np.ndarray:
    """The reference model's command-line runner on the test's desc.json (reads i48 .npy inputs)."""
    from qconvert.backends.tosa import tosa_tool

    output = test.folder / "expected"
    output.mkdir(exist_ok=True)
    completed = subprocess.run(
        [str(tosa_tool("tosa_reference_model")), "--test_desc", str(test.folder / "desc.json"),
         "--output_dir", str(output)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert completed.returncode == 0, f"{test.name}: {completed.stdout[-2000:]}{completed.stderr[-2000:]}"
    (result,) = output.glob("*.npy")
    return np.load(result)


@pytest.fixture(scope="module")
def conformance(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[ConformanceTest], list]:
    require_tosa_python()
    from qconvert.backends.tosa import ReferenceJob, describe_flatbuffers, run_reference_jobs

    tests = generate(tmp_path_factory.mktemp("tosa_conformance"))
    results = run_reference_jobs(
        [ReferenceJob(inputs=tuple(t.inputs.values()), flatbuffer=t.flatbuffer) for t in tests]
    )
    for test, result in zip(tests, results, strict=True):
        if result.status == "TOSA_VALID":
            (test.expected,) = result.outputs
        elif result.status == "RUN_FAILED" and any(a.dtype == np.int64 for a in test.inputs.values()):
            test.expected = expected_by_command_line(test)
        else:
            pytest.fail(f"{test.name}: the reference model says {result.status}:\n{result.messages}")
    return tests, describe_flatbuffers([t.flatbuffer for t in tests])


def emulate(test: ConformanceTest, graph) -> np.ndarray:
    """Our emulation of the test's one operator, its operands read from placeholders or constants."""
    (operator,) = [o for o in graph.operators if o["op"] not in ("CONST", "CONST_SHAPE")]

    def operand(name: str) -> np.ndarray:
        return test.inputs[name] if name in test.inputs else graph.constants[name]

    operands = [operand(name) for name in operator["inputs"]]
    if operator["op"] == "TABLE":
        values, lookup = operands
        return table(values, lookup)
    assert operator["op"] == "RESCALE", operator["op"]
    fields = operator["fields"]
    values, multiplier, shift, input_zp, output_zp = operands
    input_type = TYPES[graph.tensors[operator["inputs"][0]]["type"]]
    output_type = TYPES[graph.tensors[operator["outputs"][0]]["type"]]
    return rescale(
        values,
        multiplier,
        shift,
        input_type=input_type,
        output_type=output_type,
        input_zp=int(input_zp.reshape(-1)[0]),
        output_zp=int(output_zp.reshape(-1)[0]),
        scale32=bool(fields["Scale32"]),
        rounding=ROUNDING[fields["RoundingMode"]],
        per_channel=bool(fields["PerChannel"]),
        input_unsigned=bool(fields["InputUnsigned"]),
        output_unsigned=bool(fields["OutputUnsigned"]),
    )


@pytest.mark.parametrize("operator", ["rescale", "table"])
def test_every_generated_conformance_test_passes(conformance, operator: str) -> None:
    tests, graphs = conformance
    chosen = [(t, g) for t, g in zip(tests, graphs, strict=True) if t.name.startswith(operator + "_")]
    assert len(chosen) >= {"rescale": 300, "table": 20}[operator], f"only {len(chosen)} {operator} tests"
    failures, values = [], 0
    for test, graph in chosen:
        ours = emulate(test, graph)
        assert test.expected is not None
        if ours.shape != test.expected.shape or not np.array_equal(
            ours.astype(np.int64), test.expected.astype(np.int64)
        ):
            failures.append(test.name)
        values += ours.size
    assert not failures, f"{len(failures)} of {len(chosen)} {operator} tests differ: {failures[:10]}"
    assert values > 1000
