"""The quantized form's fusion as a pass (`stablehlo-legalize-qdq-to-quantized-op`) and the typed
dimension-number attributes it reads (backends/stablehlo/dimension_numbers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qconvert.backends.stablehlo.convert import convert_with_stats, stablehlo_text
from qconvert.backends.stablehlo.dimension_numbers import ConvDimensionNumbers, DotDimensionNumbers
from qconvert.errors import InputError
from qconvert.frontends.onnx import import_onnx
from qconvert.ir.attributes import OpaqueAttr
from qconvert.ir.parser import ParserOptions, parse_module
from qconvert.ir.printer import print_module
from qconvert.passes import get_pass

MODELS = Path(__file__).resolve().parents[3] / "models"


@pytest.mark.parametrize(
    "numbers",
    [
        DotDimensionNumbers(lhs_contracting=(1,), rhs_contracting=(0,)),
        DotDimensionNumbers((0,), (0,), (2,), (1,)),
        DotDimensionNumbers((0, 1), (0, 1), (3,), (2,)),
        DotDimensionNumbers(),
    ],
)
def test_dot_dimension_numbers_round_trip(numbers: DotDimensionNumbers) -> None:
    attribute = numbers.attribute()
    assert DotDimensionNumbers.parse(attribute) == numbers
    assert DotDimensionNumbers.parse(OpaqueAttr(attribute.text)).attribute() == attribute


@pytest.mark.parametrize(
    "numbers",
    [ConvDimensionNumbers.onnx(1), ConvDimensionNumbers.onnx(2), ConvDimensionNumbers.channels_last(2)],
)
def test_conv_dimension_numbers_round_trip(numbers: ConvDimensionNumbers) -> None:
    assert ConvDimensionNumbers.parse(numbers.attribute()) == numbers
    assert numbers.attribute().text.startswith("#stablehlo.conv<[")


def test_dimension_numbers_refuse_malformed_text() -> None:
    with pytest.raises(ValueError, match="same number of batching"):
        DotDimensionNumbers(lhs_batching=(0,))
    with pytest.raises(ValueError, match="bad field"):
        DotDimensionNumbers.parse(OpaqueAttr("#stablehlo.dot<lhs_contracting = [1]>"))
    with pytest.raises(ValueError, match="expected"):
        ConvDimensionNumbers.parse(OpaqueAttr("#stablehlo.conv<raw>"))


def test_every_dimension_number_attribute_of_a_converted_model_parses_back_to_its_text() -> None:
    """The text ops.py writes for a real model (tiny_encoder: dot_general with and without batching dims)
    is what the parsed numbers print."""
    module, _ = convert_with_stats(import_onnx(MODELS / "tiny_encoder.onnx"), "qdq")
    seen = 0
    for op in module.walk():
        if op.name == "stablehlo.dot_general":
            attribute = op.attributes["dot_dimension_numbers"]
            assert DotDimensionNumbers.parse(attribute).attribute() == attribute
            seen += 1
    assert seen > 0


@pytest.mark.parametrize("fuse_arithmetic", [False, True])
def test_the_pass_on_the_qdq_form_gives_the_quantized_form(fuse_arithmetic: bool) -> None:
    """Under --semantics stablehlo every quantize is a uniform_quantize, so the pass run by `qconvert opt`
    on the printed qdq form sees what the conversion's fusion sees: the same text, byte for byte."""
    model = MODELS / "tiny_encoder.qdq.onnx"
    qdq = stablehlo_text(import_onnx(model), "qdq", "stablehlo")
    expected, stats = convert_with_stats(
        import_onnx(model), "quantized", "stablehlo", fuse_arithmetic=fuse_arithmetic
    )
    module = parse_module(qdq, options=ParserOptions(allow_unregistered_dialect=True))
    options = {"semantics": "stablehlo", "fuse-arithmetic": str(fuse_arithmetic).lower()}
    assert get_pass("stablehlo-legalize-qdq-to-quantized-op", options).run(module).changed
    get_pass("dce").run(module)
    assert stats.fused_ops > 0
    assert print_module(module) == print_module(expected)


def test_the_pass_refuses_an_unknown_semantics() -> None:
    with pytest.raises(InputError, match="semantics 'mlas' is not one of onnx, stablehlo"):
        get_pass("stablehlo-legalize-qdq-to-quantized-op", {"semantics": "mlas"})
