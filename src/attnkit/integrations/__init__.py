"""attnkit inside other libraries' models: :mod:`.transformers` (``attn_implementation="attnkit"``)
and :mod:`.torch` (drop-ins for ``torch.nn`` models). Each submodule imports its library only
when it is imported itself."""


def require_transformers():
    """The transformers module, or an ImportError that says how to install it."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError('attnkit\'s transformers support needs transformers: pip install "attnkit[hf]"') from err
    return transformers
