"""``/v1/collections``: the knowledge base over HTTP (list, upload, delete, search)."""
