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


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "private.json"
    target.write_text("old\n")
    target.chmod(0o600)
    with atomic_text_file(target) as stream:
        stream.write("new\n")
    assert target.read_text() == "new\n" and target.stat().st_mode & 0o777 == 0o600


def test_a_symlink_to_a_file_in_another_folder_keeps_its_link(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere" / "out.mlir"
    target.write_text("old\n")
    link = tmp_path / "out.mlir"
    link.symlink_to(target)
    with atomic_text_file(link) as stream:
        stream.write("new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    assert [p.name for p in (tmp_path / "elsewhere").iterdir()] == ["out.mlir"]  # staged beside the target


def test_a_folder_or_a_missing_folder_is_bad_input(tmp_path: Path) -> None:
    from qconvert.errors import InputError

    with pytest.raises(InputError, match="is a folder"), atomic_text_file(tmp_path):
        pass
    with pytest.raises(InputError, match="No such file"), atomic_text_file(tmp_path / "no" / "out.mlir"):
        pass
