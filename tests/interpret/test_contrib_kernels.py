"""The interpreter's com.microsoft kernels (qconvert/onnx_contrib_kernels.py) against onnxruntime: each op on
seeded inputs (bit-exact where onnxruntime's steps are reproduced one rounding at a time, else within
check's float32 bound of qconvert/check/bounds.py), and `check` of a BERT optimized by onnxruntime's
transformer optimizer PASSED with nothing not run, on the interpreter and (where lowered) on XLA."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import helper, numpy_helper

from qconvert.check import check
from qconvert.check.bounds import family, float_bound
from qconvert.errors import InputError
from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import interpret

MS = "com.microsoft"
RNG = np.random.default_rng(18)


def rand(*shape: int, scale: float = 2.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def one_node_model(
    node: onnx.NodeProto, inputs: dict[str, np.ndarray], weights: dict[str, np.ndarray]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "contrib",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
            for k, v in inputs.items()
        ],
        [onnx.ValueInfoProto(name=o) for o in node.output if o],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def run_both(
    node: onnx.NodeProto, inputs: dict[str, np.ndarray], weights: dict[str, np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The one-node model on the interpreter and on onnxruntime (optimizations off), outputs in order."""
    ort = require_module("onnxruntime")
    outputs = [o for o in node.output if o]
    model = one_node_model(node, inputs, weights)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    expected = session.run(outputs, inputs)
    ours = interpret(import_onnx(model), inputs)
    return [np.asarray(ours[o]) for o in outputs], expected


@pytest.mark.parametrize(
    ("op", "inputs", "attributes"),
    [
        ("FastGelu", ["x"], {}),
        ("FastGelu", ["x", "bias"], {}),
        ("BiasGelu", ["x", "bias"], {}),
        ("Gelu", ["x"], {}),
        ("QuickGelu", ["x"], {"alpha": 1.5}),
        ("QuickGelu", ["x"], {}),
    ],
)
def test_gelu_family_is_bit_exact(op: str, inputs: list[str], attributes: dict[str, float]) -> None:
    x = np.concatenate([rand(2, 7, 32), np.linspace(-12, 12, 2 * 7 * 32, dtype=np.float32).reshape(2, 7, 32)])
    node = helper.make_node(op, inputs, ["y"], domain=MS, **attributes)
    ours, expected = run_both(node, {"x": x}, {"bias": rand(32)} if "bias" in inputs else {})
    np.testing.assert_array_equal(ours[0], expected[0])


def lowered_on_xla(
    node: onnx.NodeProto, inputs: dict[str, np.ndarray], weights: dict[str, np.ndarray]
) -> list[np.ndarray]:
    """The one-node model converted to StableHLO (backends/stablehlo) and run on XLA."""
    require_module("jax")
    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text

    text = stablehlo_text(
        import_onnx(one_node_model(node, inputs, weights)), form="quantized", inline_weights=True
    )
    return [np.asarray(a) for a in run.run(text, list(inputs.values()), engine="xla")]


def within_check_bound(
    node: onnx.NodeProto, inputs: list[np.ndarray | None], ours: np.ndarray, ref: np.ndarray
) -> None:
    """|ours - ref| within the per-node bound `qconvert check` applies to this node's float output."""
    bound, rule = float_bound(node, family(node), inputs, ref, None)
    difference = np.abs(ours.astype(np.float64) - ref.astype(np.float64))
    assert ours.shape == ref.shape
    assert np.all(difference <= bound), f"{node.op_type}: max |diff| {difference.max()} over {rule}"


@pytest.mark.parametrize("simplified", [False, True])
def test_skip_layer_normalization_within_the_bound_and_its_sum_output_exact(simplified: bool) -> None:
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    names = ["x", "skip", "gamma", "bias"] if simplified else ["x", "skip", "gamma", "beta", "bias"]
    weights = {"gamma": rand(64), "beta": rand(64), "bias": rand(64)}
    weights = {k: v for k, v in weights.items() if k in names}
    x, skip = rand(2, 6, 64) + np.float32(3.0), rand(2, 6, 64)  # an offset mean: the variance cancels
    node = helper.make_node(op, names, ["y", "", "", "sum"], domain=MS, epsilon=1e-5)
    ours, expected = run_both(node, {"x": x, "skip": skip}, weights)
    within_check_bound(node, [x, skip, *weights.values()], ours[0], expected[0])
    np.testing.assert_array_equal(ours[1], expected[1])


