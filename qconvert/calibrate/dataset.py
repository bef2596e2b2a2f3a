"""Calibration datasets: `--data` as a folder of .npz/.npy files, one .npz, or `module:function`, in batches.

NOTE: a dataset streams. Folders are read file by file, arrays inside a file a few megabytes at a time
(`.npy` memory-mapped, `.npz` members read from the zip stream), and nothing holds more than one batch plus
one chunk, so memory does not grow with the dataset. Iterating twice reads the source twice (two-pass
methods): a `module:function` source is called again and must yield the same data.

Rank rule, for a model input of rank R (its first axis is the batch axis):
- an array of rank R-1 is one sample (the batch axis is added);
- rank R is samples stacked on the batch axis (digits_cnn.inputs.npz's image f32[8,1,8,8]: 8 samples);
- rank R+1 is batches stacked on a new leading axis (axes 0 and 1 together count the samples).
Every input of one file (or one item of a function) must hold the same number of samples.

Batches: a model input with a fixed batch dim (digits_cnn's image f32[8,1,8,8]) is fed batches of exactly
that size, and a ragged tail that cannot fill one is not used (counted in `DatasetStats.dropped_tail`, as
padding it would count repeated samples twice in histograms). A dynamic batch dim takes `batch_size`
samples per batch (default 8) and a smaller last batch; a change of a dynamic non-batch dim (another
sequence length) closes the batch early, so samples of different shapes are never stacked.

Samples left out, counted and warned of: those holding NaN/Inf, and those with no elements in any input (a
dynamic dim of 0): nothing in them to observe. An input empty beside others that are not is fed as it is.

`--batch-size given` (`AS_GIVEN`) drops the batch axis: each item is one run of the model, fed as stored, as
onnxruntime's CalibrationDataReader feeds each dict it returns. An array of the input's rank is one run,
one rank more is runs stacked on axis 0 (one .npz holding many). This serves the models the rank rule
cannot: sequence-first ones (x[S, B, F], whose axis 0 is not the batch) and inputs with no batch axis at
all (a scalar, a fixed table). Runs are counted where samples are, and NaN/Inf ones left out whole.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from onnx import ModelProto, helper

from qconvert.calibrate.data_sources import (
    DataSource,
    Part,
    Source,
    StoredArray,
    one_dict,
    resolve_source,
    takes_shard,
)
from qconvert.errors import InputError

DEFAULT_BATCH_SIZE = 8
AS_GIVEN = "given"  # --batch-size given: every item of the data is one run, fed as stored
CHUNK_BYTES = 16 << 20  # an .npz member is read this much at a time


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One graph input as calibration feeds it: name, numpy dtype, dims (None where dynamic)."""

    name: str
    dtype: np.dtype
    dims: tuple[int | None, ...]

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def fixed_batch(self) -> int | None:
        return self.dims[0]

    def shown(self) -> str:
        """`float32[8,1,8,8]`, `?` for a dynamic dim."""
        return f"{self.dtype}[{','.join('?' if d is None else str(d) for d in self.dims)}]"


def model_inputs(model: ModelProto, as_given: bool = False) -> tuple[InputSpec, ...]:
    """The graph inputs that are not initializers, as `InputSpec`s; InputError for ones we cannot feed
    (a scalar has no batch axis, but for `as_given`)."""
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for info in model.graph.input:
        if info.name in initializers:
            continue
        if not info.type.HasField("tensor_type"):
            raise InputError(f"graph input '{info.name}' is not a tensor; calibration feeds tensors only")
        elem_type = info.type.tensor_type.elem_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
        except (KeyError, TypeError, ValueError):
            raise InputError(
                f"graph input '{info.name}': element type {elem_type} is not supported"
            ) from None
        if not info.type.tensor_type.HasField("shape"):
            raise InputError(f"graph input '{info.name}' has no shape; calibration needs at least its rank")
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim
        )
        if not dims and not as_given:
            raise InputError(
                f"graph input '{info.name}' is a scalar: it has no batch axis to stack samples on "
                f"(--batch-size {AS_GIVEN} feeds each item of the data as stored)"
            )
        specs.append(InputSpec(info.name, dtype, dims))
    if not specs:
        raise InputError("the model has no graph inputs to feed")
    return tuple(specs)


