"""The model layer: loading (full, LoRA, QLoRA) and the reference, log-probs of completions,
FSDP2 sharding, the weights an engine receives, and export to a Hugging Face directory."""
