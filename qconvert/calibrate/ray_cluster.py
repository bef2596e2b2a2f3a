"""Calibration on Ray: a private local instance (the default), or an existing cluster joined by address.

NOTE: how a run on a cluster goes.
- Joining: `--ray-address HOST:PORT` (or `RAY_ADDRESS`, or `auto`) connects to the cluster as a driver,
  without `num_cpus` (Ray refuses it when joining). Without an address, a private instance with this
  machine's CPUs is started and shut down after (address "local": never a cluster Ray would otherwise find
  on the machine). A caller that connected itself (`ray.init(...)` before `calibrate`) keeps its connection.
- Code and paths: qconvert must be installed on every node (the actors import it); data and model paths
  are made absolute on the driver, and a worker that cannot see a file names itself, its node and the path
  (shared storage, or the same copy at the same path on every node).
- Placement: each worker is an actor reserving `--threads-per-worker` CPUs (1 when not given), spread over
  the nodes. More than the cluster holds in all, or has free now, is refused before anything starts, with
  the numbers; actors still not placed after PLACEMENT_SECONDS (a node went away) stop the run too.
- Threads: a worker's onnxruntime session runs on `--threads-per-worker` threads, by default its node's
  CPUs divided among the calibration workers placed on that node.
- Faults: an actor whose process dies (killed, out of memory, its node lost) is restarted and its share
  run again, up to DEFAULT_RETRIES times ($QCONVERT_RAY_RETRIES); a share is pure (fresh observers, its
  own files), so the result stays bit-identical. Beyond that, or when a node dies and its share finds no
  place within PLACEMENT_SECONDS, one line names the worker, its node and the cause (QConvertError, exit
  2), and every actor is killed.
- Noise: Ray's own lines (its workers' output, its raylet's reports, its logger) reach the terminal only
  with `verbose`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from qconvert.calibrate.data_sources import absolute_source
from qconvert.calibrate.workers import (
    AugmentedModel,
    Share,
    ShareResult,
    make_session,
    observe_share,
    raise_from_share,
)
from qconvert.errors import InputError, QConvertError

ADDRESS_ENV = "RAY_ADDRESS"
RETRIES_ENV = "QCONVERT_RAY_RETRIES"
DEFAULT_RETRIES = 2  # times a lost worker's share runs again on its restarted actor (QCONVERT_RAY_RETRIES)


def retries() -> int:
    """How many times a lost worker's share runs again: $QCONVERT_RAY_RETRIES, else DEFAULT_RETRIES."""
    text = os.environ.get(RETRIES_ENV, "")
    if not text:
        return DEFAULT_RETRIES
    if not text.isdigit():
        raise InputError(f"{RETRIES_ENV}={text}: expected a number of retries, 0 or more")
    return int(text)


PLACEMENT_SECONDS = 30.0  # workers not placed (or a lost node's share not re-placed) by then: the run stops


def cluster_address(address: str | None) -> str | None:
    """The cluster to join: `address`, else $RAY_ADDRESS; None for a private local instance."""
    return address or os.environ.get(ADDRESS_ENV) or None