def choose_batch_size(inputs: Sequence[InputSpec], requested: int | None) -> tuple[int, bool]:
    """(samples per batch, whether the model fixes it) for a `requested` of None or 1 or more (open_dataset
    checks it); InputError if the model and the request clash."""
    fixed = {spec.name: spec.fixed_batch for spec in inputs if spec.fixed_batch is not None}
    if not fixed:
        return (requested or DEFAULT_BATCH_SIZE), False
    sizes = sorted(set(fixed.values()))
    if len(sizes) > 1:
        raise InputError(f"the model's inputs fix different batch sizes {fixed}; cannot batch them together")
    size = sizes[0]
    if size < 1:
        raise InputError(f"the model's inputs fix a batch dim of {size}: there is nothing to feed")
    if requested is not None and requested != size:
        name = next(iter(fixed))
        raise InputError(
            f"--batch-size {requested}: input '{name}' has a fixed batch dim of {size}; "
            f"batches must be exactly {size} (leave --batch-size out)"
        )
    return size, True


# Checking a part against the model ------------------------------------------------------------------------
def counted(count: int, noun: str) -> str:
    """`1 sample`, `8 samples`, `2 batches`."""
    plural = noun + ("es" if noun.endswith("ch") else "s")
    return f"{count} {noun if count == 1 else plural}"


def _samples_in(array: StoredArray, spec: InputSpec, as_given: bool) -> tuple[int, tuple[int, ...]]:
    """(number of samples, shape of one sample) by the rank rule, or (runs, shape of one run) as given;
    InputError naming input, file and shapes."""
    shape = array.shape
    first_axis = 0 if as_given else 1  # a sample leaves out the batch axis; a run as given has none
    sample_dims = spec.dims[first_axis:]
    if as_given:
        if len(shape) == spec.rank:
            count, sample_shape, reading = 1, shape, "one run"
        elif len(shape) == spec.rank + 1:
            count, sample_shape, reading = shape[0], shape[1:], f"{counted(shape[0], 'run')} on axis 0"
        else:
            raise InputError(
                f"{array.where}: input '{spec.name}' has rank {len(shape)} (shape {list(shape)}); the model "
                f"takes {spec.shown()}: with --batch-size {AS_GIVEN}, give rank {spec.rank} (one run, as "
                f"fed) or {spec.rank + 1} (runs stacked on axis 0)"
            )
    elif len(shape) == spec.rank - 1:
        count, sample_shape, reading = 1, shape, "one sample"
    elif len(shape) == spec.rank:
        count, sample_shape, reading = shape[0], shape[1:], counted(shape[0], "sample")
    elif len(shape) == spec.rank + 1:
        count, sample_shape = shape[0] * shape[1], shape[2:]
        reading = f"{counted(shape[0], 'batch')} of {counted(shape[1], 'sample')}"
    else:
        raise InputError(
            f"{array.where}: input '{spec.name}' has rank {len(shape)} (shape {list(shape)}); the model "
            f"takes {spec.shown()}: give rank {spec.rank - 1} (one sample), {spec.rank} (samples on the "
            f"batch axis) or {spec.rank + 1} (a stack of batches)"
        )
    mismatch = [
        axis + first_axis
        for axis, (want, got) in enumerate(zip(sample_dims, sample_shape))
        if want is not None and want != got
    ]
    if mismatch:
        raise InputError(
            f"{array.where}: input '{spec.name}' has shape {list(shape)}, read as {reading} of shape "
            f"{list(sample_shape)}; the model takes {spec.shown()} (dim {mismatch[0]} differs)"
        )
    return count, tuple(sample_shape)


