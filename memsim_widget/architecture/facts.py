"""The typed facts of a model the engine, planner and rules read: frozen dataclasses, one per concern.

A family builder writes its facts as ``Architecture.extra`` entries (``families/*``, ``architecture/*``); every
entry is declared here, once: ``FACT_KEYS`` (read into a fact below) or ``KEPT_KEYS`` (config values kept for
export, trace and display, which the engine never reads). ``model_facts`` reads them into :class:`ModelFacts`
(``Architecture.facts``): the engine reads attributes, so a misspelt fact is an AttributeError (or a pyright
error), and a misspelt key written by a family is a ValueError when its Architecture is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from memsim_widget.fast_dataclass import dataclass


@dataclass(frozen=True)
class NormFacts:
    """The block's norms: how many, what they read, and the dtype of what they save (engine/activations/norms.py)."""

    #: norms per block (2: input and post-attention; Gemma 2/3, OLMo 2, GLM-4: 4 with the post-norms)
    per_layer: int = 2
    #: distinct norm inputs per block (fewer than ``per_layer`` where two norms read one tensor: Phi, NeoX)
    inputs: int = 2
    #: norms in layer 0 (ModernBERT's first layer has no attention norm: fewer saved tensors there)
    first_layer: int = 2
    #: the norm multiplies by an fp32 weight, saving an fp32 normalised tensor (OLMo 2, Cohere)
    weight_fp32: bool = False
    #: the norm computes ``x - mean`` twice: two fp32 centred copies saved (CohereLayerNorm; traced)
    centred_copy: bool = False
    #: Gemma's RMSNorm ``normed(x) * (1 + w.float())``: an fp32 ``(1 + w)`` saved, fp32 norm weights (traced)
    one_plus_weight: bool = False
    #: the norms follow attention and MLP (OLMo 2): the block's Linears read the residual stream, not a norm
    post_norms: bool = False
    #: post-norms that read a 16-bit projection output and so save 16-bit tensors under autocast (GLM-4)
    post_norms_16bit: int = 0
    #: layer 0's first norm comes after attention (ModernBERT: its attention reads the embeddings' norm)
    first_after_attention: bool = False
    #: q/k norms: ``"head"`` (per head, Qwen 3), ``"full"`` (over the projection, OLMo 2), ``"l2"`` (Llama 4)
    qk: str | None = None
    #: layers with q/k norms (None: all; Llama 4 has them on its RoPE layers only)
    qk_layers: int | None = None
    #: LayerNorm q/k norms (Phi's ``qk_layernorm``)
    qk_layernorm: bool = False
    #: a norm on the embeddings before layer 0 (BERT, ModernBERT)
    embedding: bool = False
    #: an encoder's own final norm before the MLM head's (ModernBERT)
    final: bool = False


@dataclass(frozen=True)
class MlaFacts:
    """DeepSeek-V2/V3 multi-head latent attention sizes (engine/activations/mla.py, flops.py)."""

    #: q's latent rank (None or 0: q is projected directly, DeepSeek-V2-Lite)
    q_lora_rank: int | None
    #: k and v's shared latent rank
    kv_lora_rank: int
    #: per-head q/k width without RoPE
    qk_nope_head_dim: int
    #: per-head q/k width with RoPE
    qk_rope_head_dim: int
    #: per-head v width
    v_head_dim: int


