"""Visual PLE: image–caption data, visual IDs (tokenizers), their metrics, and the multimodal model."""
