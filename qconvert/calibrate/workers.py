"""Where calibration passes run: in this process, in worker processes, or on Ray; each keeps one session.

NOTE: an engine is opened once per calibration and runs every pass: worker processes (spawn context) and
Ray actors start once, receive the model once and build their onnxruntime session on first use, so a
two-pass method pays for start-up and model loading once. A pass is split into shares: share i of N
runs the batches whose index is i mod N, observing into its own copy of the pass's (empty) observers;
`collect` merges the copies in share order. Every share reads the whole dataset (so all form the same
batches) but runs the model only on its own batches.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import multiprocessing
import os
import pickle
import queue
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np

from qconvert.calibrate.dataset import Batch, Dataset, DatasetStats
from qconvert.calibrate.observer import Observer
from qconvert.errors import InputError, QConvertError

ENGINES = ("local", "ray")

# Observers of one pass: tensor name -> the observers fed with that tensor (all see the same batches).
ObserverTable = dict[str, list[Observer]]


@dataclass(frozen=True)
class AugmentedModel:
    """The float model with every calibrated tensor as a graph output, serialized for onnxruntime.

    `model_bytes` holds none of the main graph's large float initializers stored as raw_data: they travel
    beside it as arrays (`weights`) that onnxruntime takes as external initializers, and a model with
    external data keeps it in its own folder (`external_data_folder`), which onnxruntime reads directly.
    So a model over 2 GB is never copied into a proto, and no model's weights are serialized and parsed
    once more. (onnxruntime still copies the arrays into its own initializers.)
    """

    model_bytes: bytes
    external_data_folder: str | None
    tensors: tuple[str, ...]  # calibrated tensors, in graph order
    element_types: dict[str, str]  # tensor -> "f32" | "f16"
    label: str  # the model's path for error messages, or "<ModelProto>"
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # initializer -> its data


def make_session(augmented: AugmentedModel, threads: int = 1) -> Any:
    """An onnxruntime CPU session without graph optimizations (the calibrator's), with `threads` intra-op
    threads (0: onnxruntime's default, one per core).

    `observe_share` runs two batches side by side, so its callers give each run half the cores. The
    threads do not spin between ops: the observers run beside them and need those cores.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if augmented.external_data_folder is not None:
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", augmented.external_data_folder
        )
    # onnxruntime's API wants these buffers to outlive the session (it copies them today): it keeps them.
    weights = [ort.OrtValue.ortvalue_from_numpy(array) for array in augmented.weights.values()]
    if weights:
        options.add_external_initializers(list(augmented.weights), weights)
    try:
        session = ort.InferenceSession(augmented.model_bytes, options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types for any invalid model
        raise InputError(f"{augmented.label}: onnxruntime cannot load the model: {error}") from None
    session.qconvert_weights = weights  # pyright: ignore[reportAttributeAccessIssue]
    return session


# One share of one pass -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Share:
    """One worker's part of a pass (picklable): the dataset, empty observers, which batches are its own."""

    dataset: Dataset
    observers: ObserverTable
    index: int
    count: int


@dataclass
class ShareResult:
    observers: ObserverTable
    stats: DatasetStats
    batches_run: int = 0
    samples_reported: int = 0
    seconds: float = 0.0


def run_threads(threads: int) -> int:
    """Intra-op threads of a session that `observe_share` runs on `threads` cores (two runs at once)."""
    return max(1, threads // 2)


def observe_share(session: Any, share: Share, report: Callable[[int], None], threads: int = 1) -> ShareResult:
    """Run the model on the share's batches, feeding its observers; `report(samples)` after each batch.

    `threads` is the number of cores this share may use. Batch k's tensors are observed by that many
    threads (numpy releases the GIL in its loops), the largest first, while onnxruntime runs batch k+1 on
    a helper thread (it releases the GIL too), so at most two batches of intermediates are alive. There
    are two such helpers (one with a single core) and the session has half the cores (`run_threads`):
    when onnxruntime is the slower side, batch k+2 starts as soon as batch k is observed, beside k+1, so
    the model then uses every core, and two runs on half the cores each spend less CPU than one run on
    all of them. Every observer still sees its batches in order, one at a time, so the result does not
    depend on `threads`.
    """
    started = time.perf_counter()
    names = list(share.observers)
    observers = [id(observer) for table in share.observers.values() for observer in table]
    if threads > 1 and len(set(observers)) != len(observers):
        raise ValueError("an observer listed under two tensors would be fed by two threads at once")
    stats = DatasetStats()
    result = ShareResult(share.observers, stats)

    def run(batch: Batch) -> list[np.ndarray]:
        try:
            return session.run(names, batch.arrays)
        except Exception as error:  # onnxruntime's own exception types
            raise InputError(
                f"{share.dataset.label}: onnxruntime failed on batch {batch.index}: {error}"
            ) from None

    def observe_tensor(name: str, values: np.ndarray) -> None:
        for observer in share.observers[name]:
            observer.observe(values)

    def observe(batch: Batch, outputs: Future[list[np.ndarray]], pool: ThreadPoolExecutor | None) -> None:
        # A zero-size dim leaves nothing to observe (and min/max of nothing is undefined).
        tensors = [(name, values) for name, values in zip(names, outputs.result()) if values.size]
        tensors.sort(key=lambda item: item[1].size, reverse=True)
        if pool is None:
            for name, values in tensors:
                observe_tensor(name, values)
        else:
            for future in [pool.submit(observe_tensor, name, values) for name, values in tensors]:
                future.result()
        result.batches_run += 1
        result.samples_reported += batch.size
        report(batch.size)

    with contextlib.ExitStack() as stack:
        runner = stack.enter_context(ThreadPoolExecutor(min(threads, 2), thread_name_prefix="onnxruntime"))
        pool = None
        if threads > 1:
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="observe"))
        pending: tuple[Batch, Future[list[np.ndarray]]] | None = None
        for batch in share.dataset.batches(stats):
            if batch.index % share.count != share.index:
                continue
            running = (batch, runner.submit(run, batch))
            if pending is not None:
                observe(*pending, pool)
            pending = running
        if pending is not None:
            observe(*pending, pool)
    if share.index == 0:  # samples read but not run: counted once, by the first share
        result.samples_reported += stats.excluded + stats.dropped_tail
        report(stats.excluded + stats.dropped_tail)
    result.seconds = time.perf_counter() - started
    return result


# Engines ------------------------------------------------------------------------------------------------
class Engine(Protocol):
    workers: int

    def run(self, shares: Sequence[Share], progress: Callable[[int], None]) -> list[ShareResult]:
        """Every share of one pass; results in share order. `progress(samples)` as batches finish."""
        ...


class InProcessEngine:
    """One share, here, on every core."""

    workers = 1

    def __init__(self, augmented: AugmentedModel) -> None:
        self.augmented = augmented
        self.session: Any = None

    def run(self, shares: Sequence[Share], progress: Callable[[int], None]) -> list[ShareResult]:
        threads = os.cpu_count() or 1
        if self.session is None:
            self.session = make_session(self.augmented, run_threads(threads))
        return [observe_share(self.session, share, progress, threads) for share in shares]


# State of a worker process (set by its initializer): the model, its session once built, the progress queue.
_worker_state: dict[str, Any] = {}


def _start_worker(model_path: str, threads: int, messages: Any) -> None:
    with open(model_path, "rb") as file:  # the pickle ProcessEngine wrote for its own workers
        augmented = pickle.load(file)
    _worker_state.update(augmented=augmented, threads=threads, messages=messages, session=None)


def _run_in_worker(share: Share) -> ShareResult:
    state = _worker_state
    if state["session"] is None:
        state["session"] = make_session(state["augmented"], run_threads(state["threads"]))
    messages = state["messages"]
    return observe_share(state["session"], share, lambda samples: messages.put(samples), state["threads"])


def _check_picklable(dataset: Dataset) -> None:
    """Worker processes receive the dataset pickled: a lambda or a local function cannot be sent."""
    try:
        pickle.dumps(dataset.source)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise InputError(
            f"data {dataset.label}: cannot be sent to worker processes ({error}); give a module-level "
            "function, MODULE:FUNCTION, or files (or use --workers 1)"
        ) from None


_UNGUARDED_SCRIPT = (
    'a script that calls calibrate with workers > 1 outside `if __name__ == "__main__":` (worker '
    "processes are spawned: they import the script again)"
)


def _raise_from_share(error: BaseException) -> None:
    if isinstance(error, QConvertError):
        raise InputError(error.message) from None
    if isinstance(error, BrokenProcessPool):
        raise RuntimeError(
            f"a calibration worker process died: out of memory, or {_UNGUARDED_SCRIPT}"
        ) from None
    raise RuntimeError(f"calibration worker failed: {type(error).__name__}: {error}") from None


class ProcessEngine:
    """`workers` spawned processes, each with its own session and `os.cpu_count() // workers` cores.

    The workers read the model from a temporary file, not from their start-up arguments: spawn writes
    those into a pipe the new process reads only after importing the caller's script again, and a
    process that dies first (a script calling calibrate outside `if __name__ == "__main__":`) would
    leave a model larger than the pipe's buffer half written and this process waiting forever.
    """

    def __init__(self, augmented: AugmentedModel, workers: int) -> None:
        # A spawned worker running the caller's unguarded script again: stop before creating semaphores
        # that its parent, killing the broken pool, would leave behind (and resource_tracker warn of).
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            raise RuntimeError(f"this worker process is running {_UNGUARDED_SCRIPT}")
        self.workers = workers
        self.folder = tempfile.TemporaryDirectory(prefix="qconvert-calibrate-")
        model_path = os.path.join(self.folder.name, "augmented.pickle")
        with open(model_path, "wb") as file:
            pickle.dump(augmented, file, protocol=pickle.HIGHEST_PROTOCOL)
        context = multiprocessing.get_context("spawn")
        self.messages = context.Queue()
        threads = max(1, (os.cpu_count() or 1) // workers)
        self.pool = ProcessPoolExecutor(
            workers,
            mp_context=context,
            initializer=_start_worker,
            initargs=(model_path, threads, self.messages),
        )

    def run(self, shares: Sequence[Share], progress: Callable[[int], None]) -> list[ShareResult]:
        _check_picklable(shares[0].dataset)
        futures = [self.pool.submit(_run_in_worker, share) for share in shares]
        while True:
            try:
                progress(self.messages.get(timeout=0.2))
            except queue.Empty:
                if all(future.done() for future in futures):
                    break
        results = []
        for future in futures:
            error = future.exception()
            if error is not None:
                _raise_from_share(error)
            results.append(future.result())
        return results

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.messages.close()
        self.folder.cleanup()


class _RayWorker:
    """A Ray actor: the model's session, built on first use, kept for every pass."""

    def __init__(self, augmented: AugmentedModel, threads: int) -> None:
        self.augmented = augmented
        self.threads = threads
        self.session: Any = None

    def run(self, share: Share) -> ShareResult:
        if self.session is None:  # on a cluster (threads 0) the actor cannot know its cores: the default
            self.session = make_session(self.augmented, run_threads(self.threads) if self.threads else 0)
        # Ray hands numpy arrays over zero-copy from its object store, read-only: observe into a copy.
        share = Share(share.dataset, copy.deepcopy(share.observers), share.index, share.count)
        return observe_share(self.session, share, lambda samples: None, max(1, self.threads))


class RayEngine:
    """`workers` Ray actors on a local Ray instance (or the cluster `ray.init` already connected to).

    The model travels through Ray's object store, but the data source is re-opened by each actor: on a
    cluster of several machines, its files (and a model's external data folder) must be at the same
    path on every node. Progress moves when a share finishes: actors report nothing before."""

    def __init__(self, augmented: AugmentedModel, workers: int) -> None:
        import ray

        self.workers = workers
        threads = max(1, (os.cpu_count() or 1) // workers) if not ray.is_initialized() else 0
        actor = ray.remote(num_cpus=1)(_RayWorker)
        model = ray.put(augmented)  # once, shared by the actors
        self.actors: list[Any] = [actor.remote(model, threads) for _ in range(workers)]

    def run(self, shares: Sequence[Share], progress: Callable[[int], None]) -> list[ShareResult]:
        import ray
        import ray.exceptions

        references = [actor.run.remote(share) for actor, share in zip(self.actors, shares)]
        pending = list(references)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                finished = ray.get(done[0])
            except ray.exceptions.RayTaskError as error:
                _raise_from_share(error.cause)
                raise
            progress(finished.samples_reported)
        # Results come back read-only too (zero-copy); the parent merges into them, so copy.
        return [cast(ShareResult, copy.deepcopy(ray.get(reference))) for reference in references]


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


@contextlib.contextmanager
def open_engine(augmented: AugmentedModel, workers: int = 1, engine: str = "local") -> Iterator[Engine]:
    """The engine that runs every pass of one calibration; closed (processes, Ray) on exit."""
    if workers < 1:
        raise InputError(f"--workers {workers}: expected 1 or more")
    if engine not in ENGINES:
        raise InputError(f"--engine {engine}: expected one of {', '.join(ENGINES)}")
    if engine == "ray":
        with ray_instance(workers):
            yield RayEngine(augmented, workers)
        return
    if workers == 1:
        yield InProcessEngine(augmented)
        return
    processes = ProcessEngine(augmented, workers)
    try:
        yield processes
    finally:
        processes.close()


__all__ = [
    "AugmentedModel",
    "ENGINES",
    "Engine",
    "ObserverTable",
    "Share",
    "ShareResult",
    "make_session",
    "observe_share",
    "open_engine",
    "ray_instance",
]
