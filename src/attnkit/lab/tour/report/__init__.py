"""The tour's report, written from the cached run JSONs: ``out/README.md`` and ``out/index.html``.

The table (task x mechanism: accuracy mean ± sample standard deviation over seeds,
mean training time, mean peak memory, parameters) comes from :func:`summarize`, and
:func:`markdown_table` returns it as Markdown for the project's README. Runs that
failed are counted and listed with their error; nothing here trains or measures.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..store import load_manifest, load_records
from .pieces import cell, md_table

__all__ = ["Row", "Report", "load", "load_manifest", "load_records", "summarize", "markdown_table", "write",
           "TASK_PURPOSE", "cell", "fmt_accuracy", "fmt_rate"]

TASK_PURPOSE = {
    "parity": "state tracking: the parity of the bits so far, trained on length 40 and tested up to 256 "
              "(Grazzi et al. 2025)",
    "modular_count": "state tracking: the number of ones so far modulo 3, trained short and tested long",
    "word_problem_s3": "state tracking: the running product of permutations in S3 (a solvable group), trained "
                       "short, tested long",
    "word_problem_a5": "state tracking: the running product in A5 (a simple group: NC1-complete, Merrill et al. 2024)",
    "mqar_variants": "attention's normalisers, scores, modifiers, masks and controls on MQAR, each against its "
                     "paper's claim (most: 'matches softmax', within 10 points)",
    "lag_copy": "length extrapolation: copy the previous token, trained at length 32 and scored at 33-128 "
                "(Press et al. 2022's test, in small)",
    "recurrent_recall": "recent recurrences (lightning, RWKV-4, Comba, log-linear) on MQAR at width 16 against "
                        "softmax, Mamba-2 and Gated DeltaNet",
    "delta_products": "state tracking in S3: DeltaProduct's two reflections per token against DeltaNet's one, "
                      "and RWKV-7 (Siems et al. 2025)",
    "in_context_recall": "MAD in-context recall: the value of a key seen before (Poli et al. 2024)",
    "fuzzy_recall": "MAD fuzzy recall: keys and values of 1-3 tokens",
    "noisy_recall": "MAD noisy recall: in-context recall among noise tokens",
    "mad_selective_copy": "MAD selective copying: 16 tokens among 240 of noise",
    "compression": "MAD compression: reproduce any token of a sequence from its position alone",
    "memorization": "MAD memorization: one fixed key-value map, learned into the weights",
    "mqar": "in-context recall: find the value bound to a queried key earlier in the sequence (Zoology)",
    "selective_copy": "content-based selection: copy the data tokens scattered in noise, in order",
    "listops": "hierarchical reasoning: evaluate nested MIN/MAX/MED/SUM_MOD expressions (LRA ListOps)",
    "sorting": "pointing: output the input positions in sorted order (Pointer Networks)",
    "convex_hull": "pointing with geometry: the convex hull of planar points, counter-clockwise",
    "dates": "alignment: normalise dates written in many formats to ISO (seq2seq with attention)",
    "reversal": "alignment: reverse a string (a monotone anti-diagonal alignment)",
    "han_documents": "hierarchical attention: the label is decided by one sentence; attention should find it",
    "event_logs": "explaining anomalies: next-event prediction whose attention points at the anomalous event "
                  "(the pair is kept for its maps: an LSTM carries the user's role through these short sessions, "
                  "so derived-key attention cannot add detection accuracy here)",
    "key_summaries": "repetition: summaries listing a document's key words once; the repeated words of the "
                     "decoded summaries are measured with and without coverage (See et al. 2017)",
    "deciding_position": "hard attention: one marked position decides the label; REINFORCE against backpropagation",
    "repeated_block": "memory: the next token is 6 back, inside a memory of the last 8 states (Yogatama et al. 2018)",
    "document_questions": "question-guided attention: find the segment the question asks about (Lu et al. 2016)",
    "shapes": "vision: classify small generated shapes from image patches (ViT)",
    "digits": "vision: classify sklearn's 8x8 digits from image patches (ViT)",
}


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1); the deviation is None for a single value."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


@dataclass
class Row:
    """One (task, mechanism) line of the table, aggregated over seeds."""

    key: str
    task: str
    mechanism: str
    seeds_ok: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    accuracy: tuple[float, float | None] | None = None
    train_seconds: float | None = None
    peak_bytes: float | None = None
    parameters: int | None = None
    extra: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    lr_scale: float = 1.0  # the factor of the experiment's learning rate its runs trained at
    lr: float | None = None  # that learning rate, when the runs recorded it
    lr_swept: list[float] = field(default_factory=list)  # the factors a sweep tried (empty: no sweep)


def _finite(values) -> list[float]:
    out = []
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def summarize(records: list[dict]) -> list[Row]:
    """One :class:`Row` per experiment key, in the records' order."""
    rows: dict[str, Row] = {}
    oks: dict[str, list[dict]] = {}
    for rec in records:
        row = rows.setdefault(rec["key"], Row(rec["key"], rec["task"], rec["mechanism"],
                                              lr_scale=float(rec.get("lr_scale", 1.0)), lr=rec.get("lr"),
                                              lr_swept=list(rec.get("lr_swept") or [])))
        if rec["status"] == "ok":
            row.seeds_ok.append(rec["seed"])
            oks.setdefault(rec["key"], []).append(rec["result"])
        else:
            row.failed[rec["seed"]] = rec.get("error") or "failed"
    for key, results in oks.items():
        row = rows[key]
        acc = _finite(r.get("accuracy") for r in results)
        row.accuracy = _mean_std(acc) if acc else None
        times = _finite(r.get("train_seconds") for r in results)
        row.train_seconds = statistics.fmean(times) if times else None
        peaks = _finite(r.get("peak_bytes") for r in results)
        row.peak_bytes = statistics.fmean(peaks) if peaks else None
        params = _finite(r.get("parameters") for r in results)
        row.parameters = int(params[0]) if params else None
        names = dict.fromkeys(n for r in results for n in (r.get("extra") or {}))
        for name in names:
            vals = _finite((r.get("extra") or {}).get(name) for r in results)
            if vals:
                row.extra[name] = _mean_std(vals)
    return list(rows.values())