def test_embed_layer_normalization_within_the_bound_and_its_mask_index_exact() -> None:
    ids = RNG.integers(0, 30, (3, 7)).astype(np.int32)
    segments = RNG.integers(0, 2, (3, 7)).astype(np.int32)
    mask = np.ones((3, 7), np.int32)
    mask[1, 4:] = 0
    mask[2, 1:] = 0
    weights = {"word": rand(30, 16), "position": rand(10, 16), "segment": rand(2, 16)}
    weights |= {"gamma": rand(16), "beta": rand(16)}
    node = helper.make_node(
        "EmbedLayerNormalization",
        ["ids", "segments", "word", "position", "segment", "gamma", "beta", "mask"],
        ["y", "mask_index", "sum"],
        domain=MS,
        epsilon=1e-12,
    )
    ours, expected = run_both(node, {"ids": ids, "segments": segments, "mask": mask}, weights)
    within_check_bound(node, [ids, segments, *weights.values(), mask], ours[0], expected[0])
    np.testing.assert_array_equal(ours[1], expected[1])
    np.testing.assert_array_equal(ours[1], [7, 4, 1])
    within_check_bound(node, [ids, segments, *weights.values(), mask], ours[2], expected[2])
    # The StableHLO lowering, on XLA.
    require_module("jax")
    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text

    model = one_node_model(node, {"ids": ids, "segments": segments, "mask": mask}, weights)
    text = stablehlo_text(import_onnx(model), form="qdq", inline_weights=True)
    lowered = [np.asarray(a) for a in run.run(text, [ids, segments, mask], engine="xla")]
    for position in (0, 2):
        within_check_bound(
            node, [ids, segments, *weights.values(), mask], lowered[position], expected[position]
        )
    np.testing.assert_array_equal(lowered[1], expected[1])


@pytest.mark.parametrize(
    ("mask", "attributes"),
    [
        (None, {}),
        ("raw2d", {}),
        ("end", {}),
        ("end_start", {}),
        ("raw3d", {"mask_filter_value": -1e4}),
        (None, {"unidirectional": 1}),
        ("raw2d", {"unidirectional": 1, "scale": 0.3}),
        (None, {"qkv_hidden_sizes": [16, 16, 8]}),
    ],
)
def test_attention_within_the_bound_for_every_mask_layout(
    mask: str | None, attributes: dict[str, object]
) -> None:
    batch, sequence, hidden = 2, 6, 16
    x = rand(batch, sequence, hidden, scale=1.0)
    sizes = attributes.get("qkv_hidden_sizes", [hidden] * 3)
    weights = {"weights": rand(hidden, sum(sizes), scale=0.4), "bias": rand(sum(sizes), scale=0.1)}  # type: ignore[arg-type]
    masks = {
        "raw2d": np.array([[1] * 6, [1, 1, 1, 1, 0, 0]], np.int32),
        "end": np.array([6, 3], np.int32),
        "end_start": np.array([5, 6, 1, 2], np.int32),
        "raw3d": RNG.integers(0, 2, (batch, sequence, sequence)).astype(np.int32) | np.eye(6, dtype=np.int32),
    }
    inputs = {"x": x} | ({"mask": masks[mask]} if mask else {})
    node = helper.make_node(
        "Attention",
        ["x", "weights", "bias"] + (["mask"] if mask else []),
        ["y"],
        domain=MS,
        num_heads=4,
        **attributes,
    )
    ours, expected = run_both(node, inputs, weights)
    within_check_bound(node, [x, *weights.values()], ours[0], expected[0])
    # The StableHLO lowering (backends/stablehlo/onnx_contrib.py) reads the same layouts, on XLA.
    require_module("jax")
    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text

    module = import_onnx(one_node_model(node, inputs, weights))
    if "qkv_hidden_sizes" in attributes:  # the interpreter runs it; the lowering refuses it by name
        with pytest.raises(InputError, match="qkv_hidden_sizes"):
            stablehlo_text(module, form="qdq", inline_weights=True)
        return
    text = stablehlo_text(module, form="qdq", inline_weights=True)
    lowered = np.asarray(run.run(text, list(inputs.values()), engine="xla")[0])
    within_check_bound(node, [x, *weights.values()], lowered, expected[0])


