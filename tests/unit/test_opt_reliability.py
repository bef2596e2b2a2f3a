"""`qconvert opt` on hostile input (issue 23): every defect found by fuzzing is a diagnostic with exit 1
(MLIR input) or 2 (usage), never an internal error (exit 3); and the driver's output is mlir-opt's, byte
for byte, compared with a real MlirOptMain (IREE's `iree-opt`, which registers the quant dialect)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from conftest import require_module

from qconvert.ir.lexer import MAX_NESTING
from qconvert.opt import main, parse_arguments, run_opt

ROOT = Path(__file__).resolve().parents[2]
LONG = "1" * 5000  # past Python's 4,300-digit limit on int <-> str


def conformance_dir() -> Path:
    """Where tests/conformance/lit.cfg.py finds the upstream files."""
    override = os.environ.get("QCONVERT_CONFORMANCE_DIR")
    return Path(override).resolve() if override else ROOT.parent / "shared" / "conformance"


def opt(text: str, *flags: str) -> tuple[int, str, str]:
    """Exit code, output and diagnostics of `qconvert opt` on `text`, in process."""
    result = run_opt(text, "in.mlir", parse_arguments(["in.mlir", *flags]))
    return result.exit_code, result.output, "\n".join(result.diagnostics)


def test_an_integer_with_leading_zeros_reads_as_decimal_like_mlir() -> None:
    code, output, errors = opt("!q = !quant.uniform<i8:f32, 1.0:01>\nfunc.func private @f(tensor<2x!q>)\n")
    assert code == 0, errors
    assert "tensor<2x!quant.uniform<i8:f32, 1.000000e+00:1>>" in output
    # 010 is ten (decimal, never octal), in dense literals and attributes too.
    code, output, errors = opt(
        '"test.op"() {a = 010 : i32, b = dense<[-010, 07]> : tensor<2xi8>} : () -> ()\n'
    )
    assert code == 0, errors
    assert "a = 10 : i32" in output and "dense<[-10, 7]> : tensor<2xi8>" in output


@pytest.mark.engine
def test_leading_zeros_print_as_upstream_mlir_prints_them() -> None:
    ir = require_module("torch_mlir.ir")
    text = (
        "!q = !quant.uniform<i8<-0127:0127>:f32, 1.0:01>\n"
        "func.func private @f(tensor<02x!q>) attributes {a = 010 : i32}\n"
    )
    context = ir.Context()
    with context:
        upstream = str(ir.Module.parse(text))
    code, output, errors = opt(text)
    assert code == 0, errors
    assert output == upstream.rstrip("\n") + "\n\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"!q = !quant.uniform<i8:f32, 1.0:{LONG}>\n", "1:33: error: integer value too large"),
        (f"!q = !quant.uniform<i8<-{LONG}:1>:f32, 1.0>\n", "1:24: error: integer value too large"),
        (f"func.func private @f(tensor<{LONG}xf32>)\n", "1:29: error: invalid dimension"),
        ("func.func private @f(tensor<9223372036854775808xf32>)\n", "invalid dimension"),
        (f"func.func private @f(vector<{LONG}xf32>)\n", "invalid dimension"),
        (f"func.func private @f(i{LONG})\n", "invalid integer width"),
        (f"!q = !quant.uniform<i{LONG}:f32, 1.0>\n", "invalid integer width"),
        (f"!q = !quant.uniform<u{LONG}:f32, 1.0>\n", "illegal storage type size"),
        (f'"test.op"() {{a = {LONG} : i64}} : () -> ()\n', "integer value too large"),
        (f'"test.op"() {{a = dense<{LONG}> : tensor<2xi64>}} : () -> ()\n', "integer value too large"),
        (f'"test.op"() {{a = 0x{"F" * 4000} : f32}} : () -> ()\n', "hexadecimal float constant out of range"),
        (f'%0:{LONG} = "test.op"() : () -> (i8)\n', "integer value too large"),
        (
            f'%0 = "test.op"() : () -> (i8)\n"test.use"(%0#{LONG}) : (i8) -> ()\n',
            "invalid SSA value result number",
        ),
        ('"test.op"() {a = dense<1.5> : tensor<2xi8>} : () -> ()\n', "expected integer elements, but parsed"),
    ],
)
def test_integers_too_large_for_python_are_diagnostics(text: str, message: str) -> None:
    code, _, errors = opt(text, "--allow-unregistered-dialect")
    assert code == 1 and message in errors, errors


def test_found_by_fuzzing_an_untyped_constant_is_a_diagnostic() -> None:
    code, _, errors = opt("%c = arith.constant f16<[1.0]> : tensor<1xf32>\n")
    assert code == 1 and "in.mlir:1:21: error: custom op 'arith.constant' invalid kind of attribute" in errors


@pytest.mark.parametrize(
    ("literal", "message"),
    [
        ("dense<1> : tensor<?xi8>", "elements literal type must have static shape"),
        ('dense<"0xZZ"> : tensor<2xi8>', "expected string containing hex digits starting with `0x`"),
        ('dense<"abc"> : tensor<2xi8>', "expected string containing hex digits starting with `0x`"),
        ('dense<"0x010203"> : tensor<2xi8>', "elements hex data size is invalid for provided type"),
        (
            "dense<1> : tensor<2x!quant.uniform<i8:f32, 1.0>>",
            "1:24: error: no numpy dtype for !quant.uniform",
        ),
        (
            "dense<1.0> : tensor<4294967296xf32>",
            "(17179869184 bytes) is larger than qconvert holds in memory",
        ),
    ],
)
def test_malformed_or_huge_dense_literals_are_diagnostics(literal: str, message: str) -> None:
    """Found reading the dense parser after the fuzz run: these were ValueError or MemoryError (a splat of
    4 Gi elements was allocated whole)."""
    code, _, errors = opt(f'"test.op"() {{a = {literal}}} : () -> ()\n', "--allow-unregistered-dialect")
    assert code == 1 and message in errors, errors


def test_a_huge_diagnostic_offset_is_an_unmet_expectation() -> None:
    text = f"// expected-error@+{LONG} {{{{x}}}}\nfunc.func private @f()\n"
    code, _, errors = opt(text, "--verify-diagnostics")
    assert code == 1 and 'in.mlir:1:4: error: expected error "x" was not produced' in errors


DEEP = 1000
NESTED = {
    "function types": "func.func private @f(" + "(" * DEEP + ")\n",
    "tensor types": "!t = " + "tensor<" * DEEP + "f32" + ">" * DEEP + "\n",
    "vector types": "!t = " + "vector<" * DEEP + "f32" + ">" * DEEP + "\n",
    "regions": '"test.op"() ({' * DEEP + "}) : () -> ()" * DEEP + "\n",
    "array attributes": '"test.op"() {a = ' + "[" * DEEP + "]" * DEEP + "} : () -> ()\n",
    "dictionary attributes": '"test.op"() {a = ' + "{b = " * DEEP + "1" + "}" * DEEP + "} : () -> ()\n",
    "dense literals": '"test.op"() {a = dense<' + "[" * DEEP + "]" * DEEP + "> : tensor<0xi8>} : () -> ()\n",
    "quant scales": "!q = !quant.uniform<i8:f32:{0:1}, " + "{" * DEEP + "1.0" + "}" * DEEP + ">\n",
}


@pytest.mark.parametrize("kind", NESTED)
def test_deep_nesting_is_a_located_diagnostic_not_a_recursion_error(kind: str) -> None:
    code, _, errors = opt(NESTED[kind], "--allow-unregistered-dialect")
    assert code == 1, errors
    assert f" too deep (more than {MAX_NESTING} levels)" in errors
    assert errors.startswith("in.mlir:1:")


def test_nesting_at_the_limit_parses_verifies_runs_passes_prints_and_parses_again() -> None:
    """Regions as deep as allowed (the implicit module, the function, then test ops), and inside the
    deepest one a type as deep as allowed: what parses also verifies, runs the passes and prints, and the
    printed text (now inside an explicit module) parses again to the same text."""
    regions = MAX_NESTING - 2
    deepest_type = "tensor<" * (MAX_NESTING - 1) + "f32" + ">" * (MAX_NESTING - 1)
    text = (
        "func.func @f() {"
        + '"test.op"() ({' * regions
        + f'%0 = "test.leaf"() : () -> ({deepest_type})'
        + "}) : () -> ()" * regions
        + " return }\n"
    )
    flags = ["--allow-unregistered-dialect", "--normalize-quant-types", "--canonicalize", "--lower-quant-ops"]
    code, output, errors = opt(text, *flags)
    assert code == 0, errors
    assert output.count("test.op") == regions
    again = opt(output, *flags)
    assert again[0] == 0, again[2]
    assert again[1] == output
    one_more = text.replace('"test.op"() ({', '"test.op"() ({"test.op"() ({', 1).replace(
        "}) : () -> ()", "}) : () -> ()" * 2, 1
    )
    code, _, errors = opt(one_more, *flags)
    assert code == 1 and f"regions nested too deep (more than {MAX_NESTING} levels)" in errors


def test_an_invalid_regex_in_expected_error_re_is_a_diagnostic_naming_its_line() -> None:
    text = "// expected-error-re@+1 {{{{[}}}}\n!q = !quant.uniform<i33:f32, 1.0>\n"
    code, _, errors = opt(text, "--verify-diagnostics")
    assert code == 1
    assert "in.mlir:1:4: error: invalid regex: missing ]" in errors
    unterminated = "// expected-error-re@+1 {{illegal {{[a-z]+ type}}\n!q = !quant.uniform<i33:f32, 1.0>\n"
    code, _, errors = opt(unterminated, "--verify-diagnostics")
    assert code == 1 and "in.mlir:1:4: error: found start of regex with no end '}}'" in errors


def test_expected_error_re_matches_with_regex_parts_and_literal_text() -> None:
    # The text runs to the line's last `}}` (upstream's greedy match): the literal after the regex counts.
    text = (
        "// expected-error-re@+1 {{illegal {{[a-z]+}} type size: {{[0-9]+}}}}\n"
        "!q = !quant.uniform<i33:f32, 1.0>\n"
    )
    code, _, errors = opt(text, "--verify-diagnostics")
    assert code == 0, errors
    wrong = text.replace("size: {{[0-9]+}}", "size: {{[0-9]+}}!")
    code, _, errors = opt(wrong, "--verify-diagnostics")
    assert code == 1 and "unexpected error: illegal storage type size: 33" in errors


def test_a_backtracking_regex_finishes_in_linear_time() -> None:
    # With Python's backtracking `re`, (.|.|.)*Z against 30 characters takes 3**30 steps.
    text = "// expected-error-re@+1 {{{{(.|.|.)*Z}}}}\n!q = !quant.uniform<i33:f32, 1.0>\n"
    started = time.perf_counter()
    code, _, errors = opt(text, "--verify-diagnostics")
    assert time.perf_counter() - started < 10
    assert code == 1 and 'expected error "{{(.|.|.)*Z}}" was not produced' in errors


def test_output_into_a_missing_folder_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.mlir"
    source.write_text("func.func private @f()\n")
    assert main([str(source), "-o", str(tmp_path / "missing" / "out.mlir")]) == 2
    message = capsys.readouterr().err
    assert message.startswith("qconvert opt: -o ") and "does not exist" in message
    assert main([str(source), "-o", str(tmp_path)]) == 2  # a folder
    assert "is a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mlir"]
    # As with mlir-opt, the input may be rewritten in place (it is read whole before the output is written).
    assert main([str(source), "-o", str(source)]) == 0
    assert source.read_text() == "module {\n  func.func private @f()\n}\n\n"


def test_cli_exit_codes_on_hostile_input() -> None:
    """Through the real command line: the issue's reproducers exit 1 with a diagnostic, never 3."""
    for text in (
        "!q = !quant.uniform<i8:f32, 1.0:01>\nfunc.func private @f(tensor<2x!q>)\n",
        "func.func private @f(" + "(" * 1000 + ")\n",
        f"func.func private @f(tensor<{LONG}xf32>)\n",
    ):
        result = subprocess.run(
            [sys.executable, "-m", "qconvert", "opt", "-"],
            input=text,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode in (0, 1), result.stderr
        assert "internal error" not in result.stderr and "Traceback" not in result.stderr


SPLIT_TEXT = """\
func.func private @f(tensor<4x!quant.uniform<i8:f32, 1.0>>)
// -----
!q = !quant.uniform<i99:f32, 1.0>
// -----

// -----
func.func private @g()
"""


def test_split_input_file_writes_a_separator_for_every_chunk_and_a_final_newline() -> None:
    code, output, _ = opt(SPLIT_TEXT, "--split-input-file")
    assert code == 1
    assert output == (
        "module {\n  func.func private @f(tensor<4x!quant.uniform<i8:f32, 1.000000e+00>>)\n}\n\n"
        "// -----\n"  # the chunk that failed: nothing, then its separator
        "// -----\n"
        "module {\n}\n\n"
        "// -----\n"
        "module {\n  func.func private @g()\n}\n\n"
    )


def iree_opt() -> str:
    binaries = require_module("iree.compiler.tools.binaries")
    return binaries.find_tool("iree-opt")


@pytest.mark.engine
@pytest.mark.parametrize(
    "name",
    [
        "canonicalize.mlir",
        "invalid.mlir",
        "invalid-quantile-types.mlir",
        "ops.mlir",
        "parse-any-invalid.mlir",
        "parse-calibrated-invalid.mlir",
        "parse-uniform-invalid.mlir",
        "parse-uniform.mlir",
        "quant_region.mlir",
        "quantile-types.mlir",
        "normalize-quant-types.mlir",
        "strip-func-quant-types.mlir",
    ],
)
def test_split_input_file_output_is_mlir_opts_byte_for_byte(name: str, tmp_path: Path) -> None:
    """`diff <(iree-opt --split-input-file F) <(qconvert opt --split-input-file F)` is empty; same exit."""
    path = conformance_dir() / "mlir-quant" / name
    if not path.is_file():
        pytest.skip(f"upstream conformance file not found at {path} (set QCONVERT_CONFORMANCE_DIR)")
    flags = ["--split-input-file", "--allow-unregistered-dialect"]
    upstream = subprocess.run([iree_opt(), *flags, str(path)], capture_output=True, text=True, timeout=120)
    ours = tmp_path / "ours.mlir"
    with ours.open("w") as stream:
        done = subprocess.run(
            [sys.executable, "-m", "qconvert", "opt", *flags, str(path)],
            stdout=stream,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == upstream.returncode, done.stderr
    assert ours.read_text() == upstream.stdout


def test_a_float_beyond_its_type_is_infinity_without_a_numpy_warning() -> None:
    """Found by the fuzz run: numpy printed 'overflow encountered in cast' on stderr. The output is
    iree-opt's (MlirOptMain) for the same input, checked by hand: dense<[0x7C00, 1.000000e+00]>."""
    text = (
        "%c = arith.constant dense<[1.0e10, 1.0]> : tensor<2xf16>\n"
        "%d = arith.constant dense<1.0e10> : tensor<2xf16>\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, output, errors = opt(text)
    assert code == 0, errors
    assert (
        "dense<[0x7C00, 1.000000e+00]> : tensor<2xf16>" in output
        and "dense<0x7C00> : tensor<2xf16>" in output
    )
