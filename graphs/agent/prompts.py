"""Prompts of the ``agent`` graph."""

__all__ = ["SYSTEM_PROMPT", "system_prompt"]

SYSTEM_PROMPT = """You are a helpful assistant that can call tools.
Call a tool when it helps answer the question; otherwise answer directly.
After a tool result arrives, answer the user using it."""


def system_prompt(examples: list[str]) -> str:
    if not examples:
        return SYSTEM_PROMPT + "\nNo tools are available now: answer directly."
    return SYSTEM_PROMPT + "\n\nExamples of tool calls:\n" + "\n".join(f"- {e}" for e in examples)
