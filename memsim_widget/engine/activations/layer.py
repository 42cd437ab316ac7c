"""One HF layer's rules in progress: the sizes and dtypes every rule reads, the terms added so far, and the two
ways a rule adds a term (``add``, and ``consumers`` for what the Linears reading one tensor keep of it)."""

from __future__ import annotations

from memsim_widget.architecture.moe import peft_parameter
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.context import Context, deepspeed_zero3_linear
from memsim_widget.engine.frameworks import effective_recipe, profile, quantises_module, uses_autocast


class HFLayer:
    """The state the HF rules share while they build one micro-batch's ``ActivationBudget`` (engine/activations/
    hf.py runs them in order; a rule reads what an earlier one recorded, e.g. the attention's eager-output terms
    that the backward transients subtract)."""

    def __init__(self, ctx: Context) -> None:
        arch, sc, recipe = ctx.arch, ctx.scenario, effective_recipe(ctx)
        self.ctx, self.arch, self.sc, self.recipe = ctx, arch, sc, recipe
        self.prof = profile(ctx)
        self.D = Dims(ctx)
        self.amp = uses_autocast(ctx)  # FSDP2 mixed precision (torchtitan) computes in bf16 without autocast
        self.ec = recipe.act_bytes  # bytes of a compute-dtype element (16-bit under autocast)
        self.r = 4 if self.amp else self.ec  # residual stream dtype: autocast keeps it fp32
        self.full = ctx.full_training
        self.ab = ctx.adapter_bytes
        self.targets = {ad.base.module for ad in ctx.adapters}
        #: the MoE parameters peft adapts through ``target_parameters`` (``gate_up_proj``, ``down_proj``, the
        #: router's ``gate.weight``) -> their adapter
        self.expert_adapters = {peft_parameter(ad.base): ad for ad in ctx.adapters if peft_parameter(ad.base)}
        self.modules = set(ctx.linear_modules)
        self.out = ActivationBudget()
        self.L = self.out.per_layer
        # (Megatron-style "selective" recomputes only inside attention: the layer boundary is as without it)
        self.frozen_first = (
            not self.full and sc.activation_checkpointing in ("none", "selective") and not ctx.vision_grad
        )
        # DeepSpeed ZeRO-3's linear keeps every Linear's input, a frozen one's too (16-bit runs: autocast not
        # traced there)
        self.zero3_linear = not self.full and not self.amp and deepspeed_zero3_linear(sc)
        self.gemma = arch.facts.norm.one_plus_weight
        # CohereLayerNorm computes x - mean twice: two fp32 centred copies saved (traced)
        self.cw = 8 if arch.facts.norm.centred_copy else 4
        # Gemma's RMSNorm returns normed(x) * (1 + w.float()): the product saves the fp32 (1 + w) whenever its
        # input needs a gradient, and the fp32 normalised tensor only when w trains (traced, Gemma 2 and 3)
        self.onep = 4 if self.gemma else 0
        # a norm's output has the residual stream's dtype (Gemma's ``.type_as(x)`` too: fp32 under autocast and
        # in fp32, where every Linear reading it then keeps its own 16-bit copy under autocast; traced)
        self.nout = self.r
        self.ssm = arch.facts.ssm
        self.eager = arch.attention_kernel(sc.attention) == "eager" and not self.ssm
        # recorded by the rules as they run (hf.py says which)
        self.ssm_from = 0  # state-space layers have neither Linear input the norms' readers save
        self.masked_frac = 0.0  # layers whose SDPA gets an explicit mask (k, v repeated)
        self.ao_from = self.ao_to = 0  # the eager attention-output term(s) in L (freed before its backward)
        self.softmax_fp32 = False
        self.recomputed = 0.0  # selective: what the eager core's recompute makes again in one layer (bytes)
        self.Tm, self.I = self.D.T, self.D.I  # rows and width of the (largest) MLP part
        self.mlp_from = self.mlp_to = 0
        # what a sequential block's MLP side saves beside the MLP's own terms, released by its backward before
        # the attention's (backward.attention_backward): the saved bytes of the norms after the attention core,
        # the MLP input's terms in L, the autocast 16-bit copies of the MLP's and o_proj's weights
        self.late_norm = 0.0
        self.mi_from = self.mi_to = 0
        self.late_copies = 0.0
        self.t5_sm: tuple[float, str] = (0, "")
        self.kv_cache = False
        self.kb = self.ec  # the training KV cache's k bytes
        self.upcast_loss = True
        self.le = 2  # bytes of a logits element

    def add(
        self,
        name: str,
        nbytes: float,
        formula: str,
        tensors: int = 1,
        level: str = "tensor",
        first_bytes: float = 0.0,
        shares: tuple[float, ...] = (),
    ) -> None:
        """Append a per-layer term; ``first_bytes`` of it are absent in layer 0; ``shares``: each tensor's share
        of one repeat where they differ (``Term.shares``)."""
        if nbytes > 0:
            self.L.append(Term(name, nbytes, formula, tensors, level, first_bytes > 0, first_bytes, shares))

    def consumers(
        self,
        role: frozenset[str],
        width: int,
        rows: int,
        dtype: int,
        label: str,
        already_saved: bool = False,
        upstream: frozenset[str] | None = None,
    ) -> None:
        """What the Linears reading one tensor (rows x width, ``dtype`` bytes) keep of it. ``upstream``: the
        Linears of the same layer before it whose adapters make it need a gradient in layer 0 under LoRA (None:
        it needs one there too), for a frozen Linear's input kept under DeepSpeed ZeRO-3 (``frozen_input``)."""
        add, amp, ab = self.add, self.amp, self.ab
        present = sorted(role & self.modules)
        if self.full:
            if amp and dtype == 4:
                n = len(present)
                add(
                    f"{label}: autocast 16-bit input copies",
                    n * 2 * rows * width,
                    f"{n} Linears x 2 B x T x {width}",
                    n,
                )
            elif not already_saved:
                add(f"{label}: Linear input", dtype * rows * width, f"{dtype} B x T x {width}", 1)
            return
        hit = [m for m in present if m in self.targets]
        if not hit:
            if not already_saved:
                self.frozen_input(present, width, rows, dtype, label, upstream)
            return
        if amp or ab != dtype:
            cb = 2 if amp else ab
            add(
                f"{label}: LoRA input copies",
                len(hit) * cb * rows * width,
                f"{len(hit)} adapters x {cb} B x T x {width}",
                len(hit),
            )
            if not already_saved:  # the adapters read their own copy; the frozen base keeps the input itself
                self.frozen_input(present, width, rows, dtype, label, upstream)
        elif not already_saved:
            add(f"{label}: LoRA input", dtype * rows * width, f"{dtype} B x T x {width}", 1)

    def frozen_input(
        self,
        present: list[str],
        width: int,
        rows: int,
        dtype: int,
        label: str,
        upstream: frozenset[str] | None,
    ) -> None:
        """Under DeepSpeed ZeRO-3 (``zero3_linear``: ``context.deepspeed_zero3_linear``) a frozen Linear
        reading the tensor keeps it for backward whenever it needs a gradient (the base of an adapter's Linear
        is frozen too; bitsandbytes' 4-bit Linears run their own autograd Function, not the replaced linear):
        in layer 0 only where an adapter of ``upstream`` comes before it."""
        qlora = self.sc.method == "qlora"
        if not self.zero3_linear or all(qlora and quantises_module(self.ctx, m) for m in present):
            return
        n = dtype * rows * width
        free0 = self.frozen_first and upstream is not None and not (upstream & self.targets)
        self.add(
            f"{label}: frozen Linear input (DeepSpeed ZeRO-3 linear)",
            n,
            f"{dtype} B x T x {width}" + ("; none in layer 0 (no gradient there)" if free0 else ""),
            1,
            first_bytes=n if free0 else 0,
        )