def fmt_accuracy(row: Row) -> str:
    """Accuracy in percent, ``mean ± std`` (std over seeds, n - 1), or "failed"."""
    if row.accuracy is None:
        return "failed" if row.failed else "n/a"
    mean, std = row.accuracy
    return f"{100 * mean:.1f}" + ("" if std is None else f" ± {100 * std:.1f}")


def fmt_rate(row: Row) -> str:
    """The learning rate a swept row's runs trained at, as ``<lr> (x<factor>)``; ``""`` without a sweep.

    Example:
        >>> fmt_rate(Row("t/m", "t", "m", lr_scale=3.0, lr=0.009, lr_swept=[1 / 3, 1.0, 3.0]))
        '0.009 (x3 of 0.333, 1, 3)'
    """
    if not row.lr_swept:
        return ""
    lr = "" if row.lr is None else f"{row.lr:.2g} "
    return f"{lr}(x{row.lr_scale:.3g} of {', '.join(f'{f:.3g}' for f in row.lr_swept)})"


def fmt_seeds(row: Row) -> str:
    text = str(len(row.seeds_ok))
    return text + (f" ({len(row.failed)} failed)" if row.failed else "")


def table_rows(rows: list[Row]) -> list[list[str]]:
    """The table as strings: header first; after a learning-rate sweep, the best rate of each row too."""
    swept = any(r.lr_swept for r in rows)
    out = [["task", "mechanism", "accuracy % (mean ± std)", *(["best learning rate"] if swept else []), "seeds",
            "train time s", "peak memory MiB", "parameters"]]
    for r in rows:
        out.append([r.task, r.mechanism, fmt_accuracy(r), *([fmt_rate(r) or "-"] if swept else []), fmt_seeds(r),
                    "-" if r.train_seconds is None else f"{r.train_seconds:.1f}",
                    "-" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.1f}",
                    "-" if r.parameters is None else f"{r.parameters:,}"])
    return out


def markdown_table(out_or_rows) -> str:
    """The results table as Markdown, from a report folder or from :func:`summarize`'s rows.

    Example:
        >>> from attnkit.lab.tour.report import markdown_table, summarize
        >>> recs = [{"key": "mqar/softmax", "task": "mqar", "mechanism": "softmax", "seed": s, "status": "ok",
        ...          "result": {"accuracy": a, "train_seconds": 2.0, "peak_bytes": 2**20, "parameters": 900}}
        ...         for s, a in [(0, 0.9), (1, 1.0)]]
        >>> print(markdown_table(summarize(recs)).splitlines()[-1])
        | mqar | softmax | 95.0 ± 7.1 | 2 | 2.0 | 1.0 | 900 |
    """
    rows = out_or_rows if isinstance(out_or_rows, list) else summarize(load_records(out_or_rows))
    return "\n".join(md_table(table_rows(rows)))


@dataclass
class Report:
    """Everything a report page shows, loaded once from the folder."""

    out: Path
    manifest: dict | None
    records: list[dict]
    rows: list[Row]
    costs: list[dict]
    scaling: dict | None


def load(out) -> Report:
    """The :class:`Report` of a tour folder (cached runs of its last invocation, cost table, scaling data)."""
    from .scaling import cost_entries, load_scaling

    out = Path(out)
    manifest = load_manifest(out)
    records = load_records(out, manifest)
    rows = summarize(records)
    return Report(out, manifest, records, rows, cost_entries(rows, records), load_scaling(out, manifest))


def write(out) -> tuple[Path, Path]:
    """Write ``out/README.md`` and ``out/index.html`` from the cached runs; returns both paths."""
    from .html import write_html
    from .markdown import write_markdown

    rep = load(out)
    return write_markdown(rep), write_html(rep)
