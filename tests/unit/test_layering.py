"""The import graph follows DESIGN.md's dependency rules (STYLE.md P1): layering is tested, not hoped for.

- `qconvert/ir` and `qconvert/numerics/` import no ONNX package (`onnx`, `onnx_ir`, `onnxruntime`);
- `qconvert/ir` imports no frontend and no backend;
- a backend never imports another backend;
- frontends and backends meet only in the IR: neither imports the other.

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


def test_no_backend_imports_another_backend() -> None:
    names = backend_names()
    problems = []
    for name in names:
        others = {f"qconvert.backends.{other}" for other in names if other != name}
        problems += violations(f"backends/{name}", others)
    assert not problems


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
