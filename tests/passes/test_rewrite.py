"""The rewrite framework (qconvert/passes/rewrite.py) and the `dce` pass: greedy rewriting, erase, replace."""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

from qconvert.ir.attributes import StringAttr
from qconvert.ir.core import GenericOp, Operation
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp
from qconvert.ir.parser import ParserOptions, parse_module
from qconvert.ir.printer import print_module
from qconvert.passes import get_pass
from qconvert.passes.dce import erase_unused
from qconvert.passes.rewrite import PatternRewriter, Root, apply_patterns

SOURCE = """\
func.func @f(%arg0: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "stablehlo.negate"(%arg0) : (tensor<2xf32>) -> tensor<2xf32>
  %1 = "stablehlo.negate"(%0) : (tensor<2xf32>) -> tensor<2xf32>
  %2 = "stablehlo.abs"(%1) : (tensor<2xf32>) -> tensor<2xf32>
  return %2 : tensor<2xf32>
}
"""


def parse(text: str) -> ModuleOp:
    return parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))


def function_of(text: str) -> FuncOp:
    module = parse(text)
    (function,) = [op for op in module.body.ops if isinstance(op, FuncOp)]
    return function


def names(function: FuncOp) -> list[str]:
    return [op.name for op in function.body.ops]


class DoubleNegation:
    """negate(negate(x)) -> x: replaces the outer op, leaves the inner one for dce."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.negate",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        inner = op.operands[0].owner_op()
        if inner is None or inner.name != "stablehlo.negate":
            return False
        rewriter.replace_op(op, [inner.operands[0]])
        return True


class AbsToNegateNegate:
    """abs(x) -> negate(negate(x)): a rewrite whose new ops the next sweep rewrites again."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.abs",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        first = rewriter.insert(GenericOp("stablehlo.negate", [op.operands[0]], [op.result.type]))
        second = rewriter.insert(GenericOp("stablehlo.negate", [first.result], [op.result.type]))
        rewriter.replace_op(op, [second.result])
        return True


def test_replace_op_rewires_uses_and_erases_the_op() -> None:
    function = function_of(SOURCE)
    assert apply_patterns(function, [DoubleNegation()]) == 1
    # The outer negate is gone, abs reads %arg0; the inner negate is unused but stays (no dce here).
    assert names(function) == ["stablehlo.negate", "stablehlo.abs", "func.return"]
    abs_op = function.body.ops[1]
    assert abs_op.operands[0] is function.body.arguments[0]
    assert not function.body.ops[0].result.uses


def test_greedy_sweeps_rewrite_the_ops_an_earlier_rewrite_inserted() -> None:
    function = function_of(SOURCE)
    count = apply_patterns(function, [AbsToNegateNegate(), DoubleNegation()])
    # sweep 1: abs -> negate(negate(.)) and the first double negation; sweep 2: the new double negation.
    assert count == 3
    returned = function.body.ops[-1].operands[0]
    assert returned is function.body.arguments[0]
    # One sweep only sees the ops present when it starts.
    once = function_of(SOURCE)
    assert apply_patterns(once, [AbsToNegateNegate(), DoubleNegation()], max_sweeps=1) == 2
    assert once.body.ops[-1].operands[0] is not once.body.arguments[0]


def test_insert_goes_before_the_matched_op_and_set_attribute_marks_it() -> None:
    class Mark:
        roots: ClassVar[tuple[Root, ...]] = ("stablehlo.abs",)

        def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
            if "note" in op.attributes:
                return False
            rewriter.insert(GenericOp("stablehlo.constant", [], [op.result.type]))
            rewriter.set_attribute(op, "note", StringAttr("seen"))
            return True

    function = function_of(SOURCE)
    assert apply_patterns(function, [Mark()]) == 1  # the second sweep finds it marked: a fixed point
    assert names(function)[2:4] == ["stablehlo.constant", "stablehlo.abs"]


def test_erase_unused_erases_chains_last_to_first() -> None:
    function = function_of(SOURCE.replace("return %2", "return %arg0"))
    assert erase_unused(function.body, lambda op: True) == 3
    assert names(function) == ["func.return"]
    assert not function.body.arguments[0].uses.keys() - {(function.body.ops[0], 0)}


def test_dce_pass_keeps_ops_of_dialects_it_does_not_know_are_pure() -> None:
    text = SOURCE.replace("return %2", "return %arg0").replace('"stablehlo.abs"', '"test.effect"')
    module = parse(text)
    # test.effect may have side effects: it stays, and so do the negates it reads.
    assert not get_pass("dce").run(module).changed
    assert "test.effect" in print_module(module) and "stablehlo.negate" in print_module(module)
    assert get_pass("dce", {"pure-dialects": "stablehlo,test"}).run(module).changed
    assert "stablehlo" not in print_module(module) and "test.effect" not in print_module(module)


def test_qconvert_opt_runs_dce() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "qconvert", "opt", "--allow-unregistered-dialect", "--dce", "-"],
        input=SOURCE.replace("return %2", "return %1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "stablehlo.abs" not in result.stdout
    assert result.stdout.count("stablehlo.negate") == 2


def test_erase_op_keeps_the_insertion_point_before_the_matched_op() -> None:
    """A pattern erases a dead op before the matched one, then inserts: the new op still lands just before
    the matched op."""

    class EraseDeadNegateThenMark:
        roots: ClassVar[tuple[Root, ...]] = ("stablehlo.abs",)

        def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
            dead = [o for o in op.parent.ops if o.name == "stablehlo.negate" and not o.result.uses]  # type: ignore[union-attr]
            if not dead:
                return False
            rewriter.insert(GenericOp("stablehlo.constant", [], [op.result.type]))
            for negate in dead:
                rewriter.erase_op(negate)
            rewriter.insert(GenericOp("stablehlo.iota", [], [op.result.type]))
            return True

    function = function_of(SOURCE.replace('"stablehlo.abs"(%1)', '"stablehlo.abs"(%arg0)'))
    assert apply_patterns(function, [EraseDeadNegateThenMark()]) == 2  # %1 first, then %0 (dead once %1 goes)
    assert names(function) == [
        "stablehlo.constant",
        "stablehlo.iota",
        "stablehlo.constant",
        "stablehlo.iota",
        "stablehlo.abs",
        "func.return",
    ]
