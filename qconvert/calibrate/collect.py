"""Run the float model over a dataset, feeding every float intermediate tensor to its observers per batch.

NOTE: the tensors observed are the ones onnxruntime's calibrators observe (reference §2.2): every input
and output of every node whose inferred element type is float32 or float16 and that is not an
initializer. They are exposed as graph outputs of an augmented copy of the model, run once per batch by
onnxruntime on the CPU with graph optimizations disabled (so values are the ones onnxruntime's calibrator
sees); each output's batch goes to its observers and is dropped before the next batch runs.

Work splits across processes (`workers > 1`, spawn context) or Ray tasks (`engine="ray"`): batch i runs
in share i mod N; each share observes into its own copy of the (empty) observers, and the parent merges
the copies in share order. Every share reads the whole dataset (to form the same batches) but runs the
model only on its own batches. With exact observers (min/max, fixed-range histograms) the merged result
is bit-identical to one process.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import multiprocessing
import os
import pickle
import queue
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto
from onnx.external_data_helper import uses_external_data

from qconvert.calibrate.dataset import Batch, Dataset, DatasetStats
from qconvert.calibrate.observer import Observer
from qconvert.errors import InputError, QConvertError

FLOAT_TYPES: dict[int, str] = {TensorProto.FLOAT: "f32", TensorProto.FLOAT16: "f16"}
ENGINES = ("local", "ray")

# Observers of one pass: tensor name -> the observers fed with that tensor (all see the same batches).
ObserverTable = dict[str, list[Observer]]
# progress(samples done, total samples or None when unknown)
ProgressCallback = Callable[[int, int | None], None]


@dataclass(frozen=True)
class AugmentedModel:
    """The float model with every calibrated tensor as a graph output, serialized for onnxruntime.

    `model_bytes` never holds external data: a model with external data keeps it in its own folder
    (`external_data_folder`), which onnxruntime reads directly, so a model over 2 GB is never copied.
    """

    model_bytes: bytes
    external_data_folder: str | None
    tensors: tuple[str, ...]  # calibrated tensors, in graph order
    element_types: dict[str, str]  # tensor -> "f32" | "f16"


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


def load_float_model(source: str | os.PathLike[str] | ModelProto) -> tuple[ModelProto, Path | None]:
    """The model with inferred types, external data checked but not read, and its folder."""
    from qconvert.frontends.onnx.load import load_model

    loaded = load_model(source)
    if loaded.inference_error is not None:
        raise loaded.inference_error
    return loaded.model, loaded.base_dir


def augment_model(
    model: ModelProto,
    base_dir: Path | None,
    tensors: Sequence[str] | None = None,
    op_types: Collection[str] | None = None,
) -> AugmentedModel:
    """`model` (types inferred) with `tensors` (default: all of `calibration_tensors(model, op_types)`)
    as extra outputs."""
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
    folder = str(base_dir) if has_external and base_dir is not None else None
    return AugmentedModel(augmented.SerializeToString(), folder, tuple(types), types)


def make_session(augmented: AugmentedModel, threads: int = 0) -> Any:
    """An onnxruntime CPU session without graph optimizations (the calibrator's), `threads` 0 = default."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    if augmented.external_data_folder is not None:
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", augmented.external_data_folder
        )
    try:
        return ort.InferenceSession(augmented.model_bytes, options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types for any invalid model
        raise InputError(f"onnxruntime cannot load the model: {error}") from None


# One share of the work -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Share:
    """What one worker needs (picklable): model, dataset, empty observers, and which batches are its own."""

    augmented: AugmentedModel
    dataset: Dataset
    observers: ObserverTable
    index: int
    count: int
    threads: int


@dataclass
class _ShareResult:
    observers: ObserverTable
    stats: DatasetStats
    batches_run: int = 0
    samples_reported: int = 0
    seconds: float = 0.0


def _observe_share(share: _Share, report: Callable[[int], None]) -> _ShareResult:
    """Run the model on the share's batches, feeding its observers; `report(samples)` after each batch.

    onnxruntime runs batch k+1 on a helper thread (it releases the GIL) while batch k is observed, so
    at most two batches of intermediates are alive; batches are still observed in order.
    """
    started = time.perf_counter()
    session = make_session(share.augmented, share.threads)
    names = list(share.observers)
    stats = DatasetStats()
    result = _ShareResult(share.observers, stats)

    def run(batch: Batch) -> list[np.ndarray]:
        try:
            return session.run(names, batch.arrays)
        except Exception as error:  # onnxruntime's own exception types
            raise InputError(
                f"{share.dataset.label}: onnxruntime failed on batch {batch.index}: {error}"
            ) from None

    def observe(batch: Batch, outputs: Future[list[np.ndarray]]) -> None:
        for name, values in zip(names, outputs.result()):
            if values.size == 0:
                continue  # nothing to observe (a zero-size dim), and min/max of nothing is undefined
            for observer in share.observers[name]:
                observer.observe(values)
        result.batches_run += 1
        result.samples_reported += batch.size
        report(batch.size)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnxruntime") as runner:
        pending: tuple[Batch, Future[list[np.ndarray]]] | None = None
        for batch in share.dataset.batches(stats):
            if batch.index % share.count != share.index:
                continue
            running = (batch, runner.submit(run, batch))
            if pending is not None:
                observe(*pending)
            pending = running
        if pending is not None:
            observe(*pending)
            pending = None
    if share.index == 0:  # samples read but not run: counted once, by the first share
        result.samples_reported += stats.excluded + stats.dropped_tail
        report(stats.excluded + stats.dropped_tail)
    result.seconds = time.perf_counter() - started
    return result


def _worker_main(share: _Share, messages: Any) -> None:
    """Entry point of a worker process: progress and the result (or the error) go back on `messages`."""
    try:
        result = _observe_share(share, lambda samples: messages.put(("progress", share.index, samples)))
        messages.put(("done", share.index, result))
    except QConvertError as error:
        messages.put(("error", share.index, (type(error).__name__, error.message)))
    except Exception as error:  # a bug: reported by the parent as one line
        messages.put(("error", share.index, ("internal", f"{type(error).__name__}: {error}")))


def _raise_worker_error(index: int, kind: str, message: str) -> None:
    if kind == "internal":
        raise RuntimeError(f"calibration worker {index} failed: {message}")
    raise InputError(message)


def _check_picklable(dataset: Dataset) -> None:
    """Worker processes receive the dataset pickled: a lambda or a local function cannot be sent."""
    try:
        pickle.dumps(dataset.source)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise InputError(
            f"data {dataset.label}: cannot be sent to worker processes ({error}); give a module-level "
            "function, MODULE:FUNCTION, or files (or use --workers 1)"
        ) from None


# Engines ------------------------------------------------------------------------------------------------
def _run_local(shares: Sequence[_Share], progress: Callable[[int], None]) -> list[_ShareResult]:
    if len(shares) == 1:
        return [_observe_share(shares[0], progress)]
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    processes = [
        context.Process(target=_worker_main, args=(share, messages), daemon=True) for share in shares
    ]
    for process in processes:
        process.start()
    results: dict[int, _ShareResult] = {}
    try:
        while len(results) < len(shares):
            try:
                kind, index, payload = messages.get(timeout=0.5)
            except queue.Empty:
                dead = [
                    i for i, p in enumerate(processes) if i not in results and p.exitcode not in (None, 0)
                ]
                if dead:
                    code = processes[dead[0]].exitcode
                    raise RuntimeError(f"calibration worker {dead[0]} died (exit code {code})") from None
                continue
            if kind == "progress":
                progress(payload)
            elif kind == "done":
                results[index] = payload
            else:
                _raise_worker_error(index, *payload)
    finally:
        for process in processes:
            if process.is_alive() and len(results) < len(shares):
                process.terminate()
            process.join()
        messages.close()
    return [results[i] for i in range(len(shares))]


def _observe_share_on_ray(share: _Share) -> _ShareResult:
    # Ray hands numpy arrays over zero-copy from its object store, read-only: observe into a copy.
    share = dataclasses.replace(share, observers=copy.deepcopy(share.observers))
    return _observe_share(share, lambda samples: None)


@contextlib.contextmanager
def ray_instance(cpus: int) -> Iterator[None]:
    """A local Ray instance for the duration (shut down after), or the one already connected (kept)."""
    try:
        import ray
    except ImportError:
        raise InputError("--engine ray needs the optional `ray` extra: pip install 'qconvert[ray]'") from None
    if ray.is_initialized():  # the caller's cluster (ray.init(address=...)): use it as it is
        yield
        return
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        yield
    finally:
        ray.shutdown()


def _run_ray(shares: Sequence[_Share], progress: Callable[[int], None]) -> list[_ShareResult]:
    """The shares as Ray tasks; progress moves when a task finishes (tasks report nothing before)."""
    with ray_instance(len(shares)):
        import ray
        import ray.exceptions

        task = ray.remote(num_cpus=1)(_observe_share_on_ray)
        references = [task.remote(share) for share in shares]
        pending = list(references)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                finished = ray.get(done[0])
            except ray.exceptions.RayTaskError as error:
                cause = error.cause
                if isinstance(cause, QConvertError):
                    raise InputError(cause.message) from None
                raise RuntimeError(f"calibration task failed: {cause}") from None
            progress(finished.samples_reported)
        # Results come back read-only too (zero-copy); the parent merges into them, so copy.
        return [copy.deepcopy(ray.get(reference)) for reference in references]


# Public entry point ------------------------------------------------------------------------------------
@dataclass
class CollectResult:
    """Merged observers of one pass, what the dataset gave, and how long it took."""

    observers: ObserverTable
    stats: DatasetStats
    seconds: float
    batches: int
    shares: list[float] = field(default_factory=list)  # seconds per share


def collect(
    augmented: AugmentedModel,
    dataset: Dataset,
    observers: ObserverTable,
    *,
    workers: int = 1,
    engine: str = "local",
    progress: ProgressCallback | None = None,
    total: int | None = None,
) -> CollectResult:
    """One pass over `dataset`: every batch through the model, each tensor in `observers` observed.

    `observers` are fresh (or seeded by a previous pass, e.g. with a histogram range); they are copied
    per share, filled, and merged in share order into the returned table. `total` is the sample count
    for the progress callback (None: unknown).
    """
    if workers < 1:
        raise InputError(f"--workers {workers}: expected 1 or more")
    if engine not in ENGINES:
        raise InputError(f"--engine {engine}: expected one of {', '.join(ENGINES)}")
    unknown = [name for name in observers if name not in augmented.element_types]
    if unknown:
        raise InputError(f"tensor(s) {unknown} are not exposed by the augmented model")
    started = time.perf_counter()
    shares_count = workers if (workers > 1 or engine == "ray") else 1
    # Each process gets its share of the cores; onnxruntime's default is all of them in every process.
    threads = 0 if shares_count == 1 else max(1, (os.cpu_count() or 1) // shares_count)
    shares = [
        _Share(augmented, dataset, copy.deepcopy(observers), index, shares_count, threads)
        for index in range(shares_count)
    ]
    if shares_count > 1 and engine == "local":
        _check_picklable(dataset)
    done = 0

    def report(samples: int) -> None:
        nonlocal done
        done += samples
        if progress is not None:
            progress(done, total)

    results = _run_ray(shares, report) if engine == "ray" else _run_local(shares, report)
    merged = results[0].observers
    for result in results[1:]:
        for name, own in merged.items():
            for mine, theirs in zip(own, result.observers[name]):
                mine.merge(theirs)
    stats = results[0].stats
    if progress is not None:
        progress(stats.samples_read, stats.samples_read)
    return CollectResult(
        observers=merged,
        stats=stats,
        seconds=time.perf_counter() - started,
        batches=sum(result.batches_run for result in results),
        shares=[result.seconds for result in results],
    )


def collect_passes(
    augmented: AugmentedModel,
    dataset: Dataset,
    passes: Sequence[Callable[[Mapping[str, list[Observer]] | None], ObserverTable]],
    *,
    workers: int = 1,
    engine: str = "local",
    progress: ProgressCallback | None = None,
) -> list[CollectResult]:
    """Several passes over the data: `passes[k](observers of pass k-1 or None)` gives pass k's fresh
    observers (a histogram pass takes its fixed range from a min/max pass). Progress spans all passes."""
    total = dataset.count_samples()  # None for a function: known after pass 1
    results: list[CollectResult] = []
    # One Ray instance for every pass: starting one takes seconds.
    engine_scope = ray_instance(workers) if engine == "ray" else contextlib.nullcontext()
    with engine_scope:
        for number, make_observers in enumerate(passes):

            def report(
                done: int, pass_total: int | None, number: int = number, known: int | None = total
            ) -> None:
                per_pass = known if known is not None else pass_total
                if progress is not None:
                    grand = None if per_pass is None else per_pass * len(passes)
                    progress(number * (per_pass or 0) + done, grand)

            previous = results[-1].observers if results else None
            results.append(
                collect(
                    augmented,
                    dataset,
                    make_observers(previous),
                    workers=workers,
                    engine=engine,
                    progress=report,
                    total=total,
                )
            )
            if total is None:
                total = results[-1].stats.samples_read
    return results


__all__ = [
    "AugmentedModel",
    "CollectResult",
    "ENGINES",
    "ObserverTable",
    "ProgressCallback",
    "augment_model",
    "calibration_tensors",
    "collect",
    "collect_passes",
    "load_float_model",
    "make_session",
]
