"""One self-contained HTML page from a `calibrate --json` or `check --json` result (`qconvert report`).

NOTE: the plots are plotly figures (plotly.py builds and validates each figure; plotly.js draws it). The
page inlines plotly.js once (no network to open it) and keeps every figure as JSON in one script tag; a
figure is drawn when its section is first opened, so a model of thousands of tensors or nodes loads as
fast as a small one. Sections list the worst first (failed nodes, tensors losing most to their own
quantization), the first few open; long tables show their top rows and fold the rest.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from qconvert.errors import InputError

OPEN_SECTIONS = 6  # per-tensor / per-node sections open (and drawn) when the page loads
TABLE_ROWS = 40  # rows shown before a table folds the rest
WORST_TENSORS = 20  # bars in the worst-tensors plot
EXACT_PLOT_DB = 160.0  # where an exact (infinite SQNR) node sits on the SQNR plot
COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "not run": "#757575"}
TEMPLATE = "plotly_white"  # plotly's template, given once to every figure of the page

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1200px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { color: #2e7d32; } .fail { color: #c62828; font-weight: bold; } .notrun { color: #757575; }
.verdict { font-size: 1.3em; font-weight: bold; padding: 0.2em 0.6em; border-radius: 4px; color: white; }
.verdict.PASSED { background: #2e7d32; } .verdict.FAILED { background: #c62828; }
.verdict.INCOMPLETE { background: #ef6c00; }
details { margin: 0.3em 0; } summary { cursor: pointer; }
.plot { width: 100%; min-height: 320px; } .small { min-height: 240px; }
.note { color: #555; font-size: 0.9em; } ul.warnings li { color: #ad5f00; }
"""

# Draws each figure of `figures` into its div the first time the div is shown (page load or a <details>
# opened): plotly cannot size a plot inside a closed <details>.
_DRAW = """
(function () {
  const shared = JSON.parse(document.getElementById("qconvert-figures").textContent);
  const figures = shared.figures;
  const config = {displaylogo: false, responsive: true};
  function draw(div) {
    if (div.dataset.drawn) return;
    const figure = figures[div.id];
    if (!figure) return;
    div.dataset.drawn = "1";
    figure.layout.template = shared.template;
    Plotly.newPlot(div, figure.data, figure.layout, config);
  }
  function shown(div) {  // every <details> around it open (Chrome lays out closed details' content too)
    for (let d = div.closest("details"); d; d = d.parentElement.closest("details")) {
      if (!d.open) return false;
    }
    return true;
  }
  function drawVisible(root) {
    root.querySelectorAll("div.plot").forEach(function (div) {
      if (shown(div)) draw(div);
    });
  }
  document.querySelectorAll("details").forEach(function (details) {
    details.addEventListener("toggle", function () { if (details.open) drawVisible(details); });
  });
  drawVisible(document);
})();
"""


def render_html(result: Mapping[str, Any], source: str = "") -> str:
    """The page for a check or calibrate JSON result (`source`: where it was read, for the title)."""
    try:
        import plotly  # noqa: F401 (an optional dependency: say how to get it)
    except ImportError:
        raise InputError("the HTML report draws with plotly: pip install 'qconvert[report]'") from None
    if "layers" in result and "verdict" in result:
        page: _Page = _CheckPage(result)
    elif "comparisons" in result and "verdict" in result:
        page = _AgainstPage(result)
    elif "ranges" in result and "method" in result:
        page = _CalibrationPage(result)
    else:
        where = f"{source}: " if source else ""
        raise InputError(
            f"{where}not a result of `qconvert check --json` or `qconvert calibrate --json` "
            "(no 'layers' or 'comparisons' with a 'verdict', nor 'ranges' and 'method')"
        )
    return page.render(source)