@pytest.mark.parametrize("per_column", [False, True])
def test_quantized_attention_within_the_bound(per_column: bool) -> None:
    """QAttention (quantize_dynamic of an optimized model): uint8 input, int8 weights with a scalar or a
    per-column scale and zero point, a 1-D mask_index."""
    x = RNG.integers(0, 256, (2, 6, 16)).astype(np.uint8)
    columns = 48 if per_column else 1
    weights = {
        "weights": RNG.integers(-128, 128, (16, 48)).astype(np.int8),
        "bias": rand(48, scale=0.1),
        "x_scale": np.array(0.02, np.float32),
        "w_scale": (RNG.uniform(0.001, 0.01, columns).astype(np.float32)).reshape(
            () if columns == 1 else (48,)
        ),
        "x_zero": np.array(128, np.uint8),
        "w_zero": RNG.integers(-3, 4, columns).astype(np.int8).reshape(() if columns == 1 else (48,)),
    }
    mask = np.array([6, 4], np.int32)
    names = ["x", "weights", "bias", "x_scale", "w_scale", "mask", "x_zero", "w_zero"]
    node = helper.make_node("QAttention", names, ["y"], domain=MS, num_heads=2)
    ours, expected = run_both(node, {"x": x, "mask": mask}, weights)
    within_check_bound(node, [x, *weights.values(), mask], ours[0], expected[0])
    lowered = lowered_on_xla(node, {"x": x, "mask": mask}, weights)
    within_check_bound(node, [x, *weights.values(), mask], lowered[0], expected[0])


def test_quantized_embed_layer_normalization_within_the_bound() -> None:
    ids = RNG.integers(0, 30, (2, 7)).astype(np.int32)
    segments = RNG.integers(0, 2, (2, 7)).astype(np.int32)
    mask = np.array([[1] * 7, [1, 1, 1, 0, 0, 0, 0]], np.int32)
    tables = {"word": (30, 16), "position": (10, 16), "segment": (2, 16), "gamma": (16,), "beta": (16,)}
    weights = {name: RNG.integers(0, 256, shape).astype(np.uint8) for name, shape in tables.items()}
    weights |= {f"{name}_scale": np.array(RNG.uniform(0.005, 0.02), np.float32) for name in tables}
    weights |= {f"{name}_zero": np.array(RNG.integers(100, 156), np.uint8) for name in tables}
    names = [
        "ids",
        "segments",
        *tables,
        "mask",
        *(f"{t}_scale" for t in tables),
        *(f"{t}_zero" for t in tables),
    ]
    node = helper.make_node("QEmbedLayerNormalization", names, ["y", "mask_index"], domain=MS, epsilon=1e-12)
    ours, expected = run_both(node, {"ids": ids, "segments": segments, "mask": mask}, weights)
    within_check_bound(node, [ids, segments, *weights.values()], ours[0], expected[0])
    np.testing.assert_array_equal(ours[1], expected[1])
    lowered = lowered_on_xla(node, {"ids": ids, "segments": segments, "mask": mask}, weights)
    within_check_bound(node, [ids, segments, *weights.values()], lowered[0], expected[0])
    np.testing.assert_array_equal(lowered[1], expected[1])


# check on a BERT optimized by onnxruntime's transformer optimizer --------------------------------------


