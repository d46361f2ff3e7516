"""attnkit inside other libraries' models: :mod:`.transformers` (``attn_implementation="attnkit"``)
and :mod:`.torch` (drop-ins for ``torch.nn`` models). Each submodule imports its library only
when it is imported itself."""
