"""Entry points vLLM discovers through ``importlib.metadata`` (see ``pyproject.toml``)."""

from __future__ import annotations

import logging


def register_models() -> None:
    """``vllm.general_plugins``: runs in every vLLM process before models are resolved."""
    from scoring_plugin.models import register

    log_through_vllm()
    register()


def log_through_vllm() -> None:
    """Hangs the plugin's loggers under vLLM's where the process configured no logging of its
    own: vLLM's engine-core process sets up only the ``vllm`` logger (after plugins load), so
    the model's start-up decisions (kernels chosen by timing on the GPU) would go unseen there."""
    plugin = logging.getLogger("scoring_plugin")
    if plugin.handlers or logging.getLogger().handlers:
        return  # the host process set logging up (our server, pytest)
    plugin.parent = logging.getLogger("vllm")  # its handlers and level, whenever vLLM sets them


def reranker_io_processor() -> str:
    """``vllm.io_processor_plugins``: vLLM imports the returned class lazily."""
    return "scoring_plugin.io_processors.reranker.RerankerIOProcessor"


def absa_io_processor() -> str:
    """``vllm.io_processor_plugins``: (aspect, review) pairs to labels and evidence spans."""
    return "scoring_plugin.io_processors.absa.AbsaIOProcessor"


def image_ranker_io_processor() -> str:
    """``vllm.io_processor_plugins``: a query and images to images ranked by score."""
    return "scoring_plugin.io_processors.image_ranker.ImageRankerIOProcessor"
