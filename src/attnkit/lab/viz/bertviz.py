"""Export attention maps in the format bertviz's head view and model view read.

bertviz (Vig, "A Multiscale Visualization of Attention in the Transformer Model", ACL 2019
demo, arXiv:1906.05714) takes per-layer tensors ``(1, H, L, L)`` and a token list in Python,
and hands its JavaScript (``head_view.js`` / ``model_view.js``) one JSON object in place of
the marker ``PYTHON_PARAMS``. :func:`to_bertviz` builds that object from a transformers
model's attentions (or any tuple of per-layer tensors), so maps recorded here can be shown
with bertviz's views, or its JSON stored and rendered later, without bertviz's Python side.

The object, as bertviz's JS reads it:

* ``attention``: a list of filters, each ``{"name", "attn", "left_text", "right_text"}``;
  ``attn`` is nested lists ``[layer][head][query][key]`` (rows sum to 1), ``left_text`` the
  query tokens, ``right_text`` the key tokens. Self-attention models give one filter (name
  None; with ``sentence_b_start``: ``All`` and the four sentence pairs); encoder-decoder
  models give ``Encoder``, ``Decoder`` and ``Cross``.
* ``default_filter``: ``"0"`` (the first filter); ``root_div_id``: the id of the element
  holding the view (``"bertviz-attnkit"``: the page must have a ``div`` with that id, and in
  it ``<select id="layer">`` (head view) and ``<div id="vis">``).
* head view: ``layer`` (initial layer or None), ``heads`` (initially shown heads or None: all),
  ``include_layers``; model view: ``display_mode``, ``include_layers``, ``include_heads``,
  ``total_heads``.
"""

from __future__ import annotations

import json

import torch

from ...errors import ArgumentError, check_int
from ..analysis.model_maps import layer_maps
from ._style import check_path

__all__ = ["to_bertviz"]

ROOT_DIV_ID = "bertviz-attnkit"
VIEWS = ("head", "model")
_FILTER_NAMES = {"layers": None, "encoder.layers": "Encoder", "decoder.layers": "Decoder", "cross.layers": "Cross"}


def _indices(arg: str, given, n: int, what: str) -> list[int]:
    """``given`` as a list of distinct ints in ``[0, n)``; all of them for None."""
    if given is None:
        return list(range(n))
    given = list(given)
    for i in given:
        check_int("to_bertviz", arg, i, 0)
    if not given or any(i >= n for i in given) or len(set(given)) != len(given):
        raise ArgumentError(f"to_bertviz: {arg} must be distinct {what} indices in [0, {n}); got {given}")
    return given


def _stacks(maps) -> dict[str, tuple[torch.Tensor, list[str], list[str]]]:
    """``{stack prefix: ((layers, H, Lq, Lk), query labels, key labels)}`` in the order of the maps."""
    groups: dict[str, list] = {}
    for m in maps:
        groups.setdefault(m.name.rsplit(".", 1)[0], []).append(m)
    stacks = {}
    for prefix, layers in groups.items():
        if len({tuple(m.weights.shape) for m in layers}) != 1:
            raise ArgumentError(f"to_bertviz: the layers of {prefix!r} differ in shape; bertviz needs equal ones")
        first = layers[0]
        q = first.q_tokens or [str(i) for i in range(first.weights.shape[1])]
        k = first.k_tokens or [str(i) for i in range(first.weights.shape[2])]
        stacks[prefix] = (torch.stack([m.weights for m in layers]), q, k)
    return stacks


def _filters(stacks, sentence_b_start) -> list[dict]:
    """bertviz's filter list: one per stack, or All and the sentence pairs of a self-attention model."""
    filters = [{"name": _FILTER_NAMES.get(p, p), "attn": w, "left_text": q, "right_text": k}
               for p, (w, q, k) in stacks.items()]
    if sentence_b_start is None:
        return filters
    if list(stacks) != ["layers"]:
        raise ArgumentError("to_bertviz: sentence_b_start is for self-attention models (one stack of layers)")
    (w, tokens, _), = stacks.values()
    check_int("to_bertviz", "sentence_b_start", sentence_b_start, 1)
    if sentence_b_start >= len(tokens):
        raise ArgumentError(f"to_bertviz: sentence_b_start must be in [1, {len(tokens)}) (the tokens); got "
                            f"{sentence_b_start}")
    a, b = slice(0, sentence_b_start), slice(sentence_b_start, len(tokens))
    pairs = [("Sentence A -> Sentence A", a, a), ("Sentence B -> Sentence B", b, b),
             ("Sentence A -> Sentence B", a, b), ("Sentence B -> Sentence A", b, a)]
    return [{**filters[0], "name": "All"}] + [
        {"name": name, "attn": w[:, :, q, k], "left_text": tokens[q], "right_text": tokens[k]} for name, q, k in pairs]


