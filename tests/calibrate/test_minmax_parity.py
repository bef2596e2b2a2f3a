"""MinMax parity: our calibrate -> finalize gives onnxruntime's `quantize_static` scales and zero points.

Same model, same data, same settings: onnxruntime's `quantize_static` (MinMax, QDQ) on one side; on the
other, per-tensor min/max over the same batches (onnxruntime runs the float model with the tensors its
calibrator observes exposed, graph optimizations off), `attach_ranges`, `finalize`. Every
QuantizeLinear / DequantizeLinear is matched by node name (`<tensor>_QuantizeLinear`,
`<tensor>_DequantizeLinear`: onnxruntime's naming, which finalize reproduces), and the scale, zero point,
zero-point type and axis must be equal bit for bit; the sets of Q and DQ nodes must be equal too.

The written-model tests go through the public `qconvert.calibrate` (collect + observers) and the ONNX
writer, and also require onnxruntime to compute the same output bytes from both models.

Known, deliberate differences (the numbers compared here are equal regardless):
- onnxruntime quantizes 16-bit / 4-bit types below opset 21 with com.microsoft Q/DQ; we raise the opset
  (and to 13 for per-axis, 19 for float8 or float16 scales, where onnxruntime keeps an opset that
  cannot hold them and writes an invalid model).
- A block longer than its axis is written as one block of the axis length (or as per-axis): same
  numbers; a ragged last block (axis not a multiple of the block) is refused (onnxruntime pads).
- `keep_float` tensors are never quantized; a bias whose input or weight stays float stays float;
  blocked weights of rank != 2 fall back to per-channel / per-tensor (onnxruntime raises or hangs).
- With float8 activations Relu/Clip are kept: float8 Q/DQ do not clamp at zero (onnxruntime folds
  them; its float8 static path fails on these models anyway, see test_finalize.py).
- Where onnxruntime's placement gives a wrong model (a Relu/Clip folded over a range its Q/DQ does not
  clamp as it does, or with no Q/DQ on its output; a Clip with bounds that are not constants is kept; a
  Relu input that is a graph output narrowed to the Relu's range; an Inf/NaN initializer or bias):
  test_placement.py. MinMax ranges on these two models never meet them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from calibrate.parity_support import (
    MODELS,
    QdqParams,
    batches,
    finalized_qdq,
    minmax_ranges,
    onnxruntime_qdq,
    op_zoo_model,
    save_npz,
    written_qdq,
)
from conftest import require_module

from qconvert.calibrate.attach import attach_ranges
from qconvert.calibrate.finalize import finalize
from qconvert.calibrate.scheme import DEFAULT_OP_TYPES, Scheme
from qconvert.frontends.onnx import import_onnx

CNN_OVERRIDES = {
    "image": [{"rmin": -1.0, "rmax": 2.0}],  # a range wider than the data's
    "/Relu_output_0": [{"quant_type": "QUInt16"}],  # mixed precision: 16 bits between 8-bit ops
    "/gap/GlobalAveragePool_output_0": [{"symmetric": True}],
    "logits": [{"scale": 0.25, "zero_point": 3}],
    "conv1.weight": [{"quant_type": "QInt4", "axis": 0}],  # per-channel though per_channel is off
    "fc.weight": [{"symmetric": False, "reduce_range": True}],
    "conv2.weight": [{"rmin": -0.5, "rmax": 0.5}],
}
ENCODER_OVERRIDES = {
    "/layers.0/Softmax_output_0": [{"quant_type": "QUInt16", "rmin": 0.0, "rmax": 1.0}],
    "/layers.1/gelu/Mul_1_output_0": [{"quant_type": "QInt16", "symmetric": True}],
    "onnx::MatMul_218": [{"quant_type": "QUInt8"}],  # per-tensor though per_channel is on
    "onnx::MatMul_224": [{"quant_type": "QInt4", "axis": 1}],
}


def ort_overrides(overrides: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Our overrides in the types onnxruntime's quantize_static requires (QuantType, numpy values)."""
    from onnxruntime.quantization import QuantType

    converted = {}
    for name, (options,) in overrides.items():
        options = dict(options)
        if "quant_type" in options:
            options["quant_type"] = QuantType[options["quant_type"]]
        for key in ("scale", "rmin", "rmax"):  # it reads the dtype of an activation's
            if key in options:
                options[key] = np.array(options[key], dtype=np.float32)
        if "zero_point" in options:
            options["zero_point"] = np.array(options["zero_point"], dtype=np.uint8)
        converted[name] = [options]
    return converted


