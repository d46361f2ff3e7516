"""Attention mechanisms as ``nn.Module``s, one file per family or paper."""
