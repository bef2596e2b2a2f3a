"""The files `calibrate` writes (model, ranges JSON, result JSON): checked before any work, all or none.

NOTE: `check_output_paths` runs before the model is even loaded, so a path that cannot be written (missing
or non-folder parent, a folder in the way, two outputs naming one file, an output naming an input) costs
no calibration. `write_outputs` then writes the model (backends/onnx's `save_onnx`, itself
temp-then-rename; calibrate compares it with the float model there, and the result JSON reports that),
stages each JSON as a hidden temporary file beside its target and only then renames them into place: a
failure at any step removes what this run wrote, so no output exists without the others. `-`, a FIFO, a
device or /dev/stdout is written through and a symlink's target replaced (qconvert/atomic_file.py); what
was written through is not removed on a later failure (it is not a file of ours).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from qconvert.atomic_file import STDOUT, output_place, place_file, staging_folder, writes_through
from qconvert.errors import InputError

PathLike = str | os.PathLike[str]


def _identity(path: PathLike) -> str:
    """The file `path` names, symbolic links and `..` resolved (the file need not exist)."""
    return os.path.realpath(os.fspath(path))


def check_output_paths(outputs: Mapping[str, PathLike | None], inputs: Mapping[str, object]) -> None:
    """InputError naming the option when an output cannot be written where it says.

    `outputs`: option (e.g. "--out") -> path or None; `inputs`: what is read (option -> path; anything
    else, e.g. a function or a ModelProto, is skipped). Refused: an empty path, a path that is a folder,
    a parent that is missing, not a folder or not writable, two outputs naming one file, an output naming
    an input file."""
    seen: dict[str, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        text = os.fspath(path)
        if not text:
            raise InputError(f"{option}: the path is empty")
        if text == STDOUT:
            if STDOUT in seen:
                raise InputError(f"{option} -: {seen[STDOUT]} writes to stdout already; give one a file path")
            seen[STDOUT] = f"{option} -"
            continue
        target = Path(text)
        if target.is_dir():
            raise InputError(f"{option} {text}: is a folder; give a file path")
        try:
            place = output_place(text)
        except OSError as error:  # a loop of links, a parent that cannot be searched
            raise InputError(f"{option} {text}: cannot write: {error.strerror or error}") from None
        if place.kind == "through":  # a FIFO, a device, /dev/stdout: opened as it is, nothing beside it
            if not os.access(text, os.W_OK):
                raise InputError(f"{option} {text}: is not writable")
            seen.setdefault(_identity(target), f"{option} {text}")
            continue
        folder = Path(place.path).parent  # a symlink's target is what gets replaced
        if not folder.exists():
            raise InputError(f"{option} {text}: folder '{folder}' does not exist")
        if not folder.is_dir():
            raise InputError(f"{option} {text}: '{folder}' is not a folder")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise InputError(f"{option} {text}: folder '{folder}' is not writable")
        identity = _identity(target)
        if identity in seen:
            raise InputError(
                f"{option} {text}: {seen[identity]} names the same file; give each output its own path"
            )
        seen[identity] = f"{option} {text}"
    for option, path in inputs.items():
        if not isinstance(path, str | os.PathLike) or not Path(path).is_file():
            continue
        written = seen.get(_identity(path))
        if written is not None:
            raise InputError(f"{written}: would overwrite {option} (an input); write it elsewhere")


@dataclass(frozen=True)
class TextOutput:
    """One JSON output: its option (for messages), its path, and a function writing it to a given path."""

    option: str
    path: PathLike
    write: Callable[[Path], object]  # its return value is ignored


def write_outputs(texts: Sequence[TextOutput], write_model: Callable[[], Path] | None) -> None:
    """Write the model and every text output, or nothing: the model written, texts staged, texts renamed
    (a text may report what writing the model found)."""
    staged: list[tuple[TextOutput, Path]] = []
    placed: list[Path] = []
    try:
        if write_model is not None:
            model_path = write_model()
            if not writes_through(model_path):  # a FIFO or a device is not ours to remove
                placed.append(model_path)
        for output in texts:
            staged.append((output, _stage(output)))
        for output, temporary in staged:
            try:
                written = place_file(temporary, output.path)  # through a FIFO, device or '-'; else renamed
            except OSError as error:
                raise InputError(f"{output.option} {os.fspath(output.path)}: cannot write: {error}") from None
            if written:
                placed.append(Path(written))
    except BaseException:
        for _, temporary in staged:
            temporary.unlink(missing_ok=True)
        for path in placed:  # this run's outputs only: the rest failed, so none of them stays
            path.unlink(missing_ok=True)
        raise


def _stage(output: TextOutput) -> Path:
    """`output` written to a new hidden file in its target's folder (so the final rename cannot cross
    file systems)."""
    target = Path(output.path)
    try:
        folder = staging_folder(output.path)
        handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        os.close(handle)
    except OSError as error:
        raise InputError(f"{output.option} {os.fspath(output.path)}: cannot write: {error}") from None
    temporary = Path(name)
    try:
        output.write(temporary)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes 0600; the output gets the usual mode
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise InputError(f"{output.option} {os.fspath(output.path)}: cannot write: {error}") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary


__all__ = ["TextOutput", "check_output_paths", "write_outputs"]
