"""The engine: a scenario in, an ``Estimate`` out, in pure Python (no torch, Jupyter or numpy imported).

The entry point and the result sit at the top (``core.estimate``, ``estimate.Estimate``), beside what every part
reads: ``context`` (a scenario resolved once), ``items`` (one named amount of memory), ``frameworks`` (framework
profiles), ``arith`` (rules written once for numbers and numpy arrays) and ``caveats`` (what is not modelled, in
words). The rest is one sub-package per concern (docs/architecture.md lists every module):

- ``states``: model states on one rank; ``activations``: what each implementation saves for backward (with the
  whole-model kinds, ``hybrid`` and ``calibrated``); ``multimodal``: the vision side of multimodal models;
- ``step``: the moments of a training step and one rank's result; ``parallel``: pipeline stages and ranks;
- ``counters``: workspaces, fragmentation and the caching allocator replayed; ``rl``: preference and RL
  objectives; ``speed``: the step time; ``caches``: memos keyed by the scenario fields each part reads.
"""
