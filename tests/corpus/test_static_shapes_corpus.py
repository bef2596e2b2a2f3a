"""Static shapes on the corpus: with its inputs pinned to the shapes of its `.npz` (what `--input-shape`
gives), every value of every corpus model lifts with a static type; unpinned, conversion fails with one
message naming the dynamic inputs, not a line per op."""

from __future__ import annotations

import numpy as np
import pytest
from corpus_manifest import ENTRIES, CorpusEntry

from qconvert.errors import InputError
from qconvert.ir.types import RankedTensorType

# What stays dynamic today, and why (strict: a fix makes the case XPASS and fail until its line goes).
STILL_DYNAMIC: dict[str, str] = {}


def entries() -> list[object]:
    return [
        pytest.param(
            entry,
            id=entry.name,
            marks=[pytest.mark.xfail(strict=True, reason=STILL_DYNAMIC[entry.name])]
            if entry.name in STILL_DYNAMIC
            else [],
        )
        for entry in ENTRIES
    ]


def pinned_shapes(corpus_dir, entry: CorpusEntry) -> dict[str, tuple[int, ...]]:
    with np.load(corpus_dir / entry.inputs_file) as arrays:
        return {name: arrays[name].shape for name in arrays.files}


@pytest.mark.parametrize("entry", entries())
def test_pinned_corpus_model_lifts_with_static_types_everywhere(corpus_dir, entry: CorpusEntry) -> None:
    from qconvert.frontends.onnx import import_onnx

    module = import_onnx(corpus_dir / entry.file, pinned_shapes(corpus_dir, entry))
    function = next(op for op in module.body.ops if op.name == "func.func")
    dynamic = [
        f"{op.attributes.get('onnx.node_name') or op.name}: {result.type}"
        for op in function.body.ops
        for result in op.results
        if not (isinstance(result.type, RankedTensorType) and result.type.has_static_shape())
    ]
    assert dynamic == [], f"{len(dynamic)} dynamic values, e.g. {dynamic[:3]}"


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.style == "float"], ids=lambda e: e.name)
def test_unpinned_corpus_model_is_one_message_per_dynamic_input(corpus_dir, entry: CorpusEntry) -> None:
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx

    inputs = pinned_shapes(corpus_dir, entry)
    with pytest.raises(InputError) as caught:
        stablehlo_text(import_onnx(corpus_dir / entry.file), form="qdq")
    lines = caught.value.message.splitlines()
    assert len(lines) == len(inputs) + 2, lines  # the summary, one line per dynamic input, the fix
    for name in inputs:
        assert sum(f"input '{name}' has type" in line for line in lines) == 1
        assert f"--input-shape {name}=" in lines[-1]
