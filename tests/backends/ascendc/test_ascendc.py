"""The ascendc backend: call graph, product matrix, tiling, kernels (compiled against the stub header) and
`check --backend ascendc` against onnxruntime.

No Ascend hardware or CANN toolkit exists here: the kernels are judged by g++ against
stub/kernel_operator.h (declarations of the documented signatures only), the numbers by the emulator of
qconvert/numerics/ascendc.py against onnxruntime.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import engines_required
from onnx import TensorProto, helper, numpy_helper

from qconvert.backends import get_backend, parse_options
from qconvert.backends.ascendc import PRODUCTS, AscendcOptions, build_artifact, build_call_graph
from qconvert.convert import convert, write
from qconvert.errors import InputError
from qconvert.frontends.onnx import import_onnx

ROOT = Path(__file__).resolve().parents[3]
DIGITS = ROOT / "models" / "digits_cnn.qdq.onnx"
STUB = Path(__file__).resolve().parent / "stub"


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto],
    opset: int = 21,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _qdq(
    shape: tuple[int, ...],
    scale: np.ndarray,
    zero_point: np.ndarray,
    axis: int | None = None,
    block_size: int | None = None,
    dequantize: bool = True,
) -> onnx.ModelProto:
    """x -> QuantizeLinear [-> DequantizeLinear] -> y."""
    attributes: dict[str, int] = {}
    if axis is not None:
        attributes["axis"] = axis
    if block_size is not None:
        attributes["block_size"] = block_size
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quantize", **attributes),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dequantize", **attributes),
    ]
    zero = numpy_helper.from_array(zero_point, "z")
    if not dequantize:
        nodes[0].output[0] = "y"
        del nodes[1:]
    output_type = TensorProto.FLOAT if dequantize else helper.np_dtype_to_tensor_dtype(zero_point.dtype)
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", output_type, shape)],
        [numpy_helper.from_array(scale.astype(np.float32), "s"), zero],
    )


def _weight_only_gemm() -> onnx.ModelProto:
    """Float activation x [4, 40] times int8 weights [24, 40] (Gemm transB, per-row scales): AntiQuant."""
    rng = np.random.default_rng(3)
    weights = rng.integers(-127, 128, (24, 40), dtype=np.int8)
    scale = rng.uniform(0.001, 0.02, 24).astype(np.float32)
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], name="weight_dq", axis=0),
        helper.make_node("Gemm", ["x", "wf"], ["y"], name="gemm", transB=1),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 40))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 24))],
        [
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(scale, "ws"),
            numpy_helper.from_array(np.zeros(24, np.int8), "wz"),
        ],
    )


def _weight_only_cast_mul() -> onnx.ModelProto:
    """onnxruntime's weight-only form of a bidirectional GRU weight: int8 [2, 24, 40] -> Cast -> Mul by a
    [1, 24, 1] scale (per axis 1): AscendAntiQuant on [48, 40] rows, each row's scale its channel's."""
    rng = np.random.default_rng(7)
    nodes = [
        helper.make_node("Cast", ["w"], ["wf"], name="w_cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["wf", "ws"], ["y"], name="w_mul"),
    ]
    return _model(
        nodes,
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 24, 40))],
        [
            numpy_helper.from_array(rng.integers(-127, 128, (2, 24, 40), dtype=np.int8), "w"),
            numpy_helper.from_array(rng.uniform(0.001, 0.02, (1, 24, 1)).astype(np.float32), "ws"),
        ],
    )


def _int4_weight_only() -> onnx.ModelProto:
    """x [4, 64] times int4 weights [64, 40] per column (DequantizeLinear axis 1) -> AscendAntiQuant int4."""
    rng = np.random.default_rng(1)
    weights = helper.make_tensor("w", TensorProto.INT4, (64, 40), rng.integers(-8, 8, 64 * 40).tolist())
    zero = helper.make_tensor("wz", TensorProto.INT4, (40,), [0] * 40)
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], name="w_dq", axis=1),
        helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm"),
    ]
    scale = numpy_helper.from_array(rng.uniform(0.01, 0.1, 40).astype(np.float32), "ws")
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 64))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 40))],
        [weights, scale, zero],
    )


def _dynamic() -> onnx.ModelProto:
    """DynamicQuantizeLinear: AscendQuant PER_TENSOR with 1/s and zp - 128 read from GM at run time."""
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "ys", "yz"], name="dynamic")
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.UINT8, (4, 32)),
        helper.make_tensor_value_info("ys", TensorProto.FLOAT, ()),
        helper.make_tensor_value_info("yz", TensorProto.UINT8, ()),
    ]
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 32))], outputs, [])


def _per_channel() -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    return _qdq((6, 10), rng.uniform(0.01, 0.1, 10), rng.integers(-20, 20, 10).astype(np.int8), axis=1)


def _graph(model: onnx.ModelProto, product: str = "atlas-a2", round_mode: str = "rint"):  # type: ignore[no-untyped-def]
    return build_call_graph(import_onnx(model), product, round_mode)


# Call graph and files -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ascendc") / "digits"
    write(convert(str(DIGITS), to="ascendc"), str(folder), to="ascendc")
    return folder


def test_digits_call_graph_names_every_site_with_its_call(digits_folder: Path) -> None:
    document = json.loads((digits_folder / "callgraph.json").read_text())
    assert document["product"] == "atlas-a2"
    apis = [site["api"] for site in document["sites"]]
    assert apis.count("Mmad") == 3  # conv1, conv2, fc: int8 x int8 -> int32
    assert apis.count("AscendDequant") == 3  # each Mmad's accumulator, deqScale = s_x * s_w
    assert apis.count("AscendQuant") == 7  # every QuantizeLinear of the model
    for site in document["sites"]:
        if site["api"] == "AscendDequant":
            assert site["feeds"] in ("/conv1/Conv", "/conv2/Conv", "/fc/Gemm")
        if site["api"] == "AscendQuant":
            counts = site["counts"]
            assert counts["calCount"] % 32 == 0 and counts["calCount"] >= 80
            assert site["template"]["srcT"] == "float" and site["template"]["dstT"] == "int8_t"
    image = next(site for site in document["sites"] if site["node"] == "image_QuantizeLinear")
    # AscendQuant multiplies by 1/s: the image's s is 1/255
    assert image["scale"]["values"] == pytest.approx([255.0], rel=1e-6)
    assert image["offset"]["values"] == [-128.0]
    logits = next(site for site in document["sites"] if site["node"] == "logits_QuantizeLinear")
    assert "80 elements padded to 96" in logits["padding"]


def test_digits_constants_are_in_storage_and_api_types(digits_folder: Path) -> None:
    document = json.loads((digits_folder / "callgraph.json").read_text())
    fc = next(site for site in document["sites"] if site["api"] == "Mmad" and site["node"] == "/fc/Gemm")
    weights = np.load(digits_folder / fc["weight"]["file"])
    bias = np.load(digits_folder / fc["bias"]["file"])
    model = onnx.load(DIGITS)
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert weights.dtype == np.int8 and np.array_equal(weights, initializers["fc.weight_quantized"])
    assert bias.dtype == np.int32 and np.array_equal(bias, initializers["fc.bias_quantized"])
    raw = (digits_folder / fc["weight"]["file"]).with_suffix(".bin").read_bytes()
    assert raw == weights.tobytes()
    dequant = next(s for s in document["sites"] if s["api"] == "AscendDequant" and s["feeds"] == "/fc/Gemm")
    deq_scale = np.load(digits_folder / dequant["scale"]["file"])
    assert deq_scale.dtype == np.float32 and deq_scale.shape == (16,)  # 10 channels padded: n·4 % 32 == 0
    x_scale = initializers["/gap/GlobalAveragePool_output_0_scale"]  # what the Flatten DQ reads
    assert np.array_equal(deq_scale[:10], (x_scale * initializers["fc.weight_scale"]).astype(np.float32))
    tiling = json.loads((digits_folder / "tiling.json").read_text())
    assert {entry["kernel"] for entry in tiling["tilings"]} == {
        path.stem for path in (digits_folder / "kernels").glob("*.cpp")
    }


def test_folder_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "out"
    artifact = convert(str(DIGITS), to="ascendc")
    artifact.files["kernels/../../escape.cpp"] = b"x"  # a path the staging folder cannot hold inside DIR
    (tmp_path / "escape.cpp").mkdir()  # writing it fails: nothing may be left behind
    with pytest.raises(InputError):
        write(artifact, str(target), to="ascendc")
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["escape.cpp"]


def test_weight_only_cast_mul_is_antiquant_with_each_rows_scale() -> None:
    """The emulated AntiQuant of the GRU-shaped weight equals ONNX's Cast -> Mul within half's rounding."""
    from qconvert.backends.ascendc.check import half_bound
    from qconvert.backends.ascendc.emulate import emulate_site

    model = _weight_only_cast_mul()
    (site,) = _graph(model).sites
    assert site.api == "AscendAntiQuant" and site.transpose and site.m == 48 and site.columns == 40
    assert site.n == 64 and "K = 40 padded to 64" in (site.padding or "")
    weights = numpy_helper.to_array(model.graph.initializer[0])
    scale = numpy_helper.to_array(model.graph.initializer[1])
    ours, _ = emulate_site(site, weights)
    reference = weights.astype(np.float32) * scale
    assert ours.shape == reference.shape
    assert np.all(
        np.abs(ours - reference) <= half_bound(weights, np.broadcast_to(scale, weights.shape), reference)
    )
    assert np.count_nonzero(ours != reference) > 0  # half arithmetic: not float32's


def test_int4_weights_are_packed_two_to_a_byte_and_check_passes(tmp_path: Path) -> None:
    from qconvert.check import check

    model = _int4_weight_only()
    path = tmp_path / "int4.onnx"
    onnx.save(model, path)
    artifact = build_artifact(import_onnx(model), AscendcOptions())
    (site,) = artifact.graph.sites
    assert site.src_type == "int4" and site.n == 64  # 40 columns padded to 64 int4: 32 bytes
    packed = np.load(io.BytesIO(artifact.files["constants/site000_weight.npy"]))
    codes = numpy_helper.to_array(model.graph.initializer[0]).astype(np.int8).reshape(-1)
    assert packed.dtype == np.uint8 and packed.size == codes.size // 2
    assert np.array_equal(packed & 0xF, codes[0::2].astype(np.uint8) & 0xF)
    assert np.array_equal(packed >> 4, codes[1::2].astype(np.uint8) & 0xF)
    report = check(str(path), backend="ascendc")
    assert report.verdict == "PASSED"
    (layer,) = [layer for layer in report.layers.values() if layer.op_type == "DequantizeLinear"]
    assert 0 < layer.mismatches == layer.predicted_mismatches  # half arithmetic, within its rounding


def test_qoperator_source_converts_through_its_qdq_form() -> None:
    """digits_cnn.qop (QLinearConv, QGemm, ...) becomes the calls of digits_cnn.qdq: same APIs, same weights
    and scales in the same order."""
    qop = _graph(onnx.load(ROOT / "models" / "digits_cnn.qop.onnx")).sites
    qdq = _graph(onnx.load(DIGITS)).sites
    assert sorted(site.api for site in qop) == sorted(site.api for site in qdq)
    for api in ("Mmad", "AscendDequant"):
        ours = [site for site in qop if site.api == api]
        theirs = [site for site in qdq if site.api == api]
        for one, other in zip(ours, theirs, strict=True):
            assert (one.m, one.n, one.k) == (other.m, other.n, other.k)
            for name in ("weight", "bias"):
                assert np.array_equal(one.constants.get(name, 0), other.constants.get(name, 0))
            assert one.scale is None or np.array_equal(one.scale, other.scale)
    from qconvert.check import check

    report = check(str(ROOT / "models" / "digits_cnn.qop.onnx"), backend="ascendc")
    assert report.verdict == "PASSED"
    qlinear = [layer for layer in report.layers.values() if layer.op_type in ("QLinearConv", "QGemm")]
    assert len(qlinear) == 3  # each QLinearConv / QGemm node a case: Mmad + AscendDequant + AscendQuant
    assert all(
        layer.verdict == "pass" and layer.mismatches == layer.predicted_mismatches for layer in qlinear
    )


def test_per_channel_pads_to_32_channels_and_records_it() -> None:
    (site,) = _graph(_per_channel()).sites[:1]
    assert site.mode == "PER_CHANNEL" and site.channels == 10 and site.n == 32
    assert "10 channels padded to 32" in (site.padding or "")
    assert site.scale is not None and np.all(site.scale[10:] == 0)


# Product matrix -------------------------------------------------------------------------------------------


def test_per_token_is_refused_on_atlas_a2_and_taken_by_atlas_350() -> None:
    model = _qdq((2, 8, 32), np.linspace(0.01, 0.08, 8), np.zeros(8, np.int8), axis=1, dequantize=False)
    with pytest.raises(InputError) as refused:
        _graph(model, "atlas-a2")
    assert "node 'quantize'" in refused.value.message and "PER_TOKEN" in refused.value.message
    assert "atlas-350" in refused.value.message
    sites = _graph(model, "atlas-350").sites
    assert sites[0].mode == "PER_TOKEN"


def test_no_quant_api_on_atlas_200i_500_a2() -> None:
    with pytest.raises(InputError) as refused:
        _graph(_per_channel(), "atlas-200i-500-a2")
    assert "has no AscendQuant" in refused.value.message and "atlas-a2" in refused.value.message


def test_fp8_destination_needs_a_950_part() -> None:
    scale = np.array(0.05, np.float32)
    zero = numpy_helper.from_array(np.array(0, np.float32), "z")
    zero.data_type = TensorProto.FLOAT8E4M3FN
    zero.ClearField("float_data")
    zero.raw_data = b"\x00"
    model = _qdq((4, 32), scale, np.array(0, np.float32), dequantize=False)
    model.graph.initializer[1].CopyFrom(zero)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT8E4M3FN
    with pytest.raises(InputError) as refused:
        _graph(model, "atlas-a2")
    assert "float8_e4m3fn" in refused.value.message and "atlas-350" in refused.value.message
    assert _graph(model, "atlas-350").sites[0].dst_type == "float8_e4m3fn"


def test_group_size_not_a_multiple_of_32_cannot_be_padded() -> None:
    model = _qdq(
        (4, 64), np.full((4, 4), 0.05), np.zeros((4, 4), np.int8), axis=1, block_size=16, dequantize=False
    )
    with pytest.raises(InputError) as refused:
        _graph(model, "atlas-350")
    assert "groupSize must be a positive multiple of 32" in refused.value.message


def test_round_modes_only_where_the_api_has_them() -> None:
    with pytest.raises(InputError, match="CAST_NONE"):
        parse_options(get_backend("ascendc"), {"product": "atlas-a2", "round-mode": "round"})
    with pytest.raises(InputError, match="PER_TENSOR form casts with CAST_RINT"):
        _graph(_dynamic(), "atlas-350", "round")  # a run-time scale has no PER_TOKEN rewrite
    model = _qdq((2, 8, 32), np.linspace(0.01, 0.08, 8), np.zeros(8, np.int8), axis=1, dequantize=False)
    assert _graph(model, "atlas-350", "round").sites[0].round_mode == "round"


def _rounded_models() -> dict[str, onnx.ModelProto]:
    rng = np.random.default_rng(11)
    return {
        "per_tensor": _qdq((4, 3, 40), np.array(0.0371), np.array(3, np.int8), dequantize=False),
        "per_channel": _qdq(
            (40, 16),
            rng.uniform(0.01, 0.1, 16),
            rng.integers(-20, 20, 16).astype(np.int8),
            axis=1,
            dequantize=False,
        ),
    }


@pytest.mark.parametrize("round_mode", ["round", "floor", "ceil", "trunc", "hybrid"])
def test_every_round_mode_on_per_tensor_and_per_channel_sites(tmp_path: Path, round_mode: str) -> None:
    """atlas-350: PER_TENSOR goes as PER_TOKEN rows and PER_CHANNEL as PER_GROUP (kDim 0, groupSize 32),
    the forms whose config takes a round mode; callgraph.json records it, and check judges each element
    against onnxruntime with the prediction of that round mode (float32 compute: those forms' scaleT)."""
    from qconvert.check import check

    expected = {"per_tensor": ("PER_TOKEN", None), "per_channel": ("PER_GROUP", 32)}
    for label, model in _rounded_models().items():
        artifact = build_artifact(
            import_onnx(model), AscendcOptions(product="atlas-350", round_mode=round_mode)
        )
        (entry,) = json.loads(artifact.files["callgraph.json"])["sites"]
        mode, group = expected[label]
        assert entry["mode"] == mode and entry["template"]["policy"] == mode
        cast = "CAST_RINT" if round_mode == "hybrid" else f"CAST_{round_mode.upper()}"  # hybrid: HiF8 only
        assert entry["roundMode"] == cast == entry["template"]["config"]["roundMode"], label
        assert entry.get("groupSize") == group and f"--round-mode {round_mode}" in entry["note"]
        path = tmp_path / f"{label}.onnx"
        onnx.save(model, path)
        report = check(str(path), backend="ascendc", product="atlas-350", round_mode=round_mode)
        (layer,) = [layer for layer in report.layers.values() if layer.op_type == "QuantizeLinear"]
        assert layer.verdict == "pass", (label, layer.reason, layer.explanation)
        assert layer.mismatches == layer.predicted_mismatches, (label, layer.explanation)
        if round_mode in ("floor", "ceil", "trunc"):  # directed rounding parts from ONNX's nearest often
            assert layer.mismatches > layer.elements // 10, (label, layer.mismatches)


# Tiling: every element exactly once, tile by tile == whole tensor -------------------------------------------


def test_tiling_covers_every_element_once_and_tiles_equal_the_whole_tensor() -> None:
    from qconvert.backends.ascendc.emulate import emulate_site
    from qconvert.backends.ascendc.tiling import ELEMENT_BYTES, coverage, tiling_for

    small = dataclasses.replace(PRODUCTS["atlas-a2"], ub_bytes=16384, vector_cores=3)  # many tiles, 3 cores
    rng = np.random.default_rng(11)
    cases = [
        (_graph(_qdq((40, 96), np.array(0.037), np.array(3, np.int8))).sites[0], rng.normal(0, 2, (40, 96))),
        (_graph(_per_channel()).sites[0], rng.normal(0, 1, (600, 10))),
        (_graph(_weight_only_gemm()).sites[0], None),
        (_graph(_weight_only_cast_mul()).sites[0], None),
    ]
    digits = _graph(onnx.load(DIGITS))
    dequant = next(site for site in digits.sites if site.api == "AscendDequant" and site.feeds == "/fc/Gemm")
    dequant.m = 700  # an accumulator of 700 rows of 10 channels (rows padded to 16 int32)
    cases.append((dequant, rng.integers(-30000, 30000, (700, 10)).astype(np.int32)))
    per_channel = _graph(_qdq((300, 10), rng.uniform(0.01, 0.1, 10), np.zeros(10, np.int8), axis=1)).sites[0]
    cases.append((per_channel, rng.normal(0, 1, (300, 10))))
    checked = 0
    for site, source in cases:
        if source is None:
            source = site.constants["weight"]
        elif site.api == "AscendDequant":
            pass
        else:
            source = source.astype(np.float32)
            site.m = source.size // (site.channels or source.size) if site.mode == "PER_CHANNEL" else 1
            if site.mode == "PER_TENSOR":
                site.n = -(-source.size // 32) * 32
            site.shape = source.shape
        tiling = tiling_for(site, small)
        assert tiling is not None and tiling.tileCount is not None and tiling.tileCount > 1
        assert tiling.tailLen is not None
        for type_name in (site.src_type, site.dst_type):  # every length 32-byte aligned in UB
            assert tiling.tileLen * ELEMENT_BYTES[type_name] % 32 == 0
            assert tiling.tailLen * ELEMENT_BYTES[type_name] % 32 == 0
        if site.mode == "PER_CHANNEL" and site.api == "AscendQuant":
            assert tiling.rowLen % 32 == 0 and tiling.tileLen % tiling.rowLen == 0  # calCount % scaleCount
        assert np.all(coverage(tiling) == 1)
        whole, _ = emulate_site(site, source)
        tiled, _ = emulate_site(site, source, tiling)
        assert tiled.shape == source.shape and np.array_equal(tiled, whole)
        checked += 1
    assert checked == 6
    # PER_TOKEN (atlas-350): tiles of whole rows, 8 at a time, each with its slice of the per-row scales
    token = _qdq((4, 16, 32), np.linspace(0.01, 0.08, 16), np.zeros(16, np.int8), axis=1, dequantize=False)
    site = _graph(token, "atlas-350").sites[0]
    tiling = tiling_for(site, dataclasses.replace(PRODUCTS["atlas-350"], ub_bytes=8192, vector_cores=3))
    assert site.mode == "PER_TOKEN" and tiling is not None and tiling.tileCount == 4
    assert tiling.tileLen % (8 * tiling.rowLen) == 0 and np.all(coverage(tiling) == 1)
    source = rng.normal(0, 1, (4, 16, 32)).astype(np.float32)
    assert np.array_equal(emulate_site(site, source, tiling)[0], emulate_site(site, source)[0])


# Kernels compile against the stub header -----------------------------------------------------------------


def _compiler() -> str:
    found = shutil.which("g++") or shutil.which("clang++")
    if found is None:
        reason = "no C++ compiler (g++ / clang++) for the kernels' compile check"
        if engines_required():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found


def test_every_generated_kernel_compiles_against_the_stub(tmp_path: Path) -> None:
    compiler = _compiler()
    models = {
        "digits": (onnx.load(DIGITS), "atlas-a2", "rint"),
        "per_channel": (_per_channel(), "atlas-a2", "rint"),
        "weight_only": (_weight_only_gemm(), "atlas-a2", "rint"),
        "weight_only_cast_mul": (_weight_only_cast_mul(), "atlas-a2", "rint"),
        "int4": (_int4_weight_only(), "atlas-a2", "rint"),
        "dynamic": (_dynamic(), "atlas-a2", "rint"),
        "digits_950": (onnx.load(DIGITS), "atlas-350", "rint"),
        "per_token": (
            _qdq((2, 8, 32), np.linspace(0.01, 0.08, 8), np.zeros(8, np.int8), axis=1, dequantize=False),
            "atlas-350",
            "round",
        ),
        "floor_per_tensor": (_rounded_models()["per_tensor"], "atlas-350", "floor"),
        "floor_per_channel": (_rounded_models()["per_channel"], "atlas-350", "floor"),
    }
    compiled = set()
    for label, (model, product, round_mode) in models.items():
        artifact = build_artifact(import_onnx(model), AscendcOptions(product=product, round_mode=round_mode))
        arch = PRODUCTS[product].npu_arch or 2201
        for name, data in artifact.files.items():
            if not name.endswith(".cpp"):
                continue
            source = tmp_path / f"{label}_{os.path.basename(name)}"
            source.write_bytes(data)
            text = data.decode()
            for part in ("TPipe", "TQue<TPosition::VECIN, BUFS>", "CopyIn", "Compute", "CopyOut", "BUFS = 2"):
                assert part in text, (name, part)
            result = subprocess.run(
                [
                    compiler,
                    "-std=c++17",
                    "-fsyntax-only",
                    "-Wall",
                    "-Werror",
                    f"-D__NPU_ARCH__={arch}",
                    f"-I{STUB}",
                    str(source),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            assert result.returncode == 0, f"{label}/{name}:\n{result.stderr[-3000:]}"
            compiled.add(os.path.basename(name))
    assert {
        "ascend_quant_per_tensor_float32_to_int8.cpp",
        "ascend_quant_per_channel_float32_to_int8.cpp",
        "ascend_dequant_per_channel_int32_to_float32.cpp",
        "ascend_antiquant_per_tensor_int8_to_float16.cpp",
        "ascend_antiquant_per_channel_int8_to_float16_transpose.cpp",
        "ascend_quant_per_token_float32_to_int8_round.cpp",
        "ascend_antiquant_per_channel_int4_to_float16.cpp",
        "ascend_quant_per_tensor_float32_to_int8_runtime_scale.cpp",
    } <= compiled


def test_a_wrong_call_does_not_compile_against_the_stub(tmp_path: Path) -> None:
    """The stub is strict enough to catch a kernel bug: the PER_CHANNEL call without its counts."""
    compiler = _compiler()
    artifact = build_artifact(import_onnx(_per_channel()), AscendcOptions())
    (name,) = [n for n in artifact.files if n.endswith(".cpp") and "ascend_quant_per_channel" in n]
    broken = artifact.files[name].decode().replace("tl_.rowLen, tl_.rowLen, len);", "len);")
    source = tmp_path / "broken.cpp"
    source.write_text(broken)
    result = subprocess.run(
        [compiler, "-std=c++17", "-fsyntax-only", f"-I{STUB}", str(source)], capture_output=True, check=False
    )
    assert result.returncode != 0


# check --backend ascendc ---------------------------------------------------------------------------------


def test_check_digits_every_site_against_onnxruntime() -> None:
    from qconvert.check import check

    report = check(str(DIGITS), backend="ascendc")
    assert report.verdict == "PASSED", report.verdict
    quantize = [layer for layer in report.layers.values() if layer.op_type == "QuantizeLinear"]
    assert len(quantize) == 7
    assert all(layer.mismatches == layer.predicted_mismatches for layer in quantize)
    assert all(layer.max_lsb_diff is None or layer.max_lsb_diff <= 1 for layer in quantize)
    differing = sum(layer.mismatches for layer in quantize)
    elements = sum(layer.elements for layer in quantize)
    assert 0 < differing < 0.05 * elements  # the half pipeline is not ONNX's division: a few one-step offs
    # 7 Q + 13 DQ sites, and conv1 / conv2 / fc as Mmad + AscendDequant + AscendQuant groups; float nodes are
    # end to end only
    assert len(report.layers) == 23
    groups = [layer for layer in report.layers.values() if layer.group]
    assert [layer.op_type for layer in groups] == ["Conv", "Conv", "Gemm"]
    assert all(layer.verdict == "pass" and layer.mismatches == layer.predicted_mismatches for layer in groups)
    assert sum(layer.mismatches for layer in groups) > 0


def test_cli_refusal_exits_2_and_leaves_no_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from qconvert.cli import main

    target = tmp_path / "out"
    code = main(
        ["convert", str(DIGITS), "--to", "ascendc", "-o", str(target), "--product", "atlas-200i-500-a2"]
    )
    assert code == 2 and "has no AscendQuant" in capsys.readouterr().err
    assert not target.exists() and list(tmp_path.iterdir()) == []
    assert main(["convert", str(DIGITS), "--to", "ascendc", "-o", str(target), "--quiet"]) == 0
    assert (target / "callgraph.json").exists() and (target / "tiling.json").exists()


def test_the_folder_is_deterministic(tmp_path: Path) -> None:
    """Two conversions write the same files, byte for byte (the call graph, kernels, tiling, constants)."""
    folders = []
    for name in ("first", "second"):
        folder = tmp_path / name
        write(convert(str(DIGITS), to="ascendc"), str(folder), to="ascendc")
        folders.append({str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()})
    assert folders[0] == folders[1] and len(folders[0]) == 2 + 3 + 18  # 2 json, 3 kernels, 9 .npy + .bin


def _asymmetric_weights() -> onnx.ModelProto:
    """x -> Q/DQ (uint8) -> Conv with uint8 weights whose per-channel zero points are not 128 (w - zw spans
    more than int8: the accumulator correction) -> Q/DQ -> MatMul with int8 weights, zero point 3, codes
    within [-100, 100] (w - zw fits int8: folded) -> Q/DQ."""
    rng = np.random.default_rng(21)
    conv_w = rng.integers(0, 256, (8, 4, 3, 3), dtype=np.uint8)
    conv_zero = rng.integers(100, 160, 8).astype(np.uint8)
    matmul_w = rng.integers(-100, 101, (6, 16), dtype=np.int8)
    tensors = {
        "xs": np.array(0.02, np.float32),
        "xz": np.array(120, np.uint8),
        "cw": conv_w,
        "cws": rng.uniform(0.002, 0.01, 8).astype(np.float32),
        "cwz": conv_zero,
        "cs": np.array(0.05, np.float32),
        "cz": np.array(110, np.uint8),
        "mw": matmul_w,
        "mws": np.array(0.01, np.float32),
        "mwz": np.array(3, np.int8),
        "ms": np.array(0.04, np.float32),
        "mz": np.array(7, np.uint8),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="x_q"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="x_dq"),
        helper.make_node("DequantizeLinear", ["cw", "cws", "cwz"], ["cwd"], name="conv_w_dq", axis=0),
        helper.make_node("Conv", ["xd", "cwd"], ["c"], name="conv"),
        helper.make_node("QuantizeLinear", ["c", "cs", "cz"], ["cq"], name="conv_q"),
        helper.make_node("DequantizeLinear", ["cq", "cs", "cz"], ["cd"], name="conv_dq"),
        helper.make_node("DequantizeLinear", ["mw", "mws", "mwz"], ["mwd"], name="matmul_w_dq"),
        helper.make_node("MatMul", ["cd", "mwd"], ["m"], name="matmul"),
        helper.make_node("QuantizeLinear", ["m", "ms", "mz"], ["mq"], name="matmul_q"),
        helper.make_node("DequantizeLinear", ["mq", "ms", "mz"], ["y"], name="matmul_dq"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 4, 8, 8))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 8, 6, 16))],
        [numpy_helper.from_array(value, name) for name, value in tensors.items()],
    )


