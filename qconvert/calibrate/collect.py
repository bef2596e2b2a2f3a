"""Run the float model over a dataset, feeding every float intermediate tensor to its observers per batch.

NOTE: the tensors observed are the ones onnxruntime's calibrators observe (reference §2.2): every input
and output of every node whose inferred element type is float32 or float16 and that is not an
initializer. They are exposed as graph outputs of an augmented copy of the model, run once per batch by
onnxruntime on the CPU with graph optimizations disabled (so values are the ones onnxruntime's calibrator
sees); each output's batch goes to its observers and is dropped before the next batch runs.

Work splits across processes (`workers > 1`, spawn context) or Ray actors (`engine="ray"`), see
workers.py: batch i runs in share i mod N, each share observes into its own copy of the (empty)
observers, and the copies are merged here in share order. With exact observers (min/max, fixed-range
histograms) the merged result is bit-identical to one process.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from onnx import ModelProto, TensorProto
from onnx.external_data_helper import uses_external_data

from qconvert.calibrate.dataset import Dataset, DatasetStats, shard_datasets
from qconvert.calibrate.observer import Observer
from qconvert.calibrate.workers import (
    ENGINES,
    AugmentedModel,
    Engine,
    FirstBatches,
    ObserverTable,
    Share,
    ShareResult,
    make_session,
    open_engine,
)
from qconvert.errors import InputError

if TYPE_CHECKING:
    from qconvert.frontends.onnx.load import LoadedModel
    from qconvert.frontends.onnx.wire import RawData

FLOAT_TYPES: dict[int, str] = {TensorProto.FLOAT: "f32", TensorProto.FLOAT16: "f16"}
# Ops whose (first) output holds exactly their first input's values, rearranged: every observer sees the
# same multiset in each batch, so the output shares its input's observers instead of being observed.
VALUE_PRESERVING_OPS = frozenset({"Flatten", "Identity", "Reshape", "Squeeze", "Transpose", "Unsqueeze"})
# progress(samples done, total samples or None when unknown)
ProgressCallback = Callable[[int, int | None], None]


def calibration_tensors(model: ModelProto, op_types: Collection[str] | None = None) -> dict[str, str]:
    """Tensor name -> "f32"/"f16" for every float, non-initializer input/output of a node, in graph order.

    `op_types` (None: every op) limits the nodes, as `quantize_static` passes its op types to quantize
    to the calibrator. `model` must carry inferred types (value_info); a tensor without one is not
    observed, as in onnxruntime's `select_tensors_to_calibrate`.
    """
    graph = model.graph
    infos = {info.name: info for info in graph.value_info}
    infos.update({info.name: info for info in graph.output})
    infos.update({info.name: info for info in graph.input})
    initializers = {tensor.name for tensor in graph.initializer}
    tensors: dict[str, str] = {}
    for node in graph.node:
        if op_types is not None and node.op_type not in op_types:
            continue
        for name in (*node.input, *node.output):
            if not name or name in tensors or name in initializers or name not in infos:
                continue
            kind = infos[name].type
            if kind.HasField("tensor_type") and kind.tensor_type.elem_type in FLOAT_TYPES:
                tensors[name] = FLOAT_TYPES[kind.tensor_type.elem_type]
    return tensors


def value_preserving_sources(model: ModelProto, tensors: Collection[str]) -> dict[str, str]:
    """Tensor -> the tensor it rearranges (through VALUE_PRESERVING_OPS), for those among `tensors` whose
    chain of such ops leads back to another of `tensors`; that one's observers serve both."""
    calibrated = set(tensors)
    producers = {node.output[0]: node for node in model.graph.node if node.output}
    sources: dict[str, str] = {}
    for name in tensors:
        source = name
        while (node := producers.get(source)) is not None and node.op_type in VALUE_PRESERVING_OPS:
            if not node.input or node.input[0] not in calibrated:
                break
            source = node.input[0]
        if source != name:
            sources[name] = source
    return sources


# Float weights of at least this many bytes leave the proto on load: shape inference then copies a
# small model, and the augmented model hands them to onnxruntime as arrays instead of serialized.
DETACHED_WEIGHT_BYTES = 1024
_DETACHED_TYPES: dict[int, np.dtype] = {
    TensorProto.FLOAT: np.dtype("<f4"),
    TensorProto.FLOAT16: np.dtype("<f2"),
    TensorProto.DOUBLE: np.dtype("<f8"),
}
# The location a detached initializer points at in the augmented model: onnxruntime replaces only
# initializers marked external, and these are replaced before any location is read.
DETACHED_LOCATION = "qconvert-detached-weight"


