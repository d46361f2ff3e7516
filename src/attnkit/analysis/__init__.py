"""Measure attention: timing and peak memory side by side with PyTorch."""
