"""The AscendC backend behind `qconvert.backends`' interface: a folder with the call graph, one kernel per
distinct call, the host tiling and the constants. Light to import: the builder loads on first use.

    qconvert convert MODEL --to ascendc -o DIR [--product atlas-a2] [--round-mode rint]

DIR (written whole or not at all: staged beside it, then renamed into place):
- `callgraph.json`: the product, and every site as its API call (callgraph.py's `Site.to_json`);
- `kernels/<name>.cpp`: one kernel per distinct call (kernels.py);
- `tiling.json`: per site, the kernel, its launch (blockDim) and its QTiling fields (tiling.py);
- `constants/siteNNN_<what>.npy` and `.bin` (raw little-endian, what the kernel's GM buffer holds):
  scales and offsets in the API's convention and type, weights in their storage type, int32 biases.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from qconvert.errors import InputError

from .options import AscendcOptions

if TYPE_CHECKING:
    from collections.abc import Callable

    from onnx import ModelProto

    from qconvert.ir.dialects.builtin import ModuleOp

    from .callgraph import CallGraph
    from .check import AscendcCheckRunner

    Lift = Callable[[ModelProto], ModuleOp]

ENGINES = ("emulator",)


@dataclass(slots=True)
class AscendcArtifact:
    """The call graph and the files that go into DIR (by relative path)."""

    graph: CallGraph
    files: dict[str, bytes] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)

    def summary_lines(self) -> list[str]:
        """What `convert` prints once DIR is written: the calls by API, the kernels, the padded sites."""
        calls = ", ".join(f"{count} {api}" for api, count in self.summary.get("sites", {}).items())
        padded = sum(1 for site in self.graph.sites if site.padding)
        return [
            f"{self.graph.product.title}: {calls or 'no quantization sites'}; "
            f"{self.summary.get('kernels', 0)} kernel(s); {padded} site(s) padded (see callgraph.json)"
        ]


def build_artifact(module: ModuleOp, options: AscendcOptions) -> AscendcArtifact:
    """The call graph of `module` on the chosen product, its kernels, tiling and constants."""
    from .callgraph import build_call_graph
    from .kernels import kernel_name, kernel_source
    from .tiling import tiling_for

    graph = build_call_graph(module, options.product, options.round_mode)
    product = graph.product
    artifact = AscendcArtifact(graph)
    sites: list[dict[str, Any]] = []
    tilings: list[dict[str, Any]] = []
    kernels: dict[str, str] = {}
    for site in graph.sites:
        files: dict[str, str] = {}
        for what, array in _constants(site).items():
            if array.dtype.name in ("int4", "uint4"):
                array = _packed_int4(array)
            stem = f"constants/site{site.index:03d}_{what}"
            artifact.files[stem + ".npy"] = _npy(array)
            artifact.files[stem + ".bin"] = np.ascontiguousarray(array).tobytes()
            files[what] = stem + ".npy"
        tiling = tiling_for(site, product)
        kernel = None
        if tiling is not None:
            kernel = kernel_name(site)
            kernels.setdefault(kernel, kernel_source(site, product))
            entry = {"site": site.index, "node": site.node, "kernel": kernel, **tiling.to_json()}
            if site.mode == "PER_TENSOR" and site.scale is not None:
                entry["scale"] = float(np.asarray(site.scale, np.float32).reshape(-1)[0])
                entry["offset"] = float(np.asarray(site.offset, np.float32).reshape(-1)[0])
            tilings.append(entry)
        sites.append(site.to_json(kernel, tiling.tmpBytes if tiling else None, files))
    for name, source in kernels.items():
        artifact.files[f"kernels/{name}.cpp"] = source.encode()
    document = {
        "product": product.name,
        "productTitle": product.title,
        "npuArch": product.npu_arch,
        "roundMode": f"CAST_{options.round_mode.upper()}",
        "sites": sites,
    }
    artifact.files["callgraph.json"] = (json.dumps(document, indent=1) + "\n").encode()
    artifact.files["tiling.json"] = (
        json.dumps({"product": product.name, "ubBytes": product.ub_bytes, "tilings": tilings}, indent=1)
        + "\n"
    ).encode()
    counts: dict[str, int] = {}
    for site in graph.sites:
        counts[site.api] = counts.get(site.api, 0) + 1
    artifact.summary = {"product": product.name, "sites": counts, "kernels": len(kernels)}
    return artifact


def _constants(site: Any) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    if site.scale is not None and not (site.mode == "PER_TENSOR" and site.api != "AscendDequant"):
        found["scale"] = _api_typed(site, site.scale)
    if site.offset is not None and site.mode != "PER_TENSOR":
        found["offset"] = _api_typed(site, site.offset)
    found.update(site.constants)
    return found


def _api_typed(site: Any, values: np.ndarray) -> np.ndarray:
    """Parameters in the type the kernel's PrmT reads: the source's type for A2/A3 AscendQuant tensors."""
    if site.api == "AscendQuant":
        return np.asarray(values, np.float16 if site.src_type == "float16" else np.float32)
    return np.asarray(values)


def _packed_int4(values: np.ndarray) -> np.ndarray:
    """int4 codes two to a byte, the first in the low nibble (int4b_t's packing), an odd count padded by 0."""
    nibbles = (np.asarray(values).astype(np.int8).reshape(-1) & 0xF).astype(np.uint8)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)


