"""Pipeline stages and the layout's ranks: ``schedule`` (micro-batches a stage holds at once, for one stage or many
candidates), ``pipeline`` (what a stage holds beyond its layers' activations) and ``rank_roles`` (what one rank
holds, in words)."""
