"""The knowledge layer's errors: one root, `KnowledgeError`, with subclasses that
carry what a caller needs to say what went wrong."""

from __future__ import annotations

__all__ = [
    "CollectionNotAllowedError",
    "DocumentOwnershipError",
    "DocumentParseError",
    "EmbeddingError",
    "InvalidCollectionNameError",
    "InvalidDocumentIdError",
    "GraphNotFoundError",
    "GraphStoreError",
    "InvalidFilterError",
    "KnowledgeError",
    "OntologyError",
    "OntologyMismatchError",
    "OntologyViolationError",
    "StoreLockedError",
    "UnknownCollectionError",
    "VectorStoreError",
]


class KnowledgeError(Exception):
    """Root of the knowledge layer's errors."""


class UnknownCollectionError(KnowledgeError):
    """No collection of that name.

    Attributes:
        name: the collection asked for.
        known: the collections that exist.
    """

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        listed = ", ".join(sorted(known)) or "none yet; ingest documents to create one"
        super().__init__(f"unknown collection {name!r} (collections: {listed})")


class CollectionNotAllowedError(KnowledgeError):
    """The caller's tenant may not use this collection."""

    def __init__(self, name: str, tenant: str | None) -> None:
        self.name = name
        self.tenant = tenant
        super().__init__(f"tenant {tenant!r} may not use collection {name!r}")


class InvalidCollectionNameError(KnowledgeError):
    """A collection name outside ``[A-Za-z0-9_-]{1,64}``."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"invalid collection name {name!r}: use 1 to 64 letters, digits, '_' or '-'"
        )


class InvalidDocumentIdError(KnowledgeError):
    """A document id no store can hold as given (see `check_document_id`).

    Attributes:
        doc_id: the id.
        reason: what is wrong with it.
    """

    def __init__(self, doc_id: str, reason: str) -> None:
        self.doc_id = doc_id
        self.reason = reason
        super().__init__(f"invalid document id {doc_id!r}: {reason}")


class DocumentOwnershipError(KnowledgeError):
    """A write that would replace or delete documents another tenant (or the operator)
    wrote. Nothing was changed.

    Attributes:
        collection: the collection.
        tenant: the tenant that asked.
        doc_ids: the documents it may not replace or delete.
    """

    def __init__(self, collection: str, tenant: str | None, doc_ids: list[str]) -> None:
        self.collection = collection
        self.tenant = tenant
        self.doc_ids = doc_ids
        shown = ", ".join(repr(d) for d in doc_ids[:10]) + (f" and {len(doc_ids) - 10} more" if len(doc_ids) > 10 else "")
        super().__init__(
            f"tenant {tenant!r} may not replace or delete documents written by another tenant (or the operator) "
            f"in collection {collection!r}: {shown}; nothing was changed"
        )


class InvalidFilterError(KnowledgeError):
    """A search filter no store can apply as asked (a metadata key or value outside
    what `SearchFilter` accepts).

    Attributes:
        field: the filter field, e.g. ``metadata["year"]``.
        reason: what is wrong with it.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"filter {field}: {reason}")


class DocumentParseError(KnowledgeError):
    """A source file could not be turned into text.

    Attributes:
        source: the file (or record) that failed.
        reason: why.
    """

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


class EmbeddingError(KnowledgeError):
    """The embedder failed (model missing, backend down, wrong dimensions)."""


class VectorStoreError(KnowledgeError):
    """The vector store's engine failed an operation (a disk error, a corrupt shard, a
    vector of the wrong size); the message is the engine's."""


class StoreLockedError(KnowledgeError):
    """The embedded vector store's directory is in use by another process (one process
    per directory, for the Qdrant Edge store as for qdrant-client's local mode).

    Attributes:
        path: the directory.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"the vector store at {path} is in use by another process (the embedded store "
            "allows one process per directory)"
        )


class OntologyError(KnowledgeError):
    """An ontology file that cannot be read or does not validate.

    Attributes:
        source: the file (or ``<ontology>`` for text given directly).
        problems: ``field: message`` for each field that failed.
    """

    def __init__(self, message: str, *, source: str, problems: list[str] | None = None) -> None:
        self.source = source
        self.problems = problems or []
        super().__init__(message)


class OntologyMismatchError(KnowledgeError):
    """A collection's graph is bound to another ontology than the one given.

    Attributes:
        collection: the collection.
        bound: the ontology it is bound to (``name (fingerprint)``).
        given: the one given.
    """

    def __init__(self, collection: str, bound: str, given: str) -> None:
        self.collection = collection
        self.bound = bound
        self.given = given
        super().__init__(
            f"collection {collection!r} has a knowledge graph bound to ontology {bound}; "
            f"the ontology given is {given}: use a new collection for a new ontology"
        )


class GraphStoreError(KnowledgeError):
    """The graph database failed (unreachable, timed out, an engine error): a 503."""


class GraphNotFoundError(KnowledgeError):
    """The collection has no knowledge graph.

    Attributes:
        collection: the collection asked for.
        known: the collections that have one.
    """

    def __init__(self, collection: str, known: list[str]) -> None:
        self.collection = collection
        self.known = known
        listed = ", ".join(sorted(known)) or "none yet"
        super().__init__(f"{self.unlisted()[:-1]}; graphs: {listed}")

    def unlisted(self) -> str:
        """The message without the other graphs' names (for callers who may not see
        every collection: an HTTP client of a tenant)."""
        return (
            f"collection {self.collection!r} has no knowledge graph; build one with `switchyard ingest PATH "
            f"--collection {self.collection} --graph --ontology FILE` or `switchyard graph import`."
        )


class OntologyViolationError(KnowledgeError):
    """A write the collection's ontology does not allow (nothing was written).

    Attributes:
        reasons: what was not allowed, one line each.
    """

    def __init__(self, collection: str, reasons: list[str]) -> None:
        self.collection = collection
        self.reasons = reasons
        super().__init__(f"not allowed by the ontology of collection {collection!r}: " + "; ".join(reasons[:10]))
