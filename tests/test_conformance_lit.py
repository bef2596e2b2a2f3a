"""Runs the upstream MLIR quant tests (tests/conformance, driven by lit + filecheck) as part of pytest.

lit runs once per session; each required upstream file is one pytest case, failing with lit's output for
that file. The set of files lit ran must equal REQUIRED exactly, so an empty or shrunken suite fails.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "tests" / "conformance"

# Upstream files that must pass; the excluded ones, with reasons, are in tests/conformance/lit.cfg.py.
REQUIRED = (
    "ops.mlir",
    "invalid.mlir",
    "parse-uniform.mlir",
    "parse-uniform-invalid.mlir",
    "parse-any-invalid.mlir",
    "parse-calibrated-invalid.mlir",
    "quantile-types.mlir",
    "invalid-quantile-types.mlir",
    "lower-quant-ops.mlir",
    "normalize-quant-types.mlir",
    "strip-func-quant-types.mlir",
    "Bytecode/types.mlir",
    "canonicalize.mlir",
    "inlining.mlir",
)

RESULT_LINE = re.compile(r"^(?P<code>[A-Z]+): mlir-quant :: (?P<name>\S+) \(\d+ of \d+\)$", re.M)
FAILURE_BLOCK = re.compile(
    r"^\*{20} TEST 'mlir-quant :: (?P<name>\S+)' FAILED \*{20}$\n(?P<body>.*?)^\*{20}$", re.M | re.S
)


@dataclass(frozen=True)
class LitRun:
    returncode: int
    output: str
    results: dict[str, str]  # test file -> PASS / FAIL / UNRESOLVED / ...
    failures: dict[str, str]  # test file -> lit's report of its failure

    def report(self, name: str | None = None) -> str:
        if name is not None and name in self.failures:
            return self.failures[name]
        return self.output


@pytest.fixture(scope="session")
def lit_run() -> LitRun:
    proc = subprocess.run(
        [sys.executable, "-c", "import lit.main; lit.main.main()", "-v", str(SUITE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    output = proc.stdout + proc.stderr
    return LitRun(
        returncode=proc.returncode,
        output=output,
        results={m["name"]: m["code"] for m in RESULT_LINE.finditer(output)},
        failures={m["name"]: m["body"] for m in FAILURE_BLOCK.finditer(output)},
    )


def test_lit_ran_exactly_the_required_files(lit_run: LitRun) -> None:
    ran, required = sorted(lit_run.results), sorted(REQUIRED)
    assert ran == required, f"lit ran {ran}, expected {required}\n\nlit output:\n{lit_run.output}"


@pytest.mark.parametrize("name", REQUIRED)
def test_upstream_file_passes(lit_run: LitRun, name: str) -> None:
    code = lit_run.results.get(name)
    assert code == "PASS", f"{name}: lit says {code}\n{lit_run.report(name)}"


def test_lit_exit_status_is_success(lit_run: LitRun) -> None:
    returncode = lit_run.returncode
    assert returncode == 0, lit_run.output
