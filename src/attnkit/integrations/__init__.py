"""attnkit inside other libraries' models. Each submodule is imported on its own, with its own dependency.

- :mod:`attnkit.integrations.torch`: ``replace_attention(model)`` swaps every
  ``torch.nn.MultiheadAttention`` of a torch model for :class:`attnkit.nn.MultiHeadAttention`.
"""