def ort_scheme(**fields: object) -> Scheme:
    """Our scheme for onnxruntime's settings: per-tensor weights unless they say per_channel (onnxruntime's
    default; ours is per-channel)."""
    return Scheme(**{"per_channel": False, **fields})  # type: ignore[arg-type]


# name: (onnxruntime quantize_static settings, our scheme, models it applies to)
BOTH = ("digits_cnn", "tiny_encoder")
VARIANTS: dict[str, tuple[dict, Scheme, tuple[str, ...]]] = {
    "default": ({}, ort_scheme(), BOTH),
    "per_channel": ({"per_channel": True}, ort_scheme(per_channel=True), BOTH),
    "uint8": (
        {"activation_type": "QUInt8", "weight_type": "QUInt8"},
        ort_scheme(activation_type="uint8", weight_type="uint8"),
        BOTH,
    ),
    "symmetric_activations": (
        {"per_channel": True, "extra_options": {"ActivationSymmetric": True}},
        ort_scheme(per_channel=True, activation_symmetric=True),
        BOTH,
    ),
    "reduce_range": (
        {"per_channel": True, "reduce_range": True},
        ort_scheme(per_channel=True, reduce_range=True),
        BOTH,
    ),
    "int16": ({"activation_type": "QInt16"}, ort_scheme(activation_type="int16"), BOTH),
    "uint16_uint8": (
        {"activation_type": "QUInt16", "weight_type": "QUInt8"},
        ort_scheme(activation_type="uint16", weight_type="uint8"),
        ("digits_cnn",),
    ),
    "int4": (
        {"activation_type": "QInt4", "weight_type": "QInt4"},
        ort_scheme(activation_type="int4", weight_type="int4"),
        BOTH,
    ),
    "uint4": (
        {"activation_type": "QUInt4", "weight_type": "QUInt4"},
        ort_scheme(activation_type="uint4", weight_type="uint4"),
        BOTH,
    ),
    "int4_weights": (
        {"weight_type": "QInt4", "per_channel": True},
        ort_scheme(weight_type="int4", per_channel=True),
        BOTH,
    ),
    "uint4_weights": (
        {"activation_type": "QUInt8", "weight_type": "QUInt4"},
        ort_scheme(activation_type="uint8", weight_type="uint4"),
        ("tiny_encoder",),
    ),
    "weight_symmetric_uint8": (
        {"activation_type": "QUInt8", "weight_type": "QUInt8", "extra_options": {"WeightSymmetric": True}},
        ort_scheme(activation_type="uint8", weight_type="uint8", weight_symmetric=True),
        ("digits_cnn",),
    ),
    "min_real_range": (
        {"extra_options": {"MinimumRealRange": 0.5}},
        ort_scheme(min_real_range=0.5),
        ("digits_cnn",),
    ),
    "keep_relu": (
        {"extra_options": {"QDQKeepRemovableActivations": True}},
        ort_scheme(keep_removable_activations=True),
        ("digits_cnn",),
    ),
    "no_weight_adjust": (
        {"extra_options": {"QDQDisableWeightAdjustForInt32Bias": True}},
        ort_scheme(adjust_weight_scale_for_int32_bias=False),
        ("digits_cnn",),
    ),
    "no_bias": ({"extra_options": {"QuantizeBias": False}}, ort_scheme(quantize_bias=False), BOTH),
    # Per tensor: onnxruntime's per-channel weights take their symmetry from the type alone.
    "asymmetric_weights": (
        {"extra_options": {"WeightSymmetric": False}},
        ort_scheme(weight_symmetric=False),
        BOTH,
    ),
    # onnxruntime has no exclusion list: its selection is the default list without the excluded types.
    "op_types_excluded": (
        {"op_types_to_quantize": sorted(DEFAULT_OP_TYPES - {"MatMul", "Relu", "Softmax"})},
        ort_scheme(op_types_to_exclude={"MatMul", "Relu", "Softmax"}),
        BOTH,
    ),
    "op_types": (
        {"op_types_to_quantize": ["MatMul", "Conv", "Gemm"]},
        ort_scheme(op_types_to_quantize={"MatMul", "Conv", "Gemm"}),
        BOTH,
    ),
    "nodes_excluded": (
        {"nodes_to_exclude": ["/conv2/Conv", "/Relu", "/layers.0/q/MatMul", "/layers.1/Softmax"]},
        ort_scheme(nodes_to_exclude={"/conv2/Conv", "/Relu", "/layers.0/q/MatMul", "/layers.1/Softmax"}),
        BOTH,
    ),
    "nodes_selected": (
        {
            "nodes_to_quantize": [
                "/conv1/Conv",
                "/Relu",
                "/fc/Gemm",
                "/layers.0/q/MatMul",
                "/layers.1/Softmax",
            ]
        },
        ort_scheme(
            nodes_to_quantize={"/conv1/Conv", "/Relu", "/fc/Gemm", "/layers.0/q/MatMul", "/layers.1/Softmax"}
        ),
        BOTH,
    ),
    "matmul_axis_override": (
        {"per_channel": True, "extra_options": {"QDQOpTypePerChannelSupportToAxis": {"MatMul": 0}}},
        ort_scheme(per_channel=True, per_channel_axis={"MatMul": 0}),
        ("tiny_encoder",),
    ),
    "force_no_input_check": (
        {"extra_options": {"ForceQuantizeNoInputCheck": True}},
        ort_scheme(force_quantize_no_input_check=True),
        BOTH,
    ),
    "outputs_excluded": (
        {"extra_options": {"OpTypesToExcludeOutputQuantization": ["MatMul", "Conv"]}},
        ort_scheme(op_types_to_exclude_output_quantization={"MatMul", "Conv"}),
        BOTH,
    ),
    # onnxruntime blocks rank-2 weights only (it raises on the Conv and LayerNormalization weights).
    "blocked_16": (
        {"op_types_to_quantize": ["MatMul"], "extra_options": {"BlockSize": 16}},
        ort_scheme(op_types_to_quantize={"MatMul"}, block_size=16),
        ("tiny_encoder",),
    ),
    # A 32-block on a 2-wide axis is one block; we write it as a block of 2 (same numbers).
    "blocked_int4_per_channel": (
        {
            "op_types_to_quantize": ["MatMul"],
            "per_channel": True,
            "weight_type": "QInt4",
            "extra_options": {"BlockSize": 32},
        },
        ort_scheme(op_types_to_quantize={"MatMul"}, per_channel=True, weight_type="int4", block_size=32),
        ("tiny_encoder",),
    ),
    "blocked_uint4": (
        {
            "op_types_to_quantize": ["MatMul"],
            "activation_type": "QUInt8",
            "weight_type": "QUInt4",
            "extra_options": {"BlockSize": 32},
        },
        ort_scheme(
            op_types_to_quantize={"MatMul"}, activation_type="uint8", weight_type="uint4", block_size=32
        ),
        ("tiny_encoder",),
    ),
    # TensorQuantOverrides, in onnxruntime's form on both sides (its quant types as enums, its activation
    # scale and zero point as numpy values, as it requires); one override of each kind per model.
    "overrides_cnn": (
        {"extra_options": {"TensorQuantOverrides": ort_overrides(CNN_OVERRIDES)}},
        ort_scheme(tensor_overrides=CNN_OVERRIDES),
        ("digits_cnn",),
    ),
    "overrides_encoder": (
        {"per_channel": True, "extra_options": {"TensorQuantOverrides": ort_overrides(ENCODER_OVERRIDES)}},
        ort_scheme(per_channel=True, tensor_overrides=ENCODER_OVERRIDES),
        ("tiny_encoder",),
    ),
}
CASES = [(model, variant) for variant, (_, _, models) in VARIANTS.items() for model in models]


