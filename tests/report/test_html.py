"""The HTML report (`qconvert report`, `--report`) in a real headless Chromium, and the JSON it draws."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from report.report_support import DIGITS, DIGITS_INPUTS, load, screenshot_folder

from qconvert.check.report import STEPS_OFF_CAP, compare
from qconvert.cli import main

# Per drawn plot: whether plotly drew it, and how many marks (bars, points, line paths) its SVG holds.
_PLOTS = """
return Array.from(document.querySelectorAll('div.plot')).map(function (div) {
  const svg = div.querySelector('svg.main-svg');
  return {
    id: div.id,
    visible: !Array.from(document.querySelectorAll('details')).some(d => !d.open && d.contains(div)),
    drawn: !!div.dataset.drawn && !!svg,
    marks: div.querySelectorAll('g.point, g.trace.bars path, g.scatterlayer path.js-line').length,
    traces: div.data ? div.data.map(function (t) { return (t.y || []).length; }) : [],
  };
});
"""


def _open(
    browser: Any, page: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> list[dict[str, Any]]:
    """Load `page`; assert no console error; save a screenshot (path printed); the plots' state."""
    browser.get_log("browser")  # drop what an earlier page logged
    browser.get(page.as_uri())
    errors = [entry for entry in browser.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]
    assert errors == []
    screenshot = screenshot_folder(tmp_path) / f"{page.stem}.png"
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.stat().st_size > 10_000
    with capsys.disabled():
        print(f"\nscreenshot of the {page.stem} report: {screenshot}")
    return browser.execute_script(_PLOTS)


def test_check_report_draws_every_plot(
    browser: Any, results: dict[str, Path], tmp_path: Path, capsys
) -> None:
    check = load(results["check"])
    page = results["check_html"].read_text()
    assert "<script src=" not in page and "http://" not in page.split("<script>", 1)[0]  # nothing to fetch
    plots = _open(browser, results["check_html"], tmp_path, capsys)
    visible = [plot for plot in plots if plot["visible"]]
    assert visible and all(plot["drawn"] and plot["marks"] > 0 for plot in visible)
    # The SQNR plot along the graph: one point per node that ran, in the JSON's order.
    ran = [name for name, layer in check["layers"].items() if layer["verdict"] != "not run"]
    sqnr_plot = next(
        p
        for p in plots
        if browser.execute_script(
            f"return document.getElementById('{p['id']}').layout.title.text"
        ).startswith("SQNR per node")
    )
    assert sum(sqnr_plot["traces"][:-1]) == len(ran)  # the markers by verdict; the last trace is the line
    text = browser.find_element("tag name", "body").text
    assert check["verdict_line"] in text
    assert all(name in page for name in check["layers"])


def test_calibrate_report_draws_histograms_lazily(
    browser: Any, results: dict[str, Path], tmp_path: Path, capsys
) -> None:
    calibration = load(results["calibrate"])
    plots = _open(browser, results["calibrate_html"], tmp_path, capsys)
    visible = [plot for plot in plots if plot["visible"]]
    assert visible and all(plot["drawn"] and plot["marks"] > 0 for plot in visible)
    hidden = [plot for plot in plots if not plot["visible"]]
    histograms = calibration["histograms"]
    assert len(plots) == len(histograms) + 1  # one per tensor histogram, and the worst tensors
    assert hidden and not any(plot["drawn"] for plot in hidden)  # folded: not drawn until opened
    if hidden:
        first = hidden[0]["id"]
        browser.execute_script(f"document.getElementById('{first}').closest('details').open = true")
        drawn = browser.execute_script(f"return !!document.getElementById('{first}').dataset.drawn")
        assert drawn
    text = browser.find_element("tag name", "body").text
    assert calibration["method"] in text


def test_calibrate_json_histograms_count_every_observed_value(results: dict[str, Path]) -> None:
    """The exported histogram of each tensor holds one count per value onnxruntime computed for it."""
    calibration = load(results["calibrate"])
    histograms = calibration["histograms"]
    assert histograms
    model = onnx.load(str(DIGITS))
    names = list(histograms)
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in names
                              if name not in {o.name for o in model.graph.output})  # fmt: skip
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = dict(np.load(DIGITS_INPUTS))
    values = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    for name, histogram in histograms.items():
        array = values[name] if name in values else feeds[name]
        assert sum(histogram["counts"]) == array.size, name
        low = histogram["start"]
        high = low + histogram["width"] * len(histogram["counts"])
        assert low <= float(array.min()) and float(array.max()) <= high, name


def test_steps_off_counts_each_elements_distance_in_steps() -> None:
    rng = np.random.default_rng(3)
    reference = rng.integers(-100, 100, size=4000).astype(np.int8)
    offsets = rng.choice([0, 0, 0, 1, -1, 2, -3, 25], size=reference.size)
    ours = (reference.astype(np.int32) + offsets).astype(np.int8)
    counts = compare(reference, ours).steps_off
    expected = np.bincount(np.minimum(np.abs(offsets), STEPS_OFF_CAP), minlength=STEPS_OFF_CAP + 1)
    assert counts == [int(c) for c in np.trim_zeros(expected, "b")]
    # Dequantized values: the difference divided by the scale, per channel.
    scale = np.array([0.5, 0.25], np.float32)[:, None]
    dequantized = reference.reshape(2, -1).astype(np.float32) * scale
    shifted = (ours.reshape(2, -1).astype(np.float32)) * scale
    assert compare(dequantized, shifted, lsb_unit=scale).steps_off == counts


def test_report_of_something_else_is_refused(tmp_path: Path, capsys, plotly: None) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something"}))
    assert main(["report", str(other), "-o", str(tmp_path / "page.html")]) == 2
    assert "not a result of `qconvert check --json`" in capsys.readouterr().err
    assert not (tmp_path / "page.html").exists()