@dataclass(frozen=True)
class AttentionFacts:
    """How the model's attention runs and what its kernels save (engine/activations/attention.py, mla.py)."""

    #: the HF class has an SDPA path (False: Gemma 2 falls back to eager, as ``PreTrainedModel`` does)
    sdpa: bool = True
    #: why an SDPA request runs eager, shown on the terms (Gemma 2); None where SDPA runs
    note: str | None = None
    #: extra names of the attention's output Linear (beyond o_proj, c_proj, out_proj, o, Wo)
    output_modules: tuple[str, ...] = ()
    #: eager softmax runs in fp32 and casts back (False: GPT-2, BERT, ViT, Falcon, Llama 4, GPT-OSS keep the
    #: compute dtype; CUDA autocast runs it in fp32 anyway)
    softmax_upcast: bool = True
    #: DeepSeek's multi-head latent attention sizes, None otherwise
    mla: MlaFacts | None = None
    #: SDPA takes its math fallback (Falcon's multi-query attention: bmm and softmax saved)
    sdpa_math_fallback: bool = False
    #: the fused qkv output stays alive through the v view (ModernBERT's Wqkv)
    fused_qkv_kept: bool = False
    #: ... only where no KV cache copies v first (GPT-NeoX's query_key_value: under checkpointing HF turns the
    #: cache off, so SDPA's v is a chunk of the fused output)
    fused_qkv_kept_without_cache: bool = False
    #: the fused query_key_value output stays alive through the v view (Falcon's multi-head ALiBi layer)
    sdpa_fused_qkv_view: bool = False
    #: an explicit boolean mask cast to a float bias per call, saved by SDPA (Falcon)
    sdpa_float_mask: bool = False
    #: SDPA's output is copied before the out-projection (partial rotary: GPT-NeoX, Phi, GLM-4)
    sdpa_output_copy: bool = False
    #: which sliding-window mask SDPA saves: ``"local"`` (ModernBERT) or ``"decoder"`` (Gemma 3), None: none
    sliding_mask: str | None = None
    #: layers with a sliding window (ModernBERT's local layers)
    sliding_layers: int = 0
    #: the sliding window in tokens (None: no window)
    sliding_window: int | None = None
    #: the window applies (False: Qwen2/3 carry one they do not use, ``use_sliding_window`` false)
    sliding_window_used: bool = True
    #: every layer's kind as HF names it (``"sliding_attention"``, ``"full_attention"``), None if not given
    layer_types: tuple[str, ...] | None = None
    #: a sink logit per head in the softmax (GPT-OSS): s + 1 columns
    sinks: bool = False
    #: Gemma 2's attention logit softcapping (None: none)
    logit_softcapping: float | None = None
    #: Llama 4's attention chunk size (None: none)
    chunk_size: int | None = None
    #: Llama 4's layers with chunked attention (None: none)
    chunked_layers: int | None = None
    #: HF builds a KV cache in training (``use_cache``; False for encoders and towers)
    use_cache: bool = True
    #: attention layers of a hybrid stack (Jamba), None: every layer
    layers: int | None = None


@dataclass(frozen=True)
class PositionFacts:
    """Rotary or ALiBi positions: what the embeddings and attention hold for them (embeddings.py, output.py)."""

    #: channels RoPE covers (partial rotary), None: the whole head dim
    rotary_dim: int | None = None
    #: RoPE bases, one cos/sin pair each (Gemma 3's sliding and full layers, ModernBERT's local and global)
    rope_kinds: int = 1
    #: RoPE casts q and k back to their input dtype (OLMo 2: no fp32 k in the KV cache under autocast)
    rope_keeps_dtype: bool = False
    #: layer 0 uses RoPE (False: Llama 4's no-RoPE layers start at 0)
    rope_layer0: bool = True
    #: Falcon ALiBi: one (b, a, s, s) bias in the embeddings' dtype, saved by SDPA
    alibi_bias_saved: bool = False


@dataclass(frozen=True)
class LinearFacts:
    """How the model's Linear layers run (linears.py, mlp.py, output.py, context.py)."""

    #: the Linear adds its bias after the matmul, so an fp32 bias promotes its output under autocast (Falcon)
    unfused_bias: bool = False
    #: the experts' batched matmuls keep autocast copies of their weights (GPT-OSS, Llama 4: traced)
    autocast_expert_copies: bool = False
    #: weights stored as Conv1D, (in, out) (GPT-2): LoRA's fan-in is the first dimension
    conv1d: bool = False


