"""Output files that appear whole or not at all, and that never clobber what an output path points at.

Where an output goes depends on what its path is (`output_place`):
- `-`: standard output;
- a path that exists and is not a regular file (a FIFO, a character device such as /dev/null, a socket),
  or one reached through a file descriptor link (/dev/stdout, /dev/fd/N, /proc/self/fd/N): written
  through, opened for writing as it is, since replacing it would destroy the device node or the link
  (as root, `--json /dev/stdout` once replaced the /dev/stdout symlink with a regular file) or detach
  the file from the descriptor a shell redirected;
- a symlink to a regular file (or to a new file in an existing folder): its target is written atomically
  and the link is kept;
- a regular file or a new path: written beside it as a hidden temporary file, then renamed over it, so
  a failure or an interrupt never leaves a partial output behind (a replaced file keeps its mode).

NOTE: every text file qconvert writes goes through `atomic_text_file`; writers that stage their own
temporary file (backends/onnx/save.py, calibrate's outputs) finish with `place_file`, which applies the
same rules.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, TextIO

from qconvert.errors import InputError

STDOUT = "-"
_DESCRIPTOR_FOLDERS = ("/dev/fd/", "/proc/")  # links there name an open descriptor, not a file


@dataclass(frozen=True)
class OutputPlace:
    """Where an output path leads: `kind` says how it is written, `path` what is opened or replaced."""

    kind: Literal["stdout", "through", "atomic"]
    path: str


def output_place(path: str | os.PathLike[str]) -> OutputPlace:
    """How `path` is written: standard output, through (not a regular file), or atomically at `path`
    (a symlink's target when it is one). OSError for a folder, a loop of links or a path not readable."""
    text = os.fspath(path)
    if text == STDOUT:
        return OutputPlace("stdout", text)
    current = os.path.abspath(text)
    for _ in range(40):  # the kernel's own limit on a chain of links
        if not os.path.islink(current):
            break
        if current.startswith(_DESCRIPTOR_FOLDERS):
            return OutputPlace("through", text)
        current = os.path.join(os.path.dirname(current), os.readlink(current))
        current = os.path.abspath(current)
    else:
        raise OSError(errno.ELOOP, "too many levels of symbolic links", text)
    if current.startswith(_DESCRIPTOR_FOLDERS):
        return OutputPlace("through", text)
    try:
        mode = os.stat(current).st_mode
    except (FileNotFoundError, NotADirectoryError):  # a new file (at the link's target when it is a link);
        return OutputPlace("atomic", current)  # a missing or non-folder parent is named when it is opened
    if stat.S_ISREG(mode):
        return OutputPlace("atomic", current)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder; give a file path", text)
    return OutputPlace("through", text)


def writes_through(path: str | os.PathLike[str]) -> bool:
    """True when `path` is standard output or is written through (no file of ours beside it)."""
    return output_place(path).kind != "atomic"


def _mode_for(target: str) -> int:
    """The mode a new output gets (the usual 0666 less the umask), or the mode of the file it replaces."""
    try:
        existing = os.stat(target)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
    return stat.S_IMODE(existing.st_mode)


def _cannot_write(path: str | os.PathLike[str], error: OSError) -> InputError:
    return InputError(f"cannot write '{os.fspath(path)}': {error.strerror or error}")


@contextmanager
def atomic_text_file(path: str | os.PathLike[str]) -> Iterator[TextIO]:
    """A text stream for the output `path` (see `output_place`): standard output for `-`, the path itself
    when it is not a regular file, else a temporary file whose content replaces the file when the block
    ends, discarded if it raises. InputError when the path cannot be written."""
    try:
        place = output_place(path)
    except OSError as error:
        raise _cannot_write(path, error) from None
    if place.kind == "stdout":
        yield sys.stdout
        sys.stdout.flush()
        return
    if place.kind == "through":
        try:
            stream = open(place.path, "w", encoding="utf-8")  # noqa: SIM115 (closed below, errors named)
        except OSError as error:
            raise _cannot_write(path, error) from None
        with stream:
            yield stream
        return
    folder = os.path.dirname(place.path)
    try:
        handle, temporary = tempfile.mkstemp(
            prefix=f".{os.path.basename(place.path)}.", suffix=".tmp", dir=folder
        )
    except OSError as error:
        raise _cannot_write(path, error) from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            yield stream
        os.chmod(temporary, _mode_for(place.path))  # mkstemp makes 0600
        os.replace(temporary, place.path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def place_file(temporary: str | os.PathLike[str], path: str | os.PathLike[str]) -> str:
    """Put the finished file `temporary` (staged in the target's folder) at the output `path`: renamed
    over it (a symlink's target, the link kept), or copied into it and removed when `path` is standard
    output or not a regular file. Returns the path that now holds the output as a file of ours ("" when
    written through: nothing of ours to remove if a later step fails)."""
    place = output_place(path)
    if place.kind == "atomic":
        os.chmod(temporary, _mode_for(place.path))
        os.replace(temporary, place.path)
        return place.path
    try:
        with open(temporary, "rb") as source:
            if place.kind == "stdout":
                sys.stdout.flush()
                shutil.copyfileobj(source, sys.stdout.buffer)
                sys.stdout.buffer.flush()
            else:
                with open(place.path, "wb") as target:
                    shutil.copyfileobj(source, target)
    finally:
        os.unlink(temporary)
    return ""


def staging_folder(path: str | os.PathLike[str]) -> str:
    """The folder where the output `path` is staged before `place_file`: its (real) target's folder, or
    the temporary folder when it is written through (a temporary file there is removed once copied)."""
    place = output_place(path)
    return os.path.dirname(place.path) if place.kind == "atomic" else tempfile.gettempdir()


__all__ = [
    "OutputPlace",
    "atomic_text_file",
    "output_place",
    "place_file",
    "staging_folder",
    "writes_through",
]