def test_report_of_a_binary_file_is_refused_as_not_json(tmp_path: Path, capsys) -> None:
    """A model given where the JSON result goes: its bytes are not UTF-8, which once escaped as exit 3."""
    assert main(["report", str(DIGITS), "-o", str(tmp_path / "page.html")]) == 2
    assert f"{DIGITS}: not JSON" in capsys.readouterr().err
    assert not (tmp_path / "page.html").exists()


def test_a_large_check_result_stays_usable(browser: Any, results: dict[str, Path], tmp_path: Path) -> None:
    """780 nodes (the digits check's nodes, repeated): rendered and loaded in seconds, the table folded."""
    import time

    from qconvert.report import render_html

    check = load(results["check"])
    check["layers"] = {f"{name} #{i}": layer for i in range(30) for name, layer in check["layers"].items()}
    started = time.perf_counter()
    page = tmp_path / "large.html"
    page.write_text(render_html(check))
    assert time.perf_counter() - started < 10
    started = time.perf_counter()
    browser.get(page.as_uri())
    assert time.perf_counter() - started < 20
    folded = browser.execute_script(
        "return Array.from(document.querySelectorAll('summary')).map(s => s.textContent)"
    )
    assert f"{len(check['layers']) - 40:,} more rows" in folded
    points = browser.execute_script(
        "return Array.from(document.querySelectorAll('div.plot')).filter(d => d.data && d.layout.title.text"
        ".startsWith('SQNR per node')).map(d => d.data.slice(0, -1).reduce((n, t) => n + t.y.length, 0))"
    )
    assert points == [len(check["layers"])]


def test_calibrate_report_lists_the_sentinel_decisions(tmp_path: Path, plotly: None) -> None:
    """bert_mask's float-min attention mask: the tensors the guard kept in float are in the sentinel table."""
    from report.report_support import MODELS

    result, page = tmp_path / "bert.json", tmp_path / "bert.html"
    arguments = ["calibrate", str(MODELS / "bert_mask.onnx"), "--data", str(MODELS / "bert_mask.inputs.npz")]
    assert main([*arguments, "--quiet", "--evaluate", "0", "--json", str(result), "--report", str(page)]) == 0
    keep_float = load(result)["keep_float"]
    assert keep_float
    text = page.read_text()
    section = text[text.index("<h2>Sentinel decisions</h2>") : text.index("<h2>Ranges")]
    for name, why in keep_float.items():
        assert f"<td>{name}</td><td>kept in float</td>" in section
        assert why.split(":")[0] in section


def test_check_against_report_lists_every_compared_value(tmp_path: Path, plotly: None) -> None:
    from report.report_support import DIGITS_QDQ

    stripped, result, page = tmp_path / "digits.storage.onnx", tmp_path / "against.json", tmp_path / "a.html"
    assert main(["convert", str(DIGITS_QDQ), "--to", "onnx-storage", "-o", str(stripped), "--quiet"]) == 0
    arguments = [
        "check",
        str(stripped),
        "--against",
        str(DIGITS_QDQ),
        "--data",
        str(DIGITS_INPUTS),
        "--quiet",
    ]
    assert main([*arguments, "--json", str(result), "--report", str(page)]) == 0
    against = load(result)
    text = page.read_text()
    assert f'<span class="verdict {against["verdict"]}">' in text
    for comparison in against["comparisons"]:
        assert f"<td>{comparison['name']} ({comparison['compared']})</td>" in text


def test_a_failed_check_shows_its_rounding_divergence(browser: Any, tmp_path: Path, plotly: None) -> None:
    """Every input a tie, zero point 3: StableHLO's rounding differs from ONNX's on all 4 elements, as
    predicted; with --max-mismatch-fraction 0 the check fails. The page shows both, and loads cleanly."""
    from conftest import require_module
    from onnx import TensorProto, helper, numpy_helper

    require_module("jax")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quantize"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dequantize"),
    ]
    scale, zero_point = (
        numpy_helper.from_array(np.array(0.5, np.float32), "s"),
        numpy_helper.from_array(np.array(3, np.int8), "z"),
    )
    outputs = [helper.make_tensor_value_info("q", TensorProto.INT8, [4])]
    outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])]
    graph = helper.make_graph(nodes, "ties", inputs, outputs, [scale, zero_point])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "ties.onnx"))
    np.savez(tmp_path / "ties.npz", x=np.array([0.25, 0.75, 1.25, -0.25], np.float32))
    result, page = tmp_path / "ties.json", tmp_path / "ties.html"
    arguments = ["check", str(tmp_path / "ties.onnx"), "--data", str(tmp_path / "ties.npz"), "--quiet"]
    arguments += ["--backend", "stablehlo", "--semantics", "stablehlo", "--max-mismatch-fraction", "0"]
    assert main([*arguments, "--json", str(result), "--report", str(page)]) == 1
    check = load(result)
    quantize = check["layers"]["quantize"]
    assert quantize["predicted_mismatches"] == quantize["mismatches"] > 0
    assert sum(quantize["steps_off"][1:]) == quantize["mismatches"]
    text = page.read_text()
    divergence = text[text.index("<h2>Rounding divergence</h2>") : text.index("<h2>Per node")]
    assert (
        f'<td>quantize</td><td>QuantizeLinear</td><td class="num">{quantize["mismatches"]}</td>' in divergence
    )
    assert '<span class="verdict FAILED">' in text
    browser.get_log("browser")
    browser.get(page.as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
    drawn = browser.execute_script(
        "return document.querySelectorAll('div.plot[data-drawn] svg.main-svg').length"
    )
    assert drawn >= 3  # end to end, SQNR along the graph, the steps-off histograms
