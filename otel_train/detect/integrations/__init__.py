"""Framework integrations: Lightning and Hugging Face callbacks on top of automatic detection."""
