"""`--inline`: inline `func.call`s of functions defined in the module, as upstream's inliner does.

Upstream's algorithm, for the functions of the top-level module:

* the call graph's strongly connected components are visited callees first (Tarjan's order, starting
  from every function in module order);
* in each component, every function is canonicalized (the inliner's default pipeline, see
  `canonicalize.py`), then the calls in its body are inlined; the two steps repeat, at most 4 times,
  while calls are inlined;
* a call is inlined when its callee has a single-block body whose ops all belong to a registered dialect
  (an unregistered op, e.g. `"test.op"`, is not legal to inline), and the callee is not recursive;
* a private function with no use left is erased: one found dead when its component is visited, and a
  callee whose last call was just inlined. A private function made dead by erasing another one that was
  visited later stays, as upstream's does. Public functions and declarations always stay.

Calls into a recursive component (a function calling itself, or functions calling each other) are not
inlined; upstream unrolls some of these a bounded number of times, which this pass does not model.

    func.func private @callee(%arg0: !q) -> f32 {
      %0 = quant.dcast %arg0 : !q to f32
      return %0 : f32
    }
    func.func @caller(%arg0: !q) -> f32 {
      %0 = call @callee(%arg0) : (!q) -> f32
      return %0 : f32
    }

becomes

    func.func @caller(%arg0: !q) -> f32 {
      %0 = quant.dcast %arg0 : !q to f32
      return %0 : f32
    }
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from qconvert.ir.attributes import ArrayAttr, Attribute, DictionaryAttr, SymbolRefAttr
from qconvert.ir.core import Block, GenericOp, Operation, Region, Value
from qconvert.ir.dialects.func import CallOp, FuncOp, ReturnOp
from qconvert.passes import ModulePass, PassResult, register_pass
from qconvert.passes.canonicalize import canonicalize_function

__all__ = [
    "MAX_INLINING_ITERATIONS",
    "CallGraph",
    "InlinerPass",
    "clone_op",
    "inline",
    "inline_call",
    "is_legal_to_inline",
]

MAX_INLINING_ITERATIONS = 4  # upstream's `max-iterations` default


def symbol_references(attribute: Attribute) -> Iterator[str]:
    """The root names of the symbol references in `attribute`, nested ones included."""
    if isinstance(attribute, SymbolRefAttr):
        yield attribute.root
    elif isinstance(attribute, ArrayAttr):
        for element in attribute.elements:
            yield from symbol_references(element)
    elif isinstance(attribute, DictionaryAttr):
        for _, value in attribute.entries:
            yield from symbol_references(value)


def op_symbol_uses(op: Operation) -> Iterator[str]:
    """Every symbol `op` and the ops nested in it refer to."""
    for nested in op.walk():
        for attribute in nested.attributes.values():
            yield from symbol_references(attribute)


@dataclass
class CallGraph:
    """Functions with bodies (the nodes), their callees, and the use counts of the discardable ones."""

    functions: dict[str, FuncOp]
    edges: dict[FuncOp, list[FuncOp]] = field(default_factory=dict)
    uses: Counter[FuncOp] = field(default_factory=Counter)  # symbol uses of each private function
    inner_uses: dict[FuncOp, Counter[FuncOp]] = field(default_factory=dict)  # uses made from each node
    always_live: set[FuncOp] = field(default_factory=set)

    @classmethod
    def build(cls, module: Operation) -> CallGraph:
        body = module.regions[0].entry
        functions = {op.sym_name: op for op in body.ops if isinstance(op, FuncOp)}
        graph = cls(functions)
        for op in body.ops:
            if isinstance(op, FuncOp) and not op.is_declaration:
                callees: list[FuncOp] = []
                for nested in op.walk():
                    target = graph.resolve(nested)
                    if target is not None and target not in callees:
                        callees.append(target)
                graph.edges[op] = callees
                graph.inner_uses[op] = Counter(graph.nodes_used_by(op))
                graph.uses.update(graph.inner_uses[op])
            else:
                graph.always_live.update(graph.nodes_used_by(op))
        return graph

    def resolve(self, op: Operation) -> FuncOp | None:
        """The function with a body that `op` calls, if it is such a call."""
        if not isinstance(op, CallOp):
            return None
        target = self.functions.get(op.callee)
        return target if target is not None and not target.is_declaration else None

    def nodes_used_by(self, op: Operation) -> Iterator[FuncOp]:
        for name in op_symbol_uses(op):
            target = self.functions.get(name)
            if target is not None and not target.is_declaration:
                yield target

    def is_discardable(self, function: FuncOp) -> bool:
        visibility = function.attributes.get("sym_visibility")
        return getattr(visibility, "value", None) == "private" and function not in self.always_live

    def is_dead(self, function: FuncOp) -> bool:
        return self.is_discardable(function) and self.uses[function] == 0

    def has_one_use_and_discardable(self, function: FuncOp) -> bool:
        return self.is_discardable(function) and self.uses[function] == 1

    def erase_node(self, function: FuncOp) -> None:
        """Forget the uses `function` makes (it is about to be erased)."""
        self.uses.subtract(self.inner_uses.pop(function, Counter()))

    def sccs(self) -> list[list[FuncOp]]:
        """Strongly connected components, callees first (llvm::scc_iterator from the external node)."""
        index: dict[FuncOp, int] = {}
        low: dict[FuncOp, int] = {}
        stack: list[FuncOp] = []
        on_stack: set[FuncOp] = set()
        result: list[list[FuncOp]] = []

        def connect(node: FuncOp) -> None:
            index[node] = low[node] = len(index)
            stack.append(node)
            on_stack.add(node)
            for callee in self.edges.get(node, ()):
                if callee not in index:
                    connect(callee)
                    low[node] = min(low[node], low[callee])
                elif callee in on_stack:
                    low[node] = min(low[node], index[callee])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member is node:
                        break
                result.append(component)

        for node in self.edges:
            if node not in index:
                connect(node)
        return result


def is_legal_to_inline(callee: FuncOp) -> bool:
    """Upstream's dialect inliner interfaces: one block, and only ops of registered dialects."""
    if len(callee.regions[0].blocks) != 1:
        return False
    return not any(isinstance(op, GenericOp) for op in callee.walk())


