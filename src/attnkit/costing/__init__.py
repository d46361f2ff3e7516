"""The cost vocabulary a registry entry carries: its :class:`~.spec.Spec`, counted on a :class:`~.tally.Tally`.

Every mechanism file registers ``Entry(..., spec=Spec(...))``: the spec says which sizes the
mechanism takes (the registry example's values as defaults, the paper's settings for sizes at
scale), how to count one forward pass (``count``), and how to run it (``make``, ``inputs``).
:mod:`.analytic` reads the specs through the registry. Cost has this one home; the modules
below sit under the mechanisms (they import nothing from :mod:`attnkit.nn`), except
:mod:`.analytic`, which reads the registry and so sits above them:

- :mod:`.vocabulary`: the size names every command and ``cost(...)`` share, and a realistic layer
  (no torch: the command line reads it to build its parsers);
- :mod:`.tally`: the running totals and the stand-in tensors;
- :mod:`.spec`: :class:`~.spec.Spec`, :class:`~.spec.Cost` and the resolution of sizes;
- :mod:`.attend`: one :func:`attnkit.attention` call priced on the execution path the dispatcher picks;
- :mod:`.core_specs`: the specs that are no registry entry ("dense", "sdpa", mask expressions);
- :mod:`.kv_cache`: the decoding cache per token of MHA, GQA, MQA and MLA side by side;
- :mod:`.analytic`: ``cost(name or module, **sizes)``, ``sizes``, ``spec``, ``build``: any mechanism's
  analytic FLOPs, bytes and peak memory.

Each execution path's own estimate, the column of the kernel table that ``explain`` prints, stays
beside the table (:mod:`attnkit.kernels.path_cost`): it is written in the paths' terms and
:mod:`.attend` reads it, so there is one formula per path.
"""
