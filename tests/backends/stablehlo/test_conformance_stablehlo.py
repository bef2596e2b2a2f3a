"""Upstream StableHLO interpreter tests with quant types, run through our runner (backends/stablehlo/run.py).

The files are ../shared/conformance/stablehlo/ (or $QCONVERT_CONFORMANCE_DIR/stablehlo), unmodified. Their
expectations are ops of the `check` dialect (`check.expect_eq_const`, `check.expect_almost_eq_const`) or
`stablehlo.custom_call @check.eq`, which `stablehlo-translate --interpret` evaluates. jaxlib registers no
`check` dialect, so each function is rewritten to *return* the checked values instead, run on the engine,
and compared here the way the upstream check ops compare (stablehlo/tests/CheckOps.cpp and
stablehlo-translate's `check.eq` fallback): integers and booleans exactly; floats (and complex parts) with
|actual - expected| <= 1e-4, NaN equal to NaN, infinities equal when their signs agree.

Which files run:
- stablehlo__tests__interpret__quantized_ops.mlir: per-axis and per-tensor uniform_quantize /
  uniform_dequantize / requantize and a quantized add (custom-syntax check ops);
- stablehlo__testdata__quantized__add_qi8.mlir: stablehlo.add on every integer width (i2…ui64), i1,
  floats, complex, and a per-tensor quantized add (generic-syntax check ops and check.eq);
- stablehlo__testdata__quantized__convolution_qi8.mlir: a quantized convolution with lhs dilation;
- stablehlo__testdata__quantized__round_nearest_afz_qi8.mlir: round_nearest_afz on a quantized tensor.

Excluded files (`EXCLUDED_FILES` says why) are pass tests checked with FileCheck, not programs with goldens,
or need TOSA passes jaxlib does not ship. On XLA:CPU every program runs after
stablehlo-legalize-quant-to-math, except those listed in `XLA_EXCLUDED` with the reason; each of those must
still fail on XLA, so the list cannot go stale.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from conftest import require_module

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[3]
SPLIT = re.compile(r"^// -----\s*$", re.M)
TOLERANCE = 1e-4  # stablehlo-translate's check.eq and expect_almost_eq tolerance


def conformance_dir() -> Path:
    """Where tests/conformance/lit.cfg.py finds the upstream files (same lookup)."""
    override = os.environ.get("QCONVERT_CONFORMANCE_DIR")
    return Path(override).resolve() if override else ROOT.parent / "shared" / "conformance"


STABLEHLO_DIR = conformance_dir() / "stablehlo"

RUN_FILES = (
    "stablehlo__tests__interpret__quantized_ops.mlir",
    "stablehlo__testdata__quantized__add_qi8.mlir",
    "stablehlo__testdata__quantized__convolution_qi8.mlir",
    "stablehlo__testdata__quantized__round_nearest_afz_qi8.mlir",
)

EXCLUDED_FILES = {
    "stablehlo__conversions__tosa__tests__rescale_interpreter.mlir": (
        "needs stablehlo-quant-legalize-to-tosa-rescale and tosa-rescale-legalize-to-stablehlo, "
        "which jaxlib 0.10.2 does not register (no tosa dialect in its context)"
    ),
    "stablehlo__conversions__tosa__tests__legalize_quant_ops_to_tosa_rescale.mlir": "a FileCheck pass test",
    "stablehlo__conversions__tosa__tests__legalize_tosa_rescale_to_stablehlo.mlir": "a FileCheck pass test",
    "stablehlo__tests__ops_stablehlo_quantized.mlir": "a -verify-diagnostics test of the verifier",
    "stablehlo__tests__transforms__stablehlo_legalize_qdq_to_quantized_op.mlir": "a FileCheck pass test",
    "stablehlo__tests__transforms__stablehlo_legalize_quant_to_int.mlir": "a FileCheck pass test",
    "stablehlo__tests__transforms__stablehlo_legalize_quantized_op_to_qdq.mlir": "a FileCheck pass test",
}

# (file, function) -> why XLA:CPU cannot run it; the test asserts that it indeed fails there.
XLA_EXCLUDED = {
    ("stablehlo__testdata__quantized__add_qi8.mlir", "add_op_test_i1"): (
        "XLA:CPU adds i1 modulo 2 (true + true = false); StableHLO's spec and interpreter define add on "
        "booleans as logical or (true)"
    ),
}

# Custom syntax: `check.expect_eq_const %v, dense<...> : tensor<...>`.
CHECK_CONST = re.compile(
    r"^\s*check\.(?P<kind>expect_eq_const|expect_almost_eq_const)\s+(?P<value>%[\w.]+)\s*,\s*"
    r"(?P<attr>dense<.*>\s*:\s*tensor<.*>)\s*$"
)
# Generic syntax: `"check.expect_eq_const"(%v) <{value = dense<...> : tensor<...>}> : (tensor<...>) -> ()`.
CHECK_CONST_GENERIC = re.compile(
    r'^\s*"check\.(?P<kind>expect_eq_const|expect_almost_eq_const)"\((?P<value>%[\w.]+)\)\s*'
    r"<\{value = (?P<attr>dense<.*?>\s*:\s*tensor<.*?>)\}>\s*:\s*\((?P<type>.*)\)\s*->\s*\(\)\s*$"
)
# `%r = stablehlo.custom_call @check.eq(%a, %b) : (T, T) -> tensor<i1>`
CHECK_EQ_CALL = re.compile(
    r"^\s*%[\w.]+\s*=\s*stablehlo\.custom_call\s+@check\.eq\((?P<lhs>%[\w.]+),\s*(?P<rhs>%[\w.]+)\)\s*:\s*"
    r"\((?P<types>.*)\)\s*->\s*tensor<i1>\s*$"
)
FUNC = re.compile(r"^(?P<indent>\s*)func\.func\s+(?:public\s+)?@(?P<name>[\w.]+)\(\)\s*(->\s*.*?)?\{\s*$")
RETURN = re.compile(r"^(?P<indent>\s*)(?:func\.)?return\b.*$")


@dataclass(frozen=True)
class Expectation:
    """One check of the upstream program: the checked value's position in the rewritten function's results,
    and the expected value (a constant parsed from the file, or another result of the program)."""

    line: int
    exact: bool
    actual: int
    expected_attr: str | None = None
    expected_result: int | None = None


@dataclass(frozen=True)
class Program:
    file: str
    function: str
    text: str  # the chunk with the function rewritten to return the checked values
    expectations: tuple[Expectation, ...]


def _split_types(types: str) -> list[str]:
    """`tensor<2xf32>, tensor<2x!quant.uniform<i8:f32, 0.5:1>>` -> the two types (commas inside <> stay)."""
    parts, depth, current = [], 0, ""
    for char in types:
        depth += char == "<"
        depth -= char == ">"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return parts


def _attr_type(attr: str) -> str:
    return attr.rsplit(":", 1)[1].strip()


def _complex_parts(value: str, tensor_type: str, out: list[str]) -> list[tuple[str, str]]:
    """Append `stablehlo.real` / `stablehlo.imag` of `value` to `out`; return the two parts and their type."""
    part_type = re.sub(r"complex<(\w+)>", r"\1", tensor_type)
    parts = []
    for op in ("real", "imag"):
        name = f"%{op}_part_{len(out)}"
        out.append(f"    {name} = stablehlo.{op} {value} : ({tensor_type}) -> {part_type}")
        parts.append((name, part_type))
    return parts


def _is_integer_type(tensor_type: str) -> bool:
    element = tensor_type.removeprefix("tensor<").removesuffix(">").split("x")[-1]
    return re.fullmatch(r"u?i\d+", element) is not None


def rewrite_chunk(file: str, chunk: str, line_offset: int) -> Program | None:
    """Rewrite the one function with checks in `chunk` to return the checked values; None if it has none."""
    lines = chunk.split("\n")
    returned: list[tuple[str, str]] = []  # (value, type)
    expectations: list[Expectation] = []
    function = None
    func_line = None
    out: list[str] = []
    for index, line in enumerate(lines):
        number = line_offset + index + 1
        if (match := FUNC.match(line)) is not None:
            function, func_line = match["name"], len(out)
        if (match := CHECK_CONST.match(line) or CHECK_CONST_GENERIC.match(line)) is not None:
            attr, value = match["attr"], match["value"]
            exact = match["kind"] == "expect_eq_const"
            tensor_type = _attr_type(attr)
            if "complex<" in tensor_type:
                # jaxlib cannot hand complex tensors back to Python (see run.py): return the real and
                # imaginary parts of the value and of the expected constant, compared part by part.
                expected = f"%expected_{len(returned)}"
                out.append(f"    {expected} = stablehlo.constant {attr}")
                base = len(returned)
                returned += _complex_parts(value, tensor_type, out)
                returned += _complex_parts(expected, tensor_type, out)
                for part in (0, 1):
                    check = Expectation(number, exact, base + part, expected_result=base + 2 + part)
                    expectations.append(check)
                continue
            expectations.append(Expectation(number, exact, len(returned), expected_attr=attr))
            returned.append((value, tensor_type))
            continue
        if (match := CHECK_EQ_CALL.match(line)) is not None:
            lhs_type, rhs_type = _split_types(match["types"])
            # stablehlo-translate compares exactly when the expected (second) operand is an integer tensor.
            exact = _is_integer_type(rhs_type)
            expectations.append(Expectation(number, exact, len(returned), expected_result=len(returned) + 1))
            returned += [(match["lhs"], lhs_type), (match["rhs"], rhs_type)]
            continue
        if RETURN.match(line) is not None and function is not None and returned:
            indent = RETURN.match(line)["indent"]
            values = ", ".join(v for v, _ in returned)
            types = ", ".join(t for _, t in returned)
            out.append(f"{indent}return {values} : {types}")
            continue
        out.append(line)
    if not expectations or function is None or func_line is None:
        return None
    header = FUNC.match(out[func_line])
    types = ", ".join(t for _, t in returned)
    out[func_line] = f"{header['indent']}func.func @main() -> ({types}) {{"
    return Program(file, function, "\n".join(out), tuple(expectations))


def collect_programs(file: str) -> list[Program]:
    text = (STABLEHLO_DIR / file).read_text()
    programs, offset = [], 0
    for chunk in SPLIT.split(text):
        program = rewrite_chunk(file, chunk, offset)
        offset += chunk.count("\n") + 1
        if program is not None:
            programs.append(program)
    return programs


def _all_programs() -> list[Program]:
    if not STABLEHLO_DIR.is_dir():
        return []
    return [program for file in RUN_FILES for program in collect_programs(file)]


PROGRAMS = _all_programs()


def _program_id(program: Program) -> str:
    short = program.file.removeprefix("stablehlo__").removesuffix(".mlir")
    return f"{short}::{program.function}"


def almost_equal(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """stablehlo's areApproximatelyEqual, elementwise: NaN matches NaN, equal infinities match, else
    |a - b| <= 1e-4 (complex values arrive here as their real and imaginary parts)."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    both_nan = np.isnan(a) & np.isnan(e)
    infinite = np.isinf(a) | np.isinf(e)
    with np.errstate(invalid="ignore"):
        close = np.abs(a - e) <= TOLERANCE
    return both_nan | np.where(infinite, a == e, close)