@dataclass(frozen=True)
class MlpPart:
    """One kind of MLP in a stack that runs several (architecture/moe.py): dense first layers, MoE layers, a shared
    expert beside the routed ones (engine/activations/mlp.py)."""

    #: the terms' label (``"dense MLP"``, ``"routed experts"``, ``"shared expert"``)
    name: str
    #: layers running this part
    layers: int
    #: the part's intermediate width (per expert)
    width: int
    #: rows per token through it (k for routed experts, E for Llama 4's dense dispatch)
    rows: int = 1
    #: routed experts (0: a dense MLP)
    experts: int = 0
    #: the router's saved set: ``"softmax"``, ``"sigmoid"``, ``"softmax-fp32"``, ``"topk-softmax"``,
    #: ``"topk-sigmoid"``
    router: str = "softmax"
    #: experts chosen per token where it differs from ``rows`` (None: ``rows``)
    top_k: int | None = None
    #: ``"dense"``: every expert runs every token with ``torch.bmm`` (Llama 4); None: grouped_mm
    dispatch: str | None = None
    #: the part's activation where it differs from the model's (GPT-OSS ``"clamped-swiglu"``), None: the model's
    activation: str | None = None


@dataclass(frozen=True)
class MlpFacts:
    """The block's MLP beyond ``Architecture.mlp_activation`` (mlp.py, norms.py, t5.py)."""

    #: dense and MoE parts of the stack (first dense layers, MoE every n-th layer, shared experts;
    #: architecture/moe.py), None: one MLP kind in every layer
    parts: tuple[MlpPart, ...] | None = None
    #: extra names of the MLP's input Linears (beyond gate_proj, up_proj, fc1, ...)
    input_modules: tuple[str, ...] = ()
    #: the MLP reads the attention's norm output, beside attention (Cohere, Falcon's parallel_attn, Phi)
    parallel_attn_mlp: bool = False
    #: T5's ``feed_forward_proj`` (``"relu"``, ``"gated-gelu"``)
    feed_forward_proj: str = "relu"


@dataclass(frozen=True)
class OutputFacts:
    """The head, the loss and what the model output holds (head.py, loss.py, output.py, vision.py)."""

    #: the model returns fp32 logits (an upcast in its forward)
    fp32_logits: bool = False
    #: the loss upcasts 16-bit logits to fp32 (False: T5's loss stays in the logits' dtype outside autocast)
    loss_upcast: bool = True
    #: Gemma 2/3's final logit softcapping (None: none)
    final_logit_softcapping: float | None = None
    #: an MLM head's dense -> gelu -> LayerNorm before the decoder (BERT, RoBERTa, ModernBERT)
    mlm_head: bool = False
    #: CLIP's shared embedding width of the two towers' projections, None otherwise
    projection_dim: int | None = None


@dataclass(frozen=True)
class DropoutFacts:
    """Dropout masks beyond ``Architecture.attention_dropout`` / ``hidden_dropout`` (hf.py)."""

    #: residual dropout masks per block under ``hidden_dropout`` (2: after attention and after the MLP)
    residual_masks: int = 2
    #: the dropout after the embeddings where the config names it apart (GPT-2 ``embd_pdrop``, StarCoder2 and
    #: ModernBERT ``embedding_dropout``); BERT's embeddings use ``hidden_dropout``
    embedding: float = 0.0


@dataclass(frozen=True)
class SsmFacts:
    """State-space (Mamba) layer sizes (engine/activations/ssm.py, engine/activations/hybrid.py, flops.py)."""

    #: 1: Mamba (selective scan), 2: Mamba-2 (SSD chunked scan)
    version: int
    #: the mixer's inner width (expand x hidden)
    inner: int
    #: the state size N per channel
    state_size: int
    #: the depthwise conv's kernel
    conv_kernel: int
    #: state-space layers in the stack (all of them, or Jamba's Mamba layers)
    layers: int
    #: dt's low rank (Mamba 1, Jamba), 0 where absent
    time_step_rank: int = 0
    #: Mamba-2's heads, their width, the B/C groups and the scan's chunk length (0 for Mamba 1)
    heads: int = 0
    head_dim: int = 0
    groups: int = 0
    chunk_size: int = 0
    #: RMSNorms on dt, B and C between x_proj and the scan (Jamba)
    bcdt_norms: bool = False

    def __getitem__(self, key: str) -> Any:
        """``ssm["inner"]``: the mapping reads of engine/activations/ssm.py and engine/activations/hybrid.py's mixer, kept while
        those modules are edited elsewhere (a field that does not exist is still an AttributeError)."""
        return getattr(self, key)


