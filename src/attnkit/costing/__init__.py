"""The cost vocabulary a registry entry carries: its :class:`~.spec.Spec`, counted on a :class:`~.tally.Tally`.

Every mechanism file registers ``Entry(..., spec=Spec(...))``: the spec says which sizes the
mechanism takes (the registry example's values as defaults, the paper's settings for sizes at
scale), how to count one forward pass (``count``), and how to run it (``make``, ``inputs``).
:mod:`attnkit.lab.analysis.cost` reads the specs through the registry. This package sits below the
mechanisms (it imports nothing from :mod:`attnkit.nn`):

- :mod:`.vocabulary`: the size names every command and ``cost(...)`` share, and a realistic layer
  (no torch: the command line reads it to build its parsers);
- :mod:`.tally`: the running totals and the stand-in tensors;
- :mod:`.spec`: :class:`~.spec.Spec`, :class:`~.spec.Cost` and the resolution of sizes;
- :mod:`.attend`: one :func:`attnkit.attention` call priced on the execution path the dispatcher picks.
"""