def export_optimized_bert(folder: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """A 2-layer BERT (Hugging Face's BertModel, random weights) exported by torch with dynamic axes and
    optimized by onnxruntime's optimizer two ways: the default fusions (EmbedLayerNormalization, Attention
    on its 1-D mask_index) and without the embedding fusion on the raw 2-D mask; and its data."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, attn_implementation="eager",
    )  # fmt: skip
    bert = transformers.BertModel(config).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(
            self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor
        ) -> tuple[torch.Tensor, ...]:
            outputs = self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types, return_dict=False)
            return outputs[0], outputs[1]

    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = (
        torch.zeros(2, 8, dtype=torch.long),
        torch.ones(2, 8, dtype=torch.long),
        torch.zeros(2, 8, dtype=torch.long),
    )
    axes = {0: "batch", 1: "sequence"}
    exported = folder / "bert.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Wrapped().eval(), example, str(exported), input_names=names,
            output_names=["last_hidden_state", "pooler_output"], dynamic_axes=dict.fromkeys(names, axes),
            opset_version=17, dynamo=False,
        )  # fmt: skip
    fused = folder / "bert_fused.onnx"
    optimize_model(
        str(exported), model_type="bert", num_heads=2, hidden_size=16, opt_level=1
    ).save_model_to_file(str(fused))
    options = FusionOptions("bert")
    options.enable_embed_layer_norm = False
    options.use_raw_attention_mask(True)
    raw = folder / "bert_raw_mask.onnx"
    optimize_model(
        str(exported),
        model_type="bert",
        num_heads=2,
        hidden_size=16,
        opt_level=1,
        optimization_options=options,
    ).save_model_to_file(str(raw))
    mask = np.ones((4, 8), np.int64)
    mask[1, 5:] = 0
    mask[3, 3:] = 0
    data = {
        "input_ids": np.random.default_rng(0).integers(0, 32, (4, 8)),
        "attention_mask": mask,
        "token_type_ids": np.random.default_rng(1).integers(0, 2, (4, 8)),
    }
    return fused, raw, data


@pytest.fixture(scope="module")
def optimized_bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    return export_optimized_bert(tmp_path_factory.mktemp("optimized_bert"))


def contrib_ops(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node if n.domain == MS}


def test_check_of_an_optimized_bert_passes_on_the_interpreter(
    optimized_bert: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    fused, raw, data = optimized_bert
    assert contrib_ops(fused) >= {
        "EmbedLayerNormalization",
        "Attention",
        "SkipLayerNormalization",
        "BiasGelu",
    }
    assert contrib_ops(raw) >= {"Attention", "SkipLayerNormalization", "BiasGelu"}
    for path in (fused, raw):
        report = check(path, data)
        assert report.not_run == 0, path.name
        assert report.verdict == "PASSED", (path.name, report.verdict_line)


def test_check_of_an_optimized_bert_passes_on_xla(
    optimized_bert: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    """Both fusions: EmbedLayerNormalization with Attention on its 1-D mask_index, and the raw 2-D mask."""
    require_module("jax")
    fused, raw, data = optimized_bert
    for path in (fused, raw):
        report = check(path, data, backend="stablehlo", engine="xla")
        assert report.not_run == 0, path.name
        assert report.verdict == "PASSED", (path.name, report.verdict_line)


def test_optimized_bert_lifts_with_static_types_when_its_inputs_are_pinned(
    optimized_bert: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    """The frontend's shape rules (frontends/onnx/qoperator.py) type every contrib output: nothing after
    them is left unranked."""
    from qconvert.ir.types import RankedTensorType

    fused, _, data = optimized_bert
    module = import_onnx(fused, {name: array.shape for name, array in data.items()})
    function = next(op for op in module.body.ops if op.name == "func.func")
    contrib = [op for op in function.body.ops if op.name.startswith("onnx.com.microsoft.")]
    assert len(contrib) == 9
    results = [r.type for op in function.body.ops for r in op.results]
    assert all(isinstance(t, RankedTensorType) and t.has_static_shape() for t in results)


@pytest.fixture(scope="module")
def quantized_bert(
    optimized_bert: tuple[Path, Path, dict[str, np.ndarray]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[Path], dict[str, np.ndarray]]:
    """Optimize, then quantize (as users do): quantize_dynamic of both fusions (QAttention and
    QEmbedLayerNormalization appear) and quantize_static QDQ of the default fusions."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fused, raw, data = optimized_bert
    folder = tmp_path_factory.mktemp("quantized_bert")
    paths = []
    for path in (fused, raw):
        quantized = folder / f"{path.stem}_dynamic.onnx"
        extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}  # the contrib outputs carry no type for it
        quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8, extra_options=extra)
        paths.append(quantized)
    assert "QEmbedLayerNormalization" in contrib_ops(paths[0])
    assert all("QAttention" in contrib_ops(p) for p in paths)
    # quantize_static, QDQ format: Q/DQ pairs around the float contrib ops (QOperator: onnxruntime's
    # quantizer itself fails on these models, an AttributeError in its MatMul quantizer).
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Samples(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([{k: v[i : i + 1] for k, v in data.items()} for i in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.samples, None)

    static = folder / "bert_fused_qdq.onnx"
    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    quantize_static(str(fused), str(static), Samples(), quant_format=QuantFormat.QDQ, extra_options=extra)
    assert {"Attention", "EmbedLayerNormalization"} <= contrib_ops(static)
    paths.append(static)
    return paths, data


@pytest.mark.parametrize("backend", ["interpreter", "stablehlo"])
def test_check_of_an_optimized_then_quantized_bert_passes(
    quantized_bert: tuple[list[Path], dict[str, np.ndarray]], backend: str
) -> None:
    """On the interpreter and on XLA (backends/stablehlo/onnx_quantized_transformer.py)."""
    if backend == "stablehlo":
        require_module("jax")
    paths, data = quantized_bert
    for path in paths:
        report = check(path, data, backend=backend, engine="xla" if backend == "stablehlo" else None)
        assert report.not_run == 0, path.name
        assert report.verdict == "PASSED", (path.name, report.verdict_line)
