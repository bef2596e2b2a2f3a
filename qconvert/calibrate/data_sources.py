"""Where calibration data comes from: files and functions, opened lazily and re-openable in any process.

NOTE: nothing here reads more than it is asked for. A `.npy` file is memory-mapped; an `.npz` member's
header is read when the file is listed and its data streamed from the zip member in pieces when iterated
(never the whole member at once, unless it is stored in Fortran order); a function is called again for
every pass. A `Source` is picklable (a path, a `module:function` spec, a module-level function or a
list), so worker processes re-open it themselves. Checking arrays against the model is dataset.py's job.
A `module:function`'s module is looked up on sys.path, then in the current folder (as `python -m` does).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np

from qconvert.errors import InputError

# What `--data` may be in Python: a path, a function returning an iterable of {input: array}, or a sequence
# of such mappings (a list: it can be read twice; a bare generator cannot).
DataSource = str | os.PathLike[str] | Callable[[], Iterable[Mapping[str, Any]]] | Sequence[Mapping[str, Any]]


# Arrays of a source, read lazily ----------------------------------------------------------------------------
@dataclass(slots=True)
class StoredArray:
    """One stored array: where it comes from, its stored shape and dtype, a reader of its C-order data."""

    where: str
    shape: tuple[int, ...]
    dtype: np.dtype
    # Yields consecutive pieces of the array flattened to (elements,) in C order, `max_bytes` at a time.
    pieces: Callable[[int], Iterator[np.ndarray]]
    # "list", "float"...: the Python value a function gave instead of an array (numpy chose its dtype).
    python_type: str | None = None
    # Yields the flattened elements [start, stop) only, `max_bytes` at a time (a shard's rows): None reads
    # `pieces` and skips what lies outside.
    window: Callable[[int, int, int], Iterator[np.ndarray]] | None = None

    def elements(self, start: int, stop: int, max_bytes: int) -> Iterator[np.ndarray]:
        """The flattened elements [start, stop) in C order, in pieces of at most `max_bytes`."""
        if self.window is not None:
            yield from self.window(start, stop, max_bytes)
            return
        done = 0
        for piece in self.pieces(max_bytes):  # a stream: what lies before the window is read and dropped
            low, high = max(start - done, 0), min(stop - done, piece.size)
            done += piece.size
            if low < high:
                yield piece[low:high]
            if done >= stop:
                return


# Bytes this process has read from data files (memory-mapped pages handed out, zip members streamed): each
# worker reports what its share cost the storage (`bytes_read`).
_bytes_read = 0


def bytes_read() -> int:
    """Bytes of array data this process has read from files so far."""
    return _bytes_read


def _counted(pieces: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    global _bytes_read
    for piece in pieces:
        _bytes_read += piece.nbytes
        yield piece


def _in_memory(
    where: str, array: np.ndarray, python_type: str | None = None, from_file: bool = False
) -> StoredArray:
    """An array in memory, or memory-mapped (`from_file`: its pieces count as bytes read)."""

    def window(start: int, stop: int, max_bytes: int) -> Iterator[np.ndarray]:
        flat = np.ascontiguousarray(array).reshape(-1)  # a view of a C-order array: no page is touched yet
        step = max(1, max_bytes // max(1, array.dtype.itemsize))
        for first in range(start, stop, step):
            yield flat[first : min(first + step, stop)]

    def windowed(start: int, stop: int, max_bytes: int) -> Iterator[np.ndarray]:
        return _counted(window(start, stop, max_bytes)) if from_file else window(start, stop, max_bytes)

    def pieces(max_bytes: int) -> Iterator[np.ndarray]:
        return windowed(0, array.size, max_bytes)

    return StoredArray(where, tuple(array.shape), array.dtype, pieces, python_type, windowed)


def _npy_file(path: Path) -> StoredArray:
    # The header first: a shape it declares that the file cannot hold is named before anything is mapped.
    try:
        with path.open("rb") as stream:
            shape, dtype, _ = _read_header(stream, str(path))
            offset = stream.tell()
        size = path.stat().st_size
    except (OSError, ValueError, EOFError) as error:
        raise InputError(f"{path}: not a readable .npy array ({error})") from None
    if any(d < 0 for d in shape):
        raise InputError(f"{path}: the .npy header declares shape {list(shape)}, with a negative dim")
    needed = math.prod(shape) * dtype.itemsize
    if offset + needed > size:
        raise InputError(
            f"{path}: the .npy header declares shape {list(shape)} of {dtype} ({needed:,} bytes), but the "
            f"file holds {size - offset:,} bytes after its header (truncated?)"
        )
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError, OverflowError) as error:
        raise InputError(f"{path}: not a readable .npy array ({error})") from None
    return _in_memory(str(path), mapped, from_file=True)


def _read_header(stream: BinaryIO, where: str) -> tuple[tuple[int, ...], np.dtype, bool]:
    version = np.lib.format.read_magic(stream)
    if version in ((1, 0), (2, 0)):
        formats = np.lib.format
        read = formats.read_array_header_1_0 if version == (1, 0) else formats.read_array_header_2_0
        try:
            shape, fortran_order, dtype = read(stream)
        except (ValueError, EOFError, OSError):
            raise
        except Exception as error:  # numpy parses the header as a Python literal: tokenizer / syntax errors
            raise ValueError(f"header does not parse: {type(error).__name__}: {error}") from None
    else:
        raise InputError(
            f"{where}: .npy format version {version} is not supported (save with numpy's default)"
        )
    if dtype.hasobject:
        raise InputError(
            f"{where}: holds Python objects (dtype {dtype}); calibration reads numeric arrays only"
        )
    return tuple(shape), dtype, fortran_order


def _npz_member(path: Path, member: str) -> StoredArray:
    """An .npz member: header read now, data streamed from the zip member when its pieces are iterated."""
    where = f"{path}['{member.removesuffix('.npy')}']"
    try:
        with zipfile.ZipFile(path) as archive, archive.open(member) as stream:
            shape, dtype, fortran_order = _read_header(stream, where)  # type: ignore[arg-type]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise InputError(f"{where}: not a readable array ({error})") from None

    def pieces(max_bytes: int) -> Iterator[np.ndarray]:
        with zipfile.ZipFile(path) as archive, archive.open(member) as stream:
            if fortran_order:  # rare: numpy writes C order unless asked; read it whole
                whole = np.lib.format.read_array(stream, allow_pickle=False)  # type: ignore[arg-type]
                yield np.ascontiguousarray(whole).reshape(-1)
                return
            _read_header(stream, where)  # type: ignore[arg-type]
            total = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            step = max(dtype.itemsize, max_bytes // dtype.itemsize * dtype.itemsize)
            done = 0
            while done < total:
                data = stream.read(min(step, total - done))  # whole items: read(n) stops early only at EOF
                if len(data) % dtype.itemsize or not data:
                    raise InputError(f"{where}: truncated ({done + len(data)} of {total} bytes)")
                done += len(data)
                yield np.frombuffer(data, dtype=dtype)

    def window(start: int, stop: int, max_bytes: int) -> Iterator[np.ndarray]:
        # np.savez stores members uncompressed: map the member's rows directly; otherwise stream up to them.
        mapped = None if fortran_order else _mapped_member(path, member, where, shape, dtype)
        if mapped is None:
            yield from StoredArray(where, shape, dtype, counted_pieces).elements(start, stop, max_bytes)
            return
        yield from _in_memory(where, mapped, from_file=True).elements(start, stop, max_bytes)

    def counted_pieces(max_bytes: int) -> Iterator[np.ndarray]:
        return _counted(pieces(max_bytes))

    return StoredArray(where, shape, dtype, counted_pieces, window=window)


def _mapped_member(
    path: Path, member: str, where: str, shape: tuple[int, ...], dtype: np.dtype
) -> np.ndarray | None:
    """A stored (uncompressed) .npz member's array, memory-mapped flat; None for a compressed member."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:  # compressed or encrypted
            return None
        with archive.open(member) as stream:
            _read_header(stream, where)  # type: ignore[arg-type]
            header_bytes = stream.tell()
    with path.open("rb") as file:  # the local header's name and extra lengths say where the data starts
        file.seek(info.header_offset)
        local = file.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        return None
    name_length = int.from_bytes(local[26:28], "little")
    extra_length = int.from_bytes(local[28:30], "little")
    offset = info.header_offset + 30 + name_length + extra_length + header_bytes
    elements = math.prod(shape)
    if elements == 0:
        return np.empty(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(elements,))