# Building blocks -------------------------------------------------------------------------------------
def _text(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _number(value: object, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _text(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}g}"


def _verdict_class(verdict: str) -> str:
    return {"pass": "pass", "fail": "fail"}.get(verdict, "notrun")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int] | None = None) -> str:
    """A table of pre-escaped cells; past TABLE_ROWS rows the rest fold into a <details>."""
    numeric = numeric or set()
    head = "<tr>" + "".join(f"<th>{_text(h)}</th>" for h in header) + "</tr>"

    def body(chunk: Sequence[Sequence[str]]) -> str:
        return "".join(
            "<tr>"
            + "".join(
                f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row)
            )
            + "</tr>"
            for row in chunk
        )

    shown = f"<table>{head}{body(rows[:TABLE_ROWS])}</table>"
    if len(rows) <= TABLE_ROWS:
        return shown
    rest = rows[TABLE_ROWS:]
    return (
        shown
        + f"<details><summary>{len(rest):,} more rows</summary><table>{head}{body(rest)}</table></details>"
    )


class _Page:
    """Sections of HTML and the figures they draw (plotly figures, kept as JSON by div id)."""

    title = "qconvert report"

    def __init__(self, result: Mapping[str, Any]) -> None:
        self.result = result
        self.figures: dict[str, Any] = {}
        self.sections: list[str] = []

    def plot(self, figure: Any, small: bool = False) -> str:
        """A div that draws `figure` when shown: a plotly Figure (validated by plotly), or the plain
        `{"data", "layout"}` of one for the many small per-tensor / per-node figures (building a Figure
        costs ~15 ms; a model's thousands would take minutes). The page's template is shared, not copied."""
        div_id = f"plot-{len(self.figures)}"
        spec = figure if isinstance(figure, dict) else json.loads(figure.to_json())
        spec["layout"].pop("template", None)
        self.figures[div_id] = spec
        return f'<div class="plot{" small" if small else ""}" id="{div_id}"></div>'

    def build(self) -> None:
        raise NotImplementedError

    def render(self, source: str) -> str:
        import plotly.io
        from plotly.offline import get_plotlyjs

        self.build()
        template = plotly.io.templates[TEMPLATE].to_plotly_json()
        shared = {"template": template, "figures": self.figures}
        figures = json.dumps(shared, separators=(",", ":")).replace("</", "<\\/")
        title = _text(f"{self.title}: {self.result.get('model') or source}")
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{title}</title><style>{_STYLE}</style>"
            f"<script>{get_plotlyjs()}</script></head><body>\n"
            + "\n".join(self.sections)
            + f'\n<script type="application/json" id="qconvert-figures">{figures}</script>'
            + f"<script>{_DRAW}</script></body></html>\n"
        )


def _layout(title: str, x_title: str, y_title: str, height: int = 320) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 14}},
        "xaxis": {"title": {"text": x_title}},
        "yaxis": {"title": {"text": y_title}},
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    }


def _bars(
    layout: dict[str, Any], x: Sequence[object], y: Sequence[float], colour: str, width: float | None = None
) -> dict[str, Any]:
    """A plain bar chart spec (one trace, log counts), as `Figure.to_plotly_json()` would give."""
    trace: dict[str, Any] = {"type": "bar", "x": list(x), "y": list(y), "marker": {"color": colour}}
    if width is not None:
        trace["width"] = width
    layout["yaxis"]["type"] = "log"
    layout["showlegend"] = False
    return {"data": [trace], "layout": layout}


def _range_line(layout: dict[str, Any], x: float, label: str) -> None:
    """A dashed vertical line at `x` across the plot, labelled at its top (Figure.add_vline's shapes)."""
    line = {"color": "#c62828", "dash": "dash"}
    layout.setdefault("shapes", []).append(
        {"type": "line", "x0": x, "x1": x, "xref": "x", "y0": 0, "y1": 1, "yref": "y domain", "line": line}
    )
    layout.setdefault("annotations", []).append(
        {
            "x": x,
            "xref": "x",
            "y": 1,
            "yref": "y domain",
            "text": label,
            "showarrow": False,
            "xanchor": "left",
        }
    )