def _check_part(
    part: Part, inputs: Sequence[InputSpec], as_given: bool
) -> tuple[int, dict[str, tuple[int, ...]]]:
    names = [spec.name for spec in inputs]
    missing = [n for n in names if n not in part.arrays]
    extra = sorted(set(part.arrays) - set(names))
    if missing or extra:
        problems = [
            f"missing input(s) {missing}" if missing else "",
            f"unknown array(s) {extra}" if extra else "",
        ]
        raise InputError(f"{part.where}: {'; '.join(p for p in problems if p)}; the model takes {names}")
    counts: dict[str, int] = {}
    sample_shapes: dict[str, tuple[int, ...]] = {}
    for spec in inputs:
        array = part.arrays[spec.name]
        if array.dtype != spec.dtype and array.python_type is not None:
            raise InputError(
                f"{array.where}: input '{spec.name}' is a Python {array.python_type}, which numpy reads as "
                f"{array.dtype}; the model takes {spec.shown()}: give np.asarray(..., dtype=np.{spec.dtype})"
            )
        if array.dtype != spec.dtype:
            raise InputError(
                f"{array.where}: input '{spec.name}' has dtype {array.dtype}; the model takes {spec.shown()}"
            )
        counts[spec.name], sample_shapes[spec.name] = _samples_in(array, spec, as_given)
    if len(set(counts.values())) > 1:
        unit = "runs" if as_given else "samples"
        raise InputError(f"{part.where}: inputs hold different numbers of {unit} {counts}; they must agree")
    return next(iter(counts.values())), sample_shapes


def available_memory() -> int | None:
    """Bytes this process may still allocate: the smaller of what its address-space limit (`ulimit -v`)
    leaves and the system's available memory; None where neither can be read."""
    limits = []
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as statm:  # pages of address space in use
                used = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            limits.append(max(0, soft - used))
    except (ImportError, OSError, ValueError):
        pass
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    return min(limits) if limits else None


COPIES_WHILE_BATCHING = 3
"""A batch is held up to three times while it is assembled: the read blocks, their concatenation, and
the contiguous array fed to the model."""


def _check_batch_fits(
    part: Part, inputs: Sequence[InputSpec], sample_shapes: Mapping[str, tuple[int, ...]], samples: int
) -> None:
    """Refuse, from the headers alone, a batch that cannot be held in memory (before allocating any of it)."""
    sizes = {
        spec.name: math.prod(sample_shapes[spec.name]) * part.arrays[spec.name].dtype.itemsize
        for spec in inputs
    }
    needed = sum(sizes.values()) * samples * COPIES_WHILE_BATCHING
    available = available_memory()
    if available is not None and needed > available:
        largest = max(sizes, key=lambda name: sizes[name])
        array = part.arrays[largest]
        raise InputError(
            f"{array.where}: one sample of input '{largest}' is shape {list(sample_shapes[largest])} of "
            f"{array.dtype} ({sizes[largest] / 2**30:.2f} GiB); a batch of {samples} sample(s) needs "
            f"{needed / 2**30:.2f} GiB while it is assembled, more than the {available / 2**30:.2f} GiB this "
            f"process can still allocate (a smaller --batch-size, or smaller samples)"
        )


