"""The PLE transformer (Gemma 3n / Gemma 4 layout), its seeded init and parameter accounting."""

from plelab.model.init import build_model, init_weights
from plelab.model.transformer import CausalLMOutput, DecoderLayer, PLECausalLM, PLETextModel

__all__ = ["CausalLMOutput", "DecoderLayer", "PLECausalLM", "PLETextModel", "build_model", "init_weights"]