# check -------------------------------------------------------------------------------------------------
class _CheckPage(_Page):
    title = "qconvert check"

    def build(self) -> None:
        result = self.result
        layers: Mapping[str, Mapping[str, Any]] = result.get("layers") or {}
        summary = result.get("summary") or {}
        verdict = str(result.get("verdict", ""))
        self.sections.append(
            f"<h1>qconvert check: {_text(result.get('model'))}</h1>"
            f'<p><span class="verdict {_text(verdict)}">'
            f"{_text(result.get('verdict_line', verdict))}</span></p>"
            + _table(
                [
                    "backend",
                    "engine",
                    "form",
                    "semantics",
                    "inputs",
                    "samples end to end",
                    "samples per node",
                ],
                [
                    [
                        _text(result.get(key))
                        for key in (
                            "backend",
                            "engine",
                            "form",
                            "semantics",
                            "inputs",
                            "samples",
                            "node_samples",
                        )
                    ]
                ],
            )
            + f"<p>nodes: {_number(summary.get('layers_passed'))} passed, "
            f"{_number(summary.get('layers_failed'))} failed, "
            f"{_number(summary.get('layers_not_run'))} not run</p>"
        )
        self._end_to_end(result.get("outputs") or {})
        self._sqnr_plot(layers)
        self._steps_off(layers)
        self._divergence(result, layers)
        self._not_run(result.get("not_run") or [])
        self._nodes(layers)
        notes = result.get("notes") or []
        if notes:
            self.sections.append(
                "<h2>Notes</h2><ul>" + "".join(f"<li>{_text(n)}</li>" for n in notes) + "</ul>"
            )

    def _end_to_end(self, outputs: Mapping[str, Mapping[str, Any]]) -> None:
        import plotly.graph_objects as go

        if not outputs:
            return
        names = list(outputs)
        figure = go.Figure(layout=_layout("End to end: SQNR against onnxruntime", "output", "SQNR (dB)"))

        def sqnr(entry: Mapping[str, Any] | None) -> float | None:
            if not entry:
                return None
            value = entry.get("sqnr_db")
            if value is None and entry.get("elements") and entry.get("mismatches") == 0:
                return EXACT_PLOT_DB  # no difference at all: drawn at the top, labelled exact
            return value

        def labels(values: list[float | None]) -> list[str]:
            return ["exact" if v == EXACT_PLOT_DB else "" if v is None else f"{v:.1f} dB" for v in values]

        ours = [sqnr(outputs[n]) for n in names]
        floor = [sqnr(outputs[n].get("noise_floor")) for n in names]
        figure.add_bar(
            x=names,
            y=ours,
            name="ours",
            text=labels(ours),
            marker_color=[COLOURS.get(outputs[n]["verdict"], "#757575") for n in names],
        )
        figure.add_bar(
            x=names,
            y=floor,
            text=labels(floor),
            name="noise floor (onnxruntime optimized vs not)",
            marker_color="#90a4ae",
        )
        lockstep = [sqnr(outputs[n].get("lockstep")) for n in names]
        if any(v is not None for v in lockstep):
            figure.add_bar(x=names, y=lockstep, name="lockstep replay", marker_color="#7986cb")
        figure.update_layout(barmode="group")
        rows = []
        for name in names:
            entry = outputs[name]
            floor_entry = entry.get("noise_floor") or {}
            rows.append(
                [
                    _text(name),
                    f'<span class="{_verdict_class(entry["verdict"])}">{_text(entry["verdict"])}</span>',
                    _sqnr_text(entry),
                    _sqnr_text(floor_entry),
                    _number(entry.get("max_lsb_diff")),
                    _number(entry.get("mismatches")),
                    _number(entry.get("elements")),
                    _number(entry.get("near_tie_flips")),
                    _text(
                        "; ".join(
                            [*(entry.get("failed_tolerances") or []), entry.get("below_noise_floor") or ""]
                        ).strip("; ")
                        or entry.get("reason")
                    ),
                ]
            )
        steps = {name: outputs[name]["steps_off"] for name in names if outputs[name].get("steps_off")}
        steps_figure = go.Figure(
            layout=_layout("End to end: elements off by k quantization steps", "steps off (k)", "elements")
        )
        for name, counts in steps.items():
            labels = [_steps_label(k, len(counts)) for k in range(len(counts))]
            steps_figure.add_bar(x=labels, y=counts, name=name)
        steps_figure.update_yaxes(type="log")
        steps_figure.update_layout(barmode="group")
        self.sections.append(
            "<h2>End to end, beside the noise floor</h2>"
            + self.plot(figure)
            + (self.plot(steps_figure, small=True) if steps else "")
            + _table(
                [
                    "output",
                    "verdict",
                    "SQNR",
                    "noise floor",
                    "max steps",
                    "mismatches",
                    "elements",
                    "near-tie flips",
                    "why",
                ],
                rows,
                {2, 3, 4, 5, 6, 7},
            )
        )

    def _sqnr_plot(self, layers: Mapping[str, Mapping[str, Any]]) -> None:
        import plotly.graph_objects as go

        points = [(name, entry) for name, entry in layers.items() if entry.get("verdict") != "not run"]
        if not points:
            return
        figure = go.Figure(
            layout=_layout(
                f"SQNR per node along the graph (exact nodes drawn at {EXACT_PLOT_DB:g} dB)",
                "node (topological order)",
                "SQNR (dB)",
                height=360,
            )
        )
        for verdict in ("pass", "fail"):
            chosen = [(i, n, e) for i, (n, e) in enumerate(points) if e.get("verdict") == verdict]
            if not chosen:
                continue
            figure.add_scatter(
                x=[i for i, _, _ in chosen],
                y=[EXACT_PLOT_DB if e.get("sqnr_db") is None else e["sqnr_db"] for _, _, e in chosen],
                text=[
                    f"{n} ({e.get('op_type')}){' exact' if e.get('sqnr_db') is None else ''}"
                    for _, n, e in chosen
                ],
                mode="markers",
                name=verdict,
                marker={"color": COLOURS[verdict], "size": 7 if verdict == "pass" else 10},
                hovertemplate="%{text}<br>%{y:.2f} dB<extra></extra>",
            )
        figure.add_scatter(
            x=list(range(len(points))),
            y=[EXACT_PLOT_DB if e.get("sqnr_db") is None else e["sqnr_db"] for _, e in points],
            mode="lines",
            line={"color": "#b0bec5", "width": 1},
            showlegend=False,
            hoverinfo="skip",
        )
        self.sections.append("<h2>SQNR along the graph</h2>" + self.plot(figure))

    def _steps_off(self, layers: Mapping[str, Mapping[str, Any]]) -> None:
        import plotly.graph_objects as go

        total: list[int] = []
        for entry in layers.values():
            for k, count in enumerate(entry.get("steps_off") or []):
                total.extend([0] * (k + 1 - len(total)))
                total[k] += count
        if not total:
            return
        figure = go.Figure(
            layout=_layout(
                "Elements off by k quantization steps, all bit-exact nodes", "steps off (k)", "elements"
            )
        )
        figure.add_bar(
            x=[_steps_label(k, len(total)) for k in range(len(total))], y=total, marker_color="#455a64"
        )
        figure.update_yaxes(type="log")
        self.sections.append("<h2>Elements off by k steps</h2>" + self.plot(figure, small=True))

    def _divergence(self, result: Mapping[str, Any], layers: Mapping[str, Mapping[str, Any]]) -> None:
        rows = [
            [
                _text(name),
                _text(entry.get("op_type")),
                _number(entry.get("mismatches")),
                _number(entry.get("predicted_mismatches")),
                f'<span class="{_verdict_class(entry["verdict"])}">{_text(entry["verdict"])}</span>',
                _text(entry.get("explanation")),
            ]
            for name, entry in layers.items()
            if entry.get("predicted_mismatches") is not None
        ]
        explained = result.get("mismatches_explained_by_semantics") or 0
        body = (
            _table(
                ["node", "op", "mismatches", "predicted", "verdict", "why the rounding differs"], rows, {2, 3}
            )
            if rows
            else '<p class="note">No node differs from onnxruntime by the backend\'s rounding rule.</p>'
        )
        self.sections.append(
            "<h2>Rounding divergence</h2>"
            '<p class="note">Elements that differ only because of the chosen rounding semantics: '
            f"{_number(explained)} "
            f"(semantics: {_text(result.get('semantics') or 'onnx')}).</p>" + body
        )

    def _not_run(self, groups: Sequence[Mapping[str, Any]]) -> None:
        if not groups:
            return
        rows = [
            [
                _text(g.get("op_type")),
                _number(g.get("count")),
                _text(g.get("reason")),
                _text(", ".join(g.get("examples") or [])),
            ]
            for g in groups
        ]
        self.sections.append("<h2>Not run</h2>" + _table(["what", "count", "reason", "e.g."], rows, {1}))

    def _nodes(self, layers: Mapping[str, Mapping[str, Any]]) -> None:

        order = {"fail": 0, "not run": 1, "pass": 2}

        def badness(item: tuple[str, Mapping[str, Any]]) -> tuple[int, float, float]:
            entry = item[1]
            sqnr = entry.get("sqnr_db")
            return (
                order.get(entry.get("verdict", ""), 3),
                -(entry.get("mismatches") or 0),
                math.inf if sqnr is None else sqnr,
            )

        ranked = sorted(layers.items(), key=badness)
        rows = [
            [
                _text(name),
                _text(entry.get("op_type")),
                f'<span class="{_verdict_class(entry["verdict"])}">{_text(entry["verdict"])}</span>',
                _number(entry.get("elements")),
                _number(entry.get("mismatches")),
                _number(entry.get("max_lsb_diff")),
                "exact" if entry.get("exact") else _number(entry.get("sqnr_db")),
                _text(entry.get("judged")),
                _text(entry.get("reason") or entry.get("bound")),
            ]
            for name, entry in ranked
        ]
        parts = [
            "<h2>Per node (worst first)</h2>",
            _table(
                [
                    "node",
                    "op",
                    "verdict",
                    "elements",
                    "mismatches",
                    "max steps",
                    "SQNR (dB)",
                    "judged",
                    "reason / bound",
                ],
                rows,
                {3, 4, 5, 6},
            ),
        ]
        detailed = [(n, e) for n, e in ranked if e.get("steps_off") and e.get("mismatches")]
        if detailed:
            parts.append("<h3>Steps-off histograms of the nodes that differ</h3>")
        for index, (name, entry) in enumerate(detailed):
            counts = entry["steps_off"]
            figure = _bars(
                _layout(f"{name}: elements off by k steps", "steps off (k)", "elements", height=240),
                [_steps_label(k, len(counts)) for k in range(len(counts))],
                counts,
                COLOURS.get(entry["verdict"], "#757575"),
            )
            opened = " open" if index < OPEN_SECTIONS else ""
            parts.append(
                f"<details{opened}><summary>{_text(name)} — {_number(entry.get('mismatches'))} of "
                f"{_number(entry.get('elements'))} differ ({_text(entry['verdict'])})</summary>"
                + self.plot(figure, small=True)
                + "</details>"
            )
        self.sections.append("".join(parts))


