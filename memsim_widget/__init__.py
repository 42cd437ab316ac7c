"""memsim-widget: simulate the GPU memory of training and fine-tuning deep-learning models."""

from __future__ import annotations

__version__ = "0.1.0"