@dataclass(frozen=True)
class HybridFacts:
    """A stack mixing attention and state-space layers (Jamba; engine/activations/hybrid.py)."""

    #: the hybrid's name (``"jamba"``)
    kind: str
    #: every layer's kind (``"attention"``, ``"mamba"``)
    layer_block_types: tuple[str, ...]
    #: layers whose MLP is a mixture of experts
    moe_layer_indices: tuple[int, ...]


@dataclass(frozen=True)
class LimitFacts:
    """What the planner's rules refuse for this model (rules/model.py)."""

    #: why expert parallelism is refused (Llama 4: every expert takes every token), None: allowed
    expert_parallel_error: str | None = None
    #: why ``all-linear`` LoRA is refused, None: allowed
    lora_all_linear_error: str | None = None
    #: the LoRA target names peft 0.21.2 turns into ``target_parameters`` on this model's fused routed experts and
    #: router (``utils/transformers_weight_conversion.py`` ``_MOE_TARGET_MODULE_MAPPING``: Mixtral's w1/w3 ->
    #: gate_up_proj, w2 -> down_proj; Qwen3-MoE's gate_proj/up_proj -> gate_up_proj, down_proj -> down_proj; gate ->
    #: gate.weight; ``architecture/moe.PEFT_EXPERT_PARAMETERS``): peft's ``ParamWrapper`` makes the merged weight
    #: W + B A on every forward (``engine/activations/mlp.expert_lora``), and no Linear of those names gets one
    lora_expert_targets: tuple[str, ...] = ()
    #: layers per repeating block a pipeline stage must hold a multiple of (Jamba's period)
    block_period: int = 1


@dataclass(frozen=True)
class RuleCoverage:
    """Which traced rule sets cover this family's layout (the engine asks the fact, never the family's name)."""

    #: a trace backs the compiled-step rule (HF Llama-layout decoders: llama, mistral, qwen2;
    #: engine/activations/compiled.py)
    compiled: bool = False
    #: the (precision, method) pairs the compiled trace covers where narrower than the layout's rule (Gemma,
    #: Gemma 3: bf16 full and LoRA; OLMo 2: bf16 full), None: every pair the rule takes
    compiled_recipes: tuple[tuple[str, str], ...] | None = None
    #: litgpt's Llama-style config reproduces the layout (engine/activations/litgpt.py)
    litgpt: bool = False
    #: Liger patches its RMSNorm, SwiGLU and RoPE (``apply_liger_kernel_to_<family>``; liger.py)
    liger: bool = False
    #: encoder-decoder blocks with their own rules (T5; engine/activations/t5.py)
    encoder_decoder: bool = False
    #: the inputs are pixels in the weight dtype (ViT): the patch conv's input, not input ids
    pixel_input: bool = False


@dataclass(frozen=True)
class PatchFacts:
    """A vision model's pixel input and patch grid (ViT, a multimodal model's tower)."""

    #: channels of an image (3)
    num_channels: int = 3
    #: the square image side in pixels (0 where the image is H x W: ``image_hw``)
    image_size: int = 224
    #: Qwen2-VL's (H, W) image after its resize, None: square images of ``image_size``
    image_hw: tuple[int, ...] | None = None
    #: patch side in pixels (0: not given; Qwen2-VL's tower has its ``grid`` instead)
    patch_size: int = 0
    #: patches per image (0: not given; Qwen2-VL's tower has its ``grid`` instead)
    num_patches: int = 0
    #: Qwen2-VL's (t, h, w) patch grid of one image (None: square images)
    grid: tuple[int, ...] | None = None
    #: Qwen2.5-VL's window attention size (None: full attention in every tower layer)
    window_size: int | None = None