@contextlib.contextmanager
def ray_session(address: str | None, cpus: int, verbose: bool = False) -> Iterator[str]:
    """Connected to Ray for the duration; yields what it is connected to (for messages). Joins the cluster
    at `address` (or $RAY_ADDRESS), else starts a private instance of `cpus` CPUs; keeps a connection the
    caller made itself. Disconnects (a private instance: shuts it down) on exit."""
    try:
        import ray
    except ImportError:
        raise InputError(
            "the ray executor needs the optional `ray` extra: pip install 'qconvert[ray]'"
        ) from None
    if ray.is_initialized():  # the caller's own connection: use it as it is, and keep it
        yield "the Ray cluster this process is connected to"
        return
    joined = cluster_address(address)
    # ray.init replaces the SIGTERM handler with one that calls sys.exit(15): keep one our caller set (the
    # CLI's, which exits 143 after the same cleanup), and put the original back once Ray is shut down.
    # A SIGTERM during ray.init meets Ray's handler: its SystemExit(15) becomes our caller's response too.
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous_handler = signal.getsignal(signal.SIGTERM) if on_main_thread else None
    settings: dict[str, Any] = {
        "log_to_driver": verbose,  # the workers' own output
        "logging_level": logging.INFO if verbose else logging.ERROR,
    }
    if joined is None:  # "local": a new instance, never a cluster found on this machine
        settings.update(address="local", num_cpus=cpus, include_dashboard=False)
    else:
        _check_reachable(joined)
        settings.update(address=joined)
    # Ray's driver prints what its raylet reports (a worker that died, a task retried, ...) to stdout,
    # whatever log_to_driver says: diagnostics, which belong on stderr (stdout may carry `--json -`), and
    # only with `verbose` (our own one line says what ended a run).
    sink = sys.stderr if verbose else open(os.devnull, "w")  # noqa: SIM115 (closed below)
    ray_environment = _ray_environment()
    with (
        contextlib.redirect_stdout(sink),
        contextlib.closing(sink) if sink is not sys.stderr else contextlib.nullcontext(),
    ):
        try:
            try:
                ray.init(**settings)
            except SystemExit as exit_:
                if exit_.code == signal.SIGTERM and callable(previous_handler):
                    signal.signal(signal.SIGTERM, previous_handler)
                    previous_handler(signal.SIGTERM, None)  # raises (the CLI's raises Terminated)
                raise
            except (ConnectionError, ValueError, RuntimeError) as error:
                if joined is None:
                    raise
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                causes = f"{error} {error.__cause__ or ''} {error.__context__ or ''}"
                if "Authentication" in causes or "InvalidAuthToken" in causes:
                    first += (
                        " (the cluster wants Ray's token authentication: run with RAY_AUTH_MODE=token, "
                        "the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN)"
                    )
                raise InputError(f"--ray-address {joined}: cannot join the Ray cluster: {first}") from None
            if callable(previous_handler):
                signal.signal(signal.SIGTERM, previous_handler)
            yield "a private local Ray instance" if joined is None else f"the Ray cluster at {joined}"
        finally:
            ray.shutdown()
            _restore_ray_environment(ray_environment)
            if previous_handler is not None:
                signal.signal(signal.SIGTERM, previous_handler)


def _ray_environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key.startswith("RAY_")}


def _restore_ray_environment(saved: dict[str, str]) -> None:
    """Undo what ray.init wrote into os.environ: a private instance sets RAY_AUTH_MODE=token there (Ray
    2.60), which a later join of a cluster without token authentication, here or in a child, would inherit."""
    for key in [key for key in os.environ if key.startswith("RAY_") and key not in saved]:
        del os.environ[key]
    os.environ.update(saved)


def _check_reachable(address: str) -> None:
    """InputError at once when HOST:PORT takes no connection (ray.init would retry for half a minute,
    printing a warning a second); `auto` and `ray://` addresses are left to Ray."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as error:
        raise InputError(
            f"--ray-address {address}: no Ray cluster answers there ({error.strerror or error}); start one "
            "with `ray start --head`, or give its head's HOST:PORT"
        ) from None


@dataclass(frozen=True)
class Placement:
    """Where one worker (actor) runs."""

    node_id: str
    node_ip: str
    pid: int

    def shown(self) -> str:
        return f"node {self.node_ip} (id {self.node_id[:12]}), pid {self.pid}"


class _RayWorker:
    """A Ray actor: the model's session, built on first use (again after a restart), kept for every pass.

    The model comes with each share as a reference inside a list (Ray leaves it unresolved), fetched once:
    an actor with restarts and object-store constructor arguments is a warning in Ray's log."""

    def __init__(self) -> None:
        self.session: Any = None
        self.threads = 0

    def place(self) -> Placement:
        import ray

        context = ray.get_runtime_context()
        return Placement(context.get_node_id(), ray.util.get_node_ip_address(), os.getpid())

    def run(self, share: Share, threads: int, model: list[Any]) -> ShareResult:
        import ray

        if self.session is None or threads != self.threads:
            augmented: AugmentedModel = ray.get(model[0])
            _check_visible(share, augmented)
            self.session = make_session(augmented, threads)
            self.threads = threads
        else:
            _check_visible(share, None)
        # Ray hands numpy arrays over zero-copy from its object store, read-only: observe into a copy.
        share = Share(share.dataset, copy.deepcopy(share.observers), share.index, share.count)
        result = observe_share(self.session, share, lambda samples: None, threads)
        result.node = ray.get_runtime_context().get_node_id()
        return result


