"""The backend registry (`qconvert.backends`): lookup, options parsed like pass options, their errors.

A toy backend goes into a fresh registry, never the global one; the real backends' options are checked
through the same functions `convert`, `check` and the CLI call.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from dataclasses import dataclass
from typing import IO, Any

import pytest

from qconvert.backends import (
    BACKEND_MODULES,
    REGISTRY,
    BackendRegistry,
    backend_names,
    get_backend,
    option_help,
    parse_options,
)
from qconvert.errors import InputError
from qconvert.options import check_choice, option


@dataclass(frozen=True, kw_only=True)
class ToyOptions:
    rounding: str = option("single", "toy rescale rounding", ["single", "double"])
    shift: int = option(0, "extra shift")
    verbose: bool = option(False, "say more")

    def __post_init__(self) -> None:
        check_choice("--rounding", self.rounding, ("single", "double"))
        if self.shift < 0:
            raise InputError(f"--shift {self.shift}: expected 0 or more")


class ToyBackend:
    name = "toy"
    summary = "a toy artifact"
    Options = ToyOptions
    engines = ("reference",)
    default_engine = "reference"

    def convert(self, module: Any, options: ToyOptions) -> Any:
        return ("converted", module, options)

    def write(self, artifact: Any, output: str | IO[str]) -> None:
        raise InputError("toy artifacts are not written")

    def check_runner(self, options: ToyOptions, engine: str | None, lift: Any) -> None:
        return None


@dataclass(frozen=True, kw_only=True)
class OtherOptions:
    opset: int = option(21, "opset written")


class OtherBackend(ToyBackend):
    name = "other"
    Options = OtherOptions  # type: ignore[assignment]
    engines = ()


def fresh() -> BackendRegistry:
    registry = BackendRegistry({})
    registry.register(ToyBackend())
    registry.register(OtherBackend())
    return registry


def test_a_registered_backend_is_found_and_listed() -> None:
    registry = fresh()
    assert registry.names() == ("toy", "other")
    assert registry.get("toy").summary == "a toy artifact"
    assert [backend.name for backend in registry] == ["toy", "other"]
    assert "toy" not in backend_names(), "the toy went into the global registry"
    with pytest.raises(InputError, match="unknown backend 'tosa'; available: toy, other"):
        registry.get("tosa")
    with pytest.raises(AssertionError, match="registered twice"):
        registry.register(ToyBackend())


def test_options_are_parsed_from_text_by_field_type_and_typed_values_kept() -> None:
    registry = fresh()
    toy = registry.get("toy")
    parsed = parse_options(toy, {"rounding": "double", "shift": "3", "verbose": "true"}, registry)
    assert parsed == ToyOptions(rounding="double", shift=3, verbose=True)
    assert parse_options(toy, {"shift": 2, "verbose": None}, registry) == ToyOptions(shift=2)
    assert parse_options(toy, {}, registry) == ToyOptions()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rounding": "triple"}, "unknown --rounding 'triple'; available: single, double"),
        ({"shift": "-1"}, "--shift -1: expected 0 or more"),
        ({"shift": "many"}, "backend 'toy': bad value 'many' for option 'shift'"),
        ({"verbose": "perhaps"}, "backend 'toy': bad value 'perhaps' for option 'verbose'"),
        ({"opset": 18}, "--opset 18: only the other backend takes these options"),
        ({"colour": "red"}, "backend 'toy' has no option 'colour' (options: rounding, shift, verbose)"),
    ],
)
def test_bad_options_are_input_errors(options: dict[str, object], message: str) -> None:
    registry = fresh()
    with pytest.raises(InputError) as error:
        parse_options(registry.get("toy"), options, registry)
    assert message in error.value.message


def test_help_comes_from_the_fields() -> None:
    assert option_help("rounding", fresh()) == "toy: toy rescale rounding (single | double; default single)"
    assert option_help("verbose", fresh()) == "toy: say more"
    assert option_help("absent", fresh()) == ""


def test_the_global_registry_holds_the_real_backends() -> None:
    assert backend_names() == tuple(BACKEND_MODULES)
    assert {"stablehlo", "onnx", "onnx-storage"} <= set(backend_names())
    assert get_backend("stablehlo") is REGISTRY.get("stablehlo")
    assert get_backend("stablehlo").engines == ("interpreter", "xla")
    assert get_backend("onnx").engines == ()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"form": "integer", "fuse_arithmetic": True},
            "--fuse-arithmetic fuses quantized ops: it takes the quantized form, not --form integer",
        ),
        (
            {"elide_weights": True, "inline_weights": True},
            "--elide-weights and --inline-weights exclude each other",
        ),
        ({"form": "fused"}, "unknown --form 'fused'; available: quantized, integer, qdq"),
        ({"semantics": "ieee"}, "unknown --semantics 'ieee'; available: onnx, stablehlo"),
    ],
)
def test_stablehlo_options_refuse_what_they_refused_before(options: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as error:
        parse_options(get_backend("stablehlo"), options)
    assert error.value.message == message


def test_convert_refuses_an_option_of_another_backend_before_reading_the_model(tmp_path: Any) -> None:
    from qconvert.convert import convert

    with pytest.raises(InputError) as error:
        convert(str(tmp_path / "absent.onnx"), to="onnx", elide_weights=True)
    assert error.value.message == "--elide-weights: only the stablehlo backend takes these options"
    with pytest.raises(InputError, match="unknown --to 'tflite'; available: stablehlo, onnx"):
        convert(str(tmp_path / "absent.onnx"), to="tflite")


@pytest.mark.parametrize("name", sorted(BACKEND_MODULES))
def test_each_facade_exports_what_its_all_says(name: str) -> None:
    facade = importlib.import_module(BACKEND_MODULES[name])
    assert facade.__all__ == sorted(facade._EXPORTS)
    for public in facade.__all__:
        assert getattr(facade, public) is not None
    assert facade.BACKEND.name == name


def test_importing_the_registry_and_the_options_imports_no_engine() -> None:
    """The CLI reads every backend's options for its help: that must not load jax or onnx."""
    code = (
        "import sys, qconvert.backends as b\n"
        "for backend in b.REGISTRY: backend.Options()\n"
        "print(sorted(m for m in ('jax', 'jaxlib', 'onnx', 'onnx_ir', 'onnxruntime') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_cli_backend_option_reaches_the_backend(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`--backend-option NAME=VALUE` gives any option of the backend (a new backend's needs no flag); given
    twice, or malformed, it is refused before the model is read."""
    from qconvert.cli import main

    absent = str(tmp_path / "absent.onnx")
    assert main(["convert", absent, "--backend-option", "form=fused"]) == 2
    assert "unknown --form 'fused'" in capsys.readouterr().err
    assert main(["convert", absent, "--form", "integer", "--backend-option", "form=qdq"]) == 2
    assert "form is already given" in capsys.readouterr().err
    assert main(["convert", absent, "--backend-option", "form"]) == 2
    assert "expected NAME=VALUE" in capsys.readouterr().err
    assert main(["convert", absent, "--to", "onnx", "--backend-option", "semantics=onnx"]) == 2
    assert "--semantics onnx: only the stablehlo backend takes these options" in capsys.readouterr().err
    assert main(["convert", absent, "--backend-option", "fuse-arithmetic=perhaps"]) == 2
    assert "backend 'stablehlo': bad value 'perhaps' for option 'fuse_arithmetic'" in capsys.readouterr().err