@dataclass(frozen=True)
class VisionFacts:
    """A multimodal model's vision tower and projector (engine/multimodal/tower.py); one subclass per kind adds its own."""

    #: which model's vision path: ``"clip"``, ``"llava"``, ``"gemma3"`` (this class), or a subclass's kind
    kind: str
    #: the tower, an Architecture of its own (architecture/vision.py); typed Any because architecture/types.py
    #: imports this module (no import circle)
    tower: Any
    #: tokens one image adds to the language model's sequence (0 for CLIP)
    tokens_per_image: int
    #: images per sample when the scenario leaves ``images_per_sample`` unset
    images_default: int
    #: the tower is frozen when the scenario leaves ``freeze_vision`` unset (the model's recipe)
    freeze_default: bool
    #: tower layers whose output is used (LLaVA reads ``vision_feature_layer``; the rest save for nothing)
    layers_used: int
    #: the projector's sizes (``in``, ``hidden``, ...), None: no projector (CLIP)
    projector: Mapping[str, Any] | None = None
    #: an untraced part the caveats name (Llama 4's one tile per image), None: none
    caveat: str | None = None
    #: the image size the token count assumes (Qwen2-VL, LLaVA-NeXT), None: fixed by the tower
    image_note: str | None = None
    #: token_type_ids make HF build a mask for every layer (Gemma 3 multimodal)
    image_mask_all_layers: bool = False
    #: how the projector maps tower rows to the language model: ``"mlp"`` (linear_1 -> gelu -> linear_2),
    #: ``"norm-linear"`` (a soft-embedding RMSNorm and one matmul), ``"pixel-shuffle"`` (an adapter, one Linear)
    projector_layout: str = "mlp"
    #: the trained tower's norm at its edge (``"pre_layrnorm"`` on the embeddings, or ``"post_layernorm"``)
    edge_norm: str = "pre_layrnorm"
    #: the model output holds the tower's hidden states (``image_outputs``) through the loss
    output_holds_tower_states: bool = True
    #: under LoRA the model output also holds the hidden state the projector read (LLaVA's vision_feature_layer)
    output_holds_feature_layer: bool = False
    #: a frozen tower's forward tensors stay referenced by the graph under HF checkpointing (LLaVA; traced)
    graph_keeps_frozen_tower: bool = False
    #: two towers and a contrastive head: input ids without labels, no image tokens in the sequence (CLIP)
    contrastive_head: bool = False
    #: every image is padded or resized to the tower's square side (LLaVA 1.5): the caveats name it
    resized_to_tower: bool = False

    @property
    def patches(self) -> PatchFacts:
        """The tower's pixel input and patch grid (every tower declares them: architecture/vision.py)."""
        p = self.tower.facts.patches
        assert p is not None, "a vision tower declares image_size"
        return p


@dataclass(frozen=True)
class ClipVision(VisionFacts):
    """CLIP: the image and text towers side by side, joined by the contrastive head (engine/multimodal/tower.py)."""

    output_holds_tower_states: bool = False
    contrastive_head: bool = True


@dataclass(frozen=True)
class LlavaVision(VisionFacts):
    """LLaVA 1.5: a CLIP tower read at ``vision_feature_layer``, a two-Linear projector (engine/multimodal/tower.py)."""

    output_holds_feature_layer: bool = True
    graph_keeps_frozen_tower: bool = True
    resized_to_tower: bool = True


@dataclass(frozen=True)
class Gemma3Vision(VisionFacts):
    """Gemma 3: a SigLIP tower, pooled rows through a soft-embedding RMSNorm and one matmul (engine/multimodal/tower.py)."""

    projector_layout: str = "norm-linear"
    edge_norm: str = "post_layernorm"


@dataclass(frozen=True)
class LlavaNextVision(VisionFacts):
    """LLaVA-NeXT's anyres tiling: LLaVA's rules on every crop (engine/multimodal/llava_next.py)."""

    #: crops per image (the base image and its tiles)
    crops_per_image: int = 1
    #: projector rows per crop ((s / p)^2)
    tokens_per_crop: int = 0


@dataclass(frozen=True)
class QwenVision(VisionFacts):
    """Qwen2(.5)-VL's any-size images and patch merger (engine/multimodal/qwen_vl.py)."""

    #: input values per patch (channels x temporal patch x patch side^2)
    pixels_per_patch: int = 0


