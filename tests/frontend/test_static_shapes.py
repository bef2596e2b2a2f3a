"""Static shapes (issue 18): --input-shape carried through the shape computations of a torch export, what
stays dynamic reported once, contradictions refused (exit 2), per-node errors grouped."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper

from qconvert.cli import main
from qconvert.errors import InputError
from qconvert.ir.core import Operation
from qconvert.ir.types import RankedTensorType

SEQ, BATCH = 8, 2


def export_bert_like(path: Path) -> Path:
    """A small BERT written the way Hugging Face writes it (sizes read from tensors), exported by torch's
    TorchScript exporter with dynamic batch and sequence axes: Shape -> Gather -> Unsqueeze -> Concat ->
    Reshape for the heads, Slice of a position buffer to a computed end, Range + Expand of a computed shape
    (Equal / Where on it), ConstantOfShape for the token types."""
    torch = require_module("torch")
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, hidden: int, heads: int) -> None:
            super().__init__()
            self.hidden, self.heads, self.head = hidden, heads, hidden // heads
            self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))

        def split(self, x: torch.Tensor) -> torch.Tensor:
            # torch.Size + tuple, as Hugging Face writes it
            return x.view(x.size()[:-1] + (self.heads, self.head)).permute(0, 2, 1, 3)  # noqa: RUF005

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head) + mask
            context = torch.matmul(scores.softmax(-1), v).permute(0, 2, 1, 3).contiguous()
            return self.o(context.view(context.size()[:-2] + (self.hidden,)))  # noqa: RUF005

    class Bert(nn.Module):
        def __init__(self, vocab: int = 24, hidden: int = 16, heads: int = 2, positions: int = 32) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, hidden), nn.Embedding(positions, hidden)
            self.types = nn.Embedding(2, hidden)
            self.register_buffer("position_ids", torch.arange(positions).expand((1, -1)), persistent=False)
            self.norm = nn.LayerNorm(hidden)
            self.attention = Attention(hidden, heads)
            self.pool = nn.Linear(hidden, hidden)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
            shape = input_ids.size()
            position_ids = self.position_ids[:, : shape[1]]
            token_types = torch.zeros(shape, dtype=torch.long)
            ranged = torch.arange(shape[1]).unsqueeze(0).expand(shape)
            x = self.tokens(input_ids) + self.positions(position_ids) + self.types(token_types)
            x = self.norm(x + self.positions(ranged))
            extended = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
            x = x + self.attention(x, extended)
            return x, torch.tanh(self.pool(x[:, 0]))

    torch.manual_seed(0)
    model = Bert().eval()
    ids = torch.randint(0, 24, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(
        model,
        (ids, mask),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["hidden", "pooled"],
        dynamic_axes={"input_ids": axes, "attention_mask": axes, "hidden": axes, "pooled": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    return path


@pytest.fixture(scope="module")
def bert_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation warning
        return export_bert_like(tmp_path_factory.mktemp("bert") / "bert.onnx")


def feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, SEQ - 3 :] = 0
    return {"input_ids": rng.integers(0, 24, (BATCH, SEQ), dtype=np.int64), "attention_mask": mask}


def main_ops(module: object) -> list[Operation]:
    function = next(op for op in module.body.ops if op.name == "func.func")  # type: ignore[attr-defined]
    return list(function.body.ops)


def is_static(type_: object) -> bool:
    return isinstance(type_, RankedTensorType) and type_.has_static_shape()


PINNED = {"input_ids": (BATCH, SEQ), "attention_mask": (BATCH, SEQ)}


def test_the_export_has_the_shape_computations_onnx_inference_leaves_dynamic(bert_path: Path) -> None:
    """The premise: the export computes its shapes, and onnx's own inference (data propagation on) leaves
    values dynamic even with both inputs pinned; so the next test measures the folding, not the exporter."""
    model = onnx.load(str(bert_path))
    op_types = {node.op_type for node in model.graph.node}
    assert {"Shape", "Gather", "Concat", "Reshape", "Range", "Expand", "Where", "ConstantOfShape"} <= op_types
    for info in model.graph.input:
        for dim, size in zip(info.type.tensor_type.shape.dim, PINNED[info.name]):
            dim.Clear()
            dim.dim_value = size
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    dynamic = [
        info.name
        for info in inferred.graph.value_info
        if any(not d.HasField("dim_value") for d in info.type.tensor_type.shape.dim)
    ]
    assert len(dynamic) >= 4, dynamic


def test_pinned_export_is_static_everywhere_and_runs_on_xla_like_onnxruntime(bert_path: Path) -> None:
    require_module("jax")
    import onnxruntime as ort

    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx
    from qconvert.frontends.onnx.load import load

    model, error = load(bert_path, PINNED)
    assert error is None
    assert len(model.graph.node) == len(onnx.load(str(bert_path)).graph.node)  # types only: no node removed
    module = import_onnx(bert_path, PINNED)
    ops = main_ops(module)
    dynamic = [f"{op.name}: {r.type}" for op in ops for r in op.results if not is_static(r.type)]
    assert dynamic == []
    assert sum(op.name == "onnx.Shape" for op in ops) >= 5  # the shape computations are still there...
    text = stablehlo_text(module, form="qdq", inline_weights=True)
    assert "onnx." not in text.replace("onnx.name", "")  # ...and the lowering folded every one of them
    inputs = feeds()
    actual = run.run(text, [inputs["input_ids"], inputs["attention_mask"]], engine="xla")
    session = ort.InferenceSession(str(bert_path), providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)
    assert [a.shape for a in actual] == [e.shape for e in expected] == [(BATCH, SEQ, 16), (BATCH, 16)]
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


def test_partial_pinning_reports_the_dynamic_input_once(
    bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out.mlir"
    arguments = ["convert", str(bert_path), "--input-shape", f"input_ids={BATCH}x{SEQ}", "-o", str(output)]
    assert main(arguments) == 2
    message = capsys.readouterr().err
    assert message.count("attention_mask") == 2, message  # the line naming it, and the fix
    assert "input 'attention_mask' has type tensor<?x?xi64> (dynamic dims 'batch', 'sequence')" in message
    assert "--input-shape attention_mask=<batch>x<sequence>" in message
    assert "input_ids" not in message  # pinned: nothing is dynamic because of it
    assert "fix it with" not in message and len(message.splitlines()) <= 4
    assert not output.exists()


@pytest.fixture()
def static_model(tmp_path: Path) -> str:
    """x f32[2, 3] (static) and t f32[batch, 3] -> Add."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "t"], ["y"], name="add")],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("t", TensorProto.FLOAT, ["batch", 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    path = tmp_path / "static.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        (
            ["x=1x3"],
            "gives input 'x' the shape [1, 3], which contradicts the model's static [2, 3]: dim 0 is 2",
        ),
        (["x=2x3x1"], "gives input 'x' rank 3 [2, 3, 1]; the model's input 'x' has rank 2 [2, 3]"),
        (["t=2x4"], "contradicts the model's static [batch, 3]: dim 1 is 3 in the model, 4 given"),
        (["xs=2x3"], "names 'xs', which is not a graph input (the inputs are ['t', 'x']); did you mean 'x'?"),
        (["x=2x-3"], "expected NAME=D0xD1x..."),
        (["x=2x3", "x=3x3"], "gives 'x' twice"),
    ],
)
def test_input_shape_contradictions_exit_2(
    static_model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], shapes: list[str], expected: str
) -> None:
    arguments = ["convert", static_model, "-o", str(tmp_path / "out.mlir")]
    for shape in shapes:
        arguments += ["--input-shape", shape]
    assert main(arguments) == 2
    message = capsys.readouterr().err
    assert expected in message, message
    assert "internal error" not in message


