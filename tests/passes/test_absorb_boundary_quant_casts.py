"""absorb-boundary-quant-casts: @main takes the types its inputs are quantized to and returns what its exit
dequantizes read; with strip-storage, the storage signature onnx-storage writes."""

from __future__ import annotations

import pytest

from qconvert.errors import InputError
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.parser import ParserOptions, parse_module
from qconvert.ir.printer import print_module
from qconvert.ir.verify import verify
from qconvert.passes import get_pass
from qconvert.passes.absorb_boundary_quant_casts import (
    absorb_boundary_quant_casts,
    parse_selection,
    strip_storage_signature,
)

Q = "!quant.uniform<u8:f32, 5.000000e-01:10>"
SOURCE = f"""
!q = {Q}
func.func @main(%arg0: tensor<4xf32> {{onnx.name = "x"}}, %arg1: tensor<4xf32> {{onnx.name = "z"}})
    -> (tensor<4xf32> {{onnx.name = "y"}}, tensor<4xf32> {{onnx.name = "w"}}) {{
  %0 = quant.qcast %arg0 : tensor<4xf32> to tensor<4x!q>
  %1 = quant.dcast %0 : tensor<4x!q> to tensor<4xf32>
  %2 = "onnx.Relu"(%1) {{onnx.node_name = "relu"}} : (tensor<4xf32>) -> tensor<4xf32>
  %3 = quant.qcast %2 : tensor<4xf32> to tensor<4x!q>
  %4 = quant.dcast %3 : tensor<4x!q> to tensor<4xf32>
  %5 = "onnx.Add"(%4, %arg1) {{onnx.node_name = "add"}} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %4, %5 : tensor<4xf32>, tensor<4xf32>
}}
"""


def parse(text: str) -> ModuleOp:
    return parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))


def test_inputs_take_their_quantized_type_and_outputs_return_what_their_dequantize_read() -> None:
    module = parse(SOURCE)
    boundary = absorb_boundary_quant_casts(module)
    verify(module)
    text = print_module(module)
    assert f'@main(%arg0: tensor<4x{Q}> {{onnx.name = "x"}}, %arg1: tensor<4xf32>' in text
    assert f'-> (tensor<4x{Q}> {{onnx.name = "y"}}, tensor<4xf32> {{onnx.name = "w"}})' in text
    assert "quant.qcast %arg0" not in text and f"quant.dcast %arg0 : tensor<4x{Q}>" in text
    assert f"return %2, %4 : tensor<4x{Q}>, tensor<4xf32>" in text  # y's dequantize stays: the Add reads it
    assert list(boundary.inputs) == ["x"] and list(boundary.outputs) == ["y"]
    assert boundary.float_reasons == {
        "z": "not quantized on entry (read by 'onnx.Add' (node 'add'))",
        "w": "not dequantized on exit (computed by 'onnx.Add' (node 'add'))",
    }


def test_strip_storage_gives_the_storage_signature_with_scast_glue() -> None:
    module = parse(SOURCE)
    assert get_pass("absorb-boundary-quant-casts", {"strip-storage": "true"}).run(module).changed
    verify(module)
    text = print_module(module)
    assert '%arg0: tensor<4xi8> {onnx.elem_type = "uint8", onnx.name = "x"}' in text
    assert '-> (tensor<4xi8> {onnx.elem_type = "uint8", onnx.name = "y"}' in text
    assert f"%0 = quant.scast %arg0 : tensor<4xi8> to tensor<4x{Q}>" in text
    assert f"quant.scast %3 : tensor<4x{Q}> to tensor<4xi8>" in text
    # strip-func-quant-types' own run would fold dcast(qcast(x)) inside the body: here it stays
    assert text.count("quant.dcast") == 2 and text.count("quant.qcast") == 1


def test_selection_by_name_refuses_what_cannot_be_absorbed_and_changes_nothing() -> None:
    module = parse(SOURCE)
    before = print_module(module)
    with pytest.raises(InputError, match=r"input 'z' cannot be stripped: not quantized on entry"):
        absorb_boundary_quant_casts(module, inputs="x,z")
    with pytest.raises(InputError, match=r"--outputs: no graph output named 'v'; the model's are 'y', 'w'"):
        absorb_boundary_quant_casts(module, outputs="v")
    assert print_module(module) == before
    boundary = absorb_boundary_quant_casts(module, inputs="none", outputs="y")
    assert list(boundary.inputs) == [] and list(boundary.outputs) == ["y"]
    assert boundary.float_reasons["x"] == "not selected (--inputs)"


def test_selection_text() -> None:
    assert parse_selection("all", "--inputs") is None
    assert parse_selection("none", "--inputs") == ()
    assert parse_selection("a, b", "--inputs") == ("a", "b")
    with pytest.raises(InputError, match="an empty name"):
        parse_selection("a,,b", "--inputs")


def test_shape_readers_may_read_a_stripped_input_and_then_read_its_storage() -> None:
    module = parse(
        f"""
        !q = {Q}
        func.func @main(%arg0: tensor<4xf32> {{onnx.name = "x"}}) -> (tensor<1xi64> {{onnx.name = "s"}}) {{
          %0 = quant.qcast %arg0 : tensor<4xf32> to tensor<4x!q>
          %1 = "onnx.Shape"(%arg0) {{onnx.node_name = "shape"}} : (tensor<4xf32>) -> tensor<1xi64>
          return %1 : tensor<1xi64>
        }}
        """
    )
    boundary = absorb_boundary_quant_casts(module)
    assert list(boundary.inputs) == ["x"]
    strip_storage_signature(module)
    verify(module)
    assert '"onnx.Shape"(%arg0) {onnx.node_name = "shape"} : (tensor<4xi8>) -> tensor<1xi64>' in print_module(
        module
    )
