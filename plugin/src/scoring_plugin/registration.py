"""Entry points vLLM discovers through ``importlib.metadata`` (see ``pyproject.toml``)."""

from __future__ import annotations


def register_models() -> None:
    """``vllm.general_plugins``: runs in every vLLM process before models are resolved."""
    from scoring_plugin.models import register

    register()


def reranker_io_processor() -> str:
    """``vllm.io_processor_plugins``: vLLM imports the returned class lazily."""
    return "scoring_plugin.io_processors.reranker.RerankerIOProcessor"


def absa_io_processor() -> str:
    """``vllm.io_processor_plugins``: (aspect, review) pairs to labels and evidence spans."""
    return "scoring_plugin.io_processors.absa.AbsaIOProcessor"


def image_ranker_io_processor() -> str:
    """``vllm.io_processor_plugins``: a query and images to images ranked by score."""
    return "scoring_plugin.io_processors.image_ranker.ImageRankerIOProcessor"