def test_mmad_takes_weight_zero_points_folded_or_by_correction(tmp_path: Path) -> None:
    from qconvert.check import check

    model = _asymmetric_weights()
    graph = _graph(model)
    conv, matmul = [site for site in graph.sites if site.api == "Mmad"]
    codes = numpy_helper.to_array(model.graph.initializer[2]).astype(np.int64)
    zero = numpy_helper.to_array(model.graph.initializer[4]).astype(np.int64)
    assert np.array_equal(conv.constants["weight"], (codes - 128).astype(np.int8))
    assert np.array_equal(conv.constants["weight_offset"], 128 - zero)
    assert "weight_offset" not in matmul.constants and "folded" in (matmul.note or "")
    folded = numpy_helper.to_array(model.graph.initializer[7]).astype(np.int64) - 3
    assert np.array_equal(matmul.constants["weight"], folded.astype(np.int8))
    artifact = build_artifact(import_onnx(model), AscendcOptions())
    written = np.load(io.BytesIO(artifact.files[f"constants/site{conv.index:03d}_weight_offset.npy"]))
    assert written.dtype == np.int32 and np.array_equal(written, 128 - zero)
    path = tmp_path / "asymmetric.onnx"
    onnx.save(model, path)
    report = check(str(path), backend="ascendc")
    groups = [layer for layer in report.layers.values() if layer.group is not None]
    assert len(groups) == 2 and all(layer.verdict == "pass" for layer in groups), [
        (layer.node, layer.reason, layer.explanation) for layer in groups
    ]
    assert report.verdict == "PASSED", report.verdict_line