@dataclass(frozen=True)
class Llama4Vision(VisionFacts):
    """Llama 4's pixel-shuffle adapter and one-Linear projector (engine/multimodal/llama4.py)."""

    projector_layout: str = "pixel-shuffle"
    output_holds_tower_states: bool = False

    #: the adapter's widths (``shuffled``, ``inner``, ``out``)
    adapter: Mapping[str, int] = field(default_factory=dict)
    #: image rows after the pixel shuffle, per image
    feature_rows: int = 0


@dataclass(frozen=True)
class ModelFacts:
    """Every fact a family declares beyond the Architecture's shape fields (``Architecture.facts``)."""

    #: the transformers class the family models (``LlamaForCausalLM``), named in messages
    hf_class: str = ""
    norm: NormFacts = NormFacts()
    attention: AttentionFacts = AttentionFacts()
    position: PositionFacts = PositionFacts()
    linear: LinearFacts = LinearFacts()
    mlp: MlpFacts = MlpFacts()
    output: OutputFacts = OutputFacts()
    dropout: DropoutFacts = DropoutFacts()
    limits: LimitFacts = LimitFacts()
    coverage: RuleCoverage = RuleCoverage()
    #: a vision model's pixels and patches (ViT, a tower), None: no pixel input
    patches: PatchFacts | None = None
    #: state-space layer sizes (Mamba, Mamba-2, Jamba), None: no state-space layer
    ssm: SsmFacts | None = None
    #: a hybrid attention + state-space stack, None: not hybrid
    hybrid: HybridFacts | None = None
    #: a multimodal model's vision tower and projector, None: a text (or single-tower) model
    vision: VisionFacts | None = None
    #: fitted activation terms of a transformers type no family models (calibrate.SavedBytesSource), None:
    #: the rules derive them
    calibration: Any = None


#: ``extra`` keys read into a fact (the family writes them; ``model_facts`` reads each once).
FACT_KEYS = frozenset(
    {
        "hf_class", "norms_per_layer", "norm_inputs", "first_layer_norms", "norm_weight_fp32", "norm_centred_copy",
        "norm_one_plus_weight", "post_norms", "post_norms_16bit", "first_norm_after_attention", "qk_norm",
        "qk_norm_layers", "qk_layernorm", "embedding_norm", "final_norm",
        "sdpa", "attention_note", "attention_output_modules", "softmax_in_compute_dtype", "softmax_compute_dtype",
        "eager_softmax_dtype", "mla", "sdpa_math_fallback", "fused_qkv_kept",
        "fused_qkv_kept_without_cache", "sdpa_fused_qkv_view",
        "sdpa_float_mask", "sdpa_output_copy", "sdpa_sliding_mask", "sliding_layers", "sliding_window",
        "layer_types", "attention_sinks", "attn_logit_softcapping", "attention_chunk_size", "chunked_layers",
        "use_cache", "attention_layers",
        "rotary_dim", "rope_kinds", "rope_keeps_dtype", "rope_layer0", "alibi_bias_saved",
        "unfused_bias", "autocast_expert_copies", "conv1d",
        "mlp_parts", "mlp_input_modules", "parallel_attn_mlp", "feed_forward_proj",
        "fp32_logits", "loss_upcast", "final_logit_softcapping", "mlm_head", "projection_dim",
        "residual_dropout_masks", "embd_pdrop", "embedding_dropout",
        "hybrid", "layer_block_types", "moe_layer_indices",
        "expert_parallel_error", "lora_all_linear_error", "lora_expert_targets", "block_period",
        "coverage", "compiled_recipes", "use_sliding_window",
        "num_channels", "image_size", "patch_size", "num_patches", "grid", "window_size",
        "ssm", "vision", "calibration",
    }
)  # fmt: skip