def _check_visible(share: Share, augmented: AugmentedModel | None) -> None:
    """InputError naming this node when a file the share reads is not there (no shared storage)."""
    import ray

    source = share.dataset.source
    wanted = []
    if source.kind in ("folder", "files", "npz", "npy"):
        wanted = [
            str(path)
            for path in ([source.path] if source.kind == "folder" else source.files or [source.path])
        ]
    if source.function_spec and source.function_spec.rpartition(":")[0].endswith(".py"):
        wanted.append(source.function_spec.rpartition(":")[0])
    if augmented is not None and augmented.external_data_folder is not None:
        wanted.append(augmented.external_data_folder)
    missing = [path for path in wanted if path and not os.path.exists(path)]
    if missing:
        node = ray.util.get_node_ip_address()
        raise InputError(
            f"{missing[0]}: not found on Ray node {node}, where calibration worker {share.index + 1} of "
            f"{share.count} runs: every node must see the data and the model's external data at the same "
            "path (shared storage, or the same copy on each node)"
        )


def _cpus_by_node() -> dict[str, float]:
    import ray

    return {
        node["NodeID"]: float(node["Resources"].get("CPU", 0))
        for node in ray.nodes()
        if node.get("Alive") and node["Resources"].get("CPU")
    }


def check_capacity(workers: int, cpus_per_worker: int, where: str) -> None:
    """InputError, with the numbers, when the cluster cannot place `workers` actors of `cpus_per_worker` CPUs
    now (Ray would wait for them forever)."""
    import ray

    nodes = _cpus_by_node()
    total = sum(nodes.values())
    free = float(ray.available_resources().get("CPU", 0))
    needed = workers * cpus_per_worker
    each = f"{cpus_per_worker} CPU{'s' if cpus_per_worker > 1 else ''} each"
    fits = int(total // cpus_per_worker)
    if needed > total:
        raise InputError(
            f"--workers {workers} ({each}) needs {needed} CPUs, but {where} has {total:g} CPUs in all on "
            f"{len(nodes)} node(s): give --workers {max(fits, 1)} or fewer (or fewer --threads-per-worker)"
        )
    if needed > free:
        raise InputError(
            f"--workers {workers} ({each}) needs {needed} CPUs, but only {free:g} of the {total:g} CPUs of "
            f"{where} are free now (other jobs hold the rest)"
        )


class RayEngine:
    """`workers` Ray actors, spread over the nodes of the cluster (or the private instance)."""

    def __init__(
        self,
        augmented: AugmentedModel,
        workers: int,
        threads_per_worker: int | None,
        where: str,
        verbose: bool = False,
    ) -> None:
        import ray
        import ray.exceptions

        self.workers = workers
        self.verbose = verbose  # a lost worker's error also carries Ray's own text
        self.retries = retries()
        check_capacity(workers, threads_per_worker or 1, where)
        actor = ray.remote(
            num_cpus=threads_per_worker or 1,
            max_restarts=self.retries,
            max_task_retries=self.retries,
            scheduling_strategy="SPREAD",
        )(_RayWorker)
        self.model = ray.put(augmented)  # once, shared by the actors
        self.actors: list[Any] = [actor.remote() for _ in range(workers)]
        try:
            self.places: list[Placement] = ray.get(
                [worker.place.remote() for worker in self.actors], timeout=PLACEMENT_SECONDS
            )
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise QConvertError(
                f"{where}: the {workers} calibration workers were not all placed within "
                f"{PLACEMENT_SECONDS:g} s (its free CPUs changed, or a node is starting or gone)"
            ) from None
        cpus = _cpus_by_node()
        here = [place.node_id for place in self.places]
        self.threads = [
            threads_per_worker or max(1, int(cpus.get(node, 1) // here.count(node))) for node in here
        ]

    def run(self, shares: Sequence[Share], progress: Callable[[int], None]) -> list[ShareResult]:
        import ray
        import ray.exceptions

        shares = [
            replace(share, dataset=replace(share.dataset, source=absolute_source(share.dataset.source)))
            for share in shares
        ]
        references = [
            worker.run.remote(share, threads, [self.model])
            for worker, share, threads in zip(self.actors, shares, self.threads)
        ]
        pending = list(references)
        stalled_since: float | None = None
        unreachable = [0] * len(references)  # times each share's actor could not be reached
        while pending:
            try:
                # Ray's wait runs signal handlers without stopping for any exception but KeyboardInterrupt
                # (see below): a timeout bounds how late SIGTERM's takes effect.
                done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
                if not done:
                    stalled_since = self._check_nodes(references, pending, stalled_since)
                    continue
                stalled_since = None
                finished = ray.get(done[0])
            except ray.exceptions.RayTaskError as error:
                raise_from_share(error.cause)
                raise
            except ray.exceptions.ActorUnavailableError as error:
                # Ray does not retry a task whose actor became unreachable (it may have run): a share is
                # pure, so run it again, on the same actor once Ray has restarted it, up to the bound.
                number = references.index(done[0])
                unreachable[number] += 1
                if unreachable[number] > self.retries:
                    raise self._lost(number, error) from None
                share, threads = shares[number], self.threads[number]
                references[number] = self.actors[number].run.remote(share, threads, [self.model])
                pending.append(references[number])
                continue
            except ray.exceptions.ActorDiedError as error:
                raise self._lost(references.index(done[0]), error) from None
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

    def _check_nodes(
        self, references: list[Any], pending: list[Any], stalled_since: float | None
    ) -> float | None:
        """While shares are pending: a node of ours that died leaves its share waiting for a place, which
        may never come; after PLACEMENT_SECONDS without progress that is the run's error."""
        now = time.monotonic()
        alive = _cpus_by_node()
        lost = [
            (number, place)
            for number, place in enumerate(self.places)
            if place.node_id not in alive and references[number] in pending
        ]
        if not lost:
            return None
        if stalled_since is None:
            return now
        if now - stalled_since < PLACEMENT_SECONDS:
            return stalled_since
        number, place = lost[0]
        raise QConvertError(
            f"calibration worker {number + 1} of {len(self.places)} lost its Ray node {place.node_ip} (id "
            f"{place.node_id[:12]}): the node died, and its share found no free CPU elsewhere within "
            f"{PLACEMENT_SECONDS:g} s"
        )

    def _lost(self, number: int, error: Exception) -> QConvertError:
        """One line for an actor lost beyond its retries (Ray's own text is 7 lines and more)."""
        text = str(error)
        place = self.places[number]
        pid = re.search(r"\bpid: (\d+)", text)
        exit_type = re.search(r"Worker exit type: (\w+)", text)
        node_died = re.search(
            r"\bnode (has )?died\b|\bnode\b.*\b(dead|died)\b|NODE_DIED", text, re.IGNORECASE
        )
        if node_died or place.node_id not in _cpus_by_node():
            cause = f"its node {place.node_ip} (id {place.node_id[:12]}) died"
        elif "unavailable" in text:
            cause = "Ray could not reach it: its process or its node lost"
        elif exit_type:
            cause = f"Ray says {exit_type[1]}"
        else:
            cause = "Ray gives no reason"
        ray_text = f"\nRay's own report:\n{text}" if self.verbose else ""
        return QConvertError(
            f"calibration worker {number + 1} of {len(self.places)} (a Ray actor, pid "
            f"{pid[1] if pid else place.pid}) died while reading data or running the model on node "
            f"{place.node_ip} (id {place.node_id[:12]}), {self.retries + 1} time(s), beyond its "
            f"{self.retries} retries ({cause}): killed (out of memory?), its node lost, or a crash in native "
            "code or a data function that ended its process" + ray_text
        )

    def close(self) -> None:
        """Kill the actors (their processes end on every node), even when a share is still running."""
        import ray

        for worker in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(worker, no_restart=True)


@contextlib.contextmanager
def open_ray_engine(
    augmented: AugmentedModel,
    workers: int,
    address: str | None = None,
    threads_per_worker: int | None = None,
    verbose: bool = False,
) -> Iterator[RayEngine]:
    """A RayEngine on the cluster at `address` ($RAY_ADDRESS; None: a private instance), closed on exit."""
    # A private instance gets this machine's cores (at least what the workers reserve): each worker's
    # default threads are then its share of them, as for local processes.
    cpus = max(os.cpu_count() or 1, workers * (threads_per_worker or 1))
    with ray_session(address, cpus, verbose) as where:
        engine = RayEngine(augmented, workers, threads_per_worker, where, verbose)
        try:
            yield engine
        finally:
            engine.close()


# A Ray cluster of several nodes on this machine (tests, benchmarks, trying --ray-address) -----------------
CLUSTER_LOOPBACK = "127.0.0.2"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _processes_of(marker: str) -> set[int]:
    """Pids whose command line holds `marker` (the cluster's own temp folder), and all their descendants
    (Ray's agents and workers rename themselves `ray::...`)."""
    parents: dict[int, int] = {}
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                command = file.read()
            with open(f"/proc/{entry}/stat") as file:
                parents[int(entry)] = int(file.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if marker.encode() in command and int(entry) != os.getpid():
            found.add(int(entry))
    grown = True
    while grown:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        grown = bool(children)
        found |= children
    return found


def stop_processes(pids: set[int], grace: float = 1.0) -> None:
    """SIGTERM these processes, then SIGKILL the ones still there after `grace` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class LocalCluster:
    """A running local_cluster: its address, and the folder its processes are known by."""

    address: str
    folder: str

    def processes(self) -> set[int]:
        """Pids of every process of the cluster (its daemons, agents and workers)."""
        return _processes_of(self.folder)

    def process_titles(self) -> list[str]:
        """Their command lines (Ray's workers show `ray::IDLE`, `ray::_RayWorker...`)."""
        titles = []
        for pid in sorted(self.processes()):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as file:
                titles.append(file.read().replace(b"\0", b" ").decode(errors="replace").strip())
        return titles


@contextlib.contextmanager
def local_cluster(
    nodes: int = 2, cpus_per_node: int = 1, object_store_bytes: int = 256 << 20
) -> Iterator[LocalCluster]:
    """A Ray cluster of `nodes` nodes on this machine, each started by its own `ray start` with its own
    CPUs, as on separate machines; yields the head's address. Every node has a loopback address, so no
    traffic goes to any other address, and no dashboard. Every process of it is ended on exit, even on an
    error, by pid: never `ray stop`, which would end every Ray instance on the machine.

    The address is CLUSTER_LOOPBACK (127.0.0.2), not 127.0.0.1: `ray start` (2.60) replaces 127.0.0.1 and
    `localhost`, as a node address and as the head's, by the machine's network address, unless told the
    machine is no cluster machine, and then it refuses to join a second node. Token authentication is
    off for these nodes (RAY_AUTH_MODE=disabled): they are reachable from this machine only."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="qcr-", dir="/tmp")  # short: Ray's socket paths live under it
    environment = {key: value for key, value in os.environ.items() if key != ADDRESS_ENV}
    environment["RAY_AUTH_MODE"] = "disabled"
    ray_script = os.path.join(os.path.dirname(sys.executable), "ray")
    port = _free_port()
    address = f"{CLUSTER_LOOPBACK}:{port}"
    try:
        for number in range(nodes):
            command = [ray_script, "start", "--node-ip-address", CLUSTER_LOOPBACK]
            command += ["--num-cpus", str(cpus_per_node), "--disable-usage-stats", "--temp-dir", folder]
            command += ["--object-store-memory", str(object_store_bytes)]
            command += ["--dashboard-agent-listen-port", str(_free_port())]
            command += ["--runtime-env-agent-port", str(_free_port())]
            command += ["--metrics-export-port", str(_free_port())]
            if number == 0:
                command += ["--head", "--port", str(port), "--include-dashboard=false"]
            else:
                command += ["--address", address]
            log = os.path.join(folder, f"ray-start-{number}.log")
            # Ray's daemons inherit the output: a file, never a pipe (its reader would wait for them).
            with open(log, "wb") as output:
                code = subprocess.run(
                    command,
                    env=environment,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=output,
                    timeout=180,
                ).returncode
            if code != 0:
                with open(log, errors="replace") as output:
                    tail = output.read()[-2000:]
                raise RuntimeError(f"ray start (node {number + 1} of {nodes}) exited {code}:\n{tail}")
        yield LocalCluster(address, folder)
    finally:
        stop_processes(_processes_of(folder))
        shutil.rmtree(folder, ignore_errors=True)


__all__ = [
    "ADDRESS_ENV",
    "CLUSTER_LOOPBACK",
    "LocalCluster",
    "PLACEMENT_SECONDS",
    "DEFAULT_RETRIES",
    "RETRIES_ENV",
    "Placement",
    "RayEngine",
    "check_capacity",
    "cluster_address",
    "local_cluster",
    "open_ray_engine",
    "ray_session",
    "retries",
]