def _sample_blocks(
    part: Part, inputs: Sequence[InputSpec], as_given: bool, batch_size: int = 1
) -> Iterator[dict[str, np.ndarray]]:
    """The part's samples (or runs) as blocks {input: array[n, *sample_shape]}, a few megabytes at a time."""
    count, sample_shapes = _check_part(part, inputs, as_given)
    if count == 0:
        return
    _check_batch_fits(part, inputs, sample_shapes, 1 if as_given else min(count, batch_size))
    readers = {}
    sample_sizes = {}
    dtypes = {spec.name: part.arrays[spec.name].dtype for spec in inputs}
    for spec in inputs:
        sample_sizes[spec.name] = int(np.prod(sample_shapes[spec.name], dtype=np.int64))
        readers[spec.name] = part.arrays[spec.name].pieces(CHUNK_BYTES)
    # Every input advances by the same number of samples; leftovers wait for the next piece.
    buffers: dict[str, list[np.ndarray]] = {name: [] for name in readers}
    buffered = dict.fromkeys(readers, 0)  # elements
    done = 0
    while done < count:
        for name, reader in readers.items():
            while buffered[name] < sample_sizes[name]:  # at least one whole sample of every input
                piece = next(reader, None)
                if piece is None:
                    break
                buffers[name].append(piece)
                buffered[name] += piece.size
        available = min(
            buffered[name] // sample_sizes[name] if sample_sizes[name] else count - done for name in readers
        )
        available = min(available, count - done)
        if available == 0:
            raise InputError(f"{part.where}: ended after {done} of {count} samples")
        block = {}
        for name in readers:
            size = sample_sizes[name]
            if size == 0:  # a zero-size dim: nothing stored, every sample an empty array of this shape
                block[name] = np.empty((available, *sample_shapes[name]), dtypes[name])
                continue
            pieces = buffers[name]
            joined = np.concatenate(pieces) if len(pieces) != 1 else pieces[0]
            block[name] = joined[: available * size].reshape((available, *sample_shapes[name]))
            rest = joined[available * size :]
            buffers[name] = [rest] if rest.size else []
            buffered[name] = rest.size
        done += available
        yield block


# Batching --------------------------------------------------------------------------------------------------
@dataclass
class DatasetStats:
    """What a pass over the dataset read, used and left out."""

    samples_read: int = 0
    samples_used: int = 0
    nonfinite: dict[str, int] = field(default_factory=dict)  # input -> samples with NaN/Inf in it
    excluded: int = 0  # samples left out for NaN/Inf (in any input)
    empty: int = 0  # samples left out as every input of them has no elements (a zero-size dim)
    first_empty: str = ""  # where the first of them was: "in FILE: sample shape 'x' [0, 16]"
    dropped_tail: int = 0  # samples of a last partial batch a fixed batch dim could not take
    batches: int = 0

    def merge(self, other: DatasetStats) -> None:
        """Add another shard's counts (the shards read disjoint samples)."""
        self.samples_read += other.samples_read
        self.samples_used += other.samples_used
        self.excluded += other.excluded
        self.empty += other.empty
        self.first_empty = self.first_empty or other.first_empty
        self.dropped_tail += other.dropped_tail
        self.batches += other.batches
        for name, count in other.nonfinite.items():
            self.nonfinite[name] = self.nonfinite.get(name, 0) + count

    def reset(self, inputs: Iterable[str]) -> None:
        self.samples_read = self.samples_used = self.excluded = self.dropped_tail = self.batches = 0
        self.empty = 0
        self.first_empty = ""
        self.nonfinite = dict.fromkeys(inputs, 0)

    def warnings(self, batch_size: int, unit: str = "sample") -> list[str]:
        notes = []
        if self.excluded:
            per_input = ", ".join(f"'{name}': {count}" for name, count in self.nonfinite.items() if count)
            notes.append(
                f"{self.excluded} of {counted(self.samples_read, unit)} contain NaN/Inf and were excluded "
                f"({per_input})"
            )
        if self.empty:
            notes.append(
                f"{self.empty} of {counted(self.samples_read, unit)} have no elements in any input and were "
                f"left out (the first {self.first_empty})"
            )
        if self.dropped_tail:
            notes.append(
                f"the last {self.dropped_tail} samples do not fill a batch of {batch_size} (the model's "
                "fixed batch dim) and were not used"
            )
        return notes


