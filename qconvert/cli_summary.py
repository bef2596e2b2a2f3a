"""What `convert`, `import` and `opt` report once they have written: one line on stderr, or `--json`.

The summary counts the written module's ops, the ops computing on quantized types other than the casts
(what a backend fused: `stablehlo.convolution` on `!quant.uniform` operands), the notes the artifact
carries (onnx-storage: what was stripped, what stays float), and what was written where.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from qconvert.ir.attributes import ArrayAttr, DictionaryAttr, StringAttr
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.qconvert import NOTE
from qconvert.ir.quant_types import QuantizedType
from qconvert.ir.types import element_type_of

# Ops that only move values into or out of quantized types: what is left computes on quantized values.
CAST_OPS = frozenset(
    {
        "quant.qcast",
        "quant.dcast",
        "quant.scast",
        "stablehlo.uniform_quantize",
        "stablehlo.uniform_dequantize",
        "stablehlo.bitcast_convert",
    }
)
STRUCTURE_OPS = frozenset({"builtin.module", "func.func", "func.return"})


@dataclass
class WriteSummary:
    """The summary of one written artifact: `wrote digits.mlir (stablehlo): 41 ops, 3 quantized, 0 notes`."""

    verb: str
    target: str
    outputs: list[str]
    ops: Counter[str] = field(default_factory=Counter)
    quantized_ops: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    module_notes: list[str] = field(default_factory=list)  # counted, not echoed: they are in the artifact

    def line(self) -> str:
        written = ", ".join("stdout" if path == "-" else path for path in self.outputs) or "nothing"
        quantized = sum(self.quantized_ops.values())
        parts = [f"{sum(self.ops.values())} ops"] if self.ops else []
        if self.ops:
            parts.append(f"{quantized} on quantized types")
        noted = len(self.notes) + len(self.module_notes)
        parts.append(f"{noted} note{'s' if noted != 1 else ''}")
        return f"qconvert {self.verb}: wrote {written} ({self.target}): {', '.join(parts)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "verb": self.verb,
            "target": self.target,
            "outputs": self.outputs,
            "ops": dict(sorted(self.ops.items())),
            "quantized_ops": dict(sorted(self.quantized_ops.items())),
            "notes": [*self.notes, *self.module_notes],
        }

    def write_json(self, path: str) -> None:
        from qconvert.atomic_file import atomic_text_file

        with atomic_text_file(path) as stream:
            stream.write(json.dumps(self.to_json(), indent=1) + "\n")


def _on_quantized(op: Any) -> bool:
    values = [*getattr(op, "operands", ()), *getattr(op, "results", ())]
    return any(isinstance(element_type_of(value.type), QuantizedType) for value in values)


def count_ops(module: ModuleOp, summary: WriteSummary) -> None:
    """Count `module`'s ops into `summary`: all of them, and those computing on quantized types."""
    for op in module.walk():
        if op is module or op.name in STRUCTURE_OPS:
            continue
        summary.ops[op.name] += 1
        if op.name not in CAST_OPS and not op.name.endswith("return") and _on_quantized(op):
            summary.quantized_ops[op.name] += 1


def module_notes(module: ModuleOp) -> list[str]:
    """The distinct `qconvert.note` texts a module carries (on itself, its ops, its functions' argument and
    result attributes), in order of first appearance: what a backend whose artifact is a bare module (TOSA)
    notes. Distinct, because one float island notes each of its ops with the same text."""
    found: dict[str, None] = {}

    def collect(attribute: Any) -> None:
        if isinstance(attribute, StringAttr):
            found.setdefault(attribute.value, None)

    for op in module.walk():
        collect(op.attributes.get(NOTE))
        for key in ("arg_attrs", "res_attrs"):
            entries = op.attributes.get(key)
            for entry in entries.elements if isinstance(entries, ArrayAttr) else ():
                if isinstance(entry, DictionaryAttr):
                    collect(dict(entry.entries).get(NOTE))
    return list(found)


def summarize_artifact(verb: str, target: str, artifact: Any, outputs: list[str]) -> WriteSummary:
    """The summary of what a verb wrote: a ModuleOp, or a backend's artifact holding one (`.module`).
    Its notes are the artifact's `summary_lines`, or else the module's `qconvert.note`s."""
    summary = WriteSummary(verb, target, outputs)
    module = artifact if isinstance(artifact, ModuleOp) else getattr(artifact, "module", None)
    if isinstance(module, ModuleOp):
        count_ops(module, summary)
    if hasattr(artifact, "summary_lines"):
        summary.notes = list(artifact.summary_lines())
    elif isinstance(module, ModuleOp):
        summary.module_notes = module_notes(module)
    return summary
