"""Calibration on a real Ray cluster of two nodes on this machine (issue 25): each node started by its own
`ray start` with one CPU, on a loopback address, stopped at the end even on failure. Through `--ray-address`
the QDQ model and the ranges are byte-identical to one process; each worker reads only its share; a worker
killed mid-run is retried (still identical), and beyond the bound the run ends in one line, without output.
The cluster starts once for the module (about 15 s of this module's time)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from conftest import require_module

from qconvert.calibrate.api import calibrate
from qconvert.calibrate.collect import augment_model, collect, load_float_model
from qconvert.calibrate.dataset import open_dataset
from qconvert.calibrate.observers import AlignedHistogramObserver
from qconvert.errors import InputError, QConvertError

if TYPE_CHECKING:
    from qconvert.calibrate.ray_cluster import LocalCluster

MODELS = Path(__file__).resolve().parents[2] / "models"
SAMPLES = 512  # digits_cnn images, 64 batches of its fixed 8

# Batch k of the images belongs to shard k mod num_shards. MODE "once": shard 1 ends its own process
# (SIGKILL, as the OOM killer would) at its third batch the first time only; "always": every time.
KILLER = """
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

HERE = Path(__file__).resolve().parent
MODE = "{mode}"


def batches(shard_index=0, num_shards=1):
    images = np.load(HERE / "images.npy")
    for number, batch in enumerate(range(shard_index, len(images) // 8, num_shards)):
        mark = HERE / "killed-once"
        if shard_index == 1 and number == 2 and (MODE == "always" or not mark.exists()):
            mark.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        yield {{"image": images[batch * 8 : (batch + 1) * 8]}}
"""


@pytest.fixture(scope="module")
def nodes() -> Iterator[LocalCluster]:
    require_module("ray")
    from qconvert.calibrate.ray_cluster import local_cluster

    with local_cluster(nodes=2, cpus_per_node=1) as running:
        yield running


@pytest.fixture(scope="module")
def cluster(nodes: LocalCluster) -> str:
    return nodes.address


@pytest.fixture(autouse=True)
def token_authentication_off_in_this_process(nodes: LocalCluster) -> None:
    """A private Ray instance started earlier in this process (another test module's) leaves Ray's cached
    config in token-authentication mode, which the in-process driver would then use against these nodes
    (their authentication is off). Reset it as Ray's own test utilities do; a new process starts clean."""
    from ray._private.authentication_test_utils import reset_auth_token_state

    reset_auth_token_state()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The images as an .npy in a data folder, and one process's QDQ model and ranges on them."""
    folder = tmp_path_factory.mktemp("data")
    images = np.random.default_rng(25).normal(0, 1, (SAMPLES, 1, 8, 8)).astype(np.float32)
    np.save(folder / "images.npy", images)
    model = MODELS / "digits_cnn.onnx"
    calibrate(
        model,
        folder / "images.npy",
        method="entropy",
        out=folder / "one.onnx",
        ranges_path=folder / "one.json",
        evaluate_samples=0,
    )
    return {
        "folder": folder,
        "model": model,
        "onnx": (folder / "one.onnx").read_bytes(),
        "ranges": (folder / "one.json").read_text(),
    }


def run_cli(
    arguments: list[str], cwd: Path, address: str, **environ: str
) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"} | environ
    command = [sys.executable, "-m", "qconvert.cli", "calibrate", *arguments]
    command += [
        "--ray-address",
        address,
        "--workers",
        "2",
        "--method",
        "entropy",
        "--evaluate",
        "0",
        "--quiet",
    ]
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=240)


def test_each_worker_reads_only_its_half_on_its_own_node(
    cluster: str, reference: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Joined through RAY_ADDRESS (the CLI test below uses --ray-address). A relative data path, in a folder
    that is not the nodes' working folder, reaches the workers."""
    loaded = load_float_model(Path(reference["model"]))  # type: ignore[arg-type]
    augmented = augment_model(loaded)
    monkeypatch.chdir(tmp_path)
    data = os.path.relpath(Path(reference["folder"]) / "images.npy", tmp_path)  # type: ignore[operator]
    dataset = open_dataset(data, loaded.model)
    fresh = {name: [AlignedHistogramObserver(max_bins=257)] for name in augmented.tensors}
    one = collect(augmented, dataset, copy.deepcopy(fresh))
    monkeypatch.setenv("RAY_ADDRESS", cluster)
    two = collect(augmented, dataset, copy.deepcopy(fresh), workers=2, engine="ray")
    state = {
        name: (o.minimum, o.maximum, o.count, o.exponent, o.counts.tobytes())
        for name, (o,) in one.observers.items()
    }
    assert {
        name: (o.minimum, o.maximum, o.count, o.exponent, o.counts.tobytes())
        for name, (o,) in two.observers.items()
    } == state
    image_bytes = SAMPLES * 8 * 8 * 4
    assert [result.bytes_read for result in two.share_results] == [image_bytes // 2] * 2
    assert one.share_results[0].bytes_read == image_bytes
    assert len({result.node for result in two.share_results}) == 2  # one worker on each node
    assert [result.batches_run for result in two.share_results] == [32, 32]


def test_a_worker_killed_mid_run_is_retried_and_the_result_stays_identical(
    cluster: str, reference: dict, tmp_path: Path
) -> None:
    """The data function (MODULE:FUNCTION in the driver's folder, found there by the workers too) takes the
    shard arguments; shard 1's process dies once: Ray restarts the actor and runs the share again."""
    np.save(tmp_path / "images.npy", np.load(Path(reference["folder"]) / "images.npy"))  # type: ignore[operator]
    (tmp_path / "killer.py").write_text(KILLER.format(mode="once"))
    done = run_cli(
        [str(reference["model"]), "--data", "killer:batches", "-o", "q.onnx", "--ranges", "r.json"],
        tmp_path,
        cluster,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "killed-once").exists()  # it did die once
    assert (tmp_path / "q.onnx").read_bytes() == reference["onnx"]
    assert (tmp_path / "r.json").read_text() == reference["ranges"]
    assert done.stderr == "" and done.stdout == ""  # Ray's own report of the death and the retry: --verbose


def test_a_worker_lost_beyond_its_retries_ends_the_run_in_one_line_without_output(
    cluster: str,
    reference: dict,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Through the API (the CLI prints this QConvertError as its one line, exit 2); a bound of 0 retries
    keeps it short: the first death is beyond it."""
    np.save(tmp_path / "images.npy", np.load(Path(reference["folder"]) / "images.npy"))  # type: ignore[operator]
    (tmp_path / "killer.py").write_text(KILLER.format(mode="always"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QCONVERT_RAY_RETRIES", "0")
    with pytest.raises(QConvertError) as error:
        calibrate(
            reference["model"],
            "killer:batches",
            out="q.onnx",
            evaluate_samples=0,
            workers=2,
            ray_address=cluster,
        )  # type: ignore[arg-type]
    assert not isinstance(error.value, InputError) and error.value.exit_code == 2
    message = error.value.message
    assert "\n" not in message
    assert message.startswith("calibration worker 2 of 2 (a Ray actor, pid ")
    assert "on node 127.0.0.2 (id " in message and "1 time(s), beyond its 0 retries" in message
    assert not (tmp_path / "q.onnx").exists()
    assert capfd.readouterr() == ("", "")  # Ray's own report of the death: only with verbose


def test_more_workers_than_the_cluster_can_place_fail_at_once_with_the_numbers(
    cluster: str, reference: dict
) -> None:
    started = time.monotonic()
    with pytest.raises(InputError) as error:
        calibrate(
            reference["model"], Path(reference["folder"]) / "images.npy", workers=3, ray_address=cluster
        )  # type: ignore[arg-type, operator]
    assert time.monotonic() - started < 20
    assert (
        f"--workers 3 (1 CPU each) needs 3 CPUs, but the Ray cluster at {cluster} has 2 CPUs in all on "
        "2 node(s)" in error.value.message
    )


def test_no_worker_is_left_on_the_cluster_and_every_node_is_on_loopback(nodes: LocalCluster) -> None:
    """Runs last: after the runs above (one of them failed), no calibration actor's process is alive."""
    titles = nodes.process_titles()
    raylets = [title for title in titles if "/raylet/raylet " in title]
    assert len(raylets) == 2
    assert all(" --node_ip_address=127.0.0.2 " in title for title in raylets)
    assert [title for title in titles if "_RayWorker" in title] == []
