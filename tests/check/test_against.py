"""`qconvert check OUT.onnx --against MODEL`: a stripped model against its source, both in onnxruntime.

The stripped models are written by the onnx-storage backend from the sample digits CNN (QDQ); the tampered
ones are edited copies, which the check must report FAILED with the value named.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.check.against import BIT_EXACT, NOISE_FLOOR, check_against
from qconvert.check.report import FAILED, INCOMPLETE, NOT_RUN, PASS, PASSED
from qconvert.cli import main
from qconvert.convert import convert, write
from qconvert.errors import InputError
from qconvert.ir.parser import parse_type
from qconvert.storage_metadata import OUTPUT_KEY_PREFIX, StorageEntry, StorageMetadata

require_module("onnxruntime")

MODELS = Path(__file__).resolve().parents[2] / "models"
SOURCE = MODELS / "digits_cnn.qdq.onnx"
DATA = MODELS / "digits_cnn.inputs.npz"


def strip(out: Path, **options: str) -> Path:
    write(convert(str(SOURCE), to="onnx-storage", **options), str(out), to="onnx-storage")
    return out


@pytest.fixture(scope="module")
def stripped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return strip(tmp_path_factory.mktemp("against") / "digits.storage.onnx")


def rows(report) -> dict[tuple[str, str, str], object]:
    return {(r.name, r.what, r.level): r for r in report.results}


def metadata(model: onnx.ModelProto) -> StorageMetadata:
    return StorageMetadata.from_metadata_props({p.key: p.value for p in model.metadata_props}, "test")


def test_the_stripped_digits_cnn_is_bit_exact_with_optimizations_off_and_on(stripped: Path) -> None:
    report = check_against(stripped, SOURCE, str(DATA))
    assert report.verdict == PASSED and report.passed
    assert report.form == "qdq" and report.samples == 8
    assert set(rows(report)) == {
        ("image", "input", "off"),
        ("logits", "storage", "off"),
        ("logits", "dequantized", "off"),
        ("logits", "storage", "on"),
        ("logits", "dequantized", "on"),
    }
    for result in report.results:
        assert result.judged == BIT_EXACT and result.verdict == PASS
        assert result.comparison is not None and result.comparison.elements > 0
        assert result.mismatches == 0 and result.first is None
    assert rows(report)[("logits", "storage", "on")].comparison.elements == 80


def tampered(stripped: Path, tmp_path: Path, edit) -> Path:
    model = onnx.load(str(stripped))
    edit(model)
    path = tmp_path / "tampered.onnx"
    onnx.save(model, str(path))
    return path


def scale_the_last_quantize(model: onnx.ModelProto) -> None:
    """The scale of the QuantizeLinear that now produces 'logits' (the stripped output), times 1.5."""
    (last,) = [n for n in model.graph.node if "logits" in n.output]
    assert last.op_type == "QuantizeLinear"
    (scale,) = [t for t in model.graph.initializer if t.name == last.input[1]]
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(1.5), scale.name))


def test_a_tampered_inner_scale_is_failed_naming_the_output(stripped: Path, tmp_path: Path) -> None:
    path = tampered(stripped, tmp_path, scale_the_last_quantize)
    report = check_against(path, SOURCE, str(DATA))
    assert report.verdict == FAILED
    failed = {key for key, result in rows(report).items() if result.failure}
    assert failed == {
        (("logits", what, level)) for what in ("storage", "dequantized") for level in ("off", "on")
    }
    result = rows(report)[("logits", "storage", "off")]
    assert result.first is not None and result.first.batch == 0
    assert result.first.ours != result.first.reference
    assert result.failure.startswith(f"{result.mismatches}/80 elements differ, first at batch 0 index")
    assert rows(report)[("image", "input", "off")].verdict == PASS  # the input's metadata is untouched


def with_entry(kind_key: str, quant_type: str):
    def edit(model: onnx.ModelProto) -> None:
        (prop,) = [p for p in model.metadata_props if p.key == kind_key]
        prop.value = StorageEntry.of(parse_type(quant_type)).to_json()

    return edit


def test_tampered_metadata_is_failed_where_it_is_read(stripped: Path, tmp_path: Path) -> None:
    entry = metadata(onnx.load(str(stripped))).outputs["logits"]
    wrong = entry.quant_type.replace(f":{entry.zero_point[0]}>", f":{entry.zero_point[0] + 1}>")
    assert wrong != entry.quant_type
    path = tampered(stripped, tmp_path, with_entry(f"{OUTPUT_KEY_PREFIX}logits", wrong))
    report = check_against(path, SOURCE, str(DATA))
    assert report.verdict == FAILED
    failed = {key for key, result in rows(report).items() if result.failure}
    # The graph is untouched (its storage equals the source's); dequantizing it with the wrong zero point
    # does not give the source's float output.
    assert failed == {("logits", "dequantized", "off"), ("logits", "dequantized", "on")}
    assert rows(report)[("logits", "dequantized", "off")].mismatches == 80

    path = tampered(
        stripped, tmp_path, with_entry("qconvert.storage.input.image", "!quant.uniform<i8:f32, 0.5:-128>")
    )
    report = check_against(path, SOURCE, str(DATA))
    assert report.verdict == FAILED
    assert rows(report)[("image", "input", "off")].failure is not None


def test_outputs_left_float_are_compared_exactly(tmp_path: Path) -> None:
    path = strip(tmp_path / "inputs_only.onnx", outputs="none")
    report = check_against(path, SOURCE, str(DATA))
    assert report.verdict == PASSED
    assert set(rows(report)) == {
        ("image", "input", "off"),
        ("logits", "float", "off"),
        ("logits", "float", "on"),
    }
    assert rows(report)[("logits", "float", "on")].comparison.elements == 80


def test_an_output_the_stripped_model_lacks_is_incomplete(stripped: Path, tmp_path: Path) -> None:
    source = onnx.load(str(SOURCE))
    hidden = next(n.output[0] for n in source.graph.node if n.op_type == "Flatten")
    source.graph.output.append(onnx.ValueInfoProto(name=hidden))
    path = tmp_path / "source_more_outputs.onnx"
    onnx.save(source, str(path))
    report = check_against(stripped, path, str(DATA))
    assert report.verdict == INCOMPLETE
    (missing,) = [r for r in report.results if r.verdict == NOT_RUN]
    assert missing.name == hidden and "the stripped model has no output" in missing.reason


def test_the_qoperator_form_is_bit_exact_with_onnxruntime_fusions_and_within_the_floor(
    tmp_path: Path,
) -> None:
    path = strip(tmp_path / "digits.qop.onnx", form="qoperator")
    report = check_against(path, SOURCE, str(DATA))
    assert report.form == "qoperator"
    assert set(rows(report)) == {
        ("image", "input", "off"),
        ("logits", "storage", "on"),
        ("logits", "end to end", "on vs source off"),
    }
    end_to_end = rows(report)[("logits", "end to end", "on vs source off")]
    assert end_to_end.judged == NOISE_FLOOR and end_to_end.floor is not None
    assert end_to_end.comparison.sqnr_db > 30.0
    assert report.verdict == PASSED, [r.failure for r in report.results]


def test_models_that_do_not_belong_together_are_input_errors(stripped: Path) -> None:
    with pytest.raises(InputError, match=r"no qconvert\.storage metadata"):
        check_against(SOURCE, SOURCE, str(DATA))
    with pytest.raises(InputError, match="not a stripped copy of that model"):
        check_against(stripped, MODELS / "tiny_encoder.qdq.onnx")


def test_the_cli_exit_codes_and_json(
    stripped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_path = tmp_path / "report.json"
    code = main(
        ["check", str(stripped), "--against", str(SOURCE), "--data", str(DATA), "--json", str(report_path)]
    )
    out = capsys.readouterr().out
    assert code == 0 and "PASSED: 5 passed, 0 failed, 0 not run (8 samples)" in out
    written = json.loads(report_path.read_text())
    assert written["verdict"] == PASSED and len(written["comparisons"]) == 5

    path = tampered(stripped, tmp_path, scale_the_last_quantize)
    code = main(["check", str(path), "--against", str(SOURCE), "--data", str(DATA), "--quiet"])
    out = capsys.readouterr().out
    assert code == 1
    assert (
        "output 'logits' (storage, optimizations off):" in out and "elements differ, first at batch 0" in out
    )
    assert "FAILED: 1 passed, 4 failed, 0 not run (8 samples)" in out

    code = main(["check", str(stripped), "--against", str(SOURCE), "--backend", "stablehlo"])
    assert code == 2 and "not with --backend" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kind", "quant_type"),
    [
        (TensorProto.INT4, "!quant.uniform<i4:f32, 0.5:1>"),
        (TensorProto.UINT4, "!quant.uniform<u4:f32, 0.5:8>"),
    ],
)
def test_four_bit_boundaries_run_through_packed_values(kind: int, quant_type: str, tmp_path: Path) -> None:
    """int4 / uint4 at the boundary, which onnxruntime's Python API has no numpy type for: fed and read as
    packed OrtValues (check/ort_values.py), compared bit for bit; a stripped body that differs is FAILED."""
    scale, zero = (
        helper.make_tensor("s", TensorProto.FLOAT, [], [0.5]),
        helper.make_tensor("z", kind, [], [1]),
    )
    zero = helper.make_tensor("z", kind, [], [StorageEntry.of(parse_type(quant_type)).zero_point[0]])

    def model(nodes: list, input_kind: int, props: dict[str, str], name: str, factor: float = 2.0) -> Path:
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", input_kind, [2, 4])],
            [helper.make_tensor_value_info("y", input_kind, [2, 4])],
            [scale, zero, helper.make_tensor("factor", TensorProto.FLOAT, [], [factor])],
        )
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        proto.ir_version = 10
        for key, value in props.items():
            proto.metadata_props.add(key=key, value=value)
        onnx.save(proto, str(tmp_path / name))
        return tmp_path / name

    def body(quantized_input: str, quantized_output: str) -> list:
        return [
            helper.make_node("DequantizeLinear", [quantized_input, "s", "z"], ["dx"]),
            helper.make_node("Mul", ["dx", "factor"], ["m"]),
            helper.make_node("QuantizeLinear", ["m", "s", "z"], [quantized_output]),
        ]

    source_nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["qx"]),
        *body("qx", "qy"),
        helper.make_node("DequantizeLinear", ["qy", "s", "z"], ["y"]),
    ]
    source = model(source_nodes, TensorProto.FLOAT, {}, "source.onnx")
    entry = StorageEntry.of(parse_type(quant_type))
    props = StorageMetadata(inputs={"x": entry}, outputs={"y": entry}).metadata_props()
    x = {"x": np.array([[0.2, -1.3, 2.6, 9.0], [-0.75, 0.25, 1.0, -4.0]], np.float32)}

    report = check_against(model(body("x", "y"), kind, props, "stripped.onnx"), source, x)
    assert report.verdict == PASSED, [(r.label, r.failure, r.reason) for r in report.results]
    assert len(report.results) == 5 and all(r.comparison.elements == 8 for r in report.results)

    report = check_against(model(body("x", "y"), kind, props, "tampered.onnx", factor=1.0), source, x)
    assert report.verdict == FAILED
    storage = rows(report)[("y", "storage", "off")]
    assert storage.mismatches > 0 and storage.first is not None


def test_two_stripped_outputs_and_an_input_left_float(tmp_path: Path) -> None:
    """The sample tiny encoder: int64 token ids stay as they are, both outputs become int8 storage."""
    source = MODELS / "tiny_encoder.qdq.onnx"
    path = tmp_path / "encoder.storage.onnx"
    write(convert(str(source), to="onnx-storage"), str(path), to="onnx-storage")
    report = check_against(path, source, str(MODELS / "tiny_encoder.inputs.npz"))
    assert report.verdict == PASSED
    names = {(name, what) for name, what, _ in rows(report)}
    assert names == {(o, w) for o in ("last_hidden_state", "logits") for w in ("storage", "dequantized")}
    assert rows(report)[("last_hidden_state", "storage", "on")].comparison.elements == 2 * 16 * 64


def test_batches_merge_and_the_first_difference_names_its_batch(tmp_path: Path) -> None:
    """Two batches of a model with a dynamic batch dim: a tampered scale changes nothing on the all-zero first
    batch (0 quantizes to the zero point at any scale) and most of the second; the counts merge."""
    scale, zero = (
        helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]),
        helper.make_tensor("z", TensorProto.INT8, [], [3]),
    )
    wrong = helper.make_tensor("s_out", TensorProto.FLOAT, [], [0.1])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])

    def model(nodes: list, kind: int, props: dict[str, str], name: str, out_scale: float = 0.1) -> Path:
        wrong.float_data[:] = [out_scale]
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", kind, ["batch", 4])],
            [helper.make_tensor_value_info("y", kind, ["batch", 4])],
            [scale, zero, two, wrong],
        )
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        proto.ir_version = 10
        for key, value in props.items():
            proto.metadata_props.add(key=key, value=value)
        onnx.save(proto, str(tmp_path / name))
        return tmp_path / name

    def body(quantized_input: str, quantized_output: str) -> list:
        return [
            helper.make_node("DequantizeLinear", [quantized_input, "s", "z"], ["dx"]),
            helper.make_node("Mul", ["dx", "two"], ["m"]),
            helper.make_node("QuantizeLinear", ["m", "s_out", "z"], [quantized_output]),
        ]

    source_nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["qx"]),
        *body("qx", "qy"),
        helper.make_node("DequantizeLinear", ["qy", "s_out", "z"], ["y"]),
    ]
    source = model(source_nodes, TensorProto.FLOAT, {}, "source.onnx")
    entry = StorageEntry.of(parse_type("!quant.uniform<i8:f32, 0.1:3>"))
    props = StorageMetadata(inputs={"x": entry}, outputs={"y": entry}).metadata_props()
    rng = np.random.default_rng(0)
    data = [{"x": np.zeros((3, 4), np.float32)}, {"x": rng.normal(0, 3, (3, 4)).astype(np.float32)}]

    good = model(body("x", "y"), TensorProto.INT8, props, "good.onnx")
    report = check_against(good, source, data, batch_size=3)
    assert report.verdict == PASSED and report.samples == 6
    with pytest.raises(InputError, match="graph input 'x' has dynamic dims: give --data"):
        check_against(good, source)  # random inputs need static shapes
    assert rows(report)[("y", "storage", "off")].comparison.elements == 24

    bad = model(body("x", "y"), TensorProto.INT8, props, "bad.onnx", out_scale=0.13)
    report = check_against(bad, source, data, batch_size=3)
    assert report.verdict == FAILED
    storage = rows(report)[("y", "storage", "off")]
    assert storage.first is not None and storage.first.batch == 1
    assert 0 < storage.mismatches <= 12 and storage.comparison.elements == 24
