"""Model families: one module per family, each registering its builders with
``memsim_widget.architecture.register_family`` (HF ``model_type`` -> Architecture).

A new family is one module here plus its name in ``MODULES`` (and one test); ``memsim_widget.architecture``
imports this package at its end, so every registered ``model_type`` is known wherever an Architecture is built.
Modules whose name starts with ``_`` hold helpers shared by several families and register nothing.
"""

from __future__ import annotations

import importlib

#: The family modules of this package, imported in order (each registers its model types).
MODULES: tuple[str, ...] = (
    "llama",
    "mistral",
    "qwen2",
    "mixtral",
    "gemma",
    "gemma2",
    "phi3",
    "gpt2",
    "bert",
    "t5",
    "vit",
    "gpt_neox",
    "phi",
    "qwen3",
    "qwen3_moe",
    "olmo2",
    "deepseek",
    "glm4",
    "cohere",
    "starcoder2",
    "roberta",
    "modernbert",
    "gemma3",
    "llama4",
    "llama4_vlm",
    "gpt_oss",
    "falcon",
    # state-space models (Mamba, Mamba-2, Jamba)
    "mamba",
    "jamba",
    # multimodal (vision tower + language model): CLIP, LLaVA, LLaVA-NeXT, Qwen2-VL / Qwen2.5-VL
    "clip",
    "llava",
    "qwen2_vl",
    "llava_next",
)

for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")
