"""Question-answer data: the example type, loaders for common formats, the synthetic world."""

from llds.data.example import QAExample

__all__ = ["QAExample"]
