"""Output files that appear whole or not at all: written beside the target, then renamed over it.

NOTE: every file qconvert writes goes through `atomic_text_file` (the ONNX writer, which also writes
external data, has its own folder-level version in backends/onnx/save.py), so a failure or an
interrupt never leaves a partial output behind.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


@contextmanager
def atomic_text_file(path: str | os.PathLike[str]) -> Iterator[TextIO]:
    """A text stream whose content replaces `path` when the block ends, and is discarded if it raises."""
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            yield stream
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes 0600; the output gets the usual mode
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
