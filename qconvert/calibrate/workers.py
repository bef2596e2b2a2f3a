"""Where calibration passes run: in this process, in worker processes, or on Ray; each keeps one session.

NOTE: an engine is opened once per calibration and runs every pass: worker processes (spawn context) and
Ray actors start once, receive the model once and build their onnxruntime session on first use, so a
two-pass method pays for start-up and model loading once. A pass is split into shares, each observing
into its own copy of the pass's (empty) observers; `collect` merges the copies in share order. Files and
lists are sharded (dataset.shard_datasets): share i reads only its own files or rows, contiguous runs of
whole batches. A data function that takes `shard_index, num_shards` yields share i's data only; any other
function is read whole by every share, which runs the batches whose index is i mod N.
Ray (ray_cluster.py) runs the shares as actors on a private instance or on a cluster it joins.

When something stops a calibration (an error, Ctrl-C, the CLI's SIGTERM), worker processes are ended at
once, not waited for. A worker that dies (killed, out of memory, a crash, a data function ending its process)
is reported in one line naming it and its exit code or signal.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from qconvert.calibrate.data_sources import bytes_read
from qconvert.calibrate.dataset import Batch, Dataset, DatasetStats
from qconvert.calibrate.observer import Observer
from qconvert.did_you_mean import did_you_mean
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
    threads (0: onnxruntime's default, one per core). The threads do not spin between ops: other workers'
    sessions and the observers need those cores.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # fatal only: its errors reach us as exceptions, named once by us
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


class FirstBatches(Protocol):
    """Who also reads the first batches of the in-process pass (one worker, first pass only): the whole
    batches until `samples` samples are covered, with the graph `outputs` fetched beside the observed
    tensors (first_samples.py: the outlier-channel statistics and the float reference of the comparison,
    without a second session and run). Per batch, `add_outputs` on the pass's thread, then `add_tensor`
    once per observed tensor on the observers' threads (different tensors at once, never one twice)."""

    samples: int
    outputs: tuple[str, ...]

    def add_outputs(self, size: int, outputs: dict[str, np.ndarray]) -> None: ...

    def add_tensor(self, name: str, values: np.ndarray) -> None: ...


# One share of one pass -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Share:
    """One worker's part of a pass (picklable): the dataset, empty observers, which batches are its own.

    A sharded dataset (`dataset.shard` set, see dataset.shard_datasets) holds only this share's data: all
    its batches are run. Otherwise (a data function without the shard protocol) every share reads the
    whole dataset and runs the batches whose index is `index` mod `count`."""

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
    bytes_read: int = 0  # data bytes this share read from files (its shard only, when sharded)
    pid: int = 0  # the process that ran it
    peak_memory: int = 0  # that process's peak resident bytes when it finished
    node: str = ""  # the Ray node it ran on (its id), "" off Ray
    threads: int = 0  # the intra-op threads of the onnxruntime session that ran it (0: onnxruntime's default)