def _float8_qdq(element_type: int, scale: float) -> onnx.ModelProto:
    """x -> QuantizeLinear to a float8 type (zero point 0, saturate 1) -> DequantizeLinear -> y."""
    zero = helper.make_tensor("z", element_type, (), [0.0])
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quantize"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dequantize"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, 64))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (8, 64))],
        [numpy_helper.from_array(np.array(scale, np.float32), "s"), zero],
    )


def test_fp8_sites_are_judged_against_onnxruntime(tmp_path: Path) -> None:
    """atlas-350's fp8 AscendQuant (float32 x·(1/s), CAST_RINT, saturating) against onnxruntime's fp8
    QuantizeLinear (x/s): the elements that differ are exactly those predicted_mismatch_float8 names. The
    inputs sit on the fp8 grid's midpoints times s (where x·(1/s) and x/s can round apart), beyond its
    largest value (saturation) and at random. float8_e5m2 cannot be judged per node (onnxruntime's Python
    API returns no e5m2 tensor): tests/numerics/test_ascendc_float8_prediction.py judges its prediction."""
    import ml_dtypes

    from qconvert.check import check

    name = "float8_e4m3fn"
    dtype = np.dtype(ml_dtypes.float8_e4m3fn)
    element_type = TensorProto.FLOAT8E4M3FN
    scale = 0.0371
    grid = np.unique(np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64))
    grid = grid[np.isfinite(grid)]
    midpoints = (grid[:-1] + grid[1:]) / 2
    rng = np.random.default_rng(4)
    values = np.concatenate(
        [
            midpoints * scale,
            np.array([1e6, -1e6, np.inf, -np.inf]),
            rng.normal(0.0, 4.0, 512 - midpoints.size - 4),
        ]
    )
    x = rng.permutation(values).astype(np.float32).reshape(8, 64)
    path = tmp_path / f"{name}.onnx"
    onnx.save(_float8_qdq(element_type, scale), path)
    report = check(str(path), {"x": x}, backend="ascendc", product="atlas-350")
    layer = report.layers["quantize"]
    assert layer.verdict == "pass", layer.explanation
    assert layer.predicted_mismatches is not None and layer.mismatches == layer.predicted_mismatches
    assert layer.mismatches > 0, layer.explanation  # the midpoints do part the two roundings
    antiquant = report.layers["dequantize"]  # AscendAntiQuant of the fp8 codes (950), in half
    assert antiquant.verdict == "pass", (antiquant.reason, antiquant.explanation)
    report.write_json(tmp_path / "report.json")  # fp8 steps may be infinite: the JSON stays valid
    json.loads((tmp_path / "report.json").read_text())
    # End to end these chosen ties leave outputs one fp8 step off where onnxruntime agrees with itself
    # exactly (FAILED by the shared rule); on ordinary inputs the model passes.
    ordinary = rng.normal(0.0, 4.0, (8, 64)).astype(np.float32)
    assert check(str(path), {"x": ordinary}, backend="ascendc", product="atlas-350").verdict == "PASSED"