def clone_op(op: Operation, mapping: dict[Value, Value]) -> Operation:
    """A copy of `op` (regions included) whose operands are looked up in `mapping`; results are mapped."""
    new = object.__new__(type(op))
    if isinstance(op, GenericOp):
        new.name = op.name  # type: ignore[misc]
    regions = [clone_region(region, mapping) for region in op.regions]
    Operation.__init__(
        new,
        [mapping.get(operand, operand) for operand in op.operands],
        op.result_types,
        dict(op.attributes),
        regions,
        list(op.successors),
        op.location,
    )
    for old, cloned in zip(op.results, new.results, strict=True):
        mapping[old] = cloned
    return new


def clone_region(region: Region, mapping: dict[Value, Value]) -> Region:
    new = Region()
    for block in region.blocks:
        copy = new.append(Block([argument.type for argument in block.arguments]))
        for old, cloned in zip(block.arguments, copy.arguments, strict=True):
            mapping[old] = cloned
        for op in block.ops:
            copy.append(clone_op(op, mapping))
    return new


def inline_call(call: CallOp, callee: FuncOp) -> list[Operation]:
    """Replace `call` by a copy of `callee`'s body; returns the inlined ops (the return excluded)."""
    body = callee.body
    mapping: dict[Value, Value] = dict(zip(body.arguments, call.operands, strict=True))
    block = call.parent
    assert block is not None
    position = block.ops.index(call)
    inlined: list[Operation] = []
    for op in body.ops:
        if isinstance(op, ReturnOp):
            for result, value in zip(call.results, op.operands, strict=True):
                result.replace_all_uses_with(mapping.get(value, value))
            break
        position += 1
        block.insert(position - 1, clone_op(op, mapping))
        inlined.append(block.ops[position - 1])
    call.erase()
    return inlined


