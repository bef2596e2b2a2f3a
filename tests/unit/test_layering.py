"""The import graph follows DESIGN.md's dependency rules (STYLE.md P1): layering is tested, not hoped for.

- `qconvert/ir` and `qconvert/numerics/` import no ONNX package (`onnx`, `onnx_ir`, `onnxruntime`);
- `qconvert/ir` imports no frontend and no backend;
- a backend may build on another backend through that backend's package (its facade, `__all__`), never
  through one of its modules; every other package imports backends only through their facades (or the
  registry, `qconvert.backends`);
- frontends and backends meet only in the IR: neither imports the other;
- no `_private` name is imported from another module (a package may import its own private modules,
  e.g. compiled helpers: `from qconvert.calibrate import _counting`).

Imports are read with `ast`, so imports inside functions count too. `frontends/` and `backends/` install
as `qconvert.frontends` and `qconvert.backends`; relative imports are resolved against those names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ONNX_PACKAGES = {"onnx", "onnx_ir", "onnxruntime"}
# Repo folder -> the package name it installs as (pyproject.toml's package-dir).
INSTALLED_AS = {"qconvert": "qconvert", "frontends": "qconvert.frontends", "backends": "qconvert.backends"}


def module_name(path: Path) -> str:
    """`backends/tosa/emit.py` -> `qconvert.backends.tosa.emit` (a package's `__init__.py` -> the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts[0] = INSTALLED_AS[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def dotted_prefixes(name: str) -> Iterator[str]:
    """`a.b.c` -> `a`, `a.b`, `a.b.c`."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


def normalize(name: str) -> str:
    """An absolute import of `backends.x` or `frontends.x` means the installed `qconvert.backends.x`."""
    if name.split(".")[0] in ("frontends", "backends"):
        return f"qconvert.{name}"
    return name


def imported_names(source: str, module: str, is_package: bool) -> set[str]:
    """Every dotted prefix of every module that `source` (the text of `module`) imports, relative or not.

    `from a.b import c` counts `a`, `a.b` and `a.b.c` (c may be a submodule).
    """
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base = ".".join(base_parts[: len(base_parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
        else:
            continue
        for target in targets:
            names.update(dotted_prefixes(normalize(target)))
    return names


def imports_of(path: Path) -> set[str]:
    return imported_names(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")


def python_files(relative: str) -> list[Path]:
    """The .py files of a repo folder, or the file itself."""
    path = ROOT / relative
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def violations(relative: str, banned: set[str]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {sorted(bad)}"
        for path in python_files(relative)
        if (bad := imports_of(path) & banned)
    ]


def imported_private_names(source: str, module: str, is_package: bool) -> set[str]:
    """The `_private` names that `source` imports from another module (`qconvert.interpret._main`); a
    private module of its own package is its own business. Dunders (`__version__`) are public."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [normalize(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base = ".".join(base_parts[: len(base_parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = normalize(node.module or "")
            targets = [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[0] != "qconvert":
                continue
            first = next(
                (i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None
            )
            if first is not None and ".".join(parts[:first]) != package:
                found.add(target)
    return found


def backend_submodules(names: set[str]) -> set[str]:
    """The names that are a module (or subpackage) inside a backend package (`...stablehlo.run`),
    not the package itself nor a name its facade exports (`qconvert.backends.stablehlo.Form`)."""
    found = set()
    for name in names:
        parts = name.split(".")
        if parts[:2] != ["qconvert", "backends"] or len(parts) < 4:
            continue
        inside = ROOT / "backends" / parts[2] / parts[3]
        if inside.with_suffix(".py").exists() or (inside / "__init__.py").exists():
            found.add(".".join(parts[:4]))
    return found


def backend_names() -> list[str]:
    backends = ROOT / "backends"
    return sorted(p.name for p in backends.iterdir() if p.is_dir() and (p / "__init__.py").exists())


@pytest.mark.parametrize("relative", ["qconvert/ir", "qconvert/numerics"])
def test_ir_and_numerics_import_no_onnx(relative: str) -> None:
    assert (ROOT / relative).exists(), f"{relative} is missing: the layering rule would pass vacuously"
    assert not violations(relative, ONNX_PACKAGES)


def test_ir_imports_no_frontend_or_backend() -> None:
    assert not violations("qconvert/ir", {"qconvert.frontends", "qconvert.backends"})


def test_frontends_and_backends_do_not_import_each_other() -> None:
    assert not violations("frontends", {"qconvert.backends"})
    assert not violations("backends", {"qconvert.frontends"})


def facade_violations(relative: str, own_backend: str | None = None) -> list[str]:
    """Files under `relative` that import a module inside a backend package (their own backend's aside)."""
    problems = []
    for path in python_files(relative):
        bad = {
            name
            for name in backend_submodules(imports_of(path))
            if own_backend is None or name.split(".")[2] != own_backend
        }
        if bad:
            problems.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}: import the backend's package")
    return problems


def test_a_backend_builds_on_another_only_through_its_facade() -> None:
    problems = []
    for name in backend_names():
        problems += facade_violations(f"backends/{name}", own_backend=name)
    assert not problems


@pytest.mark.parametrize("relative", ["qconvert", "frontends"])
def test_other_packages_import_backends_only_through_facades(relative: str) -> None:
    assert not facade_violations(relative)


def test_every_backend_has_a_facade_with_all() -> None:
    """Each backend package declares its public names (`__all__`), which its facade can give."""
    for name in backend_names():
        tree = ast.parse((ROOT / "backends" / name / "__init__.py").read_text(encoding="utf-8"))
        declared = [
            n for n in tree.body if isinstance(n, ast.Assign) and "__all__" in ast.unparse(n.targets[0])
        ]
        assert declared, f"backends/{name}/__init__.py has no __all__"


@pytest.mark.parametrize("relative", ["qconvert", "frontends", "backends"])
def test_no_private_name_is_imported_from_another_module(relative: str) -> None:
    problems = [
        f"{path.relative_to(ROOT)} imports {sorted(bad)}"
        for path in python_files(relative)
        if (
            bad := imported_private_names(
                path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py"
            )
        )
    ]
    assert not problems


@pytest.mark.parametrize(
    ("source", "module", "facade_ok"),
    [
        (
            "from qconvert.backends.stablehlo import convert_to_stablehlo",
            "qconvert.backends.tosa.convert",
            True,
        ),
        ("from .. import stablehlo", "qconvert.backends.tosa.convert", True),
        ("from ..stablehlo import lower_quant", "qconvert.backends.tosa.convert", False),
        ("from ..stablehlo.lowering import Form", "qconvert.backends.tosa.convert", False),
        ("from qconvert.backends.stablehlo.run import run", "qconvert.check.backends", False),
        ("from qconvert.backends import get_backend", "qconvert.convert", True),
    ],
)
def test_facade_rule_fails_on_a_violation(source: str, module: str, facade_ok: bool) -> None:
    """The rule the facade tests apply, on sources that break it (a TOSA backend reaching into StableHLO's
    modules, check importing StableHLO's runner module) and on sources that keep it."""
    found = backend_submodules(imported_names(source, module, False))
    found = {name for name in found if name.split(".")[2] != module.split(".")[2]}
    assert (not found) == facade_ok, found


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("from qconvert.interpret import _main", "qconvert.check.backends", {"qconvert.interpret._main"}),
        (
            "from qconvert.backends.stablehlo.lowering import _signature_type",
            "qconvert.check.x",
            {"qconvert.backends.stablehlo.lowering._signature_type"},
        ),
        (
            "from .lowering import _signature_type",
            "qconvert.backends.stablehlo.onnx_nn",
            {"qconvert.backends.stablehlo.lowering._signature_type"},
        ),
        ("from qconvert.calibrate import _counting", "qconvert.calibrate.counting", set()),
        ("from qconvert.interpret import _main", "qconvert.convert", {"qconvert.interpret._main"}),
        ("from qconvert.check._internal import x", "qconvert.convert", {"qconvert.check._internal.x"}),
        ("from qconvert import __version__", "qconvert.cli", set()),
    ],
)
def test_private_rule_fails_on_a_violation(source: str, module: str, expected: set[str]) -> None:
    assert imported_private_names(source, module, False) == expected