def to_bertviz(attentions, tokens=None, *, view="head", decoder_tokens=None, attention_mask=None,
               decoder_attention_mask=None, sentence_b_start=None, include_layers=None, include_heads=None,
               sample=0, path=None) -> dict:
    """The JSON object bertviz's ``head_view.js`` or ``model_view.js`` reads (module docstring), as a dict.

    Args:
        attentions: a transformers model's ``outputs.attentions`` (one ``(B, H, L, L)`` per layer), or its whole
            output (encoder-decoder models: ``encoder_attentions``, ``decoder_attentions``, ``cross_attentions``).
        tokens: the (encoder's) tokens of sample ``sample``; positions where None.
        view: ``"head"`` or ``"model"``.
        decoder_tokens: the decoder's tokens of an encoder-decoder model.
        attention_mask, decoder_attention_mask: ``(B, L)``, nonzero at real tokens: padded positions are left out.
        sentence_b_start: index of the first token of sentence B (self-attention models): adds bertviz's
            sentence-pair filters.
        include_layers: the layers to include (all of each stack if None; given ones must exist in every stack).
        include_heads: model view: the heads to include; head view: the heads shown at first (all if None).
        sample: which batch entry.
        path: also write the object as JSON to this ``.json`` file.

    Returns:
        The dict (plain lists, floats and strings; ``json.dumps`` takes it).

    Example:
        >>> import torch
        >>> layer = torch.softmax(torch.randn(1, 2, 3, 3), -1)
        >>> params = to_bertviz((layer, layer, layer), ["[CLS]", "hi", "[SEP]"], include_layers=[0, 2])
        >>> f = params["attention"][0]
        >>> len(f["attn"]), len(f["attn"][0]), f["left_text"], params["include_layers"]
        (2, 2, ['[CLS]', 'hi', '[SEP]'], [0, 2])
    """
    if view not in VIEWS:
        raise ArgumentError(f"to_bertviz: view must be one of {', '.join(VIEWS)}; got {view!r}")
    path = check_path(path, (".json",))
    maps = layer_maps(attentions, attention_mask=attention_mask, decoder_attention_mask=decoder_attention_mask,
                      tokens=tokens, decoder_tokens=decoder_tokens, sample=sample)
    stacks = _stacks(maps)
    # Given indices must hold in every stack; None keeps every layer / head of each (stacks may differ in size).
    layers, total_heads = (max(w.shape[d] for w, _, _ in stacks.values()) for d in (0, 1))
    bound = {d: min(w.shape[d] for w, _, _ in stacks.values()) for d in (0, 1)}
    chosen_layers = None if include_layers is None else _indices("include_layers", include_layers, bound[0], "layer")
    chosen_heads = None if include_heads is None else _indices("include_heads", include_heads, bound[1], "head")
    filters = _filters(stacks, sentence_b_start)
    for f in filters:
        w = f["attn"] if chosen_layers is None else f["attn"][chosen_layers]
        f["attn"] = (w if chosen_heads is None or view == "head" else w[:, chosen_heads]).tolist()
    include_layers = list(range(layers)) if chosen_layers is None else chosen_layers
    heads = list(range(total_heads)) if chosen_heads is None else chosen_heads
    params = {"attention": filters, "default_filter": "0", "root_div_id": ROOT_DIV_ID,
              "include_layers": include_layers}
    if view == "head":
        params.update(layer=None, heads=chosen_heads)
    else:
        params.update(display_mode="dark", include_heads=heads, total_heads=total_heads)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(params), encoding="utf-8")
    return params
