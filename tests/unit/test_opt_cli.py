"""`qconvert opt` as a command: mlir-opt's flags, diagnostics, exit codes, and no partial output files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

VALID = """\
func.func @f(%arg0: tensor<4xf32>) -> tensor<4x!quant.uniform<i8:f32, 5.000000e-01>> {
  %0 = quant.qcast %arg0 : tensor<4xf32> to tensor<4x!quant.uniform<i8:f32, 5.000000e-01>>
  return %0 : tensor<4x!quant.uniform<i8:f32, 5.000000e-01>>
}
"""


def run_opt(
    *arguments: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qconvert", "opt", *arguments],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
    )


def test_round_trip_from_stdin_wraps_bare_ops_in_a_module() -> None:
    result = run_opt("-", stdin=VALID)
    assert result.returncode == 0, result.stderr
    # mlir-opt writes a newline after the module's last line: the output ends with a blank line.
    body = "".join("  " + line + "\n" for line in VALID.splitlines())
    assert result.stdout == "module {\n" + body + "}\n\n"


def test_split_input_file_joins_chunks_like_mlir_opt() -> None:
    result = run_opt("-split-input-file", "-", stdin=VALID + "// -----\n" + VALID.replace("@f", "@g"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("module {") == 2
    assert "}\n\n// -----\nmodule {" in result.stdout


def test_parse_error_names_file_line_column_and_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "bad.mlir"
    source.write_text(VALID.replace("5.000000e-01>>\n  return", "0.0>>\n  return"))
    output = tmp_path / "out.mlir"
    result = run_opt(str(source), "-o", str(output))
    assert result.returncode == 1
    assert (
        f"{source}:2:" in result.stderr
        and "error: scale 0.000000e+00 out of expressed type range" in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not output.exists() and list(tmp_path.iterdir()) == [source]


def test_verifier_error_uses_upstream_wording() -> None:
    text = VALID.replace("tensor<4xf32> to tensor<4x!quant", "tensor<4xf32> to tensor<5x!quant")
    result = run_opt(
        "-", stdin=text.replace("-> tensor<4x", "-> tensor<5x").replace(": tensor<4x!", ": tensor<5x!")
    )
    assert result.returncode == 1
    assert (
        "error: 'quant.qcast' op failed to verify that input and result are both scalars or both tensors "
        "with matching shape" in result.stderr
    )


def test_verify_diagnostics_reports_unmet_and_unexpected() -> None:
    text = "// expected-error@+1 {{illegal storage type size: 34}}\n!q = !quant.uniform<i33:f32, 1.0>\n"
    result = run_opt("-verify-diagnostics", "-", stdin=text)
    assert result.returncode == 1
    assert "<stdin>:2:21: error: unexpected error: illegal storage type size: 33" in result.stderr
    assert 'expected error "illegal storage type size: 34" was not produced' in result.stderr
    met = run_opt("--verify-diagnostics", "-", stdin=text.replace("34", "33"))
    assert met.returncode == 0, met.stderr


def test_bad_usage_exits_2_without_traceback(tmp_path: Path) -> None:
    for arguments in (("--no-such-flag", "x.mlir"), (str(tmp_path / "missing.mlir"),), ("a.mlir", "b.mlir")):
        result = run_opt(*arguments)
        assert result.returncode == 2, arguments
        assert result.stderr.startswith("qconvert opt: ") and "Traceback" not in result.stderr
    binary = tmp_path / "binary.mlir"
    binary.write_bytes(bytes(range(256)))
    result = run_opt(str(binary))
    assert result.returncode == 2 and str(binary) in result.stderr


def test_output_file_written_atomically(tmp_path: Path) -> None:
    output = tmp_path / "out.mlir"
    result = run_opt("-", "-o", str(output), stdin=VALID)
    assert result.returncode == 0 and result.stdout == ""
    assert output.read_text().startswith("module {\n  func.func @f(")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mlir"]


def test_integer_literals_follow_apint_rules() -> None:
    wraps = run_opt("-", stdin="%c = arith.constant dense<[32768, 5]> : tensor<2xi16>\n")
    assert wraps.returncode == 0, wraps.stderr
    assert "dense<[-32768, 5]> : tensor<2xi16>" in wraps.stdout
    too_large = run_opt("-", stdin="%c = arith.constant dense<70000> : tensor<2xi16>\n")
    assert too_large.returncode == 1 and "integer constant out of range for type" in too_large.stderr
    negative = run_opt("-", stdin="%c = arith.constant -1 : ui8\n")
    expected = "<stdin>:1:22: error: negative integer literal not valid for unsigned integer type"
    assert expected in negative.stderr
    assert "Traceback" not in too_large.stderr + negative.stderr
