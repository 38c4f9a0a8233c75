"""Each configured model's checkpoint checked against its kind before any engine starts.

An engine takes tens of seconds to load (minutes for a large model on a GPU); a kind that does
not fit its checkpoint must not cost that, nor reach SERVING and fail every call. The rules
live in the plugin (:mod:`scoring_plugin.checkpoint_fit`), which applies them again when vLLM
loads an IO processor without our server.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from transformers import AutoTokenizer

from scoring_plugin.checkpoint_fit import CheckpointMismatch, check_fit
from scoring_server.config import ModelKind, ModelSettings


logger = logging.getLogger(__name__)


class UnservableModel(RuntimeError):
    """A configured model that cannot serve; the message says which and why."""


def check_checkpoints(models: list[ModelSettings]) -> None:
    for model in models:
        try:
            config = model.served_config()
        except (OSError, json.JSONDecodeError) as error:
            raise UnservableModel(f"model {model.name!r}: cannot read {Path(model.path) / 'config.json'}: {error}") from None
        try:
            check_fit(model.name, model.kind.value, config, _tokenizer(model))
        except CheckpointMismatch as error:
            raise UnservableModel(str(error)) from None
        conversion = model.conversion()
        if conversion is not None:
            logger.info("model %s: %s", model.name, conversion.reason)
        unpacked = model.unpacked_reason()
        if unpacked is not None:
            logger.warning("model %s: %s", model.name, unpacked)


def _tokenizer(model: ModelSettings) -> object | None:
    """Image rankers' queries go through the text tower's tokenizer, which their settings
    check; the other kinds' prompts depend on the tokenizer's layout."""
    if model.kind is ModelKind.IMAGE_RANK:
        return None
    source = str(model.engine_args.get("tokenizer") or model.path)
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise UnservableModel(f"model {model.name!r}: cannot load the tokenizer from {source}: {error}") from None
