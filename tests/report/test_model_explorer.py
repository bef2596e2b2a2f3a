"""`check --model-explorer`: the node data reads with Model Explorer's own builder, keyed as its ONNX adapter
names the graph and nodes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import require_module
from report.report_support import DIGITS_QDQ, load

from qconvert.report.model_explorer import EXACT_DB, steps_path


def _adapter_graph() -> tuple[str, set[str]]:
    """The main graph's id and its node ids, as model-explorer-onnx converts the model."""
    adapter = require_module("model_explorer_onnx.main")
    graphs = adapter.ONNXAdapter().convert(str(DIGITS_QDQ), {})
    main = graphs["graphs"][0]
    return main.id, {node.id for node in main.nodes}


def test_node_data_loads_with_model_explorer_and_names_the_adapters_nodes(results: dict[str, Path]) -> None:
    require_module("model_explorer")
    from dacite import from_dict
    from model_explorer.node_data_builder import GraphNodeData, ModelNodeData

    graph_id, node_ids = _adapter_graph()
    check = load(results["check"])
    for path in (results["explorer"], steps_path(results["explorer"])):
        written = json.loads(path.read_text())
        data = ModelNodeData(graphsData={k: from_dict(GraphNodeData, v) for k, v in written.items()})
        assert json.loads(data.to_json_string()) == written  # the builder writes back what we wrote
        assert list(data.graphsData) == [graph_id]
        results_by_node = data.graphsData[graph_id].results
        assert set(results_by_node) <= node_ids
        # every checked node (a fused group: each of its nodes) has its value
        checked = {m for name, layer in check["layers"].items() for m in layer.get("fused_group") or [name]}
        assert checked == set(results_by_node)
    sqnr = from_dict(GraphNodeData, json.loads(results["explorer"].read_text())[graph_id]).results
    for name, layer in check["layers"].items():
        expected = EXACT_DB if layer["sqnr_db"] is None else layer["sqnr_db"]
        assert sqnr[name].value == expected
        assert sqnr[name].bgColor is not None


def test_model_explorer_shows_the_node_data_on_the_adapters_graph(
    browser: Any, results: dict[str, Path]
) -> None:
    """Model Explorer's own server (with the ONNX adapter) and web UI, in the shared headless Chromium: the
    node-data table lists each float node's SQNR from our file against the node the adapter made."""
    require_module("model_explorer")
    require_module("model_explorer_onnx")
    with socket.socket() as probe:  # a free port for the server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    explorer = Path(sys.executable).with_name("model-explorer")
    data = f"{results['explorer']},{steps_path(results['explorer'])}"
    command = [
        str(explorer),
        str(DIGITS_QDQ),
        "--extensions=model_explorer_onnx",
        f"--node_data_paths={data}",
    ]
    command += ["--no_open_in_browser", "--host=127.0.0.1", f"--port={port}"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None
        url = next((line.strip() for line in server.stdout if line.startswith("http://")), None)
        assert url is not None, "the Model Explorer server printed no address"
        browser.get(url)
        deadline = time.monotonic() + 30
        rows: list[str] = []
        while time.monotonic() < deadline:
            rows = browser.execute_script(
                "return Array.from(document.querySelectorAll('tr')).map(r => r.innerText)"
            )
            if any("\tConv\t" in row for row in rows):
                break
            time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=10)
    check = load(results["check"])
    shown = sorted(float(row.split("\t")[2]) for row in rows if row.split("\t")[1:2] in (["Conv"], ["Gemm"]))
    ours = sorted(
        layer["sqnr_db"] for layer in check["layers"].values() if layer["op_type"] in ("Conv", "Gemm")
    )
    assert shown and shown == pytest.approx(ours)