@pytest.fixture(scope="module")
def onnxruntime_models(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], tuple[dict, Path]]:
    """(model, variant) -> onnxruntime's Q/DQ parameters and its QDQ model file, each made once."""
    quantization = require_module("onnxruntime.quantization")
    made: dict[tuple[str, str], tuple[dict[str, QdqParams], Path]] = {}

    def get(model_name: str, variant: str) -> tuple[dict[str, QdqParams], Path]:
        if (model_name, variant) not in made:
            settings = dict(VARIANTS[variant][0])
            for key in ("activation_type", "weight_type"):
                if key in settings:
                    settings[key] = getattr(quantization.QuantType, settings[key])
            folder = tmp_path_factory.mktemp(f"{model_name}-{variant}")
            expected = onnxruntime_qdq(MODELS / f"{model_name}.onnx", batches(model_name), folder, **settings)
            made[model_name, variant] = (expected, folder / "ort.qdq.onnx")
        return made[model_name, variant]

    return get


@pytest.mark.parametrize(("model_name", "variant"), CASES)
def test_minmax_matches_quantize_static(model_name: str, variant: str, onnxruntime_models: Callable) -> None:
    expected, _ = onnxruntime_models(model_name, variant)
    path = MODELS / f"{model_name}.onnx"
    module = import_onnx(path)
    assert attach_ranges(module, minmax_ranges(path, batches(model_name))) == []
    finalize(module, VARIANTS[variant][1])
    ours = finalized_qdq(module)
    assert sorted(ours) == sorted(expected)
    mismatched = {name: (ours[name], expected[name]) for name in expected if ours[name] != expected[name]}
    assert not mismatched
    assert len(expected) >= 8  # the comparison covered real work