def test_weight_only_mul_is_judged_as_its_antiquant_call(tmp_path: Path) -> None:
    """The weight-only Cast -> Mul (a GRU-shaped [2, 24, 40] int8 weight, per-channel [1, 24, 1] scale) is
    a case of its own: the Mul judged as its AscendAntiQuant (half arithmetic: the elements that differ from
    onnxruntime's float32 all within the half rounding of scale and product), not as a float32 Mul."""
    from qconvert.check import check

    model = _weight_only_cast_mul()
    graph = model.graph
    graph.node.append(helper.make_node("Reshape", ["y", "shape"], ["rows"], name="reshape"))
    graph.node.append(helper.make_node("MatMul", ["x", "rows"], ["z"], name="matmul"))
    graph.initializer.append(numpy_helper.from_array(np.array([48, 40], np.int64), "shape"))
    graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 48)))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, (3, 40)))
    path = tmp_path / "weight_only.onnx"
    onnx.save(model, path)
    report = check(str(path), backend="ascendc")
    layer = report.layers["w_mul"]
    assert layer.family is None and "emulator" in (layer.evaluated_by or "")
    assert layer.verdict == "pass" and layer.elements == 2 * 24 * 40
    assert 0 < layer.mismatches == layer.predicted_mismatches, layer.explanation
    assert "matmul" not in report.layers  # a float MatMul stays an end-to-end matter
    assert report.verdict == "PASSED", report.verdict_line