#: ``extra`` keys no engine rule reads: config values kept for export, trace, tests and display.
KEPT_KEYS = frozenset(
    {
        "alibi", "attn_temperature_tuning", "bias", "decoder_norms_per_layer", "decoder_sparse_step",
        "dense_intermediate_size", "embedding_scale", "encoder_causal",
        "experts_dtype_note", "first_k_dense_replace", "fp32_router", "fullatt_block_indexes", "hidden_act",
        "hidden_activation", "layer_norm_eps", "layer_pattern", "local_attention", "logit_scale",
        "max_position_embeddings", "max_window_layers", "meta_build_seconds", "mlp_only_layers", "moe_intermediate_size", "moe_layers",
        "mtp_layers_not_built", "multi_query", "n_group", "n_positions", "n_shared_experts",
        "new_decoder_architecture", "norm_bias", "norm_class", "norm_eps", "norm_epsilon", "norm_topk_prob",
        "num_labels", "objective", "original_max_position_embeddings", "pad_token_id", "parallel_attn",
        "parallel_residual", "partial_rotary_factor", "qkv_bias", "qkv_kv_heads", "query_pre_attn_scalar",
        "relative_attention_max_distance", "relative_attention_num_buckets", "residual_in_fp32", "resized",
        "rms_norm_eps", "rope_head_dim", "rope_layers", "rope_local_base_freq", "rope_parameters", "rope_scaling",
        "rope_theta", "routed_scaling_factor", "router_aux_loss_coef", "scale_decoder_outputs", "shared_experts",
        "sparse_prediction", "swiglu_alpha", "swiglu_limit", "text_family", "text_model_type", "text_vocab_size",
        "tied_head", "topk_group", "topk_method", "type_vocab_size", "use_bias", "use_qk_norm",
    }
)  # fmt: skip

#: The rule sets a family's ``extra["coverage"]`` may name (``RuleCoverage`` fields).
TRACED_RULES = frozenset(f.name for f in dataclasses.fields(RuleCoverage) if f.type == "bool")

_VISION_KINDS: dict[str, type[VisionFacts]] = {
    "clip": ClipVision,
    "llava": LlavaVision,
    "gemma3": Gemma3Vision,
    "llava_next": LlavaNextVision,
    "qwen2_vl": QwenVision,
    "llama4": Llama4Vision,
}


def _vision(v: Mapping[str, Any] | None) -> VisionFacts | None:
    """The vision dict a multimodal family writes, as its kind's VisionFacts (every key declared by a field)."""
    if not v:
        return None
    cls = _VISION_KINDS[v["kind"]]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: val for k, val in v.items() if k in names})