@dataclass(frozen=True, slots=True)
class Batch:
    """One model feed: arrays by input name, `size` samples on the batch axis; `index` counts from 0."""

    index: int
    arrays: dict[str, np.ndarray]
    size: int
    read: int  # samples read from the source since the previous batch (excluded ones included)


def _window_part(part: Part, inputs: Sequence[InputSpec], as_given: bool, start: int, stop: int) -> Part:
    """The part's samples (or runs) [start, stop) only, stacked on axis 0; only their bytes are read."""
    count, sample_shapes = _check_part(part, inputs, as_given)
    if start == 0 and stop == count:
        return part
    arrays = {}
    for spec in inputs:
        array = part.arrays[spec.name]
        size = math.prod(sample_shapes[spec.name])
        low = start * size

        def pieces(max_bytes: int, array: StoredArray = array, low: int = low, high: int = stop * size):
            return array.elements(low, high, max_bytes)

        def window(first: int, last: int, max_bytes: int, array: StoredArray = array, low: int = low):
            return array.elements(low + first, low + last, max_bytes)

        shape = (stop - start, *sample_shapes[spec.name])
        arrays[spec.name] = StoredArray(array.where, shape, array.dtype, pieces, array.python_type, window)
    return Part(part.where, arrays)


@dataclass(frozen=True)
class Dataset:
    """A calibration dataset bound to a model's inputs and a batch size; iterate `batches()` (re-iterable).
    `as_given`: every item is one run as stored (a `Batch` of size 1), `batch_size` is then 1.

    A shard (`shard`: its index and the number of shards, see `shard_datasets`) reads only its own files,
    items or rows (`windows`: samples [start, stop) per part of its source, None for a whole part), numbers
    its batches from `first_batch`, and leaves the checks of the whole dataset (empty, nothing usable) to
    whoever merges the shards' stats (`check_usable`)."""

    source: Source
    inputs: tuple[InputSpec, ...]
    batch_size: int
    fixed_batch: bool
    as_given: bool = False
    shard: tuple[int, int] | None = None
    windows: tuple[tuple[int, int] | None, ...] | None = None
    first_batch: int = 0

    @property
    def unit(self) -> str:
        """What the stats count: samples, or runs as given."""
        return "run" if self.as_given else "sample"

    @property
    def feed(self) -> str:
        """What one `Batch` is called: a batch of samples, or a run as given."""
        return "run" if self.as_given else "batch"

    @property
    def label(self) -> str:
        return self.source.label

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def count_samples(self) -> int | None:
        """Samples in the source, from headers only (no data read); None when only iterating can tell."""
        if self.source.kind == "function":
            return None
        parts = self.source.parts(self.input_names)
        return sum(_check_part(part, self.inputs, self.as_given)[0] for part in parts)

    def batches(self, stats: DatasetStats | None = None) -> Iterator[Batch]:
        """Batches in a fixed order; NaN/Inf samples left out and counted in `stats`. InputError when the
        source has no samples, or none left to use."""
        stats = stats if stats is not None else DatasetStats()
        stats.reset([spec.name for spec in self.inputs])
        float_inputs = [spec.name for spec in self.inputs if spec.dtype.kind == "f"]
        pending: list[dict[str, np.ndarray]] = []
        pending_count = 0
        pending_shapes: dict[str, tuple[int, ...]] | None = None
        read_since = 0
        index = self.first_batch

        def flush(count: int) -> Batch:
            nonlocal pending, pending_count, read_since, index
            arrays = {
                name: np.concatenate([block[name] for block in pending])
                if len(pending) > 1
                else pending[0][name]
                for name in pending[0]
            }
            # A run as given is fed as stored: its one item, without the axis the blocks stack items on.
            batch_arrays = {
                name: np.ascontiguousarray(array[0] if self.as_given else array[:count])
                for name, array in arrays.items()
            }
            rest = {name: array[count:] for name, array in arrays.items()}
            pending_count -= count
            pending = [rest] if pending_count else []
            batch = Batch(index, batch_arrays, count, read_since)
            read_since = 0
            index += 1
            stats.samples_used += count
            stats.batches += 1
            return batch

        for part in self._parts():
            for block in _sample_blocks(part, self.inputs, self.as_given, self.batch_size):
                block_size = next(iter(block.values())).shape[0]
                stats.samples_read += block_size
                read_since += block_size
                # Samples whose every input has a zero-size dim hold nothing to observe (and might stop the
                # model): left out and counted, as NaN samples are. An input empty beside non-empty ones
                # (a decoder's first step, with its past key/value cache of length 0) is fed as it is.
                if all(array.size == 0 for array in block.values()):
                    stats.empty += block_size
                    if not stats.first_empty:
                        shapes = ", ".join(f"'{n}' {list(a.shape[1:])}" for n, a in block.items())
                        stats.first_empty = f"in {part.where}: sample shape {shapes}"
                    continue
                keep = np.ones(block_size, dtype=bool)
                for name in float_inputs:
                    if block[name].size == 0:  # no values, so none is NaN (and reshape(n, -1) is ambiguous)
                        continue
                    finite = np.isfinite(block[name].reshape(block_size, -1)).all(axis=1)
                    stats.nonfinite[name] += int(block_size - finite.sum())
                    keep &= finite
                if not keep.all():
                    stats.excluded += int(block_size - keep.sum())
                    block = {name: array[keep] for name, array in block.items()}
                    block_size = int(keep.sum())
                    if block_size == 0:
                        continue
                shapes = {name: array.shape[1:] for name, array in block.items()}
                if pending_shapes is not None and shapes != pending_shapes and pending_count:
                    if self.fixed_batch:
                        name = next(n for n in shapes if shapes[n] != pending_shapes[n])
                        raise InputError(
                            f"{part.where}: input '{name}' has samples of shape {list(shapes[name])}, but "
                            f"the batch being filled has {list(pending_shapes[name])}; a fixed batch of "
                            f"{self.batch_size} needs samples of one shape"
                        )
                    yield flush(pending_count)  # a dynamic batch dim: close the batch at the shape change
                pending_shapes = shapes
                pending.append(block)
                pending_count += block_size
                while pending_count >= self.batch_size:
                    yield flush(self.batch_size)
        if pending_count:
            if self.fixed_batch:
                stats.dropped_tail = pending_count
                pending = []
            else:
                yield flush(pending_count)
        if self.shard is None:
            self.check_usable(stats)

    def _parts(self) -> Iterator[Part]:
        """The source's parts, each cut to this shard's window of it."""
        parts = self.source.parts(self.input_names)
        if self.windows is None:
            yield from parts
            return
        for part, window in zip(parts, self.windows, strict=True):
            yield part if window is None else _window_part(part, self.inputs, self.as_given, *window)

    def check_usable(self, stats: DatasetStats) -> None:
        """InputError when a whole pass (all shards' stats merged) read no samples, or none it could use."""
        if stats.samples_read == 0:
            raise InputError(f"{self.label}: dataset is empty (no {self.unit}s)")
        if stats.samples_used == 0:
            if stats.excluded == stats.samples_read:
                per_input = ", ".join(f"'{n}': {c}" for n, c in stats.nonfinite.items() if c)
                raise InputError(
                    f"{self.label}: all {stats.samples_read} {self.unit}s contain NaN/Inf ({per_input}); "
                    "nothing to calibrate on"
                )
            if stats.excluded + stats.empty == stats.samples_read:
                nonfinite = f"{stats.excluded} contain NaN/Inf, " if stats.excluded else ""
                raise InputError(
                    f"{self.label}: none of the {stats.samples_read} {self.unit}s is usable: {nonfinite}"
                    f"{stats.empty} have no elements (a zero-size dim in every input; the first "
                    f"{stats.first_empty}); nothing to calibrate on"
                )
            raise InputError(
                f"{self.label}: {stats.samples_read - stats.excluded - stats.empty} usable samples do not "
                f"fill one batch of {self.batch_size} (the model's fixed batch dim)"
            )