# End to end through the public API and the ONNX writer (a subset: each case runs two quantizers).
WRITTEN_CASES = [
    ("digits_cnn", "per_channel"),
    ("digits_cnn", "overrides_cnn"),
    ("tiny_encoder", "overrides_encoder"),
    ("digits_cnn", "uint8"),
    ("tiny_encoder", "per_channel"),
    ("tiny_encoder", "int16"),
    ("tiny_encoder", "uint4"),
    ("tiny_encoder", "blocked_int4_per_channel"),
]
# A 32-block on the head weight's 2-wide axis 1 is one block: the IR holds it as blocks of 2 and the
# writer writes that as per-axis on axis 0 (same 64 scales and zero points, same outputs).
ONE_BLOCK_AS_PER_AXIS = {("tiny_encoder", "blocked_int4_per_channel"): {"onnx::MatMul_268_DequantizeLinear"}}


@pytest.mark.parametrize(("model_name", "variant"), WRITTEN_CASES)
def test_written_model_matches_quantize_static(
    model_name: str, variant: str, tmp_path: Path, onnxruntime_models: Callable
) -> None:
    """`qconvert.calibrate(..., method="minmax")` writes onnxruntime's QDQ model: same Q/DQ parameters,
    and onnxruntime computes bit-identical outputs from both on the calibration batches."""
    ort = require_module("onnxruntime")
    from qconvert.calibrate.api import calibrate

    path = MODELS / f"{model_name}.onnx"
    data = batches(model_name)
    expected, expected_path = onnxruntime_models(model_name, variant)
    scheme = copy.deepcopy(VARIANTS[variant][1])  # calibrate() adds the sentinel guard's keep_float
    ours_path = tmp_path / "ours.qdq.onnx"
    calibrate(
        path, data, method="minmax", scheme=scheme, out=ours_path, sentinel="off", outlier_channels="off"
    )
    ours = written_qdq(onnx.load(ours_path))

    assert sorted(ours) == sorted(expected)
    per_axis = ONE_BLOCK_AS_PER_AXIS.get((model_name, variant), set())
    for name, params in expected.items():
        if name in per_axis:
            assert (ours[name].scale, ours[name].zero_point) == (params.scale, params.zero_point)
            assert (ours[name].axis, params.axis) == (0, 1)
        else:
            assert ours[name] == params, name
    theirs = ort.InferenceSession(str(expected_path), providers=["CPUExecutionProvider"])
    mine = ort.InferenceSession(str(ours_path), providers=["CPUExecutionProvider"])
    for batch in data:
        for left, right in zip(theirs.run(None, batch), mine.run(None, batch), strict=True):
            assert left.tobytes() == right.tobytes()


# `qconvert calibrate`'s scheme flags, each against quantize_static with the settings it stands for.
def _names(variant: str, field: str) -> str:
    return ",".join(sorted(getattr(VARIANTS[variant][1], field)))


CLI_FLAGS: dict[str, list[str]] = {
    "per_channel": ["--per-channel"],
    "uint8": ["--activation-type", "uint8", "--weight-type", "uint8"],
    "symmetric_activations": ["--per-channel", "--symmetric-activations"],
    "reduce_range": ["--per-channel", "--reduce-range"],
    "int16": ["--activation-type", "int16"],
    "uint4_weights": ["--activation-type", "uint8", "--weight-type", "uint4"],
    "asymmetric_weights": ["--asymmetric-weights"],
    "op_types": ["--op-types", "MatMul,Conv", "--op-types", "Gemm"],  # comma-separated and repeated
    "op_types_excluded": ["--exclude-op-types", _names("op_types_excluded", "op_types_to_exclude")],
    "nodes_excluded": ["--exclude-nodes", _names("nodes_excluded", "nodes_to_exclude")],
    "nodes_selected": ["--nodes", _names("nodes_selected", "nodes_to_quantize")],
    "blocked_16": ["--op-types", "MatMul", "--block-size", "16"],
}
CLI_CASES = [(model, variant) for variant in CLI_FLAGS for model in VARIANTS[variant][2]]


