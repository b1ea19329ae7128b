"""plelab: a lab for Per-Layer Embeddings (PLE) in transformer language models."""

__version__ = "0.1.0"
