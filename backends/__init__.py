"""Backends: lower the qconvert IR to artifacts and run them on real engines (`qconvert.backends`).

One registry that `qconvert.convert`, `qconvert.check` and the CLI (its flags' help) all read:

    from qconvert.backends import get_backend, backend_names, parse_options
    backend = get_backend("stablehlo")
    options = parse_options(backend, {"form": "integer", "fuse-arithmetic": "false"})
    artifact = backend.convert(module, options)
    backend.write(artifact, "out.mlir")

A backend is one package whose facade (`__init__.py`) exposes `BACKEND`, an object with the `Backend`
protocol; adding one is that folder plus one line in `BACKEND_MODULES`. Its options are the fields of
a frozen dataclass (`Backend.Options`, fields made with `qconvert.options.option`: help and choices
in their metadata, rules between them in `__post_init__`), parsed like pass options. Importing this
package imports no backend (nor jax, nor onnx): each loads on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any, Protocol

from qconvert.did_you_mean import did_you_mean
from qconvert.errors import InputError
from qconvert.options import CHOICES, HELP, flag, option_fields, options_from_text

if TYPE_CHECKING:
    from onnx import ModelProto

    from qconvert.check.backends import CheckBackend
    from qconvert.ir.dialects.builtin import ModuleOp

# Backend name -> the package whose facade defines it as `BACKEND` (imported on first use).
BACKEND_MODULES: dict[str, str] = {
    "stablehlo": "qconvert.backends.stablehlo",
    "onnx": "qconvert.backends.onnx",
    "onnx-storage": "qconvert.backends.onnx_storage",
    "tosa": "qconvert.backends.tosa",
    "ascendc": "qconvert.backends.ascendc",
}


def lazy_exports(package: str, exports: Mapping[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A backend facade's module `__getattr__` (PEP 562): each public name, `exports[name] = (module of the
    package, its name there)`, is imported on first use, so that reading `BACKEND` imports no engine."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = exports[name]
        return getattr(importlib.import_module(f"{package}.{module}"), attribute)

    return __getattr__


# Passes on a backend's own dialect (MLIR name -> the backend's module that registers it), which `qconvert
# opt` runs beside qconvert.passes' own: declared with the backends, so that the core names none of them.
BACKEND_PASS_MODULES: dict[str, str] = {
    "stablehlo-legalize-qdq-to-quantized-op": "qconvert.backends.stablehlo.legalize_qdq_to_quantized_op",
    "onnx-qdq-to-qoperator": "qconvert.backends.onnx.qoperator_fusion",
}


class Backend(Protocol):
    """What `convert`, `check` and the CLI need from a backend."""

    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> str:
        """What `--to NAME` writes, in a few words (the CLI's help)."""
        ...

    @property
    def Options(self) -> type:
        """The frozen dataclass of the backend's options; `__post_init__` raises InputError."""
        ...

    @property
    def engines(self) -> tuple[str, ...]:
        """The engines `check` can run the artifact on; () when none."""
        ...

    @property
    def default_engine(self) -> str | None: ...

    def convert(self, module: ModuleOp, options: Any) -> Any:
        """The artifact of the lifted `module`; InputError listing what cannot be converted."""
        ...

    def write(self, artifact: Any, output: str | IO[str]) -> None:
        """Write the artifact to a stream or a path (atomically); InputError when it cannot go there."""
        ...

    def check_runner(
        self, options: Any, engine: str | None, lift: Callable[[ModelProto], ModuleOp]
    ) -> CheckBackend | None:
        """What runs `check`'s cases on `engine` (None: the default), or None when the backend has none.
        `lift` is the ONNX frontend's (check passes it: backends do not import frontends)."""
        ...


class BackendRegistry:
    """Backends by name: entries of `modules` load lazily; `register` adds one directly (tests)."""

    def __init__(self, modules: Mapping[str, str]) -> None:
        self.modules = dict(modules)
        self.loaded: dict[str, Backend] = {}

    def register(self, backend: Backend) -> None:
        assert backend.name not in self.names(), f"backend {backend.name} registered twice"
        self.loaded[backend.name] = backend

    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.modules, *self.loaded]))

    def get(self, name: str) -> Backend:
        """The backend called `name`; InputError naming the available ones when there is none."""
        if name not in self.loaded:
            if name not in self.modules:
                suggestion = did_you_mean(name, self.names())
                raise InputError(
                    f"unknown backend '{name}'; available: {', '.join(self.names())}{suggestion}"
                )
            self.loaded[name] = importlib.import_module(self.modules[name]).BACKEND
        return self.loaded[name]

    def __iter__(self) -> Iterator[Backend]:
        return (self.get(name) for name in self.names())


REGISTRY = BackendRegistry(BACKEND_MODULES)


def get_backend(name: str) -> Backend:
    return REGISTRY.get(name)


def backend_names() -> tuple[str, ...]:
    return REGISTRY.names()


def given_options(options: Mapping[str, object]) -> dict[str, object]:
    """The options a caller gave: None is "not given", and so is False (a flag left off)."""
    return {key: value for key, value in options.items() if value is not None and value is not False}


def described(options: Mapping[str, object]) -> str:
    """`--form integer, --fuse-arithmetic`: the options as a command line gives them, for messages."""
    return ", ".join(flag(k) if v is True else f"{flag(k)} {v}" for k, v in options.items())


def parse_options(
    backend: Backend, options: Mapping[str, object], registry: BackendRegistry = REGISTRY
) -> Any:
    """`backend.Options` from `options` (text or values, by field name; None and False are not given).

    InputError for an option the backend does not take: "only the X backend takes these options" when
    another backend of `registry` takes it, else the backend's list of options; and whatever the
    Options' own validation raises (a bad choice, options that exclude each other)."""
    given = given_options(options)
    fields = option_fields(backend.Options)
    foreign = {k: v for k, v in given.items() if k.replace("-", "_") not in fields}
    takers = [
        other.name for other in registry if foreign and set(foreign) <= set(option_fields(other.Options))
    ]
    if foreign and takers:
        raise InputError(f"{described(foreign)}: only the {' / '.join(takers)} backend takes these options")
    return backend.Options(**options_from_text(backend.Options, given, f"backend '{backend.name}'"))


def option_help(name: str, registry: BackendRegistry = REGISTRY) -> str:
    """The help of option `name` across the backends that take it: `stablehlo: quantize rounding (onnx |
    stablehlo; default onnx)`; the CLI's help texts come from here."""
    texts = []
    for backend in registry:
        field = option_fields(backend.Options).get(name)
        if field is None:
            continue
        choices = field.metadata.get(CHOICES, ())
        default = "" if isinstance(field.default, bool) else f"default {field.default}"
        detail = "; ".join(part for part in (" | ".join(choices), default) if part)
        texts.append(f"{backend.name}: {field.metadata.get(HELP, '')}" + (f" ({detail})" if detail else ""))
    return "; ".join(texts)


__all__ = [
    "BACKEND_MODULES",
    "REGISTRY",
    "Backend",
    "BackendRegistry",
    "backend_names",
    "described",
    "get_backend",
    "given_options",
    "option_help",
    "parse_options",
]
