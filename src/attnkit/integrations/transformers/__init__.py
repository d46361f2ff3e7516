"""attnkit as an attention implementation of Hugging Face transformers (5.x).

Importing this module registers the name ``"attnkit"`` in transformers'
``AttentionInterface`` and ``AttentionMaskInterface``, so that

    import attnkit.integrations.transformers
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attnkit")
    model.set_attn_implementation("attnkit")      # or switch a loaded model

runs every attention layer through :func:`attnkit.attention`: causal and bidirectional
layers, padding (left padding included), KV-cache decoding and chunked prefill
(bottom-right), grouped-query heads without copying K/V, sliding windows (as attnkit
band masks: long prompts take the band path), Gemma-2's soft-capping and scaling,
dropout in training, the weights when the model collects them, packed documents
(``position_ids`` restarting, ``cu_seq_lens_*``: :func:`attnkit.varlen_attn`) and sparse indexers'
key choices (``indices``, ``block_indices``: the gathered selected-keys path), attention sinks per
head or per token. What attnkit cannot honour exactly raises :class:`attnkit.UnsupportedFeature`. Model code that reads
the mask itself sees the 4-D float mask transformers builds for ``"eager"`` (:class:`ModelMask`,
built only then), and a model compiles
with ``torch.compile(fullgraph=True)``.

:func:`register` adds further names whose attnkit mask is AND-ed with the model's own
and whose score modifier is added, both evaluated on positions of the whole sequence
(the cache position), so they mean the same in one pass and in cached decoding::

    register("attnkit-window", mask=attnkit.masks.sliding_window(256))
    model.set_attn_implementation("attnkit-window")    # a dense model, now windowed

Registered names are for decoder-only and encoder models: on an encoder-decoder they raise
:class:`attnkit.UnsupportedFeature` (cross-attention has two sequences' positions). Outputs at
padded query positions are unspecified (transformers' eager path gives a
uniform average there, attnkit 0).
"""

from __future__ import annotations

import inspect
import re

from .. import require_transformers

require_transformers()  # a clear error, naming the extra, when transformers is missing

from transformers import AttentionInterface, AttentionMaskInterface  # noqa: E402

from ...bias import ScoreModifier  # noqa: E402
from ...errors import ArgumentError, DTypeError  # noqa: E402
from ...kernels.paths import BACKENDS  # noqa: E402
from ...masks.base import Mask  # noqa: E402
from .attention_function import make_attention_function, weights_wanted  # noqa: E402
from .model_mask import ModelMask  # noqa: E402
from .model_masks import make_mask_function, whole_sequence_mask  # noqa: E402

__all__ = ["register", "ModelMask", "weights_wanted", "whole_sequence_mask"]

# transformers reads meaning into an implementation's name: "owner/repo", ":" and "@" name a kernel on the Hub,
# "x|y" a paged variant; a name holding "flash", "sdpa" or "flex_attention" gets those implementations' checks
# and kernel loading. A name registered already is refused unless attnkit registered it (a name registered again
# replaces it, and reloading this module, as notebooks' autoreload does, registers its names again).
_NAME_CHARACTERS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_READ_BY_TRANSFORMERS = ("flash", "sdpa", "flex_attention")


def _taken(name: str) -> bool:
    """Whether ``name`` is transformers' own implementation or another library's (not one attnkit registered)."""
    held = AttentionInterface._global_mapping.get(name)
    return name == "eager" or (held is not None and not getattr(held, "__module__", "").startswith(__name__))


def _check_name(name) -> None:
    if not isinstance(name, str):
        raise DTypeError(f"name must be a string; got {type(name).__name__}")
    if not _NAME_CHARACTERS.fullmatch(name):
        raise ArgumentError(f"name must be letters, digits, '_', '.' or '-' (transformers reads '/', ':', '@' and "
                            f"'|' as Hub kernels or paged variants); got {name!r}")
    if _taken(name):
        raise ArgumentError(f"name {name!r} is transformers' own implementation or another library's; choose another")
    read = [part for part in _READ_BY_TRANSFORMERS if part in name.lower()]
    if read:
        raise ArgumentError(f"name must not contain {read[0]!r}: transformers then treats the implementation as "
                            f"its {read[0]} attention (checks, Hub kernels); got {name!r}")


def _check_bias(bias) -> None:
    if bias is None or isinstance(bias, ScoreModifier):
        return
    try:
        inspect.signature(bias).bind(0, 0, 0, 0, 0)
    except (TypeError, ValueError):  # not callable, or not with these arguments
        raise DTypeError(f"bias must be an attnkit score modifier (e.g. attnkit.bias.alibi(heads)) or a callable "
                         f"(scores, b, h, q_idx, kv_idx) -> scores; got {bias!r}") from None


def register(name: str = "attnkit", *, mask: Mask | None = None, bias=None, backend: str = "auto") -> str:
    """Register ``name`` as a transformers attention implementation run by attnkit; returns ``name``.

    The model's heads are checked against ``mask`` and ``bias`` at every call (a bias with
    per-head parameters, such as ALiBi, must have as many heads as the model).

    Args:
        name: the ``attn_implementation`` string (registering a name again replaces it); letters, digits,
            ``_ . -``, none of transformers' own names and no ``flash``, ``sdpa`` or ``flex_attention`` in it.
        mask: an attnkit mask AND-ed with the model's own, on whole-sequence positions.
        bias: an attnkit score modifier (e.g. ``attnkit.bias.alibi(heads)``), on whole-sequence positions.
        backend: the :func:`attnkit.attention` backend every layer uses.
    """
    _check_name(name)
    if mask is not None and not isinstance(mask, Mask):
        raise DTypeError(f"mask must be an attnkit.masks mask (a function of positions); got {type(mask).__name__}")
    _check_bias(bias)
    if backend not in BACKENDS:
        raise ArgumentError(f"backend must be one of {BACKENDS}; got {backend!r}")
    AttentionInterface.register(name, make_attention_function(mask, bias, backend))
    AttentionMaskInterface.register(name, make_mask_function(mask))
    return name


register()
