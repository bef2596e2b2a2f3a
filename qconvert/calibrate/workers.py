"""Where calibration passes run: in this process, in worker processes, or on Ray; each keeps one session.

NOTE: an engine is opened once per calibration and runs every pass: worker processes (spawn context) and
Ray actors start once, receive the model once and build their onnxruntime session on first use, so a
two-pass method pays for start-up and model loading once. A pass is split into shares: share i of N
runs the batches whose index is i mod N, observing into its own copy of the pass's (empty) observers;
`collect` merges the copies in share order. Every share reads the whole dataset (so all form the same
batches) but runs the model only on its own batches.

When something stops a calibration (an error, Ctrl-C, the CLI's SIGTERM), worker processes are ended at
once, not waited for. A worker that dies (killed, out of memory, a crash, a data function ending its process)
is reported in one line naming it and its exit code or signal.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import multiprocessing
import os
import pickle
import queue
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np

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


def observe_share(session: Any, share: Share, report: Callable[[int], None], threads: int = 1) -> ShareResult:
    """Run the model on the share's batches, feeding its observers; `report(samples)` after each batch.

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

    def run(batch: Batch) -> list[tuple[str, np.ndarray]]:
        try:
            outputs = session.run(names, batch.arrays)
        except Exception as error:  # onnxruntime's own exception types
            raise InputError(
                f"{share.dataset.label}: onnxruntime failed on {share.dataset.feed} {batch.index}: {error}"
            ) from None
        # A zero-size dim leaves nothing to observe (and min/max of nothing is undefined).
        tensors = [(name, values) for name, values in zip(names, outputs) if values.size]
        return sorted(tensors, key=lambda item: item[1].size, reverse=True)

    def observe_tensor(name: str, values: np.ndarray) -> None:
        for observer in share.observers[name]:
            observer.observe(values)

    # Its outputs are dropped on return, before the next run allocates its own.
    def observe(batch: Batch, pool: ThreadPoolExecutor | None) -> None:
        if pool is None:
            for name, values in run(batch):
                observe_tensor(name, values)
        else:
            for future in [pool.submit(observe_tensor, name, values) for name, values in run(batch)]:
                future.result()

    with contextlib.ExitStack() as stack:
        pool = None
        if threads > 1:
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="observe"))
        for batch in share.dataset.batches(stats):
            if batch.index % share.count != share.index:
                continue
            observe(batch, pool)
            result.batches_run += 1
            result.samples_reported += batch.size
            report(batch.size)
    if share.index == 0:  # samples read but not run: counted once, by the first share
        result.samples_reported += stats.excluded + stats.empty + stats.dropped_tail
        report(stats.excluded + stats.empty + stats.dropped_tail)
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
            self.session = make_session(self.augmented, threads)
        return [observe_share(self.session, share, progress, threads) for share in shares]


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


def _raise_from_share(error: BaseException) -> None:
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

    def __init__(self, augmented: AugmentedModel, workers: int) -> None:
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
                _raise_from_share(error)
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


class _RayWorker:
    """A Ray actor: the model's session, built on first use, kept for every pass."""

    def __init__(self, augmented: AugmentedModel, threads: int) -> None:
        self.augmented = augmented
        self.threads = threads
        self.session: Any = None

    def run(self, share: Share) -> ShareResult:
        if self.session is None:  # on a cluster (threads 0) the actor cannot know its cores: the default
            self.session = make_session(self.augmented, self.threads)
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
            try:
                # Ray's wait runs signal handlers without stopping for any exception but KeyboardInterrupt
                # (see below): a timeout bounds how late SIGTERM's takes effect.
                done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
                if not done:
                    continue
                finished = ray.get(done[0])
            except ray.exceptions.RayTaskError as error:
                _raise_from_share(error.cause)
                raise
            except ray.exceptions.ActorDiedError as error:
                raise _actor_death(error, references.index(done[0]) + 1, len(references)) from None
            except SystemError as error:
                # A signal handler raised inside Ray's wait (the CLI's SIGTERM handler: Terminated). Ray's
                # signal check stops waiting for KeyboardInterrupt and SystemExit only; it leaves any other
                # exception set and returns when the wait ends, which Python reports as a SystemError
                # caused by it. Raise the handler's own exception.
                cause = error.__cause__ or error.__context__
                if isinstance(cause, BaseException) and not isinstance(cause, Exception):
                    raise cause from None
                raise
            progress(finished.samples_reported)
        # Results come back read-only too (zero-copy); the parent merges into them, so copy.
        return [cast(ShareResult, copy.deepcopy(ray.get(reference))) for reference in references]


def _actor_death(error: Any, number: int, count: int) -> QConvertError:
    """One line for an actor whose process died (Ray's own text is 7 lines). Ray does not know the exit
    code or signal: the process's connection just closed. A QConvertError, as `_death` says why."""
    text = str(error)
    pid = re.search(r"\bpid: (\d+)", text)
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    who = f"calibration worker {number} of {count} (a Ray actor{f', pid {pid[1]}' if pid else ''})"
    how = f"Ray says {exit_type[1]}" if exit_type else "Ray gives no reason"
    return QConvertError(
        f"{who} died while reading data or running the model ({how}): killed (out of memory?), "
        "or a crash in native code or a data function that ended its process"
    )


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
    # ray.init replaces the SIGTERM handler with one that calls sys.exit(15): keep one our caller set (the
    # CLI's, which exits 143 after the same cleanup), and put the original back once Ray is shut down.
    # A SIGTERM during ray.init meets Ray's handler: its SystemExit(15) becomes our caller's response too.
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous_handler = signal.getsignal(signal.SIGTERM) if on_main_thread else None
    # Ray's driver prints what its raylet reports (a worker that died, ...) to stdout, whatever
    # log_to_driver says: diagnostics, which belong on stderr (stdout may carry `--json -`).
    with contextlib.redirect_stdout(sys.stderr):
        try:
            try:
                ray.init(
                    num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
                )
            except SystemExit as exit_:
                if exit_.code == signal.SIGTERM and callable(previous_handler):
                    signal.signal(signal.SIGTERM, previous_handler)
                    previous_handler(signal.SIGTERM, None)  # raises (the CLI's raises Terminated)
                raise
            if callable(previous_handler):
                signal.signal(signal.SIGTERM, previous_handler)
            yield
        finally:
            ray.shutdown()
            if previous_handler is not None:
                signal.signal(signal.SIGTERM, previous_handler)


@contextlib.contextmanager
def open_engine(augmented: AugmentedModel, workers: int = 1, engine: str = "local") -> Iterator[Engine]:
    """The engine that runs every pass of one calibration; closed (processes, Ray) on exit."""
    if workers < 1:
        raise InputError(f"--workers {workers}: expected 1 or more")
    if engine not in ENGINES:
        raise InputError(
            f"--executor {engine}: expected one of {', '.join(ENGINES)}{did_you_mean(engine, ENGINES)}"
        )
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
    except BaseException:  # an error, Ctrl-C or SIGTERM (the CLI's `Terminated`): end the workers now
        processes.close(terminate=True)
        raise
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
