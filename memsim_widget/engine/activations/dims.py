"""Per-rank sizes the activation rules read: the micro-batch's tokens and the model's widths after tensor,
sequence and context parallel division."""

from __future__ import annotations

from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import vocab_split


class Dims:
    """Per-rank sizes after tensor, sequence and context parallel division."""

    def __init__(self, ctx: Context) -> None:
        a, par, sc = ctx.arch, ctx.par, ctx.scenario
        self.b = sc.micro_batch_size
        self.s = ctx.seq_len // par.cp  # local sequence under context parallelism
        self.T = self.b * self.s
        self.tp = par.tp
        self.sp = par.sequence_parallel
        self.h = a.hidden_size
        self.a = a.num_heads // par.tp
        self.d = a.head_dim
        self.hq = self.a * self.d  # local query width
        self.kv = max(1, a.num_kv_heads // par.tp)
        self.hkv = self.kv * self.d
        self.I = a.intermediate_size // par.tp
        # an expert's width: split by the TP group unless expert parallelism folds over it (whole experts)
        self.etp = par.expert_tp
        # the "hf" plan gathers the full logits on every rank; loss parallel keeps V/tp
        self.V = a.vocab_size // par.tp if vocab_split(ctx) else a.vocab_size
        self.s_full = ctx.seq_len  # keys each query attends to (ring attention passes all)
        # outside tensor-parallel regions tensors are replicated unless sequence parallel
        self.Tout = self.T // self.tp if self.sp else self.T
