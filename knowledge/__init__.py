"""Knowledge: ingestion, chunking, embeddings, vector and graph stores, ontology.

Sits on ``gateway``; ``tools`` and ``graphs`` build on it. Empty until the knowledge
issues land: the package exists now so that the layer contract is enforced from the
first commit.
"""
