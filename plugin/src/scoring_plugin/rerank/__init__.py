"""Reranking: one query against many documents, three scoring modes behind one interface."""
