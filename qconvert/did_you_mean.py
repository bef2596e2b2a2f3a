""" "Did you mean ...?" for a value that is not one of its choices (`--method entropi` -> entropy)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(value: str, choices: Iterable[str]) -> str | None:
    """The choice nearest to `value` in spelling (a typo, a dropped letter, another case), or None."""
    allowed = [str(choice) for choice in choices]
    lowered = {choice.lower(): choice for choice in allowed}
    if value.lower() in lowered:  # `Entropy`: a case away
        return lowered[value.lower()]
    prefixed = [choice for choice in allowed if value and choice.startswith(value)]
    if len(prefixed) == 1:  # `stablehl`, `int`: the one choice it begins
        return prefixed[0]
    matches = difflib.get_close_matches(value, allowed, n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """`; did you mean 'entropy'?` when a choice is near `value`, else the empty string (for a message)."""
    match = closest(value, choices)
    return f"; did you mean '{match}'?" if match is not None and match != value else ""