def _npy(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    values = np.asarray(array)
    if (
        values.dtype.kind == "V"
        or values.dtype.name in ("bfloat16",)
        or values.dtype.name.startswith("float8")
    ):
        values = values.view(np.uint8 if values.dtype.itemsize == 1 else np.uint16)  # ml_dtypes: the bits
    np.save(buffer, values, allow_pickle=False)
    return buffer.getvalue()


def write_folder(artifact: AscendcArtifact, output: str) -> None:
    """DIR whole or not at all: the files staged in a hidden folder beside it, then renamed into place (an
    existing DIR written by us before is replaced; a file at that path is refused)."""
    target = os.path.abspath(output)
    if os.path.exists(target) and not os.path.isdir(target):
        raise InputError(f"--to ascendc writes a folder: {output} exists and is not one")
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        raise InputError(f"cannot write {output}: folder {parent} does not exist")
    staging = tempfile.mkdtemp(dir=parent, prefix=".qconvert-ascendc.")
    try:
        for relative, data in artifact.files.items():
            path = os.path.join(staging, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(data)
        if os.path.isdir(target):
            old = tempfile.mkdtemp(dir=parent, prefix=".qconvert-ascendc-old.")
            os.rename(target, os.path.join(old, "previous"))
            os.rename(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, target)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise InputError(f"cannot write {output}: {error.strerror}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class AscendcBackend:
    """IR -> the AscendC call graph (AscendQuant / AscendDequant / AscendAntiQuant), kernels, tiling."""

    name = "ascendc"
    summary = "AscendC call graph, kernel sources, tiling and constants in a folder; needs -o DIR"
    Options = AscendcOptions
    engines = ENGINES
    default_engine = "emulator"

    def convert(self, module: ModuleOp, options: AscendcOptions) -> AscendcArtifact:
        return build_artifact(module, options)

    def write(self, artifact: AscendcArtifact, output: str | IO[str]) -> None:
        if not isinstance(output, str) or output == "-":
            raise InputError(
                "--to ascendc writes a folder (callgraph.json, kernels/, tiling.json, constants/): "
                "give -o DIR"
            )
        write_folder(artifact, output)

    def check_runner(self, options: AscendcOptions, engine: str | None, lift: Lift) -> AscendcCheckRunner:
        """`check --backend ascendc`: each quantization site on the emulator, against onnxruntime."""
        from qconvert.options import check_choice

        from .check import AscendcCheckRunner

        check_choice("--engine", engine or self.default_engine, self.engines)
        return AscendcCheckRunner(lift, options)


BACKEND = AscendcBackend()