@pytest.mark.parametrize(("model_name", "variant"), CLI_CASES)
def test_cli_scheme_flags_give_quantize_statics_model(
    model_name: str, variant: str, tmp_path: Path, onnxruntime_models: Callable
) -> None:
    from qconvert.cli import main

    data = batches(model_name)
    samples = save_npz(tmp_path / "data.npz", data)
    out = tmp_path / "ours.qdq.onnx"
    command = ["calibrate", str(MODELS / f"{model_name}.onnx"), "--data", str(samples), "-o", str(out)]
    flags = CLI_FLAGS[variant]
    if variant.startswith("nodes_"):  # both models' names: calibrate refuses a name its model lacks
        graph = onnx.load(MODELS / f"{model_name}.onnx", load_external_data=False).graph
        names = {node.name for node in graph.node}
        flags = [flags[0], ",".join(name for name in flags[1].split(",") if name in names)]
    if "per_channel" not in VARIANTS[variant][0]:  # onnxruntime's default: per-tensor weights
        flags = [*flags, "--per-tensor-weights"]
    assert main([*command, "--sentinel", "off", "--outlier-channels", "off", "--quiet", *flags]) == 0
    expected, _ = onnxruntime_models(model_name, variant)
    assert written_qdq(onnx.load(out)) == expected


def test_float_min_sentinel_tensor_can_be_kept_in_float(tmp_path: Path) -> None:
    """keep_float removes a tensor's Q/DQ (and nothing else) relative to the default placement."""
    path = MODELS / "tiny_encoder.onnx"
    data = batches("tiny_encoder", 2)
    ranges = minmax_ranges(path, data)
    baseline = import_onnx(path)
    attach_ranges(baseline, ranges)
    finalize(baseline, ort_scheme())
    kept = import_onnx(path)
    attach_ranges(kept, ranges)
    notes: list[str] = []
    finalize(kept, ort_scheme(keep_float={"/layers.0/Div_output_0": "adds float-min"}), notes)
    base_names, kept_names = set(finalized_qdq(baseline)), set(finalized_qdq(kept))
    assert base_names - kept_names == {
        "/layers.0/Div_output_0_QuantizeLinear",
        "/layers.0/Div_output_0_DequantizeLinear",
    }
    assert kept_names <= base_names
    assert any("/layers.0/Div_output_0" in note and "adds float-min" in note for note in notes)


@pytest.mark.parametrize(
    ("settings", "scheme"),
    [
        ({}, ort_scheme()),
        ({"per_channel": True}, ort_scheme(per_channel=True)),
        (
            {"extra_options": {"ForceQuantizeNoInputCheck": True}},
            ort_scheme(force_quantize_no_input_check=True),
        ),
        ({"extra_options": {"ActivationSymmetric": True}}, ort_scheme(activation_symmetric=True)),
    ],
    ids=["default", "per_channel", "force_no_input_check", "symmetric_activations"],
)
def test_op_zoo_matches_quantize_static(settings: dict, scheme: Scheme, tmp_path: Path) -> None:
    """The op types with placement rules of their own, on a small synthetic graph."""
    path = tmp_path / "zoo.onnx"
    onnx.save(op_zoo_model(), path)
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((2, 4, 6, 6)).astype(np.float32)} for _ in range(3)]
    expected = onnxruntime_qdq(path, data, tmp_path, **settings)
    module = import_onnx(path)
    assert attach_ranges(module, minmax_ranges(path, data)) == []
    finalize(module, scheme)
    assert finalized_qdq(module) == expected
    assert len(expected) >= 45
    # Written back, onnxruntime computes the same bytes from both models.
    ort = require_module("onnxruntime")
    from qconvert.backends.onnx import save_onnx

    ours = ort.InferenceSession(
        str(save_onnx(module, tmp_path / "ours.onnx")), providers=["CPUExecutionProvider"]
    )
    theirs = ort.InferenceSession(str(tmp_path / "ort.qdq.onnx"), providers=["CPUExecutionProvider"])
    for batch in data:
        assert ours.run(None, batch)[0].tobytes() == theirs.run(None, batch)[0].tobytes()
