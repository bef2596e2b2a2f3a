"""Passes, one module each, registered under their MLIR names; `get_pass(name)` finds one lazily."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from qconvert.errors import InputError
from qconvert.ir.core import Operation
from qconvert.options import options_from_text

# MLIR pass name -> module that defines it (imported on first use).
PASS_MODULES: dict[str, str] = {
    "absorb-boundary-quant-casts": "qconvert.passes.absorb_boundary_quant_casts",
    "canonicalize": "qconvert.passes.canonicalize",
    "dce": "qconvert.passes.dce",
    "inline": "qconvert.passes.inline",
    "lower-quant-ops": "qconvert.passes.lower_quant_ops",
    "normalize-quant-types": "qconvert.passes.normalize_quant_types",
    "qoperator-to-qdq": "qconvert.passes.qoperator_to_qdq",
    "strip-func-quant-types": "qconvert.passes.strip_func_quant_types",
}
PASS_REGISTRY: dict[str, type[ModulePass]] = {}


@dataclass(frozen=True)
class PassResult:
    changed: bool


@dataclass(frozen=True, kw_only=True)
class ModulePass:
    """A pass: valid IR in, valid IR out. Options are dataclass fields (`--name=opt=value`)."""

    name: ClassVar[str]

    def run(self, module: Operation) -> PassResult:
        raise NotImplementedError


PassT = TypeVar("PassT", bound=type["ModulePass"])


def register_pass(cls: PassT) -> PassT:
    assert cls.name not in PASS_REGISTRY, f"pass {cls.name} registered twice"
    PASS_REGISTRY[cls.name] = cls
    return cls


def get_pass(
    name: str, options: dict[str, str] | None = None, modules: Mapping[str, str] = PASS_MODULES
) -> ModulePass:
    """Instantiate the pass registered as `name`, converting textual options to the fields' types;
    `modules` says where passes are defined (`qconvert opt` adds the backends' own passes)."""
    if name not in PASS_REGISTRY:
        if name not in modules:
            raise InputError(f"unknown pass '{name}'")
        importlib.import_module(modules[name])
    cls = PASS_REGISTRY[name]
    return cls(**options_from_text(cls, options or {}, f"pass '{name}'"))