class _AgainstPage(_Page):
    """`check STRIPPED --against SOURCE`: each boundary value and output of the two models, compared."""

    title = "qconvert check --against"

    def build(self) -> None:
        import plotly.graph_objects as go

        result = self.result
        comparisons: Sequence[Mapping[str, Any]] = result.get("comparisons") or []
        verdict = str(result.get("verdict", ""))
        self.sections.append(
            f"<h1>qconvert check: {_text(result.get('stripped'))} against {_text(result.get('source'))}</h1>"
            f'<p><span class="verdict {_text(verdict)}">{_text(verdict)}</span></p>'
            + _table(
                ["form", "inputs", "samples"],
                [[_text(result.get(key)) for key in ("form", "inputs", "samples")]],
            )
        )
        names = [f"{c.get('name')} ({c.get('compared')})" for c in comparisons]
        figure = go.Figure(layout=_layout("SQNR of each compared value", "value", "SQNR (dB)"))
        values = [
            EXACT_PLOT_DB if c.get("sqnr_db") is None and c.get("mismatches") == 0 else c.get("sqnr_db")
            for c in comparisons
        ]
        figure.add_bar(
            x=names,
            y=values,
            text=["exact" if v == EXACT_PLOT_DB else "" for v in values],
            marker_color=[COLOURS.get(str(c.get("verdict")), "#757575") for c in comparisons],
        )
        rows = [
            [
                _text(name),
                f'<span class="{_verdict_class(str(c.get("verdict")))}">{_text(c.get("verdict"))}</span>',
                _text(c.get("judged")),
                _number(c.get("elements")),
                _number(c.get("mismatches")),
                _number(c.get("max_abs_diff")),
                "exact"
                if c.get("sqnr_db") is None and c.get("mismatches") == 0
                else _number(c.get("sqnr_db")),
                _text(c.get("failure") or c.get("reason")),
            ]
            for name, c in zip(names, comparisons, strict=True)
        ]
        header = ["value", "verdict", "judged", "elements", "mismatches", "max |diff|", "SQNR (dB)", "why"]
        self.sections.append(
            "<h2>Compared values</h2>"
            + (self.plot(figure) if comparisons else "")
            + _table(header, rows, {3, 4, 5, 6})
        )
        notes = result.get("notes") or []
        if notes:
            self.sections.append(
                "<h2>Notes</h2><ul>" + "".join(f"<li>{_text(n)}</li>" for n in notes) + "</ul>"
            )


