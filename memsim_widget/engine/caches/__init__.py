"""The engine's memos, keyed by the scenario fields each part reads: ``parts_cache`` (model states, activation terms,
the timeline's groups) and ``model_rules_cache`` (the ``model`` stage of the scenario rules)."""
