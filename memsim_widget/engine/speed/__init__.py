"""The time of a training step (docs/speed.md): ``step_time`` (the formula the engine and the planner share),
``time_breakdown`` (a resolved scenario's items with their formulas), ``gpu_speed`` (each card's peaks and the fitted
matmul efficiency) and ``flops`` (FLOPs per token of a model's forward)."""