def observe_share(
    session: Any,
    share: Share,
    report: Callable[[int], None],
    threads: int = 1,
    first: FirstBatches | None = None,
) -> ShareResult:
    """Run the model on the share's batches, feeding its observers; `report(samples)` after each batch.
    `first` (a share of one, reading all the data) also reads the first batches (`FirstBatches`).

    `threads` is the number of cores this share may use: the session runs on them, then that many threads
    observe the batch's tensors (numpy and our C loops release the GIL), the largest first, and the
    batch is dropped before the next one runs. So one batch of intermediates is alive at a time: running
    batch k + 1 beside the observing of batch k took as long on 2 cores (BERT encoder, 32 and 128 samples)
    and needed a second batch's memory, 0.2 GB more at peak and 0.15 s of first-touch page faults. Every
    observer sees its batches in order, one at a time, so the result does not depend on `threads`.
    """
    started = time.perf_counter()
    names = list(share.observers)
    observers = [id(observer) for table in share.observers.values() for observer in table]
    if threads > 1 and len(set(observers)) != len(observers):
        raise ValueError("an observer listed under two tensors would be fed by two threads at once")
    stats = DatasetStats()
    result = ShareResult(share.observers, stats)
    sharded = share.dataset.shard is not None  # reads only its own data; else all of it, runs its batches
    if first is not None and (sharded or share.count != 1):
        raise ValueError("the first batches are read by a share of one that reads all the data")
    extra = [] if first is None else [name for name in first.outputs if name not in share.observers]
    covered = 0  # samples of the batches `first` has read
    read_before = bytes_read()

    def run(batch: Batch, peek: bool) -> list[tuple[str, np.ndarray]]:
        fetched = [*names, *extra] if peek else names
        try:
            outputs = session.run(fetched, batch.arrays)
        except Exception as error:  # onnxruntime's own exception types
            raise InputError(
                f"{share.dataset.label}: onnxruntime failed on {share.dataset.feed} {batch.index}: {error}"
            ) from None
        if peek:
            assert first is not None
            by_name = dict(zip(fetched, outputs))
            first.add_outputs(batch.size, {name: by_name[name] for name in first.outputs})
        # A zero-size dim leaves nothing to observe (and min/max of nothing is undefined).
        tensors = [(name, values) for name, values in zip(names, outputs) if values.size]
        return sorted(tensors, key=lambda item: item[1].size, reverse=True)

    def observe_tensor(name: str, values: np.ndarray, peek: bool) -> None:
        for observer in share.observers[name]:
            observer.observe(values)
        if peek:
            assert first is not None
            first.add_tensor(name, values)

    # Its outputs are dropped on return, before the next run allocates its own.
    def observe(batch: Batch, pool: ThreadPoolExecutor | None) -> None:
        nonlocal covered
        peek = first is not None and covered < first.samples
        covered += batch.size if peek else 0
        if pool is None:
            for name, values in run(batch, peek):
                observe_tensor(name, values, peek)
        else:
            tensors = run(batch, peek)
            for future in [pool.submit(observe_tensor, name, values, peek) for name, values in tensors]:
                future.result()

    with contextlib.ExitStack() as stack:
        pool = None
        if threads > 1:
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="observe"))
        for batch in share.dataset.batches(stats):
            if not sharded and batch.index % share.count != share.index:
                continue
            observe(batch, pool)
            result.batches_run += 1
            result.samples_reported += batch.size
            report(batch.size)
    if sharded or share.index == 0:  # samples read but not run: counted once, by the share that read them
        result.samples_reported += stats.excluded + stats.empty + stats.dropped_tail
        report(stats.excluded + stats.empty + stats.dropped_tail)
    result.seconds = time.perf_counter() - started
    result.bytes_read = bytes_read() - read_before
    result.pid = os.getpid()
    result.peak_memory = peak_memory()
    with contextlib.suppress(AttributeError):  # a stand-in session (tests) may not have the options
        result.threads = session.get_session_options().intra_op_num_threads
    return result


def peak_memory() -> int:
    """This process's peak resident memory in bytes: VmHWM (its own address space's high-water mark; ru_maxrss
    would keep the peak of a large process it was forked from, across exec), else ru_maxrss (KiB)."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    try:
        import resource
    except ImportError:  # not on POSIX
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# Engines ------------------------------------------------------------------------------------------------
class Engine(Protocol):
    workers: int

    def run(self, shares: Sequence[Share], progress: Callable[[int], None]) -> list[ShareResult]:
        """Every share of one pass; results in share order. `progress(samples)` as batches finish."""
        ...


class InProcessEngine:
    """One share, here, on every core; `first` reads the first pass's first batches (`FirstBatches`)."""

    workers = 1

    def __init__(
        self, augmented: AugmentedModel, threads: int | None = None, first: FirstBatches | None = None
    ) -> None:
        self.augmented = augmented
        self.session: Any = None
        self.threads = threads
        self.first = first

    def run(self, shares: Sequence[Share], progress: Callable[[int], None]) -> list[ShareResult]:
        threads = self.threads or os.cpu_count() or 1
        if self.session is None:
            self.session = make_session(self.augmented, threads)
        first, self.first = self.first, None  # the first pass only
        return [observe_share(self.session, share, progress, threads, first) for share in shares]


