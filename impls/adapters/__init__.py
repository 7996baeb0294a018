"""Adapters for third-party implementations: Liger-Kernel, Cut Cross-Entropy, Megatron-core, torch's own, TransformerEngine."""
