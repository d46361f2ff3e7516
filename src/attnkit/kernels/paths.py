"""The table of execution paths: every way attnkit can compute one attention call.

Each :class:`Path` is one entry: a name that says what it does, the public
``backend=`` value it belongs to, its eligibility check (``refusal(p)``: why it
cannot compute ``p`` exactly, or None), ``run(p)`` (forward, and backward through
autograd or its own ``autograd.Function`` in the same file) and ``cost(p, grad)``
(its formula, :class:`~.path_cost.PathCost`). Within a backend the paths are
listed from the most specialised to the most general: a forced backend runs the
first of its paths that accepts the call, and the last one says why the backend
cannot. ``sparse_below`` is the block density under which a block-sparse path
beats torch's kernel with a dense mask (measured; see :mod:`.dispatch`).

A new fast path is one new file (refusal, run, cost, describe) plus one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from ..functional.validate import Problem
from . import (
    band,
    bias_slabs,
    blocksparse_fused,
    blocksparse_gathered,
    blocksparse_masked,
    online_softmax,
    reference,
    sdpa,
    softcap_loop,
)
from .path_cost import PathCost
from .pipeline import KernelOutput

__all__ = ["Path", "PATHS", "BY_NAME", "of_backend", "BACKEND_NAMES"]


@dataclass(frozen=True)
class Path:
    """One execution path: ``name``, ``backend``, one line on what it does, and its module's functions."""

    name: str
    backend: str
    summary: str
    module: ModuleType
    sparse_below: float | None = None  # block-sparse paths: the density under which auto prefers them

    def refusal(self, p: Problem) -> str | None:
        return self.module.refusal(p)

    def run(self, p: Problem) -> KernelOutput:
        return self.module.run(p)

    def cost(self, p: Problem, grad: bool = False) -> PathCost:
        return self.module.cost(p, grad)

    @property
    def source(self) -> str:
        """The file that holds this path's code, as ``kernels/<module>.py``."""
        return f"kernels/{self.module.__name__.rsplit('.', 1)[-1]}.py"

    def density(self, p: Problem) -> float:
        """Fraction of the ``Lq x Lk`` scores a block-sparse path computes (what ``sparse_below`` bounds)."""
        return self.module.density(p)

    def describe(self, p: Problem) -> str:
        """What this path does on ``p`` (the module's own words where it has them)."""
        describe: Callable | None = getattr(self.module, "describe", None)
        return describe(p) if describe is not None else self.summary


PATHS: tuple[Path, ...] = (
    Path("torch-sdpa", "sdpa", "torch's fused attention kernel, where it is exact", sdpa),
    Path("band-windows", "blocksparse", "each query block reads one contiguous key window in place", band,
         sparse_below=0.7),
    Path("blocksparse-fused", "blocksparse", "gathered key blocks, one fused torch kernel call per slab",
         blocksparse_fused, sparse_below=0.7),
    Path("blocksparse-masked", "blocksparse", "gathered key blocks, mask only in partial blocks, backward by hand",
         blocksparse_masked, sparse_below=0.5),
    Path("blocksparse-gathered", "blocksparse", "gathered key blocks, any score/bias/normaliser, autograd",
         blocksparse_gathered, sparse_below=0.5),
    Path("bias-slabs", "chunked", "an additive bias on torch's fused kernel, one slab of query rows at a time",
         bias_slabs),
    Path("softcap-loop", "chunked", "soft-capped scores with a fixed shift instead of a running max", softcap_loop),
    Path("online-softmax", "chunked", "online softmax over key blocks, any score, bias and mask", online_softmax),
    Path("dense-reference", "reference", "dense scores, every option, weights on request", reference),
)
# Measured at L = 4096, 1 thread, "causal() & strided(64)" (density 0.52): the fused slab path takes
# 0.60-0.65x of SDPA's time with the dense mask (forward, forward+backward), the masked path 0.88x (forward).

BY_NAME = {path.name: path for path in PATHS}
BACKEND_NAMES = ("sdpa", "blocksparse", "chunked", "reference")


def of_backend(backend: str) -> tuple[Path, ...]:
    """The paths of one public backend, most specialised first."""
    return tuple(path for path in PATHS if path.backend == backend)