def load_float_model(source: str | os.PathLike[str] | ModelProto) -> LoadedModel:
    """The model with inferred types and its large float weights detached (`LoadedModel.detached`: views
    of a mapping of the file for a path, bytes for a ModelProto); external data is checked but not read.
    An already quantized model is an InputError."""
    from qconvert.frontends.onnx.load import load_model

    def detach(tensor: TensorProto, raw_data: RawData) -> bool:
        dtype = _DETACHED_TYPES.get(tensor.data_type)
        if dtype is None:
            return False
        size = math.prod(tensor.dims) * dtype.itemsize
        # A raw_data of the wrong length stays in the proto, for onnxruntime to refuse by name.
        return size >= DETACHED_WEIGHT_BYTES and len(raw_data) == size

    # Mapped: calibrate is done with the weights when it returns (and refuses to write over the model).
    loaded = load_model(source, detach=detach, map_file=True)
    if loaded.inference_error is not None:
        raise loaded.inference_error
    refuse_quantized(loaded.model, loaded.label)
    return loaded


# Quantized op types: ONNX's and com.microsoft's (QOperator format, dynamic and weight-only quantization).
QUANTIZED_OP_TYPES = frozenset(
    {
        "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
        "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "QGemm", "QAttention",
        "QEmbedLayerNormalization", "MatMulNBits", "MatMulBnb4", "GatherBlockQuantized",
    }
)  # fmt: skip
QUANTIZED_PREFIXES = ("QLinear", "QOrdered")  # QLinearConv, QLinearMatMul, ...; QOrderedMatMul, ...


def refuse_quantized(model: ModelProto, label: str) -> None:
    """InputError when `model` (subgraphs included) holds quantized ops: calibrating it again would stack
    Q/DQ on its Q/DQ without a word."""
    counts: dict[str, int] = {}
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            if node.op_type in QUANTIZED_OP_TYPES or node.op_type.startswith(QUANTIZED_PREFIXES):
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
            for attribute in node.attribute:
                graphs.extend([attribute.g] if attribute.HasField("g") else [])
                graphs.extend(attribute.graphs)
    if counts:
        first = ("QuantizeLinear", "DequantizeLinear")
        order = [name for name in first if name in counts] + sorted(set(counts) - set(first))
        found = ", ".join(f"{counts[name]} {name}" for name in order)
        raise InputError(f"{label}: already quantized ({found} nodes); calibrate takes a float model")


def augment_model(
    loaded: LoadedModel,
    tensors: Sequence[str] | None = None,
    op_types: Collection[str] | None = None,
) -> AugmentedModel:
    """The loaded model with `tensors` (default: all of `calibration_tensors(model, op_types)`) as
    extra outputs; its detached weights go to onnxruntime beside it (`AugmentedModel.weights`)."""
    model = loaded.model
    types = calibration_tensors(model, op_types)
    if tensors is not None:
        unknown = [name for name in tensors if name not in types]
        if unknown:
            raise InputError(f"tensor(s) {unknown} are not float activations of the model")
        types = {name: types[name] for name in tensors}
    if not types:
        among = "" if op_types is None else " of the op types to quantize"
        raise InputError(
            f"the model has no float (f32/f16) activations to calibrate: every input and output of its "
            f"nodes{among} is an initializer or of another element type"
        )
    augmented = ModelProto()
    augmented.CopyFrom(model)
    graph = augmented.graph
    infos = {info.name: info for info in (*graph.value_info, *graph.input)}
    present = {info.name for info in graph.output}
    for name in types:
        if name not in present:
            graph.output.append(infos[name])
    has_external = any(uses_external_data(tensor) for tensor in graph.initializer)
    folder = str(loaded.base_dir) if has_external and loaded.base_dir is not None else None
    weights: dict[str, np.ndarray] = {}
    for tensor in graph.initializer:
        data = loaded.detached.get(tensor.name)
        if data is None:
            continue
        weights[tensor.name] = np.frombuffer(data, _DETACHED_TYPES[tensor.data_type]).reshape(tensor.dims)
        tensor.data_location = TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value=DETACHED_LOCATION)
    return AugmentedModel(augmented.SerializeToString(), folder, tuple(types), types, loaded.label, weights)


# Public entry point ------------------------------------------------------------------------------------
@dataclass
class CollectResult:
    """Merged observers of one pass, what the dataset gave, and how long it took."""

    observers: ObserverTable
    stats: DatasetStats
    seconds: float
    batches: int
    shares: list[float] = field(default_factory=list)  # seconds per share
    share_results: list[ShareResult] = field(default_factory=list)  # per share: bytes read, process, memory


