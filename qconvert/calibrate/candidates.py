"""Mixed-precision candidates in memory: one finalized QDQ model per precision, mixed tensor by tensor.

NOTE: the search evaluates many models that differ only in which activations are 16-bit. Finalizing and
writing each (import, finalize, serialize, 4-7 s on MiniLM) is replaced by: finalize twice, once at the
base precision and once with every candidate tensor widened (`calibrate(load_ranges=...)`, the real
placement rules), and attribute each initializer that differs to the activation it belongs to:
- `T_scale` / `T_zero_point` of the Q/DQ pair of activation T (finalize names them so);
- any other (a bias whose int32 scale is input scale x weight scale, or that stays float when its step
  would be coarser than the output's): the candidate tensors the node reading it (through its own
  DequantizeLinear) reads or writes; when they are several they are tied: widened only together, as are
  tensors sharing one Q/DQ pair's parameters (equal values at both precisions).
A candidate is the widened model with the initializers of the tensors not chosen put back to the base
model's: its nodes are the widened model's (16 bits raise the opset to 21, and finalize converts the ops
whose signature changed on the way: the same computation), its `value_info` dropped (onnxruntime infers the
types, which follow each zero point). The model the search writes at the end is finalized for real and
measured again.
When the widened model holds an initializer the base one lacks (a Relu folded into its producer at 8
bits and not over a symmetric 16-bit range: digits' Conv outputs), or one that differs and belongs to no
candidate tensor, `mixable` is False and the search finalizes each candidate instead. Mixed candidates
were checked equal, initializer for initializer, to the finalized ones on the corpus MiniLM and the real
one.
"""

from __future__ import annotations

from collections.abc import Collection

from onnx import ModelProto, TensorProto


class Mixer:
    """Candidates mixed from `base` and `wide` (both finalized from the same ranges)."""

    def __init__(self, base: ModelProto, wide: ModelProto, tensors: Collection[str]) -> None:
        self.wide = wide
        del wide.graph.value_info[:]  # a quantized value's declared type changes with its zero point's
        self.reason = ""
        # tensor -> (the slot in `wide`, its widened value, its base value) per initializer it owns
        self.owned: dict[str, list[tuple[TensorProto, TensorProto, TensorProto]]] = {n: [] for n in tensors}
        # 16-bit activations raise the model to opset 21, converting the ops whose signature changed: the
        # same computation in other nodes, so the widened model's nodes serve every candidate.
        self.note = "" if _same_nodes(base, wide) else "at the widened model's opset"
        base_initializers = {tensor.name: tensor for tensor in base.graph.initializer}
        wide_initializers = {tensor.name: tensor for tensor in wide.graph.initializer}
        owners = _owners(wide, set(tensors))
        # Tensors widened only together: those sharing Q/DQ parameters (a Reshape/Transpose output shares
        # its input's, placement.py: equal values at both precisions), and the tensors one initializer
        # depends on together (a normalization bias stays float when its int32 step is coarser than its
        # output's: it follows the node's input and output).
        parent = {name: name for name in tensors}

        def root(name: str) -> str:
            while parent[name] != name:
                name = parent[name]
            return name

        def tie(names: Collection[str]) -> None:
            first, *rest = [root(name) for name in names]
            for other in rest:
                parent[other] = first

        by_values: dict[tuple[bytes, ...], list[str]] = {}
        for name in tensors:
            parts = [f"{name}_scale", f"{name}_zero_point"]
            if all(part in base_initializers and part in wide_initializers for part in parts):
                key = tuple(
                    _values(model[part]) for model in (base_initializers, wide_initializers) for part in parts
                )
                by_values.setdefault(key, []).append(name)
        for names in by_values.values():
            tie(names)
        changed: list[tuple[TensorProto, TensorProto, set[str]]] = []
        for tensor in wide.graph.initializer:
            before = base_initializers.get(tensor.name)
            if before is None:
                self.reason = f"initializer {tensor.name} is in the widened model only"
                break
            if before.SerializeToString() == tensor.SerializeToString():
                continue
            owner = owners.get(tensor.name, set())
            if not owner:
                self.reason = f"initializer {tensor.name} differs and belongs to no candidate tensor"
                break
            tie(owner)
            changed.append((tensor, before, owner))
        # The ties are needed either way: unmixable, each candidate is finalized with them widened together.
        units: dict[str, list[str]] = {}
        for name in tensors:
            units.setdefault(root(name), []).append(name)
        self.tied = {name: members for members in units.values() for name in members if len(members) > 1}
        if self.reason:
            return
        for tensor, before, owner in changed:
            # The widened model's own initializer is the slot a candidate writes either value into.
            self.owned[root(next(iter(owner)))].append((tensor, _copy(tensor), _copy(before)))

    def together(self, widened: Collection[str]) -> list[str]:
        """`widened` and every tensor tied to one of them (sharing its Q/DQ parameters)."""
        chosen = dict.fromkeys(widened)
        for name in list(chosen):
            chosen.update(dict.fromkeys(self.tied.get(name, ())))
        return list(chosen)

    @property
    def mixable(self) -> bool:
        return not self.reason

    def build(self, widened: Collection[str]) -> bytes:
        """The serialized model with exactly `widened` (of the candidate tensors) at 16 bits."""
        chosen = set(self.together(widened))
        for name, slots in self.owned.items():
            for slot, wider, before in slots:
                slot.CopyFrom(wider if name in chosen else before)
        return self.wide.SerializeToString()


def _values(tensor: TensorProto) -> bytes:
    """The tensor's type and values, whatever field holds them."""
    from onnx import numpy_helper

    array = numpy_helper.to_array(tensor)
    return str(array.dtype).encode() + array.tobytes()


def _copy(tensor: TensorProto) -> TensorProto:
    copied = TensorProto()
    copied.CopyFrom(tensor)
    return copied


def _same_nodes(first: ModelProto, second: ModelProto) -> bool:
    def shape(model: ModelProto) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
        return [(n.op_type, tuple(n.input), tuple(n.output)) for n in model.graph.node]

    return shape(first) == shape(second)


def _owners(model: ModelProto, tensors: set[str]) -> dict[str, set[str]]:
    """Initializer -> the candidate tensors it belongs to (see the NOTE)."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    owners: dict[str, set[str]] = {}
    for name in initializers:
        for suffix in ("_scale", "_zero_point"):
            if name.endswith(suffix) and name[: -len(suffix)] in tensors:
                owners[name] = {name[: -len(suffix)]}
    producers = {output: node for node in model.graph.node for output in node.output}
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for value in node.input:
            readers.setdefault(value, []).append(node)

    def activation_of(value: str) -> str | None:
        """The tensor whose Q/DQ pair produced `value` (a DequantizeLinear output), if a candidate."""
        dequantize = producers.get(value)
        if dequantize is None or dequantize.op_type != "DequantizeLinear":
            return None
        quantize = producers.get(dequantize.input[0])
        if quantize is None or quantize.op_type != "QuantizeLinear":
            return None
        return quantize.input[0] if quantize.input[0] in tensors else None

    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in initializers:
            continue  # a stored constant's dequantize: its parameters may follow an activation's scale
        found = {
            tensor
            for reader in readers.get(node.output[0], [])
            for value in reader.input
            if (tensor := activation_of(value)) is not None
        }
        found |= {  # the reader's quantized outputs (a normalization bias follows its output's step too)
            value for reader in readers.get(node.output[0], []) for value in reader.output if value in tensors
        }
        for name in node.input:
            if name in initializers and name not in owners and found:
                owners[name] = found
    return owners


__all__ = ["Mixer"]