_TOSA = "qconvert.backends.tosa"
_STABLEHLO = "qconvert.backends.stablehlo"
_STORAGE = "qconvert.backends.onnx_storage"


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("import onnx.helper", "qconvert.ir.core", False, {"onnx", "onnx.helper"}),
        ("from onnx_ir import serde", "qconvert.ir.core", False, {"onnx_ir", "onnx_ir.serde"}),
        ("def f():\n    import onnxruntime", "qconvert.numerics", False, {"onnxruntime"}),
        (
            "from ..stablehlo import emit",
            f"{_TOSA}.lower",
            False,
            {"qconvert", "qconvert.backends", _STABLEHLO, f"{_STABLEHLO}.emit"},
        ),
        ("from .. import stablehlo", _TOSA, True, {"qconvert", "qconvert.backends", _STABLEHLO}),
        (
            "from backends.onnx_storage import x",
            "qconvert.frontends.onnx.lift",
            False,
            {"qconvert", "qconvert.backends", _STORAGE, f"{_STORAGE}.x"},
        ),
        (
            "from ...frontends.onnx import lift",
            f"{_TOSA}.emit",
            False,
            {"qconvert", "qconvert.frontends", "qconvert.frontends.onnx", "qconvert.frontends.onnx.lift"},
        ),
    ],
)
def test_imported_names_resolves_every_import_form(
    source: str, module: str, is_package: bool, expected: set[str]
) -> None:
    assert imported_names(source, module, is_package) == expected
