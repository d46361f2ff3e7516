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
dropout in training, and the weights when the model collects them. What attnkit cannot
honour exactly (attention sinks) raises :class:`attnkit.UnsupportedFeature`.

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

from .. import require_transformers

require_transformers()  # a clear error, naming the extra, when transformers is missing

from transformers import AttentionInterface, AttentionMaskInterface  # noqa: E402

from ...errors import ArgumentError, DTypeError  # noqa: E402
from ...functional.mask_base import Mask  # noqa: E402
from ...kernels.paths import BACKENDS  # noqa: E402
from .attention_function import make_attention_function, weights_wanted  # noqa: E402
from .model_masks import ModelMask, make_mask_function, whole_sequence_mask  # noqa: E402

__all__ = ["register", "ModelMask", "weights_wanted", "whole_sequence_mask"]


def register(name: str = "attnkit", *, mask: Mask | None = None, bias=None, backend: str = "auto") -> str:
    """Register ``name`` as a transformers attention implementation run by attnkit; returns ``name``.

    Args:
        name: the ``attn_implementation`` string (registering a name again replaces it).
        mask: an attnkit mask AND-ed with the model's own, on whole-sequence positions.
        bias: an attnkit score modifier (e.g. ``attnkit.bias.alibi(heads)``), on whole-sequence positions.
        backend: the :func:`attnkit.attention` backend every layer uses.
    """
    if not isinstance(name, str) or not name or name == "eager":
        raise ArgumentError(f"name must be a non-empty string other than 'eager'; got {name!r}")
    if mask is not None and not isinstance(mask, Mask):
        raise DTypeError(f"mask must be an attnkit.masks mask (a function of positions); got {type(mask).__name__}")
    if bias is not None and not callable(bias) and not hasattr(bias, "modify"):
        raise DTypeError(f"bias must be an attnkit score modifier; got {type(bias).__name__}")
    if backend not in BACKENDS:
        raise ArgumentError(f"backend must be one of {BACKENDS}; got {backend!r}")
    AttentionInterface.register(name, make_attention_function(mask, bias, backend))
    AttentionMaskInterface.register(name, make_mask_function(mask))
    return name


register()