def model_facts(extra: Mapping[str, Any], model: str) -> ModelFacts:
    """``extra`` read into typed facts; ValueError naming a key no fact or kept value declares (a misspelling)."""
    unknown = sorted(set(extra) - FACT_KEYS - KEPT_KEYS)
    if unknown:
        raise ValueError(
            f"{model}: Architecture.extra has undeclared key(s) {unknown} (architecture/facts.py)"
        )

    def x(key: str, default: Any = None) -> Any:
        return extra.get(key, default)

    norms = x("norms_per_layer", 2)
    rules = set(x("coverage", ()))
    if not rules <= TRACED_RULES:
        raise ValueError(f"{model}: coverage {sorted(rules - TRACED_RULES)} not in {sorted(TRACED_RULES)}")
    hybrid, size = x("hybrid"), x("image_size")
    return ModelFacts(
        hf_class=x("hf_class", ""),
        norm=NormFacts(
            per_layer=norms,
            inputs=x("norm_inputs", norms),
            first_layer=x("first_layer_norms", norms),
            weight_fp32=bool(x("norm_weight_fp32")),
            centred_copy=bool(x("norm_centred_copy")),
            one_plus_weight=bool(x("norm_one_plus_weight")),
            post_norms=bool(x("post_norms")),
            post_norms_16bit=x("post_norms_16bit", 0),
            first_after_attention=bool(x("first_norm_after_attention")),
            qk=x("qk_norm"),
            qk_layers=x("qk_norm_layers"),
            qk_layernorm=bool(x("qk_layernorm")),
            embedding=bool(x("embedding_norm")),
            final=bool(x("final_norm")),
        ),
        attention=AttentionFacts(
            sdpa=x("sdpa") is not False,
            note=x("attention_note"),
            output_modules=tuple(x("attention_output_modules", ())),
            softmax_upcast=not x("softmax_in_compute_dtype")
            and not x("softmax_compute_dtype")
            and x("eager_softmax_dtype") != "compute",
            mla=None if not x("mla") else MlaFacts(**x("mla")),
            sdpa_math_fallback=bool(x("sdpa_math_fallback")),
            fused_qkv_kept=bool(x("fused_qkv_kept")),
            fused_qkv_kept_without_cache=bool(x("fused_qkv_kept_without_cache")),
            sdpa_fused_qkv_view=bool(x("sdpa_fused_qkv_view")),
            sdpa_float_mask=bool(x("sdpa_float_mask")),
            sdpa_output_copy=bool(x("sdpa_output_copy")),
            sliding_mask=x("sdpa_sliding_mask"),
            sliding_layers=x("sliding_layers", 0),
            sliding_window=x("sliding_window"),
            sliding_window_used=x("use_sliding_window") is not False,
            layer_types=None if x("layer_types") is None else tuple(x("layer_types")),
            sinks=bool(x("attention_sinks")),
            logit_softcapping=x("attn_logit_softcapping"),
            chunk_size=x("attention_chunk_size"),
            chunked_layers=x("chunked_layers"),
            use_cache=x("use_cache", True),
            layers=x("attention_layers"),
        ),
        position=PositionFacts(
            rotary_dim=x("rotary_dim"),
            rope_kinds=x("rope_kinds", 1),
            rope_keeps_dtype=bool(x("rope_keeps_dtype")),
            rope_layer0=x("rope_layer0", True),
            alibi_bias_saved=bool(x("alibi_bias_saved")),
        ),
        linear=LinearFacts(
            unfused_bias=bool(x("unfused_bias")),
            autocast_expert_copies=bool(x("autocast_expert_copies")),
            conv1d=bool(x("conv1d")),
        ),
        mlp=MlpFacts(
            parts=None if not x("mlp_parts") else tuple(MlpPart(**p) for p in x("mlp_parts")),
            input_modules=tuple(x("mlp_input_modules", ())),
            parallel_attn_mlp=bool(x("parallel_attn_mlp")),
            feed_forward_proj=x("feed_forward_proj", "relu"),
        ),
        output=OutputFacts(
            fp32_logits=bool(x("fp32_logits")),
            loss_upcast=x("loss_upcast", True),
            final_logit_softcapping=x("final_logit_softcapping"),
            mlm_head=bool(x("mlm_head")),
            projection_dim=x("projection_dim"),
        ),
        dropout=DropoutFacts(
            residual_masks=x("residual_dropout_masks", 2),
            embedding=float(x("embd_pdrop") or x("embedding_dropout") or 0.0),
        ),
        limits=LimitFacts(
            expert_parallel_error=x("expert_parallel_error"),
            lora_all_linear_error=x("lora_all_linear_error"),
            lora_expert_targets=tuple(x("lora_expert_targets") or ()),
            block_period=x("block_period", 1),
        ),
        coverage=RuleCoverage(
            **dict.fromkeys(rules, True),
            compiled_recipes=None
            if x("compiled_recipes") is None
            else tuple(map(tuple, x("compiled_recipes"))),
        ),
        patches=None
        if "image_size" not in extra
        else PatchFacts(
            num_channels=x("num_channels", 3),
            image_size=size if isinstance(size, int) else 0,
            image_hw=None if isinstance(size, int) else tuple(size),
            patch_size=x("patch_size", 0),
            num_patches=x("num_patches", 0),
            grid=None if x("grid") is None else tuple(x("grid")),
            window_size=x("window_size"),
        ),
        ssm=SsmFacts(**x("ssm")) if x("ssm") else None,
        hybrid=None
        if not hybrid
        else HybridFacts(hybrid, tuple(x("layer_block_types")), tuple(x("moe_layer_indices"))),
        vision=_vision(x("vision")),
        calibration=x("calibration"),
    )