# State of a worker process (set by its initializer): the model, its session once built, the progress queue.
_worker_state: dict[str, Any] = {}


def _start_worker(model_path: str, threads: int, messages: Any) -> None:
    # A mark that this process started: one that dies without it died while starting (`_death`).
    open(_started_mark(os.path.dirname(model_path), os.getpid()), "wb").close()
    with open(model_path, "rb") as file:  # the pickle ProcessEngine wrote for its own workers
        augmented = pickle.load(file)
    _worker_state.update(augmented=augmented, threads=threads, messages=messages, session=None)


def _run_in_worker(share: Share) -> ShareResult:
    state = _worker_state
    if state["session"] is None:
        state["session"] = make_session(state["augmented"], state["threads"])
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


def raise_from_share(error: BaseException) -> None:
    """Raise a share's error here: a QConvertError as an InputError (bad data), anything else as ours."""
    if isinstance(error, QConvertError):
        raise InputError(error.message) from None
    raise RuntimeError(f"calibration worker failed: {type(error).__name__}: {error}") from None


def _started_mark(folder: str, pid: int) -> str:
    return os.path.join(folder, f"started-{pid}")


_SIGNAL_CAUSES = {
    signal.SIGKILL: "out of memory?",
    signal.SIGSEGV: "a crash in native code, such as a C extension the data source uses",
    signal.SIGBUS: "a crash in native code, or a memory-mapped file that shrank",
    signal.SIGABRT: "an abort in native code",
    signal.SIGTERM: "terminated from outside",
}


def _how_it_ended(exit_code: int) -> str:
    """`exit code 9`, `killed by signal 9 (SIGKILL: out of memory?)` from a multiprocessing exit code."""
    if exit_code >= 0:
        return f"exit code {exit_code}"
    number = -exit_code
    try:
        kind = signal.Signals(number)
    except ValueError:
        return f"killed by signal {number}"
    cause = _SIGNAL_CAUSES.get(kind)
    return f"killed by signal {number} ({kind.name}{': ' + cause if cause else ''})"


def _death(processes: Sequence[multiprocessing.process.BaseProcess], folder: str) -> QConvertError:
    """The error for a pool broken by a worker's death, naming the worker and how it ended.

    A QConvertError (exit 2), not an InputError: the input may be fine (the system ran out of memory),
    but this is no bug of qconvert either (exit 3, "please report this"): the user's data function,
    the memory available or the environment ended the process, and one line says which worker and how.
    """
    # The pool terminates the other workers once one dies (SIGTERM): the one that died first ended
    # otherwise, unless someone terminated it from outside.
    ended = [(number, p) for number, p in enumerate(processes, 1) if p.exitcode not in (None, 0)]
    first = [item for item in ended if item[1].exitcode != -signal.SIGTERM] or ended
    if not first:
        return QConvertError(f"a calibration worker process (of {len(processes)}) ended unexpectedly")
    number, process = first[0]
    assert process.exitcode is not None and process.pid is not None
    how = _how_it_ended(process.exitcode)
    who = f"calibration worker process {number} of {len(processes)} (pid {process.pid})"
    if not os.path.exists(_started_mark(folder, process.pid)):
        return QConvertError(
            f"{who} died while starting ({how}; its own error, if any, is above): the usual cause is "
            + _UNGUARDED_SCRIPT
        )
    return QConvertError(f"{who} died ({how}) while reading data or running the model")


