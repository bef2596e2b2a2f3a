"""`check --model-explorer`: the node data reads with Model Explorer's own builder, keyed as its ONNX adapter
names the graph and nodes."""

from __future__ import annotations

import json
from pathlib import Path

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
