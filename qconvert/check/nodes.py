"""Per-node cases of `qconvert check`: every node of the model (or a fused group) cut out and fed what
onnxruntime gave it, and the verdict on what the backend computed for it.

A case is a small ONNX model: the node's (or group's) inputs that onnxruntime computed become graph
inputs fed with onnxruntime's values; its initializers, Constant values, Q/DQ quantization parameters and
small integer inputs (shapes, axes) become initializers (the IR carries scale and zero point in the quant
type, and static shapes need constant shape operands). A *fused group* is `DequantizeLinear* -> op ->
QuantizeLinear`, the pattern StableHLO's `legalize-qdq-to-quantized-op` turns into one quantized op; only
its final output is compared. Quantization nodes (and groups) must be bit-exact; every other node is
judged within the float bound of its op family (bounds.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
from onnx import AttributeProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from qconvert.check import bounds
from qconvert.check.report import FAIL, NOT_RUN, PASS, LayerResult, add_steps_off, compare, sqnr_sums
from qconvert.onnx_semantics import DEFAULT_DOMAINS

QUANTIZATION_OPS = frozenset(
    {
        ("", "QuantizeLinear"),
        ("", "DequantizeLinear"),
        ("", "DynamicQuantizeLinear"),
        ("", "QLinearConv"),
        ("", "QLinearMatMul"),
        ("", "MatMulInteger"),
        ("", "ConvInteger"),
        ("com.microsoft", "QLinearAdd"),
        ("com.microsoft", "QLinearMul"),
        ("com.microsoft", "QLinearConcat"),
        ("com.microsoft", "QLinearSigmoid"),
        ("com.microsoft", "QLinearLeakyRelu"),
        ("com.microsoft", "QLinearAveragePool"),
        ("com.microsoft", "QLinearGlobalAveragePool"),
        ("com.microsoft", "QLinearSoftmax"),
        ("com.microsoft", "QLinearReduceMean"),
        ("com.microsoft", "QGemm"),
        ("com.microsoft", "DynamicQuantizeMatMul"),
        ("com.microsoft", "MatMulIntegerToFloat"),
        ("com.microsoft", "QuantizeLinear"),
        ("com.microsoft", "DequantizeLinear"),
        ("com.microsoft", "DynamicQuantizeLSTM"),
    }
)
Q_DQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# Float nodes whose packed weight, scales and zero points the lifter unpacks at lift time
# (frontends/onnx/blockwise.py): those inputs stay constants, never fed as weights.
BLOCK_WEIGHT_OPS = frozenset({"MatMulNBits"})
SHAPE_LIKE_SIZE = 64  # integer inputs of float nodes up to this size (shapes, axes, pads) are constants
# Integer ops whose integer data inputs (positions 0 and 1) may be weights; their zero points stay constants.
INTEGER_WEIGHT_OPS = frozenset({"ConvInteger", "MatMulInteger"})
FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16})
INTEGER_TYPES = frozenset(
    {
        TensorProto.BOOL,
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
    }
)


@dataclass(slots=True, kw_only=True)
class NodeCase:
    """One per-node check: the cut-out model, its feeds, and the outputs compared with onnxruntime.

    `reason` is set (and `model` None) when the case cannot run at all, e.g. onnxruntime could not return
    one of its values. `group`: the display names of a fused group's nodes, None for a single node.
    """

    name: str
    op_type: str
    domain: str
    nodes: list[NodeProto]
    model: ModelProto | None = None
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    compared: list[str] = field(default_factory=list)
    group: list[str] | None = None
    reason: str | None = None
    quantization: bool = True  # bit-exact; False: a float node judged within its family's bound
    magnitude: dict[str, np.ndarray] | None = (
        None  # reduction nodes: op(|inputs|) by output, from onnxruntime
    )
    # reads or compares a deferred value (DeferredValues): cut out, run and judged on its own, after the rest
    deferred: bool = False

    @property
    def last(self) -> NodeProto:
        """The node whose outputs are compared (a fused group's QuantizeLinear)."""
        return self.nodes[-1]

    def result(self, verdict: str = NOT_RUN) -> LayerResult:
        return LayerResult(
            node=self.name,
            op_type=self.op_type,
            domain=self.domain,
            verdict=verdict,
            reason=self.reason,
            group=self.group,
            family=None if self.quantization else bounds.family(self.last),
        )


def broadcast_scale(scale: np.ndarray, shape: Sequence[int], axis: int, block_size: int) -> np.ndarray:
    """A Q/DQ scale shaped to broadcast against its tensor (per-tensor, per-axis or blocked)."""
    scale = np.asarray(scale, dtype=np.float64)
    if scale.size == 1 or not shape:
        return scale.reshape(())
    axis = axis % len(shape)
    if block_size:
        return np.repeat(scale, block_size, axis=axis).take(range(shape[axis]), axis=axis)
    dims = [1] * len(shape)
    dims[axis] = shape[axis]
    return scale.reshape(dims)


def _attribute(node: NodeProto, name: str, default: int) -> int:
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else int(helper.get_attribute_value(found))


def node_scale(node: NodeProto, scale: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """A QuantizeLinear / DequantizeLinear node's scale, shaped by its axis and block_size to `shape`."""
    return broadcast_scale(scale, shape, _attribute(node, "axis", 1), _attribute(node, "block_size", 0))


def dequantize_lsb(
    node: NodeProto, values: Mapping[str, np.ndarray], shape: Sequence[int]
) -> np.ndarray | None:
    """The quantization step of a DequantizeLinear's output (its scale, broadcast) when the scale is known."""
    if node.op_type != "DequantizeLinear" or len(node.input) < 2 or node.input[1] not in values:
        return None
    return node_scale(node, values[node.input[1]], shape)


# Per node ------------------------------------------------------------------------------------------
def _domain(node: NodeProto) -> str:
    return "" if node.domain in DEFAULT_DOMAINS else node.domain


def is_quantization_node(node: NodeProto) -> bool:
    return (_domain(node), node.op_type) in QUANTIZATION_OPS


def node_names(model: ModelProto) -> list[str]:
    """A unique display name per node: its name, `<op output 'y'>` when unnamed, `#2` on repeats."""
    names, seen = [], set()
    for node in model.graph.node:
        base = node.name or f"<{node.op_type} output '{node.output[0] if node.output else ''}'>"
        name, count = base, 1
        while name in seen:
            count += 1
            name = f"{base} #{count}"
        seen.add(name)
        names.append(name)
    return names


def _tensor(name: str, array: np.ndarray, elem_type: int | None) -> TensorProto:
    if elem_type == TensorProto.FLOAT8E4M3FN and array.dtype == np.uint8:
        array = array.view(ml_dtypes.float8_e4m3fn)
    return numpy_helper.from_array(array, name)


def _elem_type(name: str, array: np.ndarray, types: Mapping[str, int]) -> int:
    return types.get(name) or helper.np_dtype_to_tensor_dtype(array.dtype)


def cut_model(
    model: ModelProto,
    nodes: Sequence[NodeProto],
    compared: Sequence[str],
    values: Mapping[str, np.ndarray],
    types: Mapping[str, int],
    constants: set[str],
    feed_weights: bool = False,
) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """`nodes` alone, fed what onnxruntime gave them: constants and Q/DQ parameters as initializers,
    values computed elsewhere in the model as graph inputs; `compared` are the graph outputs.

    `feed_weights`: the data input of a Q/DQ node (e.g. int8 weights), and a float node's float weights
    (more than `SHAPE_LIKE_SIZE` elements), are graph inputs even when they are initializers, so that a
    compiler cannot fold the node away at compile time (XLA would constant-fold a weight's dequantize:
    slow, and not the arithmetic under test), nor inline every weight of the model in the module text."""
    initializers = {t.name: t for t in model.graph.initializer}
    produced = {name for node in nodes for name in node.output if name}
    quantization = any(is_quantization_node(node) for node in nodes)
    graph_inputs, feeds, tensors, seen = [], {}, [], set()
    for node in nodes:
        for position, name in enumerate(node.input):
            if not name or name in produced or name in seen:
                continue
            seen.add(name)
            array = values[name]
            fed_weight = (
                feed_weights
                and not (node.op_type in BLOCK_WEIGHT_OPS and position > 0)
                and (
                    (node.op_type in Q_DQ_OPS and position == 0)
                    or (not quantization and array.dtype.kind == "f" and array.size > SHAPE_LIKE_SIZE)
                )
            )
            shape_like = not quantization and array.dtype.kind in "iub" and array.size <= SHAPE_LIKE_SIZE
            if name in initializers and not fed_weight:
                tensors.append(initializers[name])
            elif (
                (name in constants and not fed_weight)
                or (node.op_type in Q_DQ_OPS and position > 0)
                or shape_like
            ):
                tensors.append(_tensor(name, values[name], types.get(name)))
            else:
                graph_inputs.append(
                    helper.make_tensor_value_info(name, _elem_type(name, array, types), list(array.shape))
                )
                feeds[name] = array
    outputs = [
        helper.make_tensor_value_info(name, _elem_type(name, values[name], types), list(values[name].shape))
        for name in compared
    ]
    graph = helper.make_graph(list(nodes), "check_node", graph_inputs, outputs, initializer=tensors)
    cut = helper.make_model(graph, opset_imports=list(model.opset_import))
    cut.ir_version = model.ir_version
    return cut, feeds


def _missing_value(
    nodes: Sequence[NodeProto], values: Mapping[str, np.ndarray], unreturnable: Mapping[str, str]
) -> str | None:
    for node in nodes:
        for value in [*node.input, *node.output]:
            if value and value not in values:
                return unreturnable.get(value, f"onnxruntime gave no value for '{value}'")
    return None


def node_cases(
    model: ModelProto,
    values: Mapping[str, np.ndarray],
    types: Mapping[str, int],
    constants: set[str],
    unreturnable: Mapping[str, str],
    feed_weights: bool = False,
    fused_groups: bool = False,
    deferred: Collection[str] = (),
) -> list[NodeCase]:
    """One case per node of `model` in graph order, then (`fused_groups`) one per fused group
    (`_fused_group_cases`); each cut out of the model (`feed_weights`: see `cut_model`), or given the
    reason it cannot run. A case that reads or compares a `deferred` value is left uncut (`case.deferred`):
    the caller cuts it when it runs it, so that one such value is alive at a time."""
    cases = _single_node_cases(model)
    if fused_groups:
        cases += _fused_group_cases(model, values, types)
    for case in cases:
        case.reason = _missing_value(case.nodes, values, unreturnable) or _subgraph(case.nodes)
        produced = {name for node in case.nodes for name in node.output if name}
        read = {name for node in case.nodes for name in node.input if name and name not in produced}
        case.deferred = bool((read | set(case.compared)) & set(deferred))
        if case.reason is None and not case.deferred:
            case.model, case.feeds = cut_model(
                model, case.nodes, case.compared, values, types, constants, feed_weights
            )
    return cases


class DeferredValues(Mapping[str, np.ndarray]):
    """onnxruntime's values, some of them (`deferred`: name -> how to compute it) computed only when read,
    the last one read kept: the float output of a weight's DequantizeLinear is as large as the weight
    times four, and a model over 2 GB has ten of a gigabyte each (issue 23)."""

    def __init__(
        self, values: dict[str, np.ndarray], deferred: Mapping[str, Callable[[], np.ndarray]]
    ) -> None:
        self.values, self.deferred = values, dict(deferred)
        self.kept: tuple[str, np.ndarray] | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.values:
            return self.values[name]
        if name not in self.deferred:
            raise KeyError(name)
        if self.kept is None or self.kept[0] != name:
            self.kept = None  # the previous one goes first
            self.kept = (name, self.deferred[name]())
        return self.kept[1]

    def __contains__(self, name: object) -> bool:
        return name in self.values or name in self.deferred

    def __iter__(self) -> Iterator[str]:
        yield from self.values
        yield from (name for name in self.deferred if name not in self.values)

    def __len__(self) -> int:
        return len(self.values) + sum(1 for name in self.deferred if name not in self.values)

    def release(self) -> None:
        self.kept = None

    def clear(self) -> None:
        self.values.clear()
        self.deferred.clear()
        self.kept = None


def dequantize_slices(
    case: NodeCase,
    model: ModelProto,
    values: Mapping[str, np.ndarray],
    types: Mapping[str, int],
    constants: set[str],
    slice_elements: int,
) -> Iterator[tuple[NodeCase, dict[str, np.ndarray]]]:
    """A weight's DequantizeLinear case cut into slices of about `slice_elements` elements along an axis
    its scale does not vary along, each a case of its own (its weight slice fed), with the values that
    judge it (scale, zero point, a shape-only placeholder for its output, which onnxruntime computes per
    slice). Each element's dequantization depends on it and its scale alone, so the slices' verdicts
    merged (`merge_results`) are the whole node's verdict."""
    node = case.nodes[0]
    weight = values[node.input[0]]
    output = node.output[0]
    per_tensor = np.asarray(values[node.input[1]]).size == 1
    quant_axis = None if per_tensor else _attribute(node, "axis", 1) % max(weight.ndim, 1)
    axes = [axis for axis in range(weight.ndim) if axis != quant_axis and weight.shape[axis] > 1]
    if not axes:
        axes = [0] if weight.ndim and per_tensor else []
    if not axes or weight.size <= slice_elements:
        spans = [(None, 0, 0)]
    else:
        axis = axes[0]
        step = max(1, slice_elements // max(1, weight.size // weight.shape[axis]))
        spans = [
            (axis, start, min(start + step, weight.shape[axis]))
            for start in range(0, weight.shape[axis], step)
        ]
    for axis, start, stop in spans:
        if axis is None:
            part = weight
        else:
            index = [slice(None)] * weight.ndim
            index[axis] = slice(start, stop)
            part = np.ascontiguousarray(weight[tuple(index)])
        part_values = {name: values[name] for name in node.input[1:] if name}
        part_values[node.input[0]] = part
        placeholder_type = helper.tensor_dtype_to_np_dtype(types.get(output, TensorProto.FLOAT))
        part_values[output] = np.broadcast_to(np.zeros((), placeholder_type), part.shape)
        sliced = NodeCase(
            name=case.name,
            op_type=case.op_type,
            domain=case.domain,
            nodes=case.nodes,
            compared=case.compared,
            quantization=case.quantization,
        )
        sliced.model, sliced.feeds = cut_model(
            model, case.nodes, case.compared, part_values, types, constants, feed_weights=True
        )
        yield sliced, part_values


def merge_results(total: LayerResult | None, part: LayerResult) -> LayerResult:
    """Two slices' verdicts of one node as one: counts and sums added, maxima kept, the worse verdict."""
    if total is None:
        return part
    if NOT_RUN in (total.verdict, part.verdict):
        kept = total if total.verdict == NOT_RUN else part
        return kept
    total.elements += part.elements
    total.mismatches += part.mismatches
    if part.max_lsb_diff is not None:
        total.max_lsb_diff = max(total.max_lsb_diff or 0.0, part.max_lsb_diff)
    if part.predicted_mismatches is not None:
        total.predicted_mismatches = (total.predicted_mismatches or 0) + part.predicted_mismatches
    if part.steps_off is not None:
        total.steps_off = (
            part.steps_off if total.steps_off is None else add_steps_off(total.steps_off, part.steps_off)
        )
    total.signal += part.signal
    total.noise += part.noise
    expected = total.predicted_mismatches or 0
    total.verdict = PASS if total.mismatches == expected else FAIL
    return total


RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


def _subgraph(nodes: Sequence[NodeProto]) -> str | None:
    """Why a control-flow node (If / Loop / Scan) is not cut out: its body reads the enclosing graph; nor a
    random op: no two generators draw the same numbers."""
    for node in nodes:
        if node.op_type in RANDOM_OPS:
            return "a random op: its values cannot be compared with onnxruntime's draw"
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            return "a node with a subgraph (control flow) is not checked on its own; end to end covers it"
    return None


def _single_node_cases(model: ModelProto) -> list[NodeCase]:
    """One case per node, comparing all its outputs; quantization nodes bit-exact, others within a bound."""
    return [
        NodeCase(
            name=name,
            op_type=node.op_type,
            domain=_domain(node),
            nodes=[node],
            compared=[o for o in node.output if o],
            quantization=is_quantization_node(node),
        )
        for node, name in zip(model.graph.node, node_names(model))
    ]


def _is_integer(name: str, values: Mapping[str, np.ndarray], types: Mapping[str, int]) -> bool:
    """An integer or boolean value (indices, shapes, masks): it passes through a fusion unquantized."""
    if name in values:
        return values[name].dtype.kind in "iub"
    return types.get(name) in INTEGER_TYPES


def _fused_group_cases(
    model: ModelProto, values: Mapping[str, np.ndarray], types: Mapping[str, int]
) -> list[NodeCase]:
    """One case per `DequantizeLinear* -> op -> QuantizeLinear` group: every float input of the op comes
    from a DequantizeLinear (a float operand of any other origin blocks upstream's fusion too; integer
    operands such as Gather's indices or Reshape's shape pass through), and its one output feeds exactly
    one QuantizeLinear and nothing else. Whether the backend fuses it is the backend's to say."""
    graph = list(model.graph.node)
    names = node_names(model)
    producers = {o: i for i, n in enumerate(graph) for o in n.output if o}
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(graph):
        for name in node.input:
            if name:
                consumers.setdefault(name, []).append(index)
    graph_outputs = {o.name for o in model.graph.output}
    cases = []
    for index, node in enumerate(graph):
        inputs = [name for name in node.input if name]
        outputs = [name for name in node.output if name]
        if is_quantization_node(node) or not inputs or len(outputs) != 1 or outputs[0] in graph_outputs:
            continue
        dequantizes = [producers.get(name) for name in inputs if not _is_integer(name, values, types)]
        if not dequantizes or any(p is None or graph[p].op_type != "DequantizeLinear" for p in dequantizes):
            continue
        users = consumers.get(outputs[0], [])
        if (
            len(users) != 1
            or graph[users[0]].op_type != "QuantizeLinear"
            or graph[users[0]].input[0] != outputs[0]
        ):
            continue
        members = [*dict.fromkeys(p for p in dequantizes if p is not None), index, users[0]]
        nodes = [graph[m] for m in members]
        case = NodeCase(
            name=f"{names[index]} (fused)",
            op_type=node.op_type,
            domain=_domain(node),
            nodes=nodes,
            compared=[nodes[-1].output[0]],
            group=[names[m] for m in members],
        )
        cases.append(case)
    return cases


def judge(
    case: NodeCase,
    ours: Mapping[str, np.ndarray],
    values: Mapping[str, np.ndarray],
    evaluated_by: str,
    predicted: tuple[int, str] | None = None,
) -> LayerResult:
    """The verdict on what the backend computed for `case`: bit-exact for quantization nodes and groups
    (or, when the backend's rounding semantics differ on purpose, exactly the predicted number of differing
    elements); within its family's float bound for any other node (bounds.py)."""
    if not case.quantization:
        return _judge_float(case, ours, values, evaluated_by)
    result = case.result()
    result.evaluated_by = evaluated_by
    for output in case.compared:
        reference = values[output]
        lsb = dequantize_lsb(case.last, values, reference.shape)
        comparison = compare(reference, np.asarray(ours[output]), lsb)
        result.elements += comparison.elements
        result.mismatches += comparison.mismatches
        if comparison.max_lsb_diff is not None:
            result.max_lsb_diff = max(result.max_lsb_diff or 0.0, comparison.max_lsb_diff)
        result.accumulate(comparison)  # steps off and SQNR, for the report
    expected = 0
    if predicted is not None:
        result.predicted_mismatches, result.explanation = predicted
        expected = predicted[0]
    result.verdict = PASS if result.mismatches == expected else FAIL
    return result


def _judge_float(
    case: NodeCase, ours: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray], evaluated_by: str
) -> LayerResult:
    result = case.result()
    result.evaluated_by = evaluated_by
    node = case.last
    kind = bounds.family(node)
    inputs = bounds.node_inputs(node, values)
    rules = []
    for output in case.compared:
        magnitude = (case.magnitude or {}).get(output)
        judged = bounds.judge_output(node, kind, inputs, values[output], np.asarray(ours[output]), magnitude)
        result.add_sqnr_sums(*sqnr_sums(values[output], np.asarray(ours[output])))  # for the report
        result.elements += judged.elements
        result.mismatches += judged.outside
        result.max_abs_diff = max(result.max_abs_diff or 0.0, judged.max_abs_diff)
        result.max_bound_ratio = max(result.max_bound_ratio or 0.0, judged.max_ratio)
        rules.append(judged.rule)
    result.bound = "; ".join(dict.fromkeys(rules))
    result.verdict = PASS if result.mismatches == 0 else FAIL
    return result


def magnitude_cases(cases: Sequence[NodeCase]) -> list[NodeCase]:
    """For each runnable reduction node (bounds.MAGNITUDE_OPS), the same case run on |inputs|: onnxruntime
    computes M = sum |a_i b_i| per output element, which scales that node's bound."""
    magnitudes = []
    for case in cases:
        if case.quantization or case.model is None or case.last.op_type not in bounds.MAGNITUDE_OPS:
            continue
        model = ModelProto()
        model.CopyFrom(case.model)
        model.graph.node[-1].CopyFrom(bounds.magnitude_node(model.graph.node[-1]))
        for tensor in model.graph.initializer:
            array = numpy_helper.to_array(tensor)
            if array.dtype.kind == "f":
                tensor.CopyFrom(numpy_helper.from_array(np.abs(array), tensor.name))
        feeds = {k: np.abs(v) if v.dtype.kind == "f" else v for k, v in case.feeds.items()}
        magnitudes.append(
            NodeCase(
                name=case.name,
                op_type=case.op_type,
                domain=case.domain,
                nodes=list(model.graph.node),
                model=model,
                feeds=feeds,
                compared=case.compared,
            )
        )
    return magnitudes


# What one side-by-side run of cases may hold in inputs: the backend's buffers for them stay bounded
# (an 82 M-parameter ConvInteger decoder's 779 cases at once: 0.6 GB more on the interpreter).
CASE_BATCH_BYTES = 128 * 2**20


def case_batches(cases: Sequence[NodeCase], limit: int = CASE_BATCH_BYTES) -> list[list[NodeCase]]:
    """`cases` in consecutive runs whose feeds (what each case reads; a weight shared by cases counted once
    per run) hold about `limit` bytes; a case larger than that runs alone."""
    batches: list[list[NodeCase]] = [[]]
    held: set[int] = set()
    size = 0
    for case in cases:
        arrays = [array for array in case.feeds.values() if id(array) not in held]
        case_bytes = sum(array.nbytes for array in arrays)
        if batches[-1] and size + case_bytes > limit:
            batches.append([])
            held, size = set(), 0
            arrays = list(case.feeds.values())
            case_bytes = sum(array.nbytes for array in arrays)
        batches[-1].append(case)
        held.update(id(array) for array in arrays)
        size += case_bytes
    return batches


def side_by_side(cases: Sequence[NodeCase]) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """One model holding every case apart, and its feeds. What a case computes is prefixed `c<i>/` (a node
    may sit in a single case and in a fused group); what it reads from the model (onnxruntime's values,
    initializers) keeps its name and is held once, however many cases read it, so the weights are not
    copied per case. A name that is an initializer in one case and fed in another is prefixed too."""
    roles: dict[str, set[bool]] = {}
    for case in cases:
        assert case.model is not None
        for tensor in case.model.graph.initializer:
            roles.setdefault(tensor.name, set()).add(True)
        for info in case.model.graph.input:
            roles.setdefault(info.name, set()).add(False)
    both = {name for name, kinds in roles.items() if len(kinds) > 1}
    nodes, inputs, outputs, initializers = [], [], [], []
    feeds: dict[str, np.ndarray] = {}
    seen: set[str] = set()
    for index, case in enumerate(cases):
        assert case.model is not None
        prefix = f"c{index}/"
        graph = case.model.graph
        inner = {name for node in graph.node for name in node.output if name} | both

        def renamed(name: str, prefix: str = prefix, inner: set[str] = inner) -> str:
            return f"{prefix}{name}" if name in inner else name

        for node in graph.node:
            copy = NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{prefix}{node.name}"
            copy.input[:] = [renamed(name) if name else "" for name in node.input]
            copy.output[:] = [renamed(name) if name else "" for name in node.output]
            nodes.append(copy)
        for info in graph.input:
            name = renamed(info.name)
            if name not in seen:
                seen.add(name)
                entry = type(info)()
                entry.CopyFrom(info)
                entry.name = name
                inputs.append(entry)
                feeds[name] = case.feeds[info.name]
        for info in graph.output:
            entry = type(info)()
            entry.CopyFrom(info)
            entry.name = renamed(info.name)
            outputs.append(entry)
        for tensor in graph.initializer:
            name = renamed(tensor.name)
            if name not in seen:
                seen.add(name)
                entry = type(tensor)()
                entry.CopyFrom(tensor)
                entry.name = name
                initializers.append(entry)
    first = cases[0].model
    assert first is not None
    merged = helper.make_graph(nodes, "check_cases", inputs, outputs, initializer=initializers)
    model = helper.make_model(merged, opset_imports=list(first.opset_import))
    model.ir_version = first.ir_version
    return model, feeds


def split_outputs(
    cases: Sequence[NodeCase], results: Mapping[str, np.ndarray]
) -> dict[str, dict[str, np.ndarray]]:
    """The side-by-side model's outputs, back by case name and the case's own output names."""
    split = {}
    for index, case in enumerate(cases):
        assert case.model is not None
        prefix = f"c{index}/"
        split[case.name] = {o.name: results[prefix + o.name] for o in case.model.graph.output}
    return split


def weights_as_inputs(model: ModelProto) -> dict[str, np.ndarray]:
    """Move `model`'s weights out of it (in place) into graph inputs, and return their arrays: inlined as
    `dense<...>` text they cost minutes to print and parse on a 20 MB model, as arguments nothing. A weight
    is a float initializer of more than `SHAPE_LIKE_SIZE` elements, or the data input of a Q/DQ node, that
    only float ops or Q/DQ data inputs read (the IR needs quantization parameters and the inputs of other
    quantization ops as constants)."""
    chosen = weight_chooser(model)
    return move_to_inputs(model, lambda tensor: numpy_helper.to_array(tensor) if chosen(tensor) else None)


def weight_chooser(model: ModelProto) -> Callable[[TensorProto], bool]:
    """Which initializers of `model` are weights (`weights_as_inputs`): what may be fed as an argument."""
    quantization_params: set[str] = set()
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            if is_quantization_node(node) and not (node.op_type in Q_DQ_OPS and position == 0):
                quantization_params.add(name)
            if node.op_type in BLOCK_WEIGHT_OPS and position > 0:  # packed weight, scales, zero points
                quantization_params.add(name)
            if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
                quantization_params.add(name)  # control flow: leave its operands alone
    dequantized = {n.input[0] for n in model.graph.node if n.op_type in Q_DQ_OPS and n.input}

    def movable(tensor: TensorProto) -> bool:
        return tensor.name not in quantization_params and (
            tensor.name in dequantized
            or (
                tensor.data_type in FLOAT_TYPES
                and int(np.prod(tensor.dims, dtype=np.int64)) > SHAPE_LIKE_SIZE
            )
        )

    return movable


def integer_weights_as_inputs(model: ModelProto) -> dict[str, np.ndarray]:
    """Move the initializers that ConvInteger / MatMulInteger read as data (inputs 0 and 1: quantize_dynamic's
    int8 weights) into graph inputs, in place, and return their arrays. Inlined, an 82M-parameter
    ConvInteger model's weights are printed element by element into the module text and parsed back by
    jaxlib (minutes); as arguments they cost nothing, and the lowering reads them as run-time tensors
    already. An initializer some node reads in another role (a zero point) stays a constant."""
    data: set[str] = set()
    other: set[str] = set()
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            if node.op_type in INTEGER_WEIGHT_OPS and position < 2:
                data.add(name)
            else:
                other.add(name)
    return move_to_inputs(
        model,
        lambda tensor: (
            numpy_helper.to_array(tensor) if tensor.name in data and tensor.name not in other else None
        ),
    )


def move_to_inputs(
    model: ModelProto, array_of: Callable[[TensorProto], np.ndarray | None]
) -> dict[str, np.ndarray]:
    """Move the initializers `array_of` gives an array for into graph inputs, in place, and return those
    arrays by name (what to feed); an initializer it gives None for stays one."""
    listed = {i.name for i in model.graph.input}
    weights: dict[str, np.ndarray] = {}
    moved = []
    for index, tensor in enumerate(model.graph.initializer):
        array = array_of(tensor)
        if array is None:
            continue
        weights[tensor.name] = array
        moved.append(index)
        if tensor.name not in listed:
            model.graph.input.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
    for index in reversed(moved):
        del model.graph.initializer[index]
    return weights