def _qlinear_add_mul() -> onnx.ModelProto:
    """a, b uint8 [16, 64] -> QLinearAdd -> c; c, b -> QLinearMul (com.microsoft) -> y."""
    tensors = {
        "sa": np.array(0.0213, np.float32),
        "za": np.array(131, np.uint8),
        "sb": np.array(0.0371, np.float32),
        "zb": np.array(97, np.uint8),
        "sc": np.array(0.0517, np.float32),
        "zc": np.array(120, np.uint8),
        "sy": np.array(0.0631, np.float32),
        "zy": np.array(128, np.uint8),
    }
    nodes = [
        helper.make_node(
            "QLinearAdd",
            ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"],
            ["c"],
            name="add",
            domain="com.microsoft",
        ),
        helper.make_node(
            "QLinearMul",
            ["c", "sc", "zc", "b", "sb", "zb", "sy", "zy"],
            ["y"],
            name="mul",
            domain="com.microsoft",
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(name, TensorProto.UINT8, (16, 64)) for name in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, (16, 64))],
        [numpy_helper.from_array(value, name) for name, value in tensors.items()],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def test_qlinear_add_and_mul_are_judged_as_their_calls(tmp_path: Path) -> None:
    """QLinearAdd / QLinearMul nodes as AscendAntiQuant of each input, the float op and AscendQuant: each
    element one step off onnxruntime's kernel only where the half pipeline or the half inputs explain it."""
    from qconvert.check import check

    path = tmp_path / "qlinear.onnx"
    onnx.save(_qlinear_add_mul(), path)
    rng = np.random.default_rng(13)
    feeds = {name: rng.integers(0, 256, (16, 64), dtype=np.uint8) for name in ("a", "b")}
    report = check(str(path), feeds, backend="ascendc")
    for name in ("add", "mul"):
        layer = report.layers[name]
        assert layer.verdict == "pass", (name, layer.reason, layer.explanation)
        assert layer.elements == 16 * 64 and layer.mismatches == layer.predicted_mismatches
        assert "AscendAntiQuant (half) of each input" in (layer.explanation or "")
    assert sum(report.layers[name].mismatches for name in ("add", "mul")) > 0
