"""Prompts of the ``rag`` graph."""

__all__ = ["ANSWER_PROMPT", "NO_ANSWER_TEXT", "REWRITE_PROMPT", "format_sources"]

ANSWER_PROMPT = """You answer questions using only the numbered sources below.
Cite the sources you use with their numbers in square brackets, like [1] or [2].
If the sources do not contain the answer, say that you do not know.

Sources:
{sources}"""

REWRITE_PROMPT = """Rewrite the user's last question as one standalone search query, using the conversation
for context. Reply with the query only.

Conversation:
{conversation}

Standalone query:"""

NO_ANSWER_TEXT = (
    "I found no relevant information in the knowledge base (collection '{collection}') to answer this question."
)


def format_sources(sources: list[dict[str, object]]) -> str:
    lines = []
    for source in sources:
        title = source.get("title") or source.get("doc_id")
        text = " ".join(str(source["text"]).split())
        lines.append(f"[{source['index']}] ({title}) {text}")
    return "\n\n".join(lines)
