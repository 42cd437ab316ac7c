"""FLOPs per token of a model's forward pass, from its architecture, and the MFU convention.

A matmul ``[t, k] x [k, n]`` is ``2 t k n`` FLOPs, so a Linear weight of ``numel`` elements costs ``2 numel``
FLOPs per token forward (Kaplan et al. 2020, arXiv 2001.08361). MoE layers count the routed experts a token
visits: ``experts_per_token / num_experts`` of the expert weights. Causal attention scores and the weighted
sum cost ``2 x heads x (d_qk + d_v)`` FLOPs per token and key position, and a token at position ``i`` sees
``i`` keys: ``(s + 1) / 2`` on average (FlashAttention skips the masked blocks; Dao 2023, arXiv 2307.08691).
MLA (DeepSeek-V2) reads ``d_qk = nope + rope`` and ``d_v`` from the architecture; its low-rank projections
are ordinary Linear weights.

MFU's model FLOPs follow PaLM's appendix B (Chowdhery et al. 2022, arXiv 2204.02311): ``6 N + 12 L H Q s``
per token, N the matmul parameters a token passes through (embedding lookups excluded, the output head
included), the attention term counted without the causal halving, and no recomputation.

State-space layers (Mamba, families/mamba.py) have no attention: their sequence mixing is the selective scan,
``9 x I x N`` FLOPs per token and layer (+ I for the D skip, + I for the z gate), the count of mamba's own
``flops_selective_scan_fn`` (state-spaces/mamba issue #110: ``flops = 9 * B * L * D * N``), linear in s; it is
reported where attention is (step_time.py runs it at attention's efficiency: an estimate, no kernel timed). The
depthwise conv (2 K I per token) is counted with it. ``A_log`` [I, N] is a parameter, not a matmul weight.
Mamba-2's chunked SSD is counted by its algorithm's einsums instead (``model_flops``).
"""

from __future__ import annotations

from memsim_widget.architecture import Architecture
from memsim_widget.fast_dataclass import dataclass

#: Parameter kinds that are not matmul weights (lookups, norms).
NON_MATMUL_KINDS = ("embedding", "position", "norm")


@dataclass(frozen=True)
class ModelFlops:
    """Forward FLOPs per token: the layers' Linear weights (averaged per layer), the head, attention."""

    layers: int
    linear_per_layer: float  # 2 x active Linear weights of one (average) layer
    io_per_layer: float  # sum of (in + out) features over those weights: activation elements per token
    head: float  # 2 x hidden x vocabulary of the output head (0 for none)
    heads: int
    d_qk: int
    d_v: int
    causal: bool
    attention_layers: int | None = None  # layers with attention (None: all); state-space layers have none
    scan_per_layer: float = 0.0  # selective-scan + conv FLOPs per token, averaged over the layers

    @property
    def _attn_share(self) -> float:
        n = self.layers if self.attention_layers is None else self.attention_layers
        return n / max(self.layers, 1)

    def attention_per_layer(self, seq_len: int) -> float:
        """Scores and weighted sum, forward, per token: ``2 heads (d_qk + d_v) x keys seen`` (averaged over the
        layers that have attention), plus the state-space scan of the others."""
        keys = (seq_len + 1) / 2 if self.causal else float(seq_len)
        return self._attn_share * 2.0 * self.heads * (self.d_qk + self.d_v) * keys + self.scan_per_layer

    def model_flops_per_token(self, seq_len: int) -> float:
        """PaLM's convention: ``6 N + 6 L heads (d_qk + d_v) s`` (= ``6 N + 12 L H Q s`` when d_qk = d_v), the
        attention term over the layers that have attention, plus 3 x the scan FLOPs (forward and backward)."""
        n = self.layers * self.linear_per_layer / 2 + self.head / 2
        att = 6.0 * self.layers * self._attn_share * self.heads * (self.d_qk + self.d_v) * seq_len
        return 6.0 * n + att + 3.0 * self.layers * self.scan_per_layer


def matmul_weights(arch: Architecture) -> tuple[float, float, int]:
    """Active Linear weight elements of the blocks (experts scaled by top-k / experts), their summed
    in + out features (activation elements a token reads and writes), and the head's weight elements."""
    layer = io = 0.0
    head = 0
    share = arch.experts_per_token / arch.num_experts if arch.is_moe else 1.0
    for g in arch.params:
        if len(g.shape) != 2 or g.kind in NON_MATMUL_KINDS or (g.kind == "ssm" and not g.module):
            continue
        if g.scope == "layer":
            layer += g.numel * share if g.expert else g.numel
            io += sum(g.shape) * g.count * (share if g.expert else 1.0)
        elif g.kind == "head":
            head += g.numel
    if not head and arch.tied_embeddings and arch.causal:
        head = arch.vocab_size * arch.hidden_size  # the tied embedding is the output head
    return layer, io, head


def model_flops(arch: Architecture) -> ModelFlops:
    """The forward FLOPs per token of ``arch``."""
    layer, io, head = matmul_weights(arch)
    d_qk = arch.head_dim
    mla = arch.facts.attention.mla
    d_v = int(mla.v_head_dim) if mla else arch.head_dim
    ssm = arch.facts.ssm
    scan = 0.0
    if ssm:
        inner, n_state, k = ssm.inner, ssm.state_size, ssm.conv_kernel
        if ssm.version == 2:
            # SSD (Dao & Gu 2024, arXiv 2405.21060, the chunked algorithm mamba2_chunk_scan runs): per token the
            # intra-chunk C.B scores and their product with x (2 l H (N + P)), the chunk states and their read-out
            # (2 x 2 I N); the conv runs over x, B and C
            l, H, P, G = ssm.chunk_size, ssm.heads, ssm.head_dim, ssm.groups
            per = 2.0 * l * H * (n_state + P) + 4.0 * inner * n_state + 2.0 * k * (inner + 2 * G * n_state)
        else:
            per = 9.0 * inner * n_state + 2.0 * inner + 2.0 * k * inner
        scan = ssm.layers * per / max(arch.num_layers, 1)
    return ModelFlops(
        layers=arch.num_layers,
        linear_per_layer=2.0 * layer / max(arch.num_layers, 1),
        io_per_layer=io / max(arch.num_layers, 1),
        head=2.0 * head,
        heads=arch.num_heads,
        d_qk=d_qk,
        d_v=d_v,
        causal=arch.causal,
        attention_layers=arch.facts.attention.layers,
        scan_per_layer=scan,
    )
