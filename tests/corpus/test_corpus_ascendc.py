"""`check --backend ascendc` on the corpus's MiniLM: weight-only (AscendAntiQuant -> half matmul), dynamic
(DynamicQuantizeLinear as AscendQuant with a run-time scale) and static QDQ (the attention mask's Q/DQ reach
beyond half's range: refused, named, not run).
"""

from __future__ import annotations

from pathlib import Path


def test_check_corpus_weight_only_and_dynamic(corpus_dir: Path) -> None:
    from qconvert.check import check

    inputs = str(corpus_dir / "minilm.inputs.npz")
    weight_only = check(str(corpus_dir / "minilm.weight_only.onnx"), inputs, backend="ascendc", max_samples=2)
    assert weight_only.verdict == "PASSED"
    dynamic = check(str(corpus_dir / "minilm.dynamic.onnx"), inputs, backend="ascendc", max_samples=2)
    sites = [layer for layer in dynamic.layers.values() if layer.op_type == "DynamicQuantizeLinear"]
    assert len(sites) == 8 and all(layer.verdict == "pass" for layer in sites)
    assert sum(layer.mismatches for layer in sites) > 0
    assert all(layer.verdict == "pass" for layer in dynamic.layers.values())
    assert all(output.ours is not None for output in dynamic.outputs.values())  # end to end ran


def test_check_minilm_qdq_refuses_the_attention_mask_sites(corpus_dir: Path) -> None:
    from qconvert.check import check

    report = check(
        str(corpus_dir / "minilm.qdq.onnx"),
        str(corpus_dir / "minilm.inputs.npz"),
        backend="ascendc",
        max_samples=2,
    )
    refused = [name for name, layer in report.layers.items() if layer.verdict == "not run"]
    assert len(refused) == 6 and all(
        "beyond half's 65504" in (report.layers[n].reason or "") for n in refused
    )
    assert all(layer.verdict in ("pass", "not run") for layer in report.layers.values())
    assert report.verdict.startswith("INCOMPLETE")


def test_check_mobilenet_qdq_u8_weight_zero_points(corpus_dir: Path) -> None:
    """uint8 weights whose zero points are not 128 go into the Mmad with the accumulator correction (15 of
    19 groups; before, refused): every group passes against onnxruntime, and so does the model."""
    from qconvert.check import check

    report = check(
        str(corpus_dir / "mobilenet_fpn.qdq_u8.onnx"),
        str(corpus_dir / "mobilenet_fpn.inputs.npz"),
        backend="ascendc",
        max_samples=2,
    )
    groups = [layer for layer in report.layers.values() if layer.group is not None]
    assert len(groups) == 19 and all(layer.verdict == "pass" for layer in groups)
    assert report.verdict == "PASSED", report.verdict_line
