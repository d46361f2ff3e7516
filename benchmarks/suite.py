"""The rows of the benchmark suite: one :class:`~attnkit.lab.benchmarking.rows.Spec` per measured case.

``specs(quick=False)`` is the full suite (about 15 minutes on 2 cores); ``quick``
keeps every row at small sizes for a smoke run. Every row can be reproduced with
``attnkit bench`` and the options printed by :func:`bench_command`.
"""

from __future__ import annotations

from attnkit.lab.analysis.timing import Case
from attnkit.lab.benchmarking.rows import Spec

TITLES = {
    1: "Dense, causal and padding masks against torch SDPA (target: ≤ 1.05x for L ≥ 1024, ≤ 1.3x at L = 128)",
    2: "Sliding window ±128 (target: forward ≤ 1.0x compiled FlexAttention at L = 4096; forward+backward "
       "≥ 5x faster than SDPA with the dense mask at L = 4096, ≥ 15x at L = 16384)",
    3: "Other sparse patterns (target: time proportional to the non-empty blocks; ≥ 5x faster than SDPA with "
       "the dense mask at about 10% block density)",
    4: "Custom scores and biases on the chunked kernel (target: ≥ 0.6x SDPA's unmasked throughput, faster than "
       "SDPA given the equivalent dense float bias at L = 4096, memory O(L))",
    5: "bfloat16 (target: attnkit's bf16 at least as fast as SDPA's bf16 and faster than its own float32)",
    6: "Additive (Bahdanau) attention (target: peak memory ≤ 1/4 of broadcast-then-tanh, and no slower)",
    7: "Achieved GFLOP/s against the measured matmul ceiling",
}

WINDOW = "sliding_window(128, 128)"
# Pattern text -> whether its block layout is near the 10% density the target is stated for (L = 4096).
PATTERNS = {
    "dilated(48, 4)": True,
    "causal() & strided(64)": False,  # Sparse Transformer strided, l = sqrt(L): every block holds a strided key
    "causal() & fixed(512, 32)": True,
    # Without causal (the long tour's block-sparse mechanism at L = 2048 and 4096): every key block holds a summary
    # key, so the block layout is dense, but the fixed-blocks path computes 3-5% of the scores.
    "fixed(64, 1)": True,
    "longformer(128, 64)": True,
    "bigbird(64, 3, 1, 2)": True,
    "documents(12)": True,
}
BIASES = {"alibi": ("sdpa", "sdpa-bias"), "relpos": ("sdpa", "sdpa-bias"), "softcap": ("sdpa", "eager")}
ADDITIVE_BATCH = 4  # B = 32 needs an 8 GiB hidden tensor per copy in the broadcast version


def _sizes(quick: bool):
    if quick:
        return dict(heads=2, big=512, huge=1024, mid=256, plot=(256, 512, 1024), small=128, repeats=2, budget=3.0)
    return dict(heads=8, big=4096, huge=16384, mid=1024, plot=(1024, 2048, 4096, 8192, 16384), small=128,
                repeats=5, budget=15.0)


def _dense(z) -> list[Spec]:
    out = []
    for length in (z["small"], z["mid"], z["big"]):
        goal = 1.3 if length <= 128 else 1.05
        repeats = z["repeats"] * (4 if length <= 128 else 2 if length < z["big"] else 1)
        for mask in (None, "causal()", f"padding([{length * 3 // 4}])"):
            for backward in (False, True):
                case = Case(1, z["heads"], length, head_dim=64, mask=mask, backward=backward)
                out.append(Spec(1, mask or "no mask", case, ("sdpa",), (goal,), repeats, budget_s=z["budget"]))
    return out


def _window(z) -> list[Spec]:
    big, huge = z["big"], z["huge"]
    case = lambda length, backward: Case(1, z["heads"], length, head_dim=64, mask=WINDOW, backward=backward)
    out = [Spec(2, "window ±128", case(big, False), ("flex", "sdpa-mask"), (1.0, None), z["repeats"],
                budget_s=z["budget"])]
    for length in z["plot"]:
        goal = 0.2 if length == big else 1 / 15 if length == huge else None
        compare = ("sdpa-mask", "flex") if length == big else ("sdpa-mask",)
        repeats = 2 if length == huge else z["repeats"]
        out.append(Spec(2, "window ±128", case(length, True), compare, (goal,), repeats,
                        budget_s=z["budget"] * (4 if length == huge else 1), memory=True))
    return out


# Pattern text -> the other lengths it is measured at, as fractions of the big length (the long tour's L = 2048).
SHORTER = {"fixed(64, 1)": (2,)}


def _patterns(z) -> list[Spec]:
    out = []
    for text, near_ten in PATTERNS.items():
        for length in (z["big"], *(z["big"] // part for part in SHORTER.get(text, ()))):
            for backward in (False, True):
                case = Case(1, z["heads"], length, head_dim=64, mask=text, backward=backward)
                out.append(Spec(3, text, case, ("sdpa-mask",), (0.2 if near_ten else None,), z["repeats"],
                                budget_s=z["budget"]))
    return out


def _biases(z) -> list[Spec]:
    out = []
    for name, compare in BIASES.items():
        for backward in (False, True):
            case = Case(1, z["heads"], z["big"], head_dim=64, bias=name, backward=backward)
            memory = backward and name == "alibi"
            out.append(Spec(4, name, case, compare, (1 / 0.6, 1.0), z["repeats"], budget_s=z["budget"] * 1.5,
                            memory=memory))
    for length in z["plot"][:2]:  # ALiBi memory against L (with the L = big row above)
        case = Case(1, z["heads"], length, head_dim=64, bias="alibi", backward=True)
        out.append(Spec(4, "alibi", case, ("sdpa-bias",), (), z["repeats"], budget_s=z["budget"], memory=True))
    return out


def _bf16(z) -> list[Spec]:
    out = []
    for mask, compare in ((None, ("sdpa", "fp32")), (WINDOW, ("sdpa-mask", "fp32"))):
        for backward in ((False, True) if mask is None else (True,)):
            case = Case(1, z["heads"], z["big"], head_dim=64, dtype="bfloat16", mask=mask, backward=backward)
            out.append(Spec(5, mask or "no mask", case, compare, (1.0, 1.0), z["repeats"], budget_s=z["budget"]))
    return out


def _additive(quick: bool, z) -> list[Spec]:
    batch, length, width = (2, 128, 64) if quick else (ADDITIVE_BATCH, 512, 256)
    return [Spec(6, "additive", Case(batch, 1, length, head_dim=width, backward=backward), ("additive",), (1.0,),
                 z["repeats"], budget_s=z["budget"], memory=True, mem_goal=0.25) for backward in (False, True)]


def specs(quick: bool = False) -> list[Spec]:
    """Every row of the suite, target by target."""
    z = _sizes(quick)
    return _dense(z) + _window(z) + _patterns(z) + _biases(z) + _bf16(z) + _additive(quick, z)


def bench_command(spec: Spec) -> str:
    """The ``attnkit bench`` call that reproduces a spec's row(s)."""
    c = spec.case
    parts = ["attnkit bench", f"--compare {','.join(spec.compare)}", f"--batch {c.batch}", f"--heads {c.heads}",
             f"--q-len {c.q_len}", f"--head-dim {c.head_dim}", f"--dtype {c.dtype}",
             f"--backward {'yes' if c.backward else 'no'}", f"--repeats {spec.repeats}"]
    if c.mask:
        parts.append(f'--mask "{c.mask}"')
    if c.bias:
        parts.append(f"--bias {c.bias}")
    return " ".join(parts)
