"""Linear attention with decays, gates and the delta rule: one recurrence in parallel, chunked and recurrent form.

Every function here is a causal recurrence on a matrix state ``S`` ``(Dk, Dv)`` per head,
``S_t = diag(exp(g_t)) S_{t-1} + k_t d_t^T``, ``o_t = S_t^T q_t``; the families differ in where the
log decay ``g_t`` comes from and in what is written, ``d_t``:

    function                  paper                        log decay g_t              written d_t
    retention                 RetNet (arXiv:2307.08621)    log gamma, fixed per head  v_t
    gated_linear_attention    GLA (arXiv:2312.06635)       per key channel            v_t
    ssd                       Mamba-2 (arXiv:2405.21060)   dt_t A, per head           dt_t x_t
    delta_rule                DeltaNet (arXiv:2406.06484)  0                          beta_t (v_t - S^T k_t)
    delta_product             DeltaProduct (2502.10297)    per head, optional         n_h delta steps per token
    gated_delta_rule          Gated DeltaNet (2412.06464)  per head                   beta_t (v_t - S^T k_t)
    kimi_delta_attention      Kimi Linear (2510.26692)     per key channel            beta_t (v_t - S^T k_t)
    comba                     Comba (arXiv:2506.02475)     per head                   beta_t (v_t - S^T p_t)
    generalized_delta_rule    RWKV-7 (arXiv:2503.14456)    per key channel            v_t, and b_t a_t^T S_{t-1}

``log_linear_attention`` (Log-Linear Attention, arXiv:2506.04761) reads Mamba-2's or Gated DeltaNet's recurrence
through O(log L) Fenwick-tree bucket states, each weighted per token (:mod:`.log_linear`).

Each takes ``form="parallel" | "chunk" | "recurrent"`` (:mod:`.forms`; the same function), an
``initial_state`` and returns ``(output, final_state)``; ``cu_seqlens`` runs packed documents, each
from its own state. Tensors are ``(B, H, L, D)``, as :func:`attnkit.attention`. Shared pieces:
:mod:`.local` (a block's terms and its decay masks), :mod:`.forms` (passing the state from block
to block), :mod:`.scan` (the map of a run of blocks).
"""

from .comba import comba
from .decay import gated_linear_attention, retention
from .delta import delta_rule
from .delta_product import delta_product
from .forms import FORMS, l2_normalize
from .gated_delta import gated_delta_rule
from .kda import kimi_delta_attention
from .local import segsum
from .log_linear import log_linear_attention
from .rwkv7 import generalized_delta_rule
from .ssd import ssd

__all__ = ["FORMS", "retention", "gated_linear_attention", "ssd", "delta_rule", "delta_product", "gated_delta_rule",
           "kimi_delta_attention", "comba", "generalized_delta_rule", "log_linear_attention", "l2_normalize",
           "segsum"]
