"""Model families: one module per family, each registering its builders with
``memsim_widget.architecture.register_family`` (HF ``model_type`` -> Architecture).

A new family is one module here plus its line in ``MODEL_TYPES`` (and one test). The modules are not imported
here: ``memsim_widget.architecture`` hands this table to its registry (``FAMILIES``), which imports a family's
module the first time one of its model types is built, so a process loads only the families it uses
(tests/families/test_family_modules.py holds the table equal to what each module registers).
Modules whose name starts with ``_`` hold helpers shared by several families and register nothing.
"""

from __future__ import annotations

#: Each family module of this package and the HF ``model_type`` values it registers.
MODEL_TYPES: dict[str, tuple[str, ...]] = {
    "llama": ("llama",),
    "mistral": ("mistral",),
    "qwen2": ("qwen2",),
    "mixtral": ("mixtral",),
    "gemma": ("gemma",),
    "gemma2": ("gemma2",),
    "phi3": ("phi3",),
    "gpt2": ("gpt2",),
    "bert": ("bert",),
    "t5": ("t5",),
    "vit": ("vit",),
    "gpt_neox": ("gpt_neox",),
    "phi": ("phi",),
    "qwen3": ("qwen3",),
    "qwen3_moe": ("qwen3_moe",),
    "olmo2": ("olmo2",),
    "deepseek": ("deepseek_v3", "deepseek_v2"),
    "glm4": ("glm4",),
    "cohere": ("cohere",),
    "starcoder2": ("starcoder2",),
    "roberta": ("roberta", "xlm-roberta", "camembert"),
    "modernbert": ("modernbert",),
    "gemma3": ("gemma3_text", "gemma3"),
    "llama4": ("llama4_text",),
    "llama4_vlm": ("llama4",),
    "gpt_oss": ("gpt_oss",),
    "falcon": ("falcon",),
    # state-space models (Mamba, Mamba-2, Jamba)
    "mamba": ("mamba", "mamba2"),
    "jamba": ("jamba",),
    # multimodal (vision tower + language model): CLIP, LLaVA, LLaVA-NeXT, Qwen2-VL / Qwen2.5-VL
    "clip": ("clip",),
    "llava": ("llava",),
    "qwen2_vl": ("qwen2_vl", "qwen2_5_vl"),
    "llava_next": ("llava_next",),
}

#: The family modules of this package.
MODULES: tuple[str, ...] = tuple(MODEL_TYPES)


def module_of_type() -> dict[str, str]:
    """HF ``model_type`` -> the dotted name of the family module that registers it."""
    return {mt: f"{__name__}.{module}" for module, types in MODEL_TYPES.items() for mt in types}
