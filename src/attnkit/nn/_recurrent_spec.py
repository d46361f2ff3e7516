"""The cost spec of the linear-recurrent layers: matmul FLOPs in each form and the decoding state.

FLOPs are the matrix products of one pass as ``torch.utils.flop_counter.FlopCounterMode`` counts
them (the tests assert equality, forward and backward): every ``nn.Linear`` once per token, the
depthwise short convolution (``2 K`` per channel and token), and the recurrence, per sequence and
value head with ``L`` tokens, widths ``Dk, Dv``, blocks of ``c`` tokens (``C = ceil(L / c)``, the
last one padded) and ``r = 1`` with the delta rule::

    parallel    2 L^2 Dk (1 + r) + 2 L^2 Dv + r 2 L^2 (Dk + Dv) + 2 L Dk Dv (2 + r)    (one block of L tokens)
    chunk       C (2 c^2 Dk (1 + r) + 2 c^2 Dv + r 2 c^2 (Dk + Dv) + 2 c Dk Dv (2 + r))
    recurrent   2 L Dk Dv (1 + r)

where ``r 2 c^2 (Dk + Dv)`` are the delta rule's ``U`` and ``W``, products with the block inverse
``(I + T)^-1`` (blocks of at most ``Dk + Dv`` tokens; a longer block solves for them: no product). With
a decay per key channel (GLA, KDA, RWKV-7) each decay-masked ``c x c`` product over ``Dk`` is split into
products of blocks (:func:`count_masked_products`): ``Dk s (s - 1)`` with ``s`` the block length rounded
up to a power of two, in place of ``2 c^2 Dk``.

The log-linear layers (``state_levels`` G) count :func:`count_log_linear` instead: each block reads
and carries every one of the G bucket states, and their decoding state is G times the recurrence's.

The backward costs each product once more per operand that needs a gradient: the state a layer
starts from (zeros) needs none, and nothing is differentiated through its final state (a layer
without a cache discards it). The delta rule's triangular solve (against the identity for the block
inverse) is counted by no counter forward; its backward adds one product, ``2 c^3`` per block (``2 c^2 (Dk +
Dv)`` for a long block's direct solve). Decays and gates are
elementwise. The decoding state is the recurrence's ``H Dk Dv`` numbers (float32, float64 for
float64 layers), the convolution's last ``K - 1`` inputs per channel and a token shift's last input
(``token_shift`` features), whatever the context.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..costing.spec import Spec
from ..costing.tally import Tally, dtype_of, randn
from ..functional.recurrences.forms import FORMS, check_form
from ..functional.recurrences.local import inverts

__all__ = ["RECURRENT_SIZES", "RECURRENT_FORMULA", "LOG_LINEAR_FORMULA", "recurrent_spec", "count_recurrence",
           "count_log_linear", "count_masked_products", "count_ut_transform"]

RECURRENT_SIZES = {"batch": 2, "length": 16, "dim": 32, "dtype": "float32", "form": "chunk"}
RECURRENT_FORMULA = ("projections 2 B L (sum of in x out); convolution 2 B L channels K; recurrence per head: "
                     "parallel 2 L^2 (Dk (1 + r) + Dv) + r 2 L^2 (Dk + Dv) + 2 L Dk Dv (2 + r), chunk C times "
                     "that at L = c, recurrent 2 L Dk Dv (1 + r) (r = 1 with the delta rule; a decay per channel: "
                     "each c x c product over Dk costs Dk s (s - 1), s = c rounded up to a power of two)")
LOG_LINEAR_FORMULA = ("projections 2 B L (sum of in x out); convolution 2 B L channels K; per head with G bucket "
                      "states: chunk C (2 c^2 (Dk + Dv) + 4 c G Dk Dv (1 + r) + r (4 c^3 + 8 c^2 Dk)), parallel "
                      "that at c = L, C = 1; recurrent 2 L G Dk Dv (1 + r) (r = 1 with the delta rule)")


def count_masked_products(t: Tally, term: str, batch: int, c: int, dk: int, *, per_channel: bool,
                          grads: int = 2) -> None:
    """``batch`` decay-masked ``c x c`` products over ``dk`` channels: one matrix product with a decay per head;
    with a decay per channel (:func:`attnkit.functional.recurrences.local.split_decayed_products`) ``c`` padded
    to a power of two ``s`` and, level by level, ``s / 2m`` products of ``m x m`` for ``m = 1, 2, .., s / 2``."""
    if not per_channel:
        t.mm(term, batch, c, dk, c, grads=grads)
        return
    size, m = 1 << max(0, (c - 1).bit_length()), 1
    while m < size:
        t.mm(term, batch * (size // (2 * m)), m, dk, m, grads=grads)
        m *= 2


def count_ut_transform(t: Tally, batch: int, c: int, dk: int, dv: int, *, value_grads: int = 2) -> None:
    """The delta rule's block inverse ``(I + T)^-1`` (a triangular solve against the identity, which no counter
    counts forward; its backward forms one ``c x c x c`` product) and ``U``, ``W`` as two products with it
    (``value_grads`` 1: the values are a constant, the log-linear blocks' identity); a block longer than
    ``Dk + Dv`` (:func:`~attnkit.functional.recurrences.local.inverts`) solves for U and W directly instead."""
    if not inverts(c, dk, dv):  # a long block solves for U and W directly: only the solve's backward product
        t.fused("delta rule: the triangular solve's backward product", 0, 2 * batch * c * c * (dk + dv))
        return
    if t.backward:
        t.fused("delta rule: the block inverse's backward product", 0, 2 * batch * c * c * c)
    t.mm("delta rule: U = (I + T)^-1 diag(beta) V", batch, c, c, dv, grads=value_grads)
    t.mm("delta rule: W = (I + T)^-1 diag(beta) P^", batch, c, c, dk)


def count_recurrence(t: Tally, form: str, heads: int, n: int, dk: int, dv: int, *, chunk: int, delta: bool,
                     learned_decay: bool = True, query_grad: bool = True, per_channel: bool = False) -> None:
    """The products of :func:`attnkit.functional.recurrences.forms.linear_recurrence` over ``heads`` (batch x value
    heads) sequences of ``n`` tokens, entered from a zero state, the final state unused.

    ``learned_decay``: the log decays need a gradient (learned or input-dependent gates), so the
    first step's decayed state does too (the recurrent form's first ``k^T S``). ``query_grad``: the queries
    need a gradient (False for a constant query, RWKV's sums: the products with them differentiate one operand;
    the decayed queries ``Q^`` still need one under learned decays). ``per_channel``: a decay per key channel
    (:func:`count_masked_products`).
    """
    q = int(query_grad)
    if n == 0:
        return
    if form == "recurrent":
        if delta:
            t.mm("delta rule: k^T S per token", heads, 1, dk, dv, grads=1 + learned_decay)
            t.mm("delta rule: k^T S per token", heads * (n - 1), 1, dk, dv)
        t.mm("output q^T S per token", heads * n, 1, dk, dv, grads=1 + q)
        return
    c, blocks = (n, 1) if form == "parallel" else (chunk, -(-n // chunk))
    # with a decay per channel both factors carry decays, so a learned decay differentiates the query's side too
    count_masked_products(t, "block scores q k^T (decay-masked)", heads * blocks, c, dk, per_channel=per_channel,
                          grads=1 + (q or (per_channel and learned_decay)))
    if delta:
        count_masked_products(t, "delta rule: block k k^T", heads * blocks, c, dk, per_channel=per_channel)
        count_ut_transform(t, heads * blocks, c, dk, dv)
        t.mm("delta rule: values written U - W S", heads, c, dk, dv, grads=1)  # the first block reads S = 0
        t.mm("delta rule: values written U - W S", heads * (blocks - 1), c, dk, dv)
        t.mm("state passed on K~^T (U - W S)", heads * (blocks - 1), dk, c, dv)
        t.mm("state passed on K~^T (U - W S)", heads, dk, c, dv, grads=0)  # the last block's: the final state
    else:
        t.mm("state passed on K~^T U", heads * blocks, dk, c, dv, grads=2 if blocks > 1 else 0)
    t.mm("output from the entering state Q^ S", heads * blocks, c, dk, dv, grads=(blocks > 1) + (q or learned_decay))
    t.mm("output within blocks A U", heads * blocks, c, c, dv)
    t.inter(heads * blocks * c * c * (1 + delta), heads * blocks * dk * dv)


def count_log_linear(t: Tally, form: str, heads: int, n: int, dk: int, dv: int, *, levels: int, chunk: int,
                     delta: bool) -> None:
    """The products of :func:`attnkit.functional.recurrences.log_linear_attention` over ``heads`` (batch x value
    heads) sequences of ``n`` tokens with ``levels`` (G) bucket states, entered from zero states, the final
    states unused: per block of ``c`` tokens the masked matrix (with the delta rule, the block's matrix
    ``A (I + T)^-1 diag(beta)``), then each bucket read and carried (G products of ``c x Dk x Dv``)."""
    g = levels
    if n == 0:
        return
    if form == "recurrent":
        if delta:
            t.mm("delta rule: k^T S per bucket and token", heads * g, 1, dk, dv, grads=1)  # the first reads zeros
            t.mm("delta rule: k^T S per bucket and token", heads * g * (n - 1), 1, dk, dv)
        t.mm("output q^T S per bucket and token", heads * g * n, 1, dk, dv)
        return
    c, blocks = (n, 1) if form == "parallel" else (chunk, -(-n // chunk))
    t.mm("block scores q k^T (decay-masked)", heads * blocks, c, dk, c)
    if delta:
        t.mm("delta rule: block k k^T", heads * blocks, c, dk, c)
        count_ut_transform(t, heads * blocks, c, dk, c, value_grads=1)  # U = (I + T)^-1 diag(beta) itself
        t.mm("delta rule: the block's matrix A (I + T)^-1 diag(beta)", heads * blocks, c, c, c)
        t.mm("delta rule: the entering state's read Q^ - A W", heads * blocks, c, c, dk)
        t.mm("delta rule: what each token leaves K~^T (I + T)^-1 diag(beta)", heads * blocks, dk, c, c,
             grads=0 if blocks == 1 else 2)  # one block: they make only the final states
    t.mm("output within blocks (P * M^H) V", heads * blocks, c, c, dv)
    t.mm("output from the entering buckets", heads * g, c, dk, dv, grads=1)  # the first block reads zeros
    t.mm("output from the entering buckets", heads * g * (blocks - 1), c, dk, dv)
    last = 0 if blocks == 1 else 2  # the last block's carry makes the final states: no gradient
    if delta:
        t.mm("delta rule: buckets carried W S", heads * g, c, dk, dv, grads=min(last, 1))
        t.mm("delta rule: buckets carried W S", heads * g * max(blocks - 2, 0), c, dk, dv)
        t.mm("delta rule: buckets carried W S", heads * g * (blocks > 1), c, dk, dv, grads=0)
        t.mm("delta rule: buckets carried K~^T (W S)", heads * g * (blocks - 1), dk, c, dv)
        t.mm("delta rule: buckets carried K~^T (W S)", heads * g, dk, c, dv, grads=0)
    t.mm("written by level (K~^T * levels) V", heads * g * (blocks - 1), dk, c, dv)
    t.mm("written by level (K~^T * levels) V", heads * g, dk, c, dv, grads=0)
    t.inter(heads * blocks * c * c * (1 + delta), heads * blocks * g * dk * dv)


def _count_layer(t: Tally, s, layer, form: str) -> None:
    b, n = s["batch"], s["length"]
    linears = [(name, m) for name, m in layer.named_modules() if isinstance(m, nn.Linear)]
    for _, m in linears:
        t.mm(f"projections ({', '.join(name for name, _ in linears)})", 1, b * n, m.in_features, m.out_features)
        t.inter(b * n * m.out_features)
    conv = getattr(layer, "conv1d", None)
    if conv is not None:
        channels, taps = conv.weight.shape[0], conv.weight.shape[-1]
        t.conv("short convolution (depthwise)", b, 1, channels, n, taps)
        t.inter(b * n * channels)
    heads, dk, dv = layer.core_sizes
    if getattr(layer, "state_levels", None) is not None:  # log-linear: G bucket states
        count_log_linear(t, form, b * heads, n, dk, dv, levels=layer.state_levels, chunk=layer.chunk_size,
                         delta=layer.delta_rule)
        t.ew("decays, gates and norms (estimate)", b * n * heads * (dk + dv), 5)
        t.io(2 * b * n * s["dim"], sum(p.numel() for p in layer.parameters()))
        return
    # a correction read before the decay (RWKV-7) reads the first state undecayed: no gradient through it
    learned = layer.learned_decay and not getattr(layer, "reads_before_decay", False)
    count_recurrence(t, form, b * heads, n * layer.steps_per_token, dk, dv, chunk=layer.chunk_size,
                     delta=layer.delta_rule, learned_decay=learned,
                     query_grad=not getattr(layer, "constant_query", False), per_channel=layer.per_channel_decay)
    t.ew("decays, gates and norms (estimate)", b * n * heads * (dk + dv), 5)
    t.io(2 * b * n * s["dim"], sum(p.numel() for p in layer.parameters()))


def _count(make, t: Tally, s, module=None) -> None:
    layer = module if module is not None else make(s)
    check_form("cost", s["form"], layer.chunk_size)
    for form in FORMS:
        each = Tally(backward=t.backward, itemsize=t.itemsize)
        _count_layer(each, s, layer, form)
        t.forms[form] = sum(each.terms.values())
    _count_layer(t, s, layer, s["form"])
    heads, dk, dv = layer.core_sizes
    dtype = dtype_of(s)
    conv = getattr(layer, "conv1d", None)
    context = 0 if conv is None else conv.weight.shape[0] * (conv.weight.shape[-1] - 1) * dtype.itemsize
    context += getattr(layer, "token_shift", 0) * dtype.itemsize  # inputs a token shift keeps (RWKV: the last x)
    levels = getattr(layer, "state_levels", 1)  # log-linear layers keep one state per bucket level
    t.decoding(fixed=levels * heads * dk * dv * torch.promote_types(dtype, torch.float32).itemsize + context)


def _inputs(s, module):
    return functools.partial(module, form=s["form"]), (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)


def _config(options, sizes: dict, layer) -> dict:
    """What a layer says of its sizes: ``dim``, ``chunk_size`` and, where the spec has them, ``heads`` and
    ``conv_size``, with ``options(layer)``."""
    shared = {"dim": layer.dim, "chunk_size": layer.chunk_size}
    if "heads" in sizes:
        shared["heads"] = layer.num_heads
    if "conv_size" in sizes:
        shared["conv_size"] = layer.conv1d.weight.shape[-1]
    return {**shared, **options(layer)}


def recurrent_spec(module_type: type, make, sizes: dict, options=lambda layer: {},
                   formula: str = RECURRENT_FORMULA) -> Spec:
    """The spec of a linear-recurrent layer: :data:`RECURRENT_SIZES` and ``sizes`` (its options, the example's
    values; None: the layer's default), ``make(sizes) -> layer`` and ``options(layer) -> sizes`` (those a layer
    reads back beyond ``dim, heads, chunk_size, conv_size``). The count builds the layer when none is given
    (its size does not grow with the length)."""
    def build(s):
        return make(s).to(dtype_of(s))

    return Spec({**RECURRENT_SIZES, **sizes}, functools.partial(_count, build), _inputs, formula, make=build,
                module_type=module_type, config=functools.partial(_config, options, sizes),
                nullable=frozenset(k for k, v in sizes.items() if v is None))