def _npz_file(path: Path) -> dict[str, StoredArray]:
    try:
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.namelist() if m.endswith(".npy")]
    except (OSError, zipfile.BadZipFile) as error:
        raise InputError(f"{path}: not a readable .npz archive ({error})") from None
    return {member.removesuffix(".npy"): _npz_member(path, member) for member in members}


# A "part" is what one file or one function item holds: arrays by input name.
@dataclass(slots=True)
class Part:
    where: str
    arrays: dict[str, StoredArray]


def _file_part(path: Path, inputs: Sequence[str]) -> Part:
    if path.suffix == ".npz":
        return Part(str(path), _npz_file(path))
    if len(inputs) != 1:
        names = list(inputs)
        raise InputError(
            f"{path}: an .npy file holds one unnamed array, but the model has {len(inputs)} inputs {names}; "
            "give .npz files with one array per input name"
        )
    return Part(str(path), {inputs[0]: _npy_file(path)})


def _item_part(where: str, item: object) -> Part:
    if not isinstance(item, Mapping):
        raise InputError(f"{where}: expected a mapping {{input name: array}}, got {type(item).__name__}")
    arrays = {}
    for name, value in item.items():
        array = np.asarray(value)
        if array.dtype.hasobject:
            raise InputError(f"{where}: input '{name}' is not a numeric array (dtype {array.dtype})")
        python_type = None if isinstance(value, np.ndarray | np.generic) else type(value).__name__
        arrays[str(name)] = _in_memory(f"{where}['{name}']", array, python_type)
    return Part(where, arrays)


