"""Model families beyond the ones in ``memsim_widget/architecture.py``: one module per family, each registering
its builders with ``memsim_widget.architecture.register_family`` (HF ``model_type`` -> Architecture).

A new family is one module here plus its name in ``MODULES`` (and one test); ``architecture.py`` imports this
package at its end, so every registered ``model_type`` is known wherever an Architecture is built.
"""

from __future__ import annotations

import importlib

#: The family modules of this package, imported in order (each registers its model types).
MODULES: tuple[str, ...] = (
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
    "gpt_oss",
    "falcon",
    # multimodal (vision tower + language model): CLIP, LLaVA
    "clip",
    "llava",
)

for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")
