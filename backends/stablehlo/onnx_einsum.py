"""Lowering of ONNX Einsum: explicit or implicit output, ellipsis, any number of operands (contracted
left to right), each pair as one `stablehlo.dot_general` (batch dims = labels both operands keep,
contracting dims = labels both drop), labels only one operand has and nobody needs summed first.

A label repeated within one operand ("ii->i", "...ii->...i") takes the diagonal first. Contractions sum
in another order than onnxruntime's, so float results agree within a few ulp of the output's magnitude.
"""

from __future__ import annotations

from collections.abc import Sequence

from qconvert import onnx_semantics as semantics
from qconvert.ir.core import Operation, Value
from qconvert.ir.types import I64, RankedTensorType

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import lowers_folding
from .onnx_reduce import reduce_sum


def _sum_unneeded(ctx: LoweringContext, x: Value, labels: str, needed: set[str]) -> tuple[Value, str]:
    """Sum away the dims whose labels nobody needs later."""
    dropped = [i for i, label in enumerate(labels) if label not in needed]
    if not dropped:
        return x, labels
    return reduce_sum(ctx, x, dropped), "".join(c for c in labels if c in needed)


def _transpose_to(ctx: LoweringContext, x: Value, labels: str, wanted: str) -> Value:
    if labels == wanted:
        return x
    return hlo.transpose(ctx.builder, x, [labels.index(c) for c in wanted])


def _stretch(ctx: LoweringContext, x: Value, labels: str, sizes: dict[str, int]) -> Value:
    """Broadcast size-1 dims (ellipsis broadcasting) to the label's size."""
    shape = hlo.tensor_type(x).shape
    wanted = [sizes[c] for c in labels]
    return x if list(shape) == wanted else ctx.broadcast_to(x, wanted)


def contract(
    ctx: LoweringContext, lhs: Value, lhs_labels: str, rhs: Value, rhs_labels: str, keep: set[str]
) -> tuple[Value, str]:
    """The pairwise einsum of lhs and rhs keeping the labels in `keep`; returns the value and its labels."""
    lhs, lhs_labels = _sum_unneeded(ctx, lhs, lhs_labels, keep | set(rhs_labels))
    rhs, rhs_labels = _sum_unneeded(ctx, rhs, rhs_labels, keep | set(lhs_labels))
    sizes: dict[str, int] = {}
    for value, labels in ((lhs, lhs_labels), (rhs, rhs_labels)):
        for label, size in zip(labels, hlo.tensor_type(value).shape):
            sizes[label] = max(sizes.get(label, 1), size)
    lhs, rhs = _stretch(ctx, lhs, lhs_labels, sizes), _stretch(ctx, rhs, rhs_labels, sizes)
    shared = [c for c in lhs_labels if c in rhs_labels]
    batch = [c for c in shared if c in keep]
    contracting = [c for c in shared if c not in keep]
    result = hlo.dot_general(
        ctx.builder,
        lhs,
        rhs,
        lhs_batching=[lhs_labels.index(c) for c in batch],
        rhs_batching=[rhs_labels.index(c) for c in batch],
        lhs_contracting=[lhs_labels.index(c) for c in contracting],
        rhs_contracting=[rhs_labels.index(c) for c in contracting],
    )
    labels = "".join(batch) + "".join(c for c in lhs_labels if c not in shared)
    labels += "".join(c for c in rhs_labels if c not in shared)
    return result, labels


def diagonal(ctx: LoweringContext, x: Value, labels: str) -> Value:
    """A label repeated within one operand ("ii->i", "bii->bi") takes the diagonal: the later dim is
    folded into the first by keeping the elements where both indices agree (a select, then a sum that
    adds zeros only: exact). Returns x over the labels with repeats removed, first occurrences kept."""
    b = ctx.builder
    while len(set(labels)) != len(labels):
        label = next(c for c in labels if labels.count(c) > 1)
        first = labels.index(label)
        second = labels.index(label, first + 1)
        type_ = hlo.tensor_type(x)
        if type_.shape[first] != type_.shape[second]:
            ctx.unsupported(
                f"Einsum label {label!r} on dims of sizes {type_.shape[first]} and {type_.shape[second]}"
            )
        positions = RankedTensorType(type_.shape, I64)
        on_diagonal = hlo.compare(b, "EQ", hlo.iota(b, positions, first), hlo.iota(b, positions, second))
        kept = hlo.select(b, on_diagonal, x, ctx.splat(0, type_.element_type, type_.shape))
        x = reduce_sum(ctx, kept, [second])
        labels = labels[:second] + labels[second + 1 :]
    return x


@lowers_folding("onnx.Einsum")
def lower_einsum(ctx: LoweringContext, op: Operation) -> list[Value]:
    operands = ctx.operands(op)
    equation = str(ctx.attribute(op, "equation", ""))
    ranks = [hlo.tensor_type(v).rank for v in operands]
    try:
        terms, output = semantics.parse_einsum(equation, ranks)
    except ValueError as error:
        ctx.unsupported(str(error))
    operands = [diagonal(ctx, value, term) for value, term in zip(operands, terms)]
    terms = ["".join(dict.fromkeys(term)) for term in terms]
    value, labels = operands[0], terms[0]
    later: Sequence[str] = terms[1:]
    if len(operands) == 1:
        value, labels = _sum_unneeded(ctx, value, labels, set(output))
    for index in range(1, len(operands)):
        keep = set(output).union(*later[index:])
        value, labels = contract(ctx, value, labels, operands[index], terms[index], keep)
    return [_transpose_to(ctx, value, labels, output)]
