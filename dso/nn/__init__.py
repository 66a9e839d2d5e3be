"""The model: the decoder, its named shapes, and its export as a Hugging Face checkpoint."""