def test_input_shape_equal_to_the_static_one_is_fine(static_model: str, tmp_path: Path) -> None:
    output = tmp_path / "out.mlir"
    arguments = [
        "convert",
        static_model,
        "-o",
        str(output),
        "--input-shape",
        "x=2,3",
        "--input-shape",
        "t=2x3",
    ]
    assert main(arguments) == 0
    assert "tensor<2x3xf32>" in output.read_text()


def test_shapes_from_data_arrays_take_partially_static_inputs(static_model: str) -> None:
    """What `check` calls with the shapes of its --data arrays: the dynamic dims take the array's sizes,
    the static ones must agree, and the message says where the shape came from."""
    from qconvert.frontends.onnx.load import load

    model, error = load(static_model, {"t": (2, 3)}, shapes_from="the --data array")
    assert error is None
    t = next(i for i in model.graph.input if i.name == "t")
    assert [d.dim_value for d in t.type.tensor_type.shape.dim] == [2, 3]
    with pytest.raises(InputError, match="the --data array gives input 't' the shape \\[5, 4\\]"):
        load(static_model, {"t": (5, 4)}, shapes_from="the --data array")


# Grouped errors ------------------------------------------------------------------------------------------
def test_unsupported_ops_are_grouped_by_op_and_reason_with_counts() -> None:
    from qconvert.backends.stablehlo.convert import convert_to_stablehlo
    from qconvert.ir.parser import ParserOptions, parse_module

    lines = [
        f'  %{i + 1} = "onnx.NoSuchOp"(%{i}) {{onnx.node_name = "n{i}"}} : (tensor<2xf32>) -> tensor<2xf32>'
        for i in range(5)
    ]
    lines.append('  %6 = "onnx.OtherOp"(%5) {onnx.node_name = "other"} : (tensor<2xf32>) -> tensor<2xf32>')
    text = (
        "func.func @main(%0: tensor<2xf32>) -> tensor<2xf32> {\n"
        + "\n".join(lines)
        + "\n  return %6 : tensor<2xf32>\n}\n"
    )
    with pytest.raises(InputError) as caught:
        convert_to_stablehlo(parse_module(text, options=ParserOptions(allow_unregistered_dialect=True)))
    message = caught.value.message.splitlines()
    assert message == [
        "cannot convert to StableHLO: 6 unsupported op(s) (2 kind(s), the most frequent first):",
        "  onnx.NoSuchOp x5 (nodes 'n0', 'n1', 'n2' and 2 more): no StableHLO lowering for this op",
        "  onnx.OtherOp (node 'other'): no StableHLO lowering for this op",
    ]


