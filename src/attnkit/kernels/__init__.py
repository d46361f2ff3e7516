"""Kernels that compute :func:`attnkit.attention`, and the dispatcher that picks one."""