def shard_datasets(dataset: Dataset, count: int) -> list[Dataset] | None:
    """`count` shards of the dataset, each reading only its share; None when the source cannot be split
    (a data function without the shard protocol: every worker then reads it all, see workers.py).

    Files, and items of a list, are split by sample ranges counted from their headers (no data read),
    cut at whole batches of the unsplit dataset: shard k takes batches [k*n/count, (k+1)*n/count) of n. So
    each shard forms the batches one process forms (unless samples left out, NaN/Inf or empty, or a change
    of a dynamic dim shift them), and a file outside a shard's range is not opened by it. A range inside
    a file reads only its rows: memory-mapped for .npy and stored .npz members (np.savez's), streamed
    up to them for a compressed .npz. A function that takes `shard_index` and `num_shards` is called
    with them in every shard and yields that shard's data only.
    """
    source = dataset.source
    if source.kind == "function":
        if not takes_shard(source.load()):
            return None
        return [
            replace(dataset, source=replace(source, shard=(k, count)), shard=(k, count)) for k in range(count)
        ]
    names = dataset.input_names
    if source.kind == "sequence":
        assert source.items is not None
        keys: list[object] = list(source.items)
    else:
        keys = [str(path) for path in source.file_paths()]
    counts = [_check_part(part, dataset.inputs, dataset.as_given)[0] for part in source.parts(names)]
    offsets = [0, *itertools.accumulate(counts)]
    batch = dataset.batch_size
    batches = -(-offsets[-1] // batch)
    shards = []
    for index in range(count):
        first, last = index * batches // count, (index + 1) * batches // count
        low, high = first * batch, min(last * batch, offsets[-1])
        chosen: list[object] = []
        windows: list[tuple[int, int] | None] = []
        for key, size, offset in zip(keys, counts, offsets):
            start, stop = max(low - offset, 0), min(high - offset, size)
            if start < stop:
                chosen.append(key)
                windows.append(None if (start, stop) == (0, size) else (start, stop))
        if source.kind == "sequence":
            part_source = replace(source, items=chosen)
        else:
            part_source = replace(source, kind="files", files=tuple(str(key) for key in chosen), path=None)
        shards.append(
            replace(
                dataset, source=part_source, shard=(index, count), windows=tuple(windows), first_batch=first
            )
        )
    return shards


def open_dataset(data: DataSource, model: ModelProto, batch_size: int | str | None = None) -> Dataset:
    """Bind `data` to the model's inputs; InputError when the source or the batch size is unusable.
    `batch_size`: samples per run, None for the model's fixed batch dim (else 8), or `AS_GIVEN`."""
    if isinstance(data, Mapping):
        # A dict is iterable (over its keys), which would read as a stream of names, not of batches.
        raise InputError(
            f"data: got {one_dict(data)}; expected a list of such dicts (input name -> array, one per "
            "batch: wrap it as [data]), a function returning them, a folder, an .npz/.npy file or "
            "MODULE:FUNCTION"
        )
    if batch_size == AS_GIVEN:
        return Dataset(resolve_source(data), model_inputs(model, as_given=True), 1, False, as_given=True)
    if isinstance(batch_size, str) or (batch_size is not None and batch_size < 1):  # before the inputs
        raise InputError(f"--batch-size {batch_size}: expected 1 or more samples, or '{AS_GIVEN}'")
    inputs = model_inputs(model)
    size, fixed = choose_batch_size(inputs, batch_size)
    return Dataset(resolve_source(data), inputs, size, fixed)


__all__ = [
    "AS_GIVEN",
    "Batch",
    "DataSource",
    "Dataset",
    "DatasetStats",
    "InputSpec",
    "choose_batch_size",
    "model_inputs",
    "open_dataset",
    "resolve_source",
    "shard_datasets",
]