def test_ops_after_a_data_dependent_shape_are_one_line_naming_where_it_starts() -> None:
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx

    n = helper.make_node
    nodes = [
        n("NonZero", ["x"], ["nz"], name="where_nonzero"),
        n("Transpose", ["nz"], ["t"], name="transpose"),
        n("Neg", ["t"], ["y"], name="negate"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
    )
    module = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(InputError) as caught:
        stablehlo_text(module, form="qdq")
    message = str(caught.value)
    # NonZero itself is in the count when it has a lowering (which then fails on its run-time shape).
    assert re.search(r"[23] op\(s\) have shapes unknown at conversion time", message), message
    assert "they start at 'where_nonzero' (onnx.NonZero)" in message
    assert "'transpose'" not in message and "'negate'" not in message  # counted, not listed


def test_unliftable_nodes_are_grouped() -> None:
    from qconvert.frontends.onnx import import_onnx

    nodes = [helper.make_node("NoSuchOp", ["x"], [f"y{i}"], name=f"typo{i}") for i in range(4)]
    nodes.append(helper.make_node("Fancy", ["x"], ["z"], name="custom", domain="my.domain"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(InputError) as caught:
        import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    assert caught.value.message.splitlines() == [
        "the model has 5 unsupported node(s) (2 kind(s), the most frequent first):",
        "  onnx.NoSuchOp, opset 21 x4 (nodes 'typo0', 'typo1', 'typo2' and 1 more): "
        "no ONNX operator of this name at opset 21",
        "  'custom' (onnx.my.domain.Fancy, opset None): "
        "domain 'my.domain' is not in the model's opset_import",
    ]


def test_static_dims_of_a_dynamic_input_fold_too() -> None:
    """`x.shape[1:]` of x[N, 3, 4] is known without pinning N: Range(0, prod(x.shape[1:]), 1) gets the static
    type [12], where onnx's own inference (data propagation on) leaves it dynamic."""
    from qconvert.frontends.onnx.load import load

    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["tail"], start=1),
        n("ReduceProd", ["tail"], ["count"], keepdims=0),
        n("Range", ["zero", "count", "one"], ["r"]),
    ]
    scalars = [
        onnx.numpy_helper.from_array(np.array(v, np.int64), name) for name, v in (("zero", 0), ("one", 1))
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
        [helper.make_tensor_value_info("r", TensorProto.INT64, None)],
        initializer=scalars,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])

    def dims(proto: onnx.ModelProto, name: str) -> list[object]:
        info = next(i for i in [*proto.graph.value_info, *proto.graph.output] if i.name == name)
        return [
            d.dim_value if d.HasField("dim_value") else d.dim_param for d in info.type.tensor_type.shape.dim
        ]

    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    assert dims(inferred, "r") != [12]  # onnx's inference alone does not know it
    loaded, error = load(model)
    assert error is None
    assert dims(loaded, "r") == [12]


def test_input_shape_of_a_sequence_input_is_refused() -> None:
    from qconvert.frontends.onnx.load import load

    graph = helper.make_graph(
        [helper.make_node("SequenceLength", ["s"], ["n"])],
        "g",
        [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InputError, match="gives input 's' a shape; it is a sequence, not a tensor"):
        load(model, {"s": (2,)})
