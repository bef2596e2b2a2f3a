"""End to end in lockstep: the interpreter's whole-model run, re-synchronised at near-tie quantizations.

NOTE: a quantized model amplifies float ulps. Where a float value sits a hair from a rounding boundary, the
float32 summation order of a MatMul or a LayerNormalization (OpenBLAS in our interpreter, MLAS in
onnxruntime: both correct, both within check's float bound) decides which step QuantizeLinear takes, and the
layers after it carry that one-step flip on, amplified (the corpus's MiniLM QDQ: one flipped element in
each of layer 1's query, key and value projections puts its sentence embedding at 31 dB against an exact
noise floor). The per-node check already proves every node right on onnxruntime's own inputs, so an
end-to-end difference can only come from such cascades or from a fault of composition (a wrong wire, a
state carried between nodes). This replay tells the two apart: it runs the model again, and wherever a
QuantizeLinear's result differs from onnxruntime's by one step on elements whose input agrees with
onnxruntime's to within `TIE_WINDOW` of a step, it takes onnxruntime's steps there (a near-tie flip, counted)
and goes on. Any other difference stays. If the outputs then pass, the flips explain the difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from onnx import ModelProto

from qconvert.check.nodes import node_scale
from qconvert.interpret import Interpreter
from qconvert.ir.core import Operation
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.onnx import node_name
from qconvert.ir.dialects.quant import QuantizeCastOp

# An input within 1/1024 of a step of onnxruntime's: only float rounding, never a real fault, moves it so
# little (a wrong op moves values by whole steps), while a near-tie can still flip its rounding.
TIE_WINDOW = 2.0**-10


@dataclass(slots=True)
class Lockstep:
    """The replay's outputs, and the near-tie flips taken from onnxruntime on the way."""

    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    flips: int = 0
    nodes: list[str] = field(default_factory=list)  # the QuantizeLinear nodes that flipped, in run order


class _LockstepInterpreter(Interpreter):
    def __init__(self, module: ModuleOp, model: ModelProto, oracle: Mapping[str, np.ndarray]) -> None:
        super().__init__(module)
        self.quantizers = {n.name: n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.name}
        self.oracle = oracle
        self.lockstep = Lockstep()

    def execute(self, op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
        results = super().execute(op, operands)
        if not isinstance(op, QuantizeCastOp):
            return results
        name = node_name(op)
        node = self.quantizers.get(name) if name is not None else None
        if node is None or len(node.input) < 2:
            return results
        theirs, their_input = self.oracle.get(node.output[0]), self.oracle.get(node.input[0])
        scale = self.oracle.get(node.input[1])
        ours = np.asarray(results[0])
        if theirs is None or their_input is None or scale is None or theirs.shape != ours.shape:
            return results
        steps = ours.astype(np.int64) - np.asarray(theirs).astype(np.int64)
        flipped = steps != 0
        if not flipped.any():
            return results
        step = node_scale(node, scale, ours.shape)
        drift = np.abs(np.asarray(operands[0], np.float64) - np.asarray(their_input, np.float64))
        near_tie = (np.abs(steps) == 1) & (drift <= TIE_WINDOW * np.broadcast_to(step, drift.shape))
        taken = flipped & near_tie
        if not taken.any():
            return results
        synchronised = ours.copy()
        synchronised[taken] = np.asarray(theirs).astype(ours.dtype)[taken]
        self.lockstep.flips += int(taken.sum())
        self.lockstep.nodes.append(node.name)
        return [synchronised, *results[1:]]


def replay(
    module: ModuleOp, model: ModelProto, feeds: Mapping[str, np.ndarray], oracle: Mapping[str, np.ndarray]
) -> Lockstep:
    """Run `module` (lifted from `model`) on `feeds`, taking onnxruntime's step at near-tie flips of its
    QuantizeLinear nodes; `oracle` holds onnxruntime's value of every tensor for these feeds."""
    interpreter = _LockstepInterpreter(module, model, oracle)
    interpreter.lockstep.outputs = interpreter.run(feeds)
    return interpreter.lockstep


__all__ = ["TIE_WINDOW", "Lockstep", "replay"]