def assert_meets(program: Program, results: list[np.ndarray], run: ModuleType, ir: ModuleType) -> None:
    for expectation in program.expectations:
        actual = results[expectation.actual]
        if expectation.expected_attr is not None:
            with run._context():
                expected = run.attribute_to_numpy(ir.Attribute.parse(expectation.expected_attr))
        else:
            assert expectation.expected_result is not None
            expected = results[expectation.expected_result]
        where = f"{program.file}:{expectation.line} (@{program.function})"
        assert actual.shape == expected.shape, f"{where}: shape {actual.shape} != {expected.shape}"
        if expectation.exact:
            np.testing.assert_array_equal(actual.astype(np.int64), expected.astype(np.int64), err_msg=where)
        else:
            ok = almost_equal(actual, expected)
            assert ok.all(), f"{where}: {actual[~ok]} (actual) vs {expected[~ok]} (expected)"


@pytest.fixture(scope="module")
def engines() -> tuple[ModuleType, ModuleType]:
    require_module("jax")
    from jaxlib.mlir import ir

    from qconvert.backends.stablehlo import run

    return run, ir


def test_every_file_is_run_or_excluded_with_a_reason() -> None:
    if not STABLEHLO_DIR.is_dir():
        pytest.skip(f"{STABLEHLO_DIR} not found (set QCONVERT_CONFORMANCE_DIR)")
    present = sorted(p.name for p in STABLEHLO_DIR.glob("*.mlir"))
    assert present == sorted([*RUN_FILES, *EXCLUDED_FILES])
    # Every function of the files we run has a check we evaluate (none is silently dropped).
    for file in RUN_FILES:
        text = (STABLEHLO_DIR / file).read_text()
        functions = len(re.findall(r"^\s*func\.func\b", text, re.M))
        assert len(collect_programs(file)) == functions, file
    assert len(PROGRAMS) == 28


@pytest.mark.parametrize("program", PROGRAMS, ids=_program_id)
def test_interpreter_meets_the_goldens(program: Program, engines: tuple[ModuleType, ModuleType]) -> None:
    run, ir = engines
    results = run.run_interpreter(program.text, [])
    assert_meets(program, results, run, ir)


@pytest.mark.parametrize("program", PROGRAMS, ids=_program_id)
def test_xla_meets_the_goldens(program: Program, engines: tuple[ModuleType, ModuleType]) -> None:
    run, ir = engines
    reason = XLA_EXCLUDED.get((program.file, program.function))
    if reason is not None:
        # The known difference must still show, or the exclusion is stale.
        with pytest.raises((run.EngineError, AssertionError)):
            assert_meets(program, run.run_xla(program.text, []), run, ir)
        pytest.skip(f"XLA:CPU: {reason}")
    results = run.run_xla(program.text, [])
    assert_meets(program, results, run, ir)