def _steps_label(k: int, length: int) -> str:
    from qconvert.check.report import STEPS_OFF_CAP

    return f"{k}+" if k == STEPS_OFF_CAP and k == length - 1 else str(k)


def _sqnr_text(entry: Mapping[str, Any]) -> str:
    if not entry or entry.get("elements") is None:
        return "—"
    if entry.get("sqnr_db") is None:
        return "exact" if entry.get("mismatches") == 0 else "—"
    return f"{entry['sqnr_db']:.2f} dB"


# calibrate -----------------------------------------------------------------------------------------------
class _CalibrationPage(_Page):
    title = "qconvert calibrate"

    def build(self) -> None:
        result = self.result
        ranges: Mapping[str, Mapping[str, Any]] = result.get("ranges") or {}
        histograms: Mapping[str, Mapping[str, Any]] = result.get("histograms") or {}
        keep_float: Mapping[str, str] = result.get("keep_float") or {}
        agreement = result.get("agreement") or {}
        samples = result.get("samples") or {}
        self.sections.append(
            f"<h1>qconvert calibrate: {_text(result.get('output') or result.get('model') or '')}</h1>"
            + _table(
                ["method", "tensors", "samples used", "batches", "kept in float", "seconds"],
                [
                    [
                        _text(result.get("method")),
                        _number(len(ranges)),
                        _number(samples.get("used")),
                        _number(samples.get("batches")),
                        _number(len(keep_float)),
                        _number((result.get("seconds") or {}).get("total"), 3),
                    ]
                ],
            )
        )
        warnings = result.get("warnings") or []
        if warnings:
            self.sections.append(
                '<h2>Warnings</h2><ul class="warnings">'
                + "".join(f"<li>{_text(w)}</li>" for w in warnings)
                + "</ul>"
            )
        self._agreement(agreement)
        losses = {
            t["name"]: t for t in agreement.get("tensors") or [] if t.get("mean_relative_error") is not None
        }
        self._worst(losses)
        self._sentinel(ranges, keep_float)
        self._tensors(ranges, histograms, keep_float, losses)
        notes = result.get("notes") or []
        if notes:
            self.sections.append(
                "<h2>Notes</h2><ul>" + "".join(f"<li>{_text(n)}</li>" for n in notes) + "</ul>"
            )

    def _agreement(self, agreement: Mapping[str, Any]) -> None:
        outputs = agreement.get("outputs") or []
        if not outputs:
            return
        rows = [
            [
                _text(o.get("name")),
                _number(o.get("mean_cosine"), 6),
                _number(o.get("lowest_cosine"), 6),
                _number(o.get("max_abs_error")),
                _number(o.get("matching")),
            ]
            for o in outputs
        ]
        self.sections.append(
            f"<h2>The QDQ model against the float one ({_number(agreement.get('samples'))} samples, "
            f"onnxruntime {_text(agreement.get('level'))})</h2>"
            + _table(["output", "mean cosine", "lowest cosine", "max |error|", "matching"], rows, {1, 2, 3})
        )

    def _worst(self, losses: Mapping[str, Mapping[str, Any]]) -> None:
        import plotly.graph_objects as go

        if not losses:
            return
        worst = sorted(losses.values(), key=lambda t: -t["mean_relative_error"])[:WORST_TENSORS]
        figure = go.Figure(
            layout=_layout(
                "Activations losing most to their own Q/DQ",
                "mean relative error",
                "",
                height=120 + 22 * len(worst),
            )
        )
        figure.add_bar(
            y=[t["name"] for t in reversed(worst)],
            x=[t["mean_relative_error"] for t in reversed(worst)],
            orientation="h",
            marker_color="#ef6c00",
        )
        figure.update_layout(margin={"l": 220})
        self.sections.append("<h2>Worst tensors</h2>" + self.plot(figure))

    def _sentinel(self, ranges: Mapping[str, Mapping[str, Any]], keep_float: Mapping[str, str]) -> None:
        rows = [[_text(name), "kept in float", _text(why)] for name, why in keep_float.items()]
        rows += [
            [
                _text(name),
                "range clipped" if name not in keep_float else "kept in float",
                _text(entry["sentinel"]),
            ]
            for name, entry in ranges.items()
            if entry.get("sentinel") and name not in keep_float
        ]
        body = (
            _table(["tensor", "decision", "why"], rows)
            if rows
            else '<p class="note">No range was dominated by a mask or padding value.</p>'
        )
        self.sections.append("<h2>Sentinel decisions</h2>" + body)

    def _tensors(
        self,
        ranges: Mapping[str, Mapping[str, Any]],
        histograms: Mapping[str, Mapping[str, Any]],
        keep_float: Mapping[str, str],
        losses: Mapping[str, Mapping[str, Any]],
    ) -> None:

        def clipped(name: str) -> float:
            """The fraction of a tensor's histogram outside its chosen range."""
            histogram, entry = histograms.get(name), ranges[name]
            if not histogram or entry.get("min") is None or entry.get("max") is None:
                return 0.0
            counts, start, width = histogram["counts"], histogram["start"], histogram["width"]
            outside = sum(
                c
                for i, c in enumerate(counts)
                if start + (i + 1) * width <= entry["min"] or start + i * width >= entry["max"]
            )
            return outside / max(1, sum(counts))

        def badness(name: str) -> tuple[int, float, float]:
            loss = losses.get(name, {}).get("mean_relative_error") or 0.0
            return (0 if name in keep_float or ranges[name].get("sentinel") else 1, -loss, -clipped(name))

        ordered = sorted(ranges, key=badness)
        rows = []
        for name in ordered:
            entry = ranges[name]
            rows.append(
                [
                    _text(name),
                    _number(entry.get("min")),
                    _number(entry.get("max")),
                    _number(entry.get("scale")),
                    _number(entry.get("zero_point")),
                    _number(losses.get(name, {}).get("mean_relative_error")),
                    f"{100 * clipped(name):.3g}%" if name in histograms else "—",
                    _text(
                        "kept in float" if name in keep_float else entry.get("sentinel") or entry.get("note")
                    ),
                ]
            )
        header = [
            "tensor",
            "min",
            "max",
            "scale",
            "zero point",
            "mean rel. error",
            "outside range",
            "sentinel / note",
        ]
        if not any("scale" in entry for entry in ranges.values()):  # a result without the written scales
            header, rows = header[:3] + header[5:], [row[:3] + row[5:] for row in rows]
        parts = ["<h2>Ranges (worst first)</h2>", _table(header, rows, set(range(1, len(header) - 1)))]
        if histograms:
            parts.append(f"<h3>Histograms and chosen ranges ({len(histograms):,} tensors)</h3>")
        for index, name in enumerate(n for n in ordered if n in histograms):
            histogram, entry = histograms[name], ranges[name]
            counts, start, width = histogram["counts"], histogram["start"], histogram["width"]
            x_title = "|value|" if histogram.get("absolute") else "value"
            centres = [start + (i + 0.5) * width for i in range(len(counts))]
            figure = _bars(_layout(name, x_title, "count", height=260), centres, counts, "#546e7a", width)
            for bound, label in ((entry.get("min"), "min"), (entry.get("max"), "max")):
                if bound is not None:
                    _range_line(figure["layout"], bound, f"{label} {bound:.4g}")
            opened = " open" if index < OPEN_SECTIONS else ""
            parts.append(
                f"<details{opened}><summary>{_text(name)}: "
                f"[{_number(entry.get('min'))}, {_number(entry.get('max'))}]"
                f"</summary>{self.plot(figure, small=True)}</details>"
            )
        self.sections.append("".join(parts))


__all__ = ["render_html"]
