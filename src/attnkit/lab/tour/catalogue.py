"""The tour's catalogue: which registry entries each tour experiment exercises, and why the others are left out.

Every entry of :func:`attnkit.registry.entries` is either used by some experiment of the default
tour (:attr:`~attnkit.lab.tour.Experiment.uses`) or of the long-range suite (a roster mechanism's
:attr:`~attnkit.lab.tour.long.roster.Mechanism.uses` plus the suite model's own parts), or named in
:data:`LEFT_OUT` with the reason it is not trained; both reports show that list. A new registry
entry without either is reported by :func:`unexplained` and listed in the tour's report
(:func:`coverage_markdown`): the tour's coverage is a report of the lab, never a gate on the library.

Example:
    >>> from attnkit.lab.tour.catalogue import LEFT_OUT, unexplained, users
    >>> unexplained()
    []
    >>> "long: associative_recall/linear" in users()["linear-attention"]
    True
"""

from __future__ import annotations

__all__ = ["LEFT_OUT", "users", "unexplained", "coverage_markdown", "where_markdown"]

LEFT_OUT: dict[str, str] = {
    "segment-level": "the mask of documents packed in one sequence; no tour task packs documents",
    "co-attention-alternating": "the alternating form of co-attention (Lu et al. 2016); the tour trains the "
                                "parallel form on the question task, and one form is enough to show the idea",
    "lambda-layer": "the global lambda layer; the long suite trains the local lambda convolution (Bello 2021, "
                    "Sec. 4.3), the form the paper uses on images",
    "tiered-attention": "tiered attention over log sessions needs multi-session histories; the event-log task "
                        "has one session per sequence",
}
"""Registry name -> why no tour experiment trains it."""


def users() -> dict[str, list[str]]:
    """Registry name -> the tour experiments that use it (``"default: task/mechanism"``, ``"long: task/mechanism"``)."""
    from . import experiments
    from .long import model, suite
    from .long.roster import MECHANISMS

    found: dict[str, list[str]] = {}
    for key, exp in experiments().items():
        for name in getattr(exp, "uses", ()):  # an experiment that declares nothing uses nothing
            found.setdefault(name, []).append(f"default: {key}")
    for scale in suite.SCALES:
        for task, mech in suite.plan(scale).pairs:
            for name in (*MECHANISMS[mech].uses, *model.USES):
                label = f"long: {task}/{mech}"
                if label not in found.setdefault(name, []):
                    found[name].append(label)
    return found


def unexplained() -> list[str]:
    """The registry entries that no tour experiment uses and :data:`LEFT_OUT` does not explain."""
    from ... import registry

    used = users()
    return [e.name for e in registry.entries() if e.name not in used and e.name not in LEFT_OUT]


def coverage_markdown() -> list[str]:
    """The report's section on registry entries no experiment trains and no reason explains (none: no lines)."""
    missing = unexplained()
    if not missing:
        return []
    return ["## Registry entries the tour does not cover yet", "",
            *[f"- **{name}**: no experiment trains it and no reason is written" for name in missing], ""]


def where_markdown(shown: int = 3) -> list[str]:
    """The report's list of each registry entry with the tour experiments that train it (the first ``shown``)."""
    lines = []
    for name, labels in sorted(users().items()):
        more = f" (+{len(labels) - shown} more)" if len(labels) > shown else ""
        lines.append(f"- **{name}**: {', '.join(f'`{label}`' for label in labels[:shown])}{more}")
    return ["## Where each registry entry is trained", "", *lines, ""]
