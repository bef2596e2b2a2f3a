"""The quant-typed IR: types, attributes, ops, text syntax and verification. NOTE: imports no ONNX."""

from qconvert.ir import dialects
from qconvert.ir.core import Block, Builder, GenericOp, Operation, Region, Value
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.parser import ParserOptions, parse_module, parse_type
from qconvert.ir.printer import print_module
from qconvert.ir.verify import verify

__all__ = [
    "Block",
    "Builder",
    "GenericOp",
    "ModuleOp",
    "Operation",
    "ParserOptions",
    "Region",
    "Value",
    "dialects",
    "parse_module",
    "parse_type",
    "print_module",
    "verify",
]
