"""Per-node problems grouped for messages (qconvert/problem_groups.py)."""

from __future__ import annotations

from qconvert.problem_groups import GROUPS_SHOWN, ProblemGroup, group_problems, listing


def test_groups_by_kind_and_reason_largest_first_ties_in_model_order() -> None:
    problems = [
        ("onnx.A", "a1", "no lowering"),
        ("onnx.B", "b1", "no lowering"),
        ("onnx.C", "c1", "no lowering"),
        ("onnx.C", "c2", "no lowering"),
        ("onnx.A", "a2", "attribute x"),  # same op, another reason: a group of its own
        ("onnx.C", "c3", "no lowering"),
    ]
    groups = group_problems(problems)
    assert [(g.kind, g.reason, g.names) for g in groups] == [
        ("onnx.C", "no lowering", ("c1", "c2", "c3")),
        ("onnx.A", "no lowering", ("a1",)),
        ("onnx.B", "no lowering", ("b1",)),
        ("onnx.A", "attribute x", ("a2",)),
    ]


def test_names_text_shows_three_named_nodes_and_counts_the_rest() -> None:
    assert ProblemGroup("k", "r", ("a", "b", "c", "d", "e")).names_text() == "'a', 'b', 'c' and 2 more"
    assert ProblemGroup("k", "r", ("a", "b")).names_text() == "'a', 'b'"
    assert (
        ProblemGroup("k", "r", ("", "a", "", "b")).names_text() == "'a', 'b' and 2 more"
    )  # unnamed: counted
    assert ProblemGroup("k", "r", ("", "")).names_text() == ""


def test_listing_stops_after_the_shown_groups_and_counts_the_rest() -> None:
    problems = [
        (f"onnx.Op{i}", f"n{i}_{j}", "no lowering") for i in range(GROUPS_SHOWN + 5) for j in range(2)
    ]
    problems.append(("onnx.Big", "big", "no lowering"))
    problems += [("onnx.Big", f"big{i}", "no lowering") for i in range(9)]
    lines = listing(group_problems(problems), lambda g: f"{g.kind} x{len(g.names)}").splitlines()
    assert len(lines) == GROUPS_SHOWN + 1
    assert lines[0] == "  onnx.Big x10"
    assert lines[-1] == "  ... and 6 more kind(s) of problem, 12 node(s) in all"
