"""atomic_text_file: the output appears whole or not at all, with the usual file mode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qconvert.atomic_file import atomic_text_file


def test_content_appears_only_when_the_block_ends(tmp_path: Path) -> None:
    target = tmp_path / "out.mlir"
    target.write_text("old\n")
    with atomic_text_file(target) as stream:
        stream.write("new\n")
        assert target.read_text() == "old\n"  # not replaced yet
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mlir"]  # no temporary left
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failure_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError), atomic_text_file(target) as stream:
        stream.write("partial")
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
