"""`--strip-func-quant-types`: function signatures carry storage integers instead of quantized types.

Runs on the whole module, nested functions included (upstream's pass has no anchor). Every quantized
type in a `func.func` signature becomes its storage type: a scalar `!quant.uniform<u8:f32, 0.5:10>` becomes
`i8` (the signless storage type, whatever the signedness flag), `tensor<4x!q>` becomes `tensor<4xi8>`, and
`?` and `*` shapes are kept. `quant.scast` ops glue the new signature to the unchanged body:

* each used argument gets `quant.scast %argN : iN to !q`, inserted at the start of the entry block, so
  the casts appear in reverse argument order; an unused argument gets none;
* a quantized value returned, or passed to a `func.call`, is cast to storage right after it is defined
  (at the start of its block for a block argument), once per value however many times it is used;
* a call's quantized results become storage results, and each result that a non-func op uses is cast
  back to the quantized type right after the call (so these casts too appear in reverse order);
* a value that moves from an argument or call result straight into a return or call needs no cast.

Callee declarations are rewritten like definitions. Other ops keep their quantized types.

    !q = !quant.uniform<i8:f32, 2.0:128>
    func.func private @callee(tensor<4x!q>) -> f32
    func.func @f(%arg0: !q, %arg1: tensor<4x!q>, %arg2: tensor<4x!q>) -> f32 {
      "test.custom_op"(%arg0) : (!q) -> ()
      %0 = call @callee(%arg1) : (tensor<4x!q>) -> f32
      return %0 : f32
    }

becomes

    func.func private @callee(tensor<4xi8>) -> f32
    func.func @f(%arg0: i8, %arg1: tensor<4xi8>, %arg2: tensor<4xi8>) -> f32 {
      %0 = quant.scast %arg0 : i8 to !quant.uniform<i8:f32, 2.000000e+00:128>
      "test.custom_op"(%0) : (!quant.uniform<i8:f32, 2.000000e+00:128>) -> ()
      %1 = call @callee(%arg1) : (tensor<4xi8>) -> f32
      return %1 : f32
    }

The pass fails, changing nothing, where upstream's conversion fails: a `!quant.calibrated` type (it has
no storage type) in a signature, call or return, and a quantized argument of a function's non-entry
block. Storage types that `quant.scast` rejects (`ui8`, `f8E5M2`) are stripped as upstream strips them;
the verifier then reports the cast, as upstream's does. Ops in blocks that no branch reaches are not
visited (upstream's order, see `conversion.py`): a return or call there keeps its quantized operands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from qconvert.errors import VerifyError
from qconvert.ir.core import Block, BlockArgument, Builder, Operation, OpResult, Value
from qconvert.ir.dialects.func import CallOp, FuncOp, ReturnOp
from qconvert.ir.dialects.quant import StorageCastOp
from qconvert.ir.quant_types import CalibratedQuantizedType, QuantizedType
from qconvert.ir.types import FunctionType, RankedTensorType, Type, UnrankedTensorType
from qconvert.passes import ModulePass, PassResult, register_pass
from qconvert.passes.conversion import (
    fold_casts,
    replace_folded,
    resolve_fold,
    value_location,
    walk_in_conversion_order,
)

__all__ = [
    "STRIP_FUNC_QUANT_TYPES_PATTERNS",
    "StorageCastRewriter",
    "StripCall",
    "StripFuncQuantTypesPass",
    "StripFunctionSignature",
    "StripReturn",
    "check_strippable",
    "is_stripped_type",
    "storage_type_of",
    "strip_func_quant_types",
    "strip_quant_type",
]


def strip_quant_type(type_: Type) -> Type | None:
    """The pass's type converter: `!q` -> its storage type, `tensor<..x!q>` -> `tensor<..xSTORAGE>`.

    Other types are returned unchanged; None means "cannot convert" (a calibrated type has no storage).
    """
    element = type_.element_type if isinstance(type_, RankedTensorType | UnrankedTensorType) else type_
    if isinstance(element, CalibratedQuantizedType):
        return None
    if not isinstance(element, QuantizedType):
        return type_
    if element is type_:
        return element.storage_type
    assert isinstance(type_, RankedTensorType | UnrankedTensorType)
    return type_.with_element_type(element.storage_type)


def is_stripped_type(type_: Type) -> bool:
    """True when the pass leaves `type_` as it is (upstream's legality: the converter maps it to itself)."""
    return strip_quant_type(type_) == type_


def storage_type_of(type_: Type) -> Type:
    """`strip_quant_type` for a type known to convert (checked by `check_strippable` beforehand)."""
    stripped = strip_quant_type(type_)
    assert stripped is not None, f"{type_} has no storage type"
    return stripped


class StorageCastRewriter:
    """Inserts the `quant.scast` glue and remembers, per quantized value, its storage-typed twin.

    A quantized value gets at most one twin: the storage value it was cast from (an argument's or call
    result's cast back to the quantized type) or the cast to storage made for its first converted use.
    `folds` are the casts upstream folds (see `conversion.fold_casts`): a converted op reads a folded
    cast's result as the value it folds to.
    """

    def __init__(self, folds: dict[Value, Value] | None = None) -> None:
        self.folds = folds if folds is not None else {}
        self.storage_twins: dict[Value, Value] = {}
        self.quantized_views: dict[Value, StorageCastOp] = {}

    def storage_value(self, value: Value) -> Value:
        """The storage-typed twin of quantized `value`, cast right after its definition on first request."""
        value = resolve_fold(value, self.folds)
        if value in self.quantized_views:
            return value  # already retyped to storage: it is its own twin
        twin = self.storage_twins.get(value)
        if twin is not None:
            return twin
        if isinstance(value, OpResult):
            builder = Builder.after(value.owner)
        else:
            assert isinstance(value, BlockArgument)
            builder = Builder.at_start(value.owner)
        cast = StorageCastOp(value, storage_type_of(value.type), location=value_location(value))
        builder.insert(cast)
        self.storage_twins[value] = cast.result
        return cast.result

    def retype_to_storage(self, value: Value, builder: Builder) -> None:
        """Give quantized `value` its storage type; its existing uses read a cast back to the old type.

        The cast (`quant.scast %value : iN to !q`) is inserted with `builder` and erased at the end when
        nothing but converted ops used it.
        """
        quantized_type = value.type
        uses = list(value.uses)
        # An in-place type change, as MLIR's Value::setType; the users are redirected to the cast below.
        value.type = storage_type_of(quantized_type)
        cast = builder.insert(StorageCastOp(value, quantized_type, location=value_location(value)))
        for owner, index in uses:
            owner.set_operand(index, cast.result)
        self.storage_twins[cast.result] = value
        self.quantized_views[value] = cast

    def use_storage_operands(self, op: Operation) -> None:
        """Replace each quantized operand of `op` by its storage twin."""
        for index, operand in enumerate(op.operands):
            if not is_stripped_type(operand.type):
                op.set_operand(index, self.storage_value(operand))

    def finish(self) -> None:
        """Apply the folds (a retyped value is read through its cast), then drop the casts back to
        quantized types that no unconverted op ended up using."""
        replace_folded(self.folds, lambda value: self.quantized_view(value))
        for cast in self.quantized_views.values():
            if not cast.result.has_uses:
                cast.erase()
        self.quantized_views.clear()

    def quantized_view(self, value: Value) -> Value:
        """`value` as unconverted ops see it: the cast back to its quantized type if it was retyped."""
        cast = self.quantized_views.get(value)
        return cast.result if cast is not None else value


@dataclass(frozen=True)
class StripFunctionSignature:
    """`func.func @f(%arg0: !q) -> !q`: the signature and entry-block arguments take storage types."""

    root: ClassVar[type[Operation]] = FuncOp

    def match_and_rewrite(self, op: FuncOp, rewriter: StorageCastRewriter) -> bool:
        function_type = op.function_type
        if all(map(is_stripped_type, (*function_type.inputs, *function_type.results))):
            return False
        inputs = tuple(map(storage_type_of, function_type.inputs))
        op.function_type = FunctionType(inputs, tuple(map(storage_type_of, function_type.results)))
        if op.is_declaration:
            return True
        entry = op.body
        for argument in entry.arguments:
            if not is_stripped_type(argument.type):
                # Each cast goes to the very start, so the casts end up in reverse argument order.
                rewriter.retype_to_storage(argument, Builder.at_start(entry))
        return True


@dataclass(frozen=True)
class StripCall:
    """`func.call`: quantized operands are passed as storage, quantized results come back as storage."""

    root: ClassVar[type[Operation]] = CallOp

    def match_and_rewrite(self, op: CallOp, rewriter: StorageCastRewriter) -> bool:
        if all(map(is_stripped_type, (*op.operand_types, *op.result_types))):
            return False
        rewriter.use_storage_operands(op)
        for result in op.results:
            if not is_stripped_type(result.type):
                # Each cast goes right after the call, so the casts end up in reverse result order.
                rewriter.retype_to_storage(result, Builder.after(op))
        return True


@dataclass(frozen=True)
class StripReturn:
    """`func.return`: quantized values are returned as storage."""

    root: ClassVar[type[Operation]] = ReturnOp

    def match_and_rewrite(self, op: ReturnOp, rewriter: StorageCastRewriter) -> bool:
        if all(map(is_stripped_type, op.operand_types)):
            return False
        rewriter.use_storage_operands(op)
        return True


STRIP_FUNC_QUANT_TYPES_PATTERNS: tuple[StripFunctionSignature | StripCall | StripReturn, ...] = (
    StripFunctionSignature(),
    StripCall(),
    StripReturn(),
)
"""The pass's patterns, one per func op; apply them with one `StorageCastRewriter` per module."""


def check_strippable(ops: Sequence[Operation]) -> None:
    """Raise where upstream's conversion fails, before anything is rewritten (so failure changes nothing).

    Raises:
        VerifyError: at the first func op, in walk order, whose types cannot be stripped.
    """
    for op in ops:
        if isinstance(op, FuncOp):
            function_type = op.function_type
            types: list[Type] = [*function_type.inputs, *function_type.results]
            later_blocks: Sequence[Block] = () if op.is_declaration else op.regions[0].blocks[1:]
            blocked = [argument.type for block in later_blocks for argument in block.arguments]
        elif isinstance(op, CallOp):
            types, blocked = [*op.operand_types, *op.result_types], []
        elif isinstance(op, ReturnOp):
            types, blocked = op.operand_types, []
        else:
            continue
        # Non-entry block arguments are not part of the signature: upstream leaves them and then fails.
        if any(strip_quant_type(t) is None for t in types) or not all(map(is_stripped_type, blocked)):
            message = f"failed to legalize operation '{op.name}' that was explicitly marked illegal"
            raise VerifyError(message, op.location)


def strip_func_quant_types(module: Operation) -> bool:
    """Strip quantized types from every function signature, call and return under `module`.

    Ops are visited in upstream's conversion order, which fixes where casts land; ops in blocks no branch
    reaches are not visited. Returns whether anything changed.
    """
    ops = list(walk_in_conversion_order(module))
    check_strippable(ops)
    patterns = {type(pattern).root: pattern for pattern in STRIP_FUNC_QUANT_TYPES_PATTERNS}
    # The target names only the func ops, so every other op counts as unknown and upstream tries to fold
    # it: each foldable cast pair goes, quantized or not.
    rewriter = StorageCastRewriter(fold_casts(ops, lambda op: True))
    changed = False
    for op in ops:
        pattern = patterns.get(type(op))
        if pattern is not None:
            changed |= pattern.match_and_rewrite(op, rewriter)  # type: ignore[arg-type]
    changed |= bool(rewriter.folds)
    rewriter.finish()
    return changed


@register_pass
@dataclass(frozen=True, kw_only=True)
class StripFuncQuantTypesPass(ModulePass):
    """Replace quantized types in function signatures by storage types, with `quant.scast` glue."""

    name: ClassVar[str] = "strip-func-quant-types"

    def run(self, module: Operation) -> PassResult:
        return PassResult(changed=strip_func_quant_types(module))
