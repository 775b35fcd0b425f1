"""llds: GRPO for LLM search agents, with LLDS regularization and LLD diagnostics."""

__version__ = "0.1.0"