def one_dict(data: Mapping[Any, Any]) -> str:
    """`one dict ('x', 'mask')`: how a single {input: array} given where a list of them was expected shows."""
    keys = ", ".join(f"'{key}'" for key in list(data)[:4]) + (", ..." if len(data) > 4 else "")
    return f"one dict ({keys})"


def _import_module(name: str, folder: str | None = None) -> Any:
    """`importlib.import_module`, and failing that the module in the current folder (`folder`: the driver's,
    for a worker on a cluster node), as `python -m`, uvicorn and gunicorn find `module:app` (the `qconvert`
    script's sys.path does not hold the folder)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        top = name.partition(".")[0]
        if error.name != top:  # the module was found; something it imports was not
            raise
        folder = folder or os.getcwd()
        here = os.path.isfile(os.path.join(folder, f"{top}.py")) or os.path.isdir(os.path.join(folder, top))
        if not here or folder in sys.path:
            raise ModuleNotFoundError(f"{error}, on sys.path nor in the current folder {folder}") from None
        sys.path.insert(0, folder)  # kept: the module may import its neighbours later; workers inherit it
        importlib.invalidate_caches()
        return importlib.import_module(name)


# Sources -------------------------------------------------------------------------------------------------
def load_function(spec: str, folder: str | None = None) -> Callable[[], Iterable[Mapping[str, Any]]]:
    """`package.module:function` or `path/to/file.py:function` -> the function; `folder` (default: the
    current one) is where a module not on sys.path is looked for."""
    module_name, _, function_name = spec.rpartition(":")
    if not module_name or not function_name:
        raise InputError(f"--data {spec}: expected a folder, an .npz file, or MODULE:FUNCTION")
    try:
        if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
            path = Path(module_name)
            if not path.is_file():
                raise InputError(f"--data {spec}: no such Python file {path}")
            unique = f"_qconvert_calibration_data_{abs(hash(str(path.resolve())))}"
            module_spec = importlib.util.spec_from_file_location(unique, path)
            if module_spec is None or module_spec.loader is None:
                raise InputError(f"--data {spec}: cannot import {path}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[unique] = module
            module_spec.loader.exec_module(module)
        else:
            module = _import_module(module_name, folder)
    except InputError:
        raise
    except Exception as error:  # the user's module failed to import: say which and why
        raise InputError(
            f"--data {spec}: importing {module_name} failed: {type(error).__name__}: {error}"
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise InputError(f"--data {spec}: {module_name} has no function '{function_name}'")
    return cast(Callable[[], Iterable[Mapping[str, Any]]], function)


def _folder_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".npz", ".npy"))
    if not files:
        raise InputError(f"{folder}: dataset is empty (no .npz or .npy files in the folder)")
    return files


SHARD_PARAMETERS = ("shard_index", "num_shards")


def takes_shard(function: Callable[..., Any]) -> bool:
    """Whether a data function follows the shard protocol: it accepts `shard_index` and `num_shards`
    (keywords), and then yields only its share of the data, shard_index of num_shards (0-based)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = all(name in parameters and parameters[name].kind in keyword for name in SHARD_PARAMETERS)
    return named or any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values())


