"""`check --model-explorer OUT.json`: per-node results as Model Explorer node data, to colour the ONNX graph.

NOTE: the format is that of Model Explorer's `node_data_builder` (pip `ai-edge-model-explorer`):
`{graph id: {"name", "results": {node id: {"value", "bgColor"}}, "thresholds" | "gradient"}}` (its
`ModelNodeData`). Graph and node ids are those the ONNX adapter (`model-explorer-onnx`) gives: the main
graph's name (`<main>` when unnamed) and each node's name, `<node_I>` (I its index) when unnamed. A fused
group's result goes to every node of the group. Two files: OUT.json holds each node's SQNR against
onnxruntime in dB (an exact node: EXACT_DB), its background the verdict's colour; OUT.steps.json holds the
largest difference in quantization steps. Load both in Model Explorer beside the model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qconvert.atomic_file import atomic_text_file

EXACT_DB = 200.0  # the value written for a node that matches onnxruntime bit for bit (infinite SQNR)
VERDICT_COLOURS = {"pass": "#a5d6a7", "fail": "#ef9a9a", "not run": "#e0e0e0"}
MAIN_GRAPH = "<main>"  # the adapter's id of an unnamed main graph


def adapter_node_ids(model: str | os.PathLike[str]) -> tuple[str, dict[str, list[str]]]:
    """The main graph's id and, by check's display name of each node (check/nodes.py `node_names`), the
    id Model Explorer's ONNX adapter gives it (one display name -> one id; a list for uniformity)."""
    import onnx

    from qconvert.check.nodes import node_names

    proto = onnx.load(os.fspath(model), load_external_data=False)
    graph_id = proto.graph.name or MAIN_GRAPH
    ids = {
        display: [node.name or f"<node_{index}>"]
        for index, (display, node) in enumerate(zip(node_names(proto), proto.graph.node, strict=True))
    }
    return graph_id, ids


def node_data(
    report: Mapping[str, Any], model: str | os.PathLike[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(SQNR node data, steps-off node data) for a check report's JSON (`CheckReport.to_json()`)."""
    graph_id, ids = adapter_node_ids(model)
    sqnr: dict[str, Any] = {}
    steps: dict[str, Any] = {}
    for name, entry in (report.get("layers") or {}).items():
        members = entry.get("fused_group") or [name]
        targets = [node_id for member in members for node_id in ids.get(member, [])]
        verdict = entry.get("verdict", "not run")
        colour = VERDICT_COLOURS.get(verdict, VERDICT_COLOURS["not run"])
        if verdict == "not run":
            value, off = -1.0, -1.0  # nothing measured: below every real value
        else:
            value = EXACT_DB if entry.get("sqnr_db") is None else float(entry["sqnr_db"])
            off = float(entry.get("max_lsb_diff") or 0.0)
        for node_id in targets:
            sqnr[node_id] = {"value": value, "bgColor": colour}
            steps[node_id] = {"value": off}
    sqnr_graph = _graph_node_data("qconvert check: SQNR vs onnxruntime (dB; verdict colours)", sqnr, [])
    thresholds = [
        {"value": 0, "bgColor": "#a5d6a7"},
        {"value": 1, "bgColor": "#fff59d"},
        {"value": 1e30, "bgColor": "#ef9a9a"},
    ]
    steps_graph = _graph_node_data("qconvert check: max steps off", steps, thresholds)
    return {graph_id: sqnr_graph}, {graph_id: steps_graph}


def _graph_node_data(name: str, results: dict[str, Any], thresholds: list[dict[str, Any]]) -> dict[str, Any]:
    """One graph's node data with every field Model Explorer's `GraphNodeData` writes (its defaults)."""
    return {
        "results": results,
        "name": name,
        "thresholds": thresholds,
        "gradient": [],
        "hideInAggregatedStatsTable": False,
        "hideInChildrenStatsTable": False,
        "showExpandedSummaryOnGroupNode": False,
        "showLabelCountColumnsInChildrenStatsTable": False,
    }


def steps_path(path: str | os.PathLike[str]) -> Path:
    """Where the steps-off file goes beside OUT.json: OUT.steps.json."""
    path = Path(path)
    return path.with_name(path.name.removesuffix(".json") + ".steps.json")


def write_model_explorer(
    report: Mapping[str, Any], model: str | os.PathLike[str], path: str | os.PathLike[str]
) -> list[Path]:
    """Write OUT.json (SQNR) and OUT.steps.json (steps off); the paths written."""
    sqnr, steps = node_data(report, model)
    written = []
    for target, data in ((Path(path), sqnr), (steps_path(path), steps)):
        with atomic_text_file(target) as stream:
            stream.write(json.dumps(data, indent=1, allow_nan=False) + "\n")
        written.append(target)
    return written


__all__ = ["EXACT_DB", "adapter_node_ids", "node_data", "steps_path", "write_model_explorer"]