def _collect_pass(
    engine: Engine,
    augmented: AugmentedModel,
    dataset: Dataset,
    observers: ObserverTable,
    progress: ProgressCallback | None,
    total: int | None,
) -> CollectResult:
    unknown = [name for name in observers if name not in augmented.element_types]
    if unknown:
        raise InputError(f"tensor(s) {unknown} are not exposed by the augmented model")
    started = time.perf_counter()
    count = engine.workers
    shards = shard_datasets(dataset, count) if count > 1 else None  # None: every share reads it all
    datasets = shards if shards is not None else [dataset] * count
    shares = [Share(datasets[index], copy.deepcopy(observers), index, count) for index in range(count)]
    done = 0

    def report(samples: int) -> None:
        nonlocal done
        done += samples
        if progress is not None:
            progress(done, total)

    report(0)  # the total shows while workers start and sessions load
    results = engine.run(shares, report)
    merged = results[0].observers
    for result in results[1:]:
        for name, own in merged.items():
            for mine, theirs in zip(own, result.observers[name]):
                mine.merge(theirs)
    stats = results[0].stats
    if shards is not None:  # each share read its own samples: add them up, then judge the whole
        stats = DatasetStats()
        for result in results:
            stats.merge(result.stats)
        dataset.check_usable(stats)
    if progress is not None:
        progress(stats.samples_read, stats.samples_read)
    return CollectResult(
        observers=merged,
        stats=stats,
        seconds=time.perf_counter() - started,
        batches=sum(result.batches_run for result in results),
        shares=[result.seconds for result in results],
        share_results=results,
    )


def collect(
    augmented: AugmentedModel,
    dataset: Dataset,
    observers: ObserverTable,
    *,
    workers: int = 1,
    engine: str = "local",
    progress: ProgressCallback | None = None,
    total: int | None = None,
    ray_address: str | None = None,
    threads_per_worker: int | None = None,
    verbose: bool = False,
) -> CollectResult:
    """One pass over `dataset`: every batch through the model, each tensor in `observers` observed.

    `observers` are fresh (or seeded by a previous pass, e.g. with a histogram range); they are copied
    per share, filled, and merged in share order into the returned table. `total` is the sample count
    for the progress callback (None: unknown).
    """
    options = {"ray_address": ray_address, "threads_per_worker": threads_per_worker, "verbose": verbose}
    with open_engine(augmented, workers, engine, **options) as running:
        return _collect_pass(running, augmented, dataset, observers, progress, total)


def collect_passes(
    augmented: AugmentedModel,
    dataset: Dataset,
    passes: Sequence[Callable[[Mapping[str, list[Observer]] | None], ObserverTable]],
    *,
    workers: int = 1,
    engine: str = "local",
    progress: ProgressCallback | None = None,
    ray_address: str | None = None,
    threads_per_worker: int | None = None,
    verbose: bool = False,
    first: FirstBatches | None = None,
) -> list[CollectResult]:
    """Several passes over the data: `passes[k](observers of pass k-1 or None)` gives pass k's fresh
    observers (a histogram pass takes its fixed range from a min/max pass). One engine (its processes,
    sessions, Ray actors) serves every pass. Progress spans all passes. `first` reads the first pass's
    first batches when one worker runs it here (workers.FirstBatches); otherwise it is left unread."""
    total = dataset.count_samples()  # None for a function: known after pass 1
    results: list[CollectResult] = []
    options = {"ray_address": ray_address, "threads_per_worker": threads_per_worker, "verbose": verbose}
    with open_engine(augmented, workers, engine, first=first, **options) as running:
        for number, make_observers in enumerate(passes):

            def report(
                done: int, pass_total: int | None, number: int = number, known: int | None = total
            ) -> None:
                per_pass = known if known is not None else pass_total
                if progress is not None:
                    grand = None if per_pass is None else per_pass * len(passes)
                    progress(number * (per_pass or 0) + done, grand)

            previous = results[-1].observers if results else None
            observers = make_observers(previous)
            results.append(_collect_pass(running, augmented, dataset, observers, report, total))
            if total is None:
                total = results[-1].stats.samples_read
    return results


__all__ = [
    "AugmentedModel",
    "CollectResult",
    "DETACHED_WEIGHT_BYTES",
    "ENGINES",
    "FirstBatches",
    "ObserverTable",
    "ProgressCallback",
    "VALUE_PRESERVING_OPS",
    "augment_model",
    "calibration_tensors",
    "collect",
    "collect_passes",
    "load_float_model",
    "make_session",
    "value_preserving_sources",
]
