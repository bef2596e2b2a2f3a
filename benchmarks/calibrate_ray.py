"""Calibration on one process, local worker processes, and Ray (private, a 1-node and a 2-node cluster).

Workloads (generated, nothing downloaded):
- `digits`: models/digits_cnn.onnx (image f32[8,1,8,8], a fixed batch of 8) on N random images in one .npy
  (`--digits-samples`, default 262,144: 64 MiB);
- `bert`: benchmarks/calibrate.py's 6-layer 384-wide BERT encoder with a -10000 padding mask on N random
  padded sequences in one .npz (`--bert-samples`, default 512; built with models/build_bert_mask.py, needs
  torch).
Each row is one fresh process (`--child`) that loads the model and runs one pass of the entropy method's
observers (power-of-two aligned histograms, `collect`), as `qconvert calibrate --method entropy` does:
- `one`: one process (`--workers 1`);
- `local2`: two spawned worker processes (`--workers 2`);
- `ray-private`: `--executor ray --workers 2`: a private Ray instance that the child starts and stops (timed);
- `ray-1node`: `--ray-address` to a running cluster of one node with 2 CPUs (started before, not timed);
- `ray-2node`: `--ray-address` to a running cluster of two nodes with 1 CPU each, every node its own
  `ray start` on this machine (qconvert.calibrate.ray_cluster.local_cluster, loopback only).
Columns: `seconds` the child's whole life (start-up, imports, model, engine, pass), `pass s` the pass alone
(engine start included), `read MiB` the data bytes each worker read (memory-mapped rows handed out), `peak
MiB` each worker process's peak RSS and the driver's own. On one machine the nodes share its cores: this
shows what Ray costs; its gain is a second machine's cores and storage.

Usage: python benchmarks/calibrate_ray.py [--workloads digits,bert] [--configs one,local2,ray-private,
       ray-1node,ray-2node] [--digits-samples N] [--bert-samples N] [--keep DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "models"
CONFIGS = ("one", "local2", "ray-private", "ray-1node", "ray-2node")
MIB = 1 << 20


def child(args: argparse.Namespace) -> int:
    """One measured run: prints its figures as JSON on stdout."""
    from qconvert.calibrate.collect import augment_model, collect, load_float_model
    from qconvert.calibrate.dataset import open_dataset
    from qconvert.calibrate.methods import make_method

    # A process forked from a large one starts with that one's peak as its own (ru_maxrss, kept across
    # exec): reset the kernel's high-water mark, then read VmHWM at the end.
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as file:
        file.write("5")
    started = time.perf_counter()
    loaded = load_float_model(args.model)
    augmented = augment_model(loaded)
    dataset = open_dataset(args.data, loaded.model)
    method = make_method("entropy")
    observers = {name: [method.first_pass_observer()] for name in augmented.tensors}
    workers = 1 if args.child == "one" else 2
    engine = "ray" if args.child.startswith("ray") else "local"
    before = time.perf_counter()
    result = collect(augmented, dataset, observers, workers=workers, engine=engine, ray_address=args.address)
    finished = time.perf_counter()
    shares = [
        {
            "read_mib": r.bytes_read / MIB,
            "peak_mib": r.peak_memory / MIB,
            "pid": r.pid,
            "node": r.node[:8],
            "seconds": r.seconds,
            "threads": r.threads,
        }
        for r in result.share_results
    ]
    print(
        json.dumps(
            {
                "pass_seconds": finished - before,
                "inside_seconds": finished - started,
                "samples": result.stats.samples_read,
                "shares": shares,
                "driver_peak_mib": own_peak_bytes() / MIB,
            }
        )
    )
    return 0


def own_peak_bytes() -> int:
    """This process's peak resident bytes since its clear_refs reset (VmHWM), else ru_maxrss."""
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def digits_data(folder: Path, samples: int) -> tuple[Path, Path]:
    path = folder / f"digits_{samples}.npy"
    if not path.exists():
        images = np.random.default_rng(25).normal(0, 1, (samples, 1, 8, 8)).astype(np.float32)
        np.save(path, images)
    return MODELS / "digits_cnn.onnx", path


def bert_data(folder: Path, samples: int) -> tuple[Path, Path]:
    sys.path.insert(0, str(HERE))
    import calibrate as calibrate_benchmark  # benchmarks/calibrate.py: the encoder and its data

    model = calibrate_benchmark.build_model(folder, False, "-10000")
    return model, calibrate_benchmark.write_data(folder, model, samples)


def run_child(config: str, model: Path, data: Path, address: str | None) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", config, "--model", str(model)]
    command += ["--data", str(data)] + (["--address", address] if address else [])
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=3600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        return {"config": config, "status": "failed", "error": done.stderr.strip().splitlines()[-1:]}
    row = json.loads(done.stdout.strip().splitlines()[-1])
    return {"config": config, "status": "ok", "seconds": seconds, **row}


@contextlib.contextmanager
def cluster_for(config: str):
    if config not in ("ray-1node", "ray-2node"):
        yield None
        return
    from qconvert.calibrate.ray_cluster import local_cluster

    nodes, cpus = (1, 2) if config == "ray-1node" else (2, 1)
    with local_cluster(nodes=nodes, cpus_per_node=cpus, object_store_bytes=512 << 20) as running:
        yield running.address


def print_rows(workload: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{workload}")
    head = f"{'config':<12} {'seconds':>8} {'pass s':>7}  {'read MiB per worker':<22} "
    print(head + f"{'peak MiB per worker':<22} driver")
    for row in rows:
        if row["status"] != "ok":
            print(f"{row['config']:<12} failed: {row['error']}")
            continue
        reads = " ".join(f"{share['read_mib']:.1f}" for share in row["shares"])
        peaks = " ".join(f"{share['peak_mib']:.0f}" for share in row["shares"])
        print(
            f"{row['config']:<12} {row['seconds']:>8.1f} {row['pass_seconds']:>7.1f}  {reads:<22} "
            f"{peaks:<22} {row['driver_peak_mib']:.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="digits,bert")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--digits-samples", type=int, default=262_144)
    parser.add_argument("--bert-samples", type=int, default=512)
    parser.add_argument("--keep", type=Path, help="build the data here (kept; reused next time)")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    configs = [name for name in args.configs.split(",") if name]
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configs {unknown}; expected some of {', '.join(CONFIGS)}")
    results: dict[str, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="calibrate-ray-")))
        folder.mkdir(parents=True, exist_ok=True)
        for workload in args.workloads.split(","):
            if workload == "digits":
                model, data = digits_data(folder, args.digits_samples)
            elif workload == "bert":
                model, data = bert_data(folder, args.bert_samples)
            else:
                parser.error(f"unknown workload {workload}; expected digits or bert")
            rows = []
            for config in configs:
                with cluster_for(config) as address:
                    rows.append(run_child(config, model, data, address))
                print(f"  {workload} {config}: done", file=sys.stderr, flush=True)
            results[workload] = rows
            print_rows(f"{workload}: {model.name}, {data.name} ({data.stat().st_size / MIB:.1f} MiB)", rows)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