@dataclass(frozen=True)
class Source:
    """A resolved `--data`: picklable, so worker processes re-open it themselves."""

    label: str
    kind: str  # "folder" | "npz" | "npy" | "function" | "sequence" | "files" (a shard's list of files)
    path: str | None = None
    function_spec: str | None = None
    function: Callable[[], Iterable[Mapping[str, Any]]] | None = None
    items: Sequence[Mapping[str, Any]] | None = None
    files: tuple[str, ...] | None = None
    shard: tuple[int, int] | None = None  # (shard_index, num_shards) given to a function that takes them
    folder: str | None = None  # where a `module:function` not on sys.path was found (the driver's folder)

    def load(self) -> Callable[..., Iterable[Mapping[str, Any]]]:
        """The data function (imported from its spec in this process)."""
        return self.function or load_function(self.function_spec or "", self.folder)

    def file_paths(self) -> list[Path]:
        """The files of a file source, in order (a folder is listed)."""
        if self.kind == "folder":
            assert self.path is not None
            return _folder_files(Path(self.path))
        if self.kind == "files":
            assert self.files is not None
            return [Path(name) for name in self.files]
        assert self.kind in ("npz", "npy") and self.path is not None
        return [Path(self.path)]

    def parts(self, inputs: Sequence[str]) -> Iterator[Part]:
        """What each file or item holds, in order; `inputs` (the model's input names) name a bare .npy."""
        if self.kind in ("folder", "files"):
            for path in self.file_paths():
                yield _file_part(path, inputs)
        elif self.kind in ("npz", "npy"):
            assert self.path is not None
            yield _file_part(Path(self.path), inputs)
        elif self.kind == "sequence":
            assert self.items is not None
            for index, item in enumerate(self.items):
                yield _item_part(f"{self.label} item {index}", item)
        else:
            function = self.load()
            try:
                if self.shard is None:
                    iterable = function()
                else:
                    index, count = self.shard
                    iterable = function(shard_index=index, num_shards=count)
                iterator = iter(iterable)
            except SystemExit as exit_:  # would end calibrate silently, with exit 0 for sys.exit(0)
                raise InputError(f"{self.label}: calling it called sys.exit({exit_.code!r})") from None
            except Exception as error:
                raise InputError(
                    f"{self.label}: calling it failed: {type(error).__name__}: {error}"
                ) from None
            if isinstance(iterable, Mapping):  # iterating would give its keys, read as items
                raise InputError(
                    f"{self.label}: returned {one_dict(iterable)}; expected an iterable of such dicts "
                    "(input name -> array, one per batch): return [data], or yield each"
                )
            index = 0
            while True:
                try:
                    item = next(iterator)
                except StopIteration:
                    return
                except SystemExit as exit_:
                    raise InputError(f"{self.label}: item {index} called sys.exit({exit_.code!r})") from None
                except Exception as error:
                    raise InputError(
                        f"{self.label}: item {index} failed: {type(error).__name__}: {error}"
                    ) from None
                yield _item_part(f"{self.label} item {index}", item)
                index += 1


def absolute_source(source: Source) -> Source:
    """The source with its paths absolute, for workers that run in another folder (Ray's workers run where
    `ray start` ran): a folder, files, and a `path/to/file.py:function`'s file. The label stays as given."""
    path = None if source.path is None else os.path.abspath(source.path)
    files = None if source.files is None else tuple(os.path.abspath(name) for name in source.files)
    spec = source.function_spec
    if spec is not None:
        module_name, _, function_name = spec.rpartition(":")
        if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
            spec = f"{os.path.abspath(module_name)}:{function_name}"
    return replace(source, path=path, files=files, function_spec=spec, folder=source.folder or os.getcwd())


def resolve_source(data: DataSource) -> Source:
    """`--data` (or its Python equivalent) -> a re-openable source; InputError when it names nothing."""
    if callable(data):
        name = getattr(data, "__qualname__", repr(data))
        return Source(label=f"{getattr(data, '__module__', '?')}:{name}", kind="function", function=data)
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        return Source(label="data", kind="sequence", items=data)
    if isinstance(data, Iterable) and not isinstance(data, str | bytes | os.PathLike):
        raise InputError(
            "data: an iterator can be read only once; pass a list, or a function returning the iterable"
        )
    text = os.fspath(data)  # type: ignore[arg-type]
    path = Path(text)
    if path.is_dir():
        return Source(label=text, kind="folder", path=text)
    if path.is_file():
        if path.suffix not in (".npz", ".npy"):
            raise InputError(f"--data {text}: expected a folder, an .npz or .npy file, or MODULE:FUNCTION")
        return Source(label=text, kind=path.suffix[1:], path=text)
    if ":" in text:
        load_function(text)  # fail now, with the reason, rather than in a worker
        return Source(label=text, kind="function", function_spec=text, folder=os.getcwd())
    raise InputError(f"--data {text}: no such file or folder")


__all__ = [
    "DataSource",
    "Part",
    "SHARD_PARAMETERS",
    "Source",
    "StoredArray",
    "absolute_source",
    "bytes_read",
    "load_function",
    "one_dict",
    "resolve_source",
    "takes_shard",
]
