"""pyproject.toml lists every package folder, so a regular (non-editable) install ships all of them.

setuptools cannot discover packages and also map `frontends/` and `backends/` to `qconvert.frontends`
and `qconvert.backends`, so `[tool.setuptools] packages` is written by hand. An editable install still
imports a folder missing from that list; only a regular install (a wheel) would lack it. This test
catches that before a user does.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def package_folders() -> dict[str, Path]:
    """Installed package name -> folder, for every folder under a mapped root that holds Python files."""
    found: dict[str, Path] = {}
    for package, folder in setuptools_config()["package-dir"].items():
        root = ROOT / folder
        for path in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
            if "__pycache__" not in path.parts and any(path.glob("*.py")):
                found[".".join((package, *path.relative_to(root).parts))] = path
    return found


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(setuptools_config()["packages"])
    on_disk = set(package_folders())
    missing, stale = sorted(on_disk - listed), sorted(listed - on_disk)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert not stale, f"listed in pyproject.toml but no folder with Python files: {stale}"


def test_every_package_folder_has_an_init() -> None:
    missing = [
        str(path.relative_to(ROOT))
        for path in package_folders().values()
        if not (path / "__init__.py").exists()
    ]
    assert not missing, f"folders with Python files but no __init__.py (not installed as packages): {missing}"