class ProcessEngine:
    """`workers` spawned processes, each with its own session and `os.cpu_count() // workers` cores.

    The workers read the model from a temporary file, not from their start-up arguments: spawn writes
    those into a pipe the new process reads only after importing the caller's script again, and a
    process that dies first (a script calling calibrate outside `if __name__ == "__main__":`) would
    leave a model larger than the pipe's buffer half written and this process waiting forever.
    """

    def __init__(self, augmented: AugmentedModel, workers: int, threads: int | None = None) -> None:
        self.processes: dict[int, multiprocessing.process.BaseProcess] = {}  # pid -> process, in start order
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
        threads = threads or max(1, (os.cpu_count() or 1) // workers)
        self.pool = ProcessPoolExecutor(
            workers,
            mp_context=context,
            initializer=_start_worker,
            initargs=(model_path, threads, self.messages),
        )

    def run(self, shares: Sequence[Share], progress: Callable[[int], None]) -> list[ShareResult]:
        _check_picklable(shares[0].dataset)
        futures = [self.pool.submit(_run_in_worker, share) for share in shares]
        # The pool starts its processes on submit; keep them to say how one died, and to end them early.
        self.processes.update(getattr(self.pool, "_processes", None) or {})
        while True:
            try:
                progress(self.messages.get(timeout=0.2))
            except queue.Empty:
                if all(future.done() for future in futures):
                    break
        results = []
        for future in futures:
            error = future.exception()
            if isinstance(error, BrokenProcessPool):
                self.pool.shutdown(wait=True)  # every process joined: their exit codes are known
                raise _death(list(self.processes.values()), self.folder.name) from None
            if error is not None:
                raise_from_share(error)
            results.append(future.result())
        return results

    def close(self, terminate: bool = False) -> None:
        """Shut the pool down; `terminate` (on an error, Ctrl-C or SIGTERM) ends running workers at once
        rather than waiting for them to finish shares nobody will use."""
        try:
            if terminate:
                for process in self.processes.values():
                    if process.is_alive():
                        process.terminate()
                for process in self.processes.values():
                    process.join(timeout=5)
                    if process.is_alive():  # a data function that catches SIGTERM
                        process.kill()
            self.pool.shutdown(wait=True, cancel_futures=True)
        finally:
            self.messages.close()
            self.folder.cleanup()


@contextlib.contextmanager
def open_engine(
    augmented: AugmentedModel,
    workers: int = 1,
    engine: str = "local",
    *,
    ray_address: str | None = None,
    threads_per_worker: int | None = None,
    verbose: bool = False,
    first: FirstBatches | None = None,
) -> Iterator[Engine]:
    """The engine that runs every pass of one calibration; closed (processes, Ray) on exit.

    `ray_address` (a cluster to join, see ray_cluster.py) implies the ray engine. `threads_per_worker`:
    each worker's onnxruntime threads (None: its share of the cores, or of its Ray node's CPUs). `first`
    reads the first batches in the in-process engine (one worker); other engines leave it unread."""
    if workers < 1:
        raise InputError(f"--workers {workers}: expected 1 or more")
    if threads_per_worker is not None and threads_per_worker < 1:
        raise InputError(f"--threads-per-worker {threads_per_worker}: expected 1 or more")
    if engine not in ENGINES:
        raise InputError(
            f"--executor {engine}: expected one of {', '.join(ENGINES)}{did_you_mean(engine, ENGINES)}"
        )
    if engine == "ray" or ray_address is not None:
        from qconvert.calibrate.ray_cluster import open_ray_engine

        with open_ray_engine(augmented, workers, ray_address, threads_per_worker, verbose) as on_ray:
            yield on_ray
        return
    if workers == 1:
        yield InProcessEngine(augmented, threads_per_worker, first)
        return
    processes = ProcessEngine(augmented, workers, threads_per_worker)
    try:
        yield processes
    except BaseException:  # an error, Ctrl-C or SIGTERM (the CLI's `Terminated`): end the workers now
        processes.close(terminate=True)
        raise
    processes.close()


__all__ = [
    "AugmentedModel",
    "FirstBatches",
    "ENGINES",
    "Engine",
    "ObserverTable",
    "Share",
    "ShareResult",
    "make_session",
    "observe_share",
    "open_engine",
    "peak_memory",
    "raise_from_share",
]
