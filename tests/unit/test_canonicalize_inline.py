"""`--canonicalize` and `--inline` against real upstream MLIR (torch-mlir's bindings), byte for byte.

The oracle runs `builtin.module(func.func(canonicalize))` and `builtin.module(inline)`, as the upstream
tests' RUN lines do; the cases avoid arith's algebraic folds and patterns, which qconvert does not model.
Engine-free tests pin the parts of the behaviour that need no oracle (options, errors of `func.call`).
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest
from conftest import require_module

from qconvert.errors import VerifyError
from qconvert.ir import parse_module, print_module, verify
from qconvert.opt import parse_arguments, parse_pipeline, run_opt
from qconvert.passes import get_pass
from qconvert.passes.canonicalize import CanonicalizePass
from qconvert.passes.inline import inline

ROOT = Path(__file__).resolve().parents[2]
SPLIT = "\n\n// -----\n"
PIPELINES = {"canonicalize": "builtin.module(func.func(canonicalize))", "inline": "builtin.module(inline)"}


def conformance_dir() -> Path:
    """Where tests/conformance/lit.cfg.py finds the upstream files."""
    override = os.environ.get("QCONVERT_CONFORMANCE_DIR")
    return Path(override).resolve() if override else ROOT.parent / "shared" / "conformance"


CANONICALIZE_CASES = {
    # Constants are uniqued and moved to the front of the entry block (those not already leading come out
    # in reverse order); dead pure ops go; scast pairs and qcast/dcast pairs fold.
    "constants_dead_ops_and_folds": """
        !q = !quant.uniform<i8:f32, 2.0:10>
        func.func @f(%arg0: f32, %arg1: i8) -> (f32, i8, f32) {
          %x = arith.mulf %arg0, %arg0 : f32
          %c0 = arith.constant 3.0 : f32
          %c1 = arith.constant 2.0 : f32
          %c2 = arith.constant 3.0 : f32
          %c3 = arith.constant 7 : i8
          %d = arith.mulf %x, %c0 : f32
          %e = arith.mulf %d, %c1 : f32
          %f = arith.mulf %e, %c2 : f32
          %g = arith.addi %arg1, %c3 : i8
          %unused = arith.mulf %f, %f : f32
          %s = quant.scast %arg1 : i8 to !q
          %s2 = quant.scast %s : !q to i8
          %h = arith.addi %s2, %g : i8
          %q = quant.qcast %f : f32 to !q
          %r = quant.dcast %q : !q to f32
          %t = tensor.empty() : tensor<4xf32>
          return %r, %h, %x : f32, i8, f32
        }
    """,
    "leading_constants_stay": """
        func.func @f(%arg0: f32) -> f32 {
          %c0 = arith.constant 3.0 : f32
          %c1 = arith.constant 4.0 : f32
          %x = arith.mulf %arg0, %c0 : f32
          %c2 = arith.constant 5.0 : f32
          %y = arith.mulf %x, %c1 : f32
          %z = arith.mulf %y, %c2 : f32
          return %z : f32
        }
    """,
    # A call keeps its operand alive; the cast chain after it folds away entirely.
    "calls_are_kept": """
        !q = !quant.uniform<u8:f32, 2.0:128>
        func.func private @decl(tensor<4x!q>) -> ()
        func.func @f(%arg0: tensor<4xf32>) -> tensor<4xf32> {
          %0 = quant.qcast %arg0 : tensor<4xf32> to tensor<4x!q>
          call @decl(%0) : (tensor<4x!q>) -> ()
          %1 = quant.dcast %0 : tensor<4x!q> to tensor<4xf32>
          %2 = quant.qcast %1 : tensor<4xf32> to tensor<4x!q>
          %3 = quant.dcast %2 : tensor<4x!q> to tensor<4xf32>
          return %3 : tensor<4xf32>
        }
    """,
    "unregistered_ops_are_kept": """
        func.func @f(%arg0: f32) -> f32 {
          %0 = arith.negf %arg0 : f32
          "test.keep"(%0) : (f32) -> ()
          %1 = "test.pure"(%0) : (f32) -> f32
          %2 = arith.negf %0 : f32
          return %arg0 : f32
        }
    """,
}

INLINE_CASES = {
    # Private callees are erased once their last call is inlined (a callee called twice too); the
    # canonicalizer then folds the cast pairs and uniques the constants brought in.
    "private_callees_inlined_and_erased": """
        !q = !quant.uniform<i8:f32, 2.0:10>
        func.func private @quantize(%arg0: f32) -> !q {
          %c = arith.constant 3.0 : f32
          %0 = arith.mulf %arg0, %c : f32
          %1 = quant.qcast %0 : f32 to !q
          return %1 : !q
        }
        func.func private @dequantize(%arg0: !q) -> f32 {
          %0 = quant.dcast %arg0 : !q to f32
          return %0 : f32
        }
        func.func @roundtrip(%arg0: f32) -> (f32, f32) {
          %x = arith.mulf %arg0, %arg0 : f32
          %c = arith.constant 5.0 : f32
          %y = arith.addf %x, %c : f32
          %0 = call @quantize(%x) : (f32) -> !q
          %1 = call @dequantize(%0) : (!q) -> f32
          %2 = call @quantize(%y) : (f32) -> !q
          %3 = call @dequantize(%2) : (!q) -> f32
          %4 = call @dequantize(%2) : (!q) -> f32
          return %1, %3 : f32, f32
        }
        func.func @pub(%arg0: f32) -> f32 {
          return %arg0 : f32
        }
        func.func @user(%arg0: f32) -> f32 {
          %0 = call @pub(%arg0) : (f32) -> f32
          %1 = call @pub(%0) : (f32) -> f32
          return %1 : f32
        }
    """,
    # Nested callees are inlined callees first; an unused private function goes, a declaration stays.
    "nested_calls_and_dead_functions": """
        !q = !quant.uniform<i8:f32, 2.0:10>
        func.func private @a(%arg0: f32) -> !q {
          %0 = quant.qcast %arg0 : f32 to !q
          return %0 : !q
        }
        func.func private @b(%arg0: f32) -> f32 {
          %0 = call @a(%arg0) : (f32) -> !q
          %1 = quant.dcast %0 : !q to f32
          return %1 : f32
        }
        func.func private @unused(%arg0: f32) -> f32 {
          return %arg0 : f32
        }
        func.func private @decl(f32) -> f32
        func.func @main(%arg0: f32) -> (f32, f32) {
          %0 = call @b(%arg0) : (f32) -> f32
          %1 = call @decl(%arg0) : (f32) -> f32
          return %0, %1 : f32, f32
        }
    """,
    # Not inlined: self-recursion, a two-function cycle, and a body with an unregistered op. A private
    # function made dead by erasing its only caller, visited after it, stays (as upstream's does).
    "not_inlinable": """
        func.func private @dead_b(%arg0: f32) -> f32 {
          %0 = call @dead_a(%arg0) : (f32) -> f32
          return %0 : f32
        }
        func.func private @dead_a(%arg0: f32) -> f32 {
          %0 = arith.negf %arg0 : f32
          return %0 : f32
        }
        func.func @rec(%arg0: f32) -> f32 {
          %0 = call @rec(%arg0) : (f32) -> f32
          return %0 : f32
        }
        func.func @m1(%arg0: f32) -> f32 {
          %0 = call @m2(%arg0) : (f32) -> f32
          return %0 : f32
        }
        func.func @m2(%arg0: f32) -> f32 {
          %0 = call @m1(%arg0) : (f32) -> f32
          return %0 : f32
        }
        func.func @unregistered(%arg0: f32) -> f32 {
          %0 = call @u(%arg0) : (f32) -> f32
          return %0 : f32
        }
        func.func private @u(%arg0: f32) -> f32 {
          %0 = "test.op"(%arg0) : (f32) -> f32
          return %0 : f32
        }
    """,
}


def oracle_outputs(chunks: list[str], pipeline: str) -> list[str]:
    """Real upstream MLIR: each chunk parsed, verified, run through `pipeline` and printed."""
    ir = require_module("torch_mlir.ir")
    passmanager = require_module("torch_mlir.passmanager")
    outputs = []
    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context:
        for chunk in chunks:
            module = ir.Module.parse(chunk)
            passmanager.PassManager.parse(pipeline).run(module.operation)
            outputs.append(str(module).rstrip("\n"))
    return outputs


def our_outputs(text: str, *flags: str) -> list[str]:
    arguments = ["input.mlir", "--split-input-file", "--allow-unregistered-dialect", *flags]
    result = run_opt(text, "input.mlir", parse_arguments(arguments))
    assert result.exit_code == 0, "\n".join(result.diagnostics)
    return result.output.rstrip("\n").split(SPLIT)


def split_chunks(text: str) -> list[str]:
    return re.split(r"^// -----.*$", text, flags=re.M)


def upstream_file(name: str) -> str:
    path = conformance_dir() / "mlir-quant" / name
    if not path.is_file():
        pytest.skip(f"upstream conformance file not found at {path} (set QCONVERT_CONFORMANCE_DIR)")
    return path.read_text(encoding="utf-8")


@pytest.mark.engine
def test_upstream_canonicalize_file_matches_oracle_byte_for_byte() -> None:
    text = upstream_file("canonicalize.mlir")
    expected = oracle_outputs(split_chunks(text), PIPELINES["canonicalize"])
    pipeline = "--pass-pipeline=builtin.module(func.func(canonicalize{test-convergence}))"
    assert len(expected) == 8
    assert our_outputs(text, pipeline) == expected


@pytest.mark.engine
def test_upstream_inlining_file_matches_oracle_byte_for_byte() -> None:
    text = upstream_file("inlining.mlir")
    assert our_outputs(text, "-inline") == oracle_outputs([text], PIPELINES["inline"])


@pytest.mark.engine
@pytest.mark.parametrize(
    ("flag", "case"),
    [("canonicalize", name) for name in CANONICALIZE_CASES] + [("inline", name) for name in INLINE_CASES],
)
def test_case_matches_oracle_byte_for_byte(flag: str, case: str) -> None:
    text = textwrap.dedent((CANONICALIZE_CASES | INLINE_CASES)[case])
    assert our_outputs(text, f"--{flag}") == oracle_outputs([text], PIPELINES[flag])


# Engine-free -----------------------------------------------------------------------------------------
def test_test_convergence_is_a_unit_option() -> None:
    assert parse_pipeline("builtin.module(func.func(canonicalize{test-convergence}))") == [
        ("canonicalize", {"test-convergence": ""})
    ]
    assert get_pass("canonicalize", {"test-convergence": ""}) == CanonicalizePass(test_convergence=True)
    assert get_pass("canonicalize", {"test-convergence": "false"}) == CanonicalizePass()


def test_inline_folds_the_inlined_cast_pair() -> None:
    module = parse_module(
        textwrap.dedent("""
            !q = !quant.uniform<i8:f32, 2.0:10>
            func.func private @q(%arg0: f32) -> !q {
              %0 = quant.qcast %arg0 : f32 to !q
              return %0 : !q
            }
            func.func @f(%arg0: f32) -> f32 {
              %0 = call @q(%arg0) : (f32) -> !q
              %1 = quant.dcast %0 : !q to f32
              return %1 : f32
            }
        """),
        "input.mlir",
    )
    assert inline(module)
    verify(module)
    assert print_module(module) == textwrap.dedent("""\
        module {
          func.func @f(%arg0: f32) -> f32 {
            return %arg0 : f32
          }
        }
    """)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("%0 = call @nope(%arg0) : (f32) -> i8", "'func.call' op 'nope' does not reference a valid function"),
        (
            "%0 = call @f(%arg0, %arg0) : (f32, f32) -> i8",
            "'func.call' op incorrect number of operands for callee",
        ),
        (
            "%0 = call @f(%1) : (i8) -> i8",
            "'func.call' op operand type mismatch: expected operand type 'f32', "
            "but provided 'i8' for operand number 0",
        ),
        (
            "%0:2 = call @f(%arg0) : (f32) -> (i8, i8)",
            "'func.call' op incorrect number of results for callee",
        ),
        ("%0 = call @f(%arg0) : (f32) -> i16", "'func.call' op result type mismatch at index 0"),
    ],
)
def test_call_is_verified_against_its_callee(call: str, message: str) -> None:
    text = f"func.func private @f(f32) -> i8\nfunc.func @g(%arg0: f32, %1: i8) {{\n  {call}\n  return\n}}\n"
    module = parse_module(text, "input.mlir")
    with pytest.raises(VerifyError) as error:
        verify(module)
    assert error.value.message == message
    assert error.value.loc is not None and error.value.loc.line == 3
