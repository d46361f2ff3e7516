"""The tour report's section on the registry-entry experiments' claims (:mod:`attnkit.lab.tour.experiments.claims`).

For each of :mod:`~attnkit.lab.tour.experiments.variants`, :mod:`~attnkit.lab.tour.experiments.positions` and
:mod:`~attnkit.lab.tour.experiments.recurrences` that ran: its claims, each with its verdict by Welch's t over
seeds (:func:`~attnkit.lab.tour.experiments.claims.decide`) and the interval behind it. Nothing here trains.
"""

from __future__ import annotations

from ..experiments import positions, recurrences, variants
from ..experiments.claims import Claim, decide
from . import Report

__all__ = ["CLAIMS", "accuracies", "claim_lines", "claims_markdown", "claims_html"]

CLAIMS: tuple[Claim, ...] = (*variants.CLAIMS, *positions.CLAIMS, *recurrences.CLAIMS)
"""Every claim this section decides, in tour order."""


def accuracies(rep: Report) -> dict[str, dict[str, list[float]]]:
    """``task -> mechanism -> [test accuracy per finished seed]`` of the runs in the report."""
    out: dict[str, dict[str, list[float]]] = {}
    for rec in rep.records:
        if rec["status"] == "ok":
            out.setdefault(rec["task"], {}).setdefault(rec["mechanism"], []).append(float(rec["result"]["accuracy"]))
    return out


def claim_lines(rep: Report) -> list[tuple[Claim, str, str]]:
    """``(claim, verdict, detail)`` of every claim whose task has runs in the report."""
    runs = accuracies(rep)
    return [(c, *decide(c, runs[c.task])) for c in CLAIMS if c.task in runs]


def claims_markdown(rep: Report) -> list[str]:
    """The section as Markdown lines (none when no claim's task ran)."""
    lines = claim_lines(rep)
    if not lines:
        return []
    out = ["## Claims of the registry-entry experiments", ""]
    for claim, result, detail in lines:
        out += [f"- `{claim.task}`: {claim.statement} ({claim.source}): **{result}**. {detail}."]
    return [*out, ""]


def claims_html(rep: Report) -> list[str]:
    """The section as HTML parts (none when no claim's task ran)."""
    import html

    lines = claim_lines(rep)
    if not lines:
        return []
    items = [f"<li><code>{html.escape(c.task)}</code>: {html.escape(c.statement)} ({html.escape(c.source)}): "
             f"<b>{html.escape(result)}</b>. {html.escape(detail)}.</li>" for c, result, detail in lines]
    return ["<h2>Claims of the registry-entry experiments</h2>", "<ul>", *items, "</ul>"]
