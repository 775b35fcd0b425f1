"""The policy being trained: loading it, its forward pass and log-probs, mixed precision, the
bf16 sampling copy, and LoRA adapters."""
