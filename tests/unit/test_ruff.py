"""The whole repo is `ruff check` clean under pyproject.toml's rules (STYLE.md: ruff and pyright clean)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import require_module

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_check_is_clean() -> None:
    require_module("ruff")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    returncode = result.returncode
    assert returncode == 0, f"ruff check found problems:\n{result.stdout}{result.stderr}"
