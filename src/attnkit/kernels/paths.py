"""The table of execution paths: every way attnkit can compute one attention call.

Each :class:`Path` is one row: a name that says what it does, the public
``backend=`` value it belongs to, the device types it serves (``devices``: None for
every device torch runs on; the CPU-tuned paths serve the CPU only, compiled
FlexAttention CUDA only), and the functions of its module: the rules it
checks (``refusals``, from :mod:`.rules`, in order: why it cannot compute a problem
exactly), ``run(p)`` (forward, and backward through autograd or its own
``autograd.Function``), ``cost(p, grad)`` (its formula, :class:`~.path_cost.PathCost`),
and where it has them ``describe``, ``density`` (block-sparse rows: the fraction of
scores computed, under ``sparse_below`` the dispatcher prefers it) and the forward
and backward the compiled operator calls (``op_forward(p) -> (out, saved) | None``,
``op_backward(p, out, saved, dout) -> (dq, dk, dv)``; :mod:`.custom_op`). Within a
backend the rows go from the most specialised to the most general: a forced backend
runs the first that accepts the call, and the last one says why none can. The device
column is checked before a path's own rules (:func:`.rules.serves`), so a row refused
for its device says so first.

The dispatcher (:mod:`.dispatch`) and the compiled operator read this one table.
A new path is one new file (``REFUSALS``, ``run``, ``cost``, ...) plus one row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from . import (
    band,
    bias_slabs,
    blocksparse_fused,
    blocksparse_gathered,
    blocksparse_masked,
    fixed_blocks,
    flex,
    online_softmax,
    paged,
    reference,
    rules,
    sdpa,
    softcap_loop,
)

__all__ = ["Path", "PATHS", "BY_NAME", "INDEX", "OF_BACKEND", "of_backend", "BACKEND_NAMES", "BACKENDS"]


@dataclass(frozen=True, eq=False)
class Path:
    """One execution path: its name and backend, one line on what it does, its module and the rules it checks.

    The dispatcher calls the module's functions (``path.module.run(p)``), so a test may
    replace one on the module.
    """

    name: str
    backend: str
    summary: str
    module: ModuleType
    sparse_below: float | None = None  # block-sparse paths: the density under which auto prefers them
    devices: tuple[str, ...] | None = None  # the device types it serves; None: every device

    def __post_init__(self):  # the device rule, made once (the dispatcher asks it in every call)
        object.__setattr__(self, "device_rule", rules.serves(self.devices))

    @property
    def refusals(self) -> tuple:
        return self.module.REFUSALS

    @property
    def source(self) -> str:
        """The file that holds this path's code, as ``kernels/<module>.py``."""
        return f"kernels/{self.module.__name__.rsplit('.', 1)[-1]}.py"

    def refusal(self, p, data: bool = True) -> str | None:
        """Why this path cannot compute ``p`` exactly (None: it can); ``data=False`` skips the rules reading data.

        The device column first (:func:`.rules.serves`), then the module's rules in order."""
        return rules.first_refusal(p, self.module.REFUSALS, data, self.device_rule)

    def serves(self, device_type: str) -> bool:
        """Whether this path runs on tensors of ``device_type``."""
        return self.devices is None or device_type in self.devices

    def describe(self, p) -> str:
        """What this path does on ``p`` (the module's own words where it has them)."""
        describe = getattr(self.module, "describe", None)
        return describe(p) if describe is not None else self.summary


def _row(name: str, backend: str, summary: str, module: ModuleType, sparse_below: float | None = None,
         devices: tuple[str, ...] | None = None) -> Path:
    return Path(name, backend, summary, module, sparse_below, devices)


CPU = ("cpu",)  # the paths tuned for the CPU (slab sizes, torch's fused CPU kernel)

PATHS: tuple[Path, ...] = (
    _row("torch-sdpa", "sdpa", "torch's fused attention kernel, where it is exact", sdpa),
    _row("paged-split-kv", "blocksparse", "a paged KV cache's pages read through the page table, split-KV", paged,
         sparse_below=1.5),
    _row("flex", "flex", "torch's FlexAttention, compiled, with a block mask and score_mod from the call", flex,
         devices=("cuda",)),
    _row("band-windows", "blocksparse", "each query block reads one contiguous key window in place", band,
         sparse_below=0.7, devices=CPU),
    _row("fixed-blocks", "blocksparse", "fixed(b, c), alone or with causal(): blocks and summary keys, merged by lse",
         fixed_blocks, sparse_below=0.7, devices=CPU),
    _row("blocksparse-fused", "blocksparse", "gathered key blocks, one fused torch kernel call per slab",
         blocksparse_fused, sparse_below=0.7, devices=CPU),
    _row("blocksparse-masked", "blocksparse", "gathered key blocks, mask only in partial blocks, backward by hand",
         blocksparse_masked, sparse_below=0.5, devices=CPU),
    _row("blocksparse-gathered", "blocksparse", "gathered key blocks, any score/bias/normaliser, autograd",
         blocksparse_gathered, sparse_below=0.5),
    _row("bias-slabs", "chunked", "an additive bias on torch's fused kernel, one slab of query rows at a time",
         bias_slabs, devices=CPU),
    _row("softcap-loop", "chunked", "soft-capped scores with a fixed shift instead of a running max", softcap_loop),
    _row("online-softmax", "chunked", "online softmax over key blocks, any score, bias and mask", online_softmax),
    _row("dense-reference", "reference", "dense scores, every option, weights on request", reference),
)
# Measured at L = 4096, 1 thread, "causal() & strided(64)" (density 0.52): the fused slab path takes
# 0.60-0.65x of SDPA's time with the dense mask (forward, forward+backward), the masked path 0.88x (forward).
# Devices: torch-sdpa runs torch's public kernels wherever torch has them; flex is the structured path on CUDA
# (FlexAttention's CPU backward raises, and its CPU forward is slower than the CPU paths below); the gathered
# block path and the chunked paths in plain torch serve every device (MPS, and any call flex refuses).

BY_NAME = {path.name: path for path in PATHS}
INDEX = {path.name: i for i, path in enumerate(PATHS)}  # a path's position: what the compiled operator records
BACKEND_NAMES = tuple(dict.fromkeys(path.backend for path in PATHS))
BACKENDS = ("auto", *BACKEND_NAMES)  # the values of attention(..., backend=): the one list of them
OF_BACKEND = {name: tuple(path for path in PATHS if path.backend == name) for name in BACKEND_NAMES}


def of_backend(backend: str) -> tuple[Path, ...]:
    """The paths of one public backend, most specialised first."""
    return OF_BACKEND[backend]
