"""Preference and RL objectives (docs/rl.md): ``objectives`` (DPO, ORPO, KTO, GRPO, PPO: the extra models, the
sequences per sample, their loss) and ``rollout`` (the generation phase of online RL)."""
