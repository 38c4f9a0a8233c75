"""Each configured model's checkpoint checked against its kind before any engine starts.

An engine takes tens of seconds to load (minutes for a large model on a GPU); a kind that does
not fit its checkpoint must not cost that, nor reach SERVING and fail every call. The rules
live in the plugin (:mod:`scoring_plugin.checkpoint_fit`), which applies them again when vLLM
loads an IO processor without our server.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import vllm
from transformers import AutoTokenizer

from scoring_plugin.checkpoint_fit import CheckpointMismatch, check_fit
from scoring_server.config import ModelKind, ModelSettings


logger = logging.getLogger(__name__)


class UnservableModel(RuntimeError):
    """A configured model that cannot serve; the message says which and why."""


# vLLM's refusal of a checkpoint whose architectures nothing implements: not vLLM itself, not a
# registered plugin, not vLLM's Transformers backend (model_executor/models/registry.py). Its
# message goes on to list every architecture vLLM knows, several hundred names on one line.
_NO_IMPLEMENTATION = re.compile(r"Model architectures (\[[^\]]*\]) are not supported for now")


@contextmanager
def vllm_refusals(model: ModelSettings) -> Iterator[None]:
    """Around the creation of a model's engine configuration: vLLM's refusal of the checkpoint's
    architecture becomes one line naming the model. Only vLLM can decide it (its registry, the
    plugin's models, the Transformers backend's compatibility rules and the architecture names it
    converts), so the check is vLLM's own, made before any weights load, not a copy of its rules."""
    try:
        yield
    except ValueError as error:
        found = _NO_IMPLEMENTATION.search(str(error))
        if found is None:
            raise
        raise UnservableModel(
            f"model {model.name!r} cannot be served: vLLM {vllm.__version__} has no implementation of its "
            f"architectures {found.group(1)} (in vLLM, in the scoring plugin or through vLLM's Transformers backend)"
        ) from None


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
