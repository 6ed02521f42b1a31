"""Prompts of the ``chat`` graph."""

__all__ = ["SYSTEM_PROMPT"]

SYSTEM_PROMPT = "You are a helpful assistant. Answer clearly and concisely."
"""Used when the conversation brings no system message of its own."""