def walk_all(ops: list[Operation]) -> Iterator[Operation]:
    for op in ops:
        yield from op.walk()


class Inliner:
    """Upstream's `Inliner::Impl` over one module's call graph."""

    def __init__(self, module: Operation) -> None:
        self.module = module
        self.graph = CallGraph.build(module)
        self.to_delete: list[FuncOp] = []

    def run(self) -> bool:
        changed = False
        for component in self.graph.sccs():
            changed |= self.inline_scc(component)
        for function in self.to_delete:
            function.erase()
            changed = True
        return changed

    def inline_scc(self, component: list[FuncOp]) -> bool:
        changed = False
        for _ in range(MAX_INLINING_ITERATIONS):
            for function in component:
                changed |= canonicalize_function(function)
            if not self.inline_calls_in_scc(component):
                break
            changed = True
        return changed

    def inline_calls_in_scc(self, component: list[FuncOp]) -> bool:
        graph = self.graph
        dead: list[FuncOp] = []
        calls: list[tuple[CallOp, FuncOp, FuncOp]] = []
        for function in component:
            if graph.is_dead(function):
                dead.append(function)
            else:
                calls += [(op, function, target) for op, target in self.calls_in(function.walk())]
        # Upstream's inline history: the callees whose inlining brought each new call in (no cycles).
        history: list[tuple[FuncOp, int | None]] = []
        call_history: list[int | None] = [None] * len(calls)
        inlined_any = False
        index = 0
        while index < len(calls):  # calls made by inlined bodies are appended as they appear
            call, source, target = calls[index]
            history_id = call_history[index]
            index += 1
            if source in dead or call.parent is None:
                continue
            if in_history(target, history_id, history) or not self.should_inline(call, source, target):
                continue
            in_place = graph.has_one_use_and_discardable(target)
            inlined = inline_call(call, target)
            history.append((target, history_id))
            new_calls = [(op, source, callee) for op, callee in self.calls_in(walk_all(inlined))]
            calls += new_calls
            call_history += [len(history) - 1] * len(new_calls)
            inlined_any = True
            graph.uses[target] -= 1
            graph.inner_uses[source][target] -= 1
            for used, count in graph.inner_uses.get(target, Counter()).items():
                graph.inner_uses[source][used] += count
                graph.uses[used] += count
            if in_place:
                graph.erase_node(target)
                dead.append(target)
        for function in dead:
            if function in component:
                component.remove(function)
            if function not in self.to_delete:
                self.to_delete.append(function)
        return inlined_any

    def calls_in(self, ops: Iterator[Operation]) -> Iterator[tuple[CallOp, FuncOp]]:
        for op in ops:
            target = self.graph.resolve(op)
            if target is not None:
                assert isinstance(op, CallOp)
                yield op, target

    def should_inline(self, call: CallOp, source: FuncOp, target: FuncOp) -> bool:
        """Upstream's `shouldInline`: not into a cycle of length one or two, not into itself, legal."""
        callees = self.graph.edges.get(target, [])
        if target in callees or source in callees:
            return False
        ancestor = call.parent_op()
        while ancestor is not None:
            if ancestor is target:
                return False
            ancestor = ancestor.parent_op()
        return is_legal_to_inline(target)


def in_history(target: FuncOp, history_id: int | None, history: list[tuple[FuncOp, int | None]]) -> bool:
    """Whether inlining `target` already produced the call with this history entry (upstream's check)."""
    while history_id is not None:
        inlined, history_id = history[history_id]
        if inlined is target:
            return True
    return False


def inline(module: Operation) -> bool:
    """Inline the calls of `module`'s functions as upstream's inliner does; returns whether IR changed."""
    return Inliner(module).run()


@register_pass
@dataclass(frozen=True, kw_only=True)
class InlinerPass(ModulePass):
    """Inline calls to functions defined in the module and erase private functions left unused."""

    name: ClassVar[str] = "inline"

    def run(self, module: Operation) -> PassResult:
        return PassResult(changed=inline(module))
