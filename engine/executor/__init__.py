"""Executors run a round's forward: `sim` (cost model, virtual clock) and `torch` (a real MoE model)."""
