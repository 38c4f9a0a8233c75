"""Whether a checkpoint can serve a model kind, decided before any request arrives.

A kind that does not fit its checkpoint (an ABSA kind on a plain classifier, a cross-encoder
mode on a bare encoder, a rerank classifier with labels nobody said how to score) would start,
report SERVING, and then fail every call. So the server checks each model before its engine
starts, and the IO processors check again when vLLM loads them (stock ``vllm serve``): one
message naming the model, what the kind needs and what the checkpoint has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from scoring_plugin.image_rank.device_pixels import device_problem
from scoring_plugin.image_rank.settings import CONFIG_KEY, ImageRankSettings
from scoring_plugin.models import ABSA_ARCHITECTURES, IMAGE_RANK_ARCHITECTURE
from scoring_plugin.packed.families.registry import packed_architectures
from scoring_plugin.rerank.prompts import SpecialTokenLayout
from scoring_plugin.rerank.settings import RerankMode, RerankSettings

_ABSA = {*ABSA_ARCHITECTURES, *packed_architectures("absa")}


class CheckpointMismatch(ValueError):
    def __init__(self, model: str, kind: str, needs: str, has: str) -> None:
        self.model, self.kind, self.needs, self.has = model, kind, needs, has
        super().__init__(f"model {model!r} cannot be served as {kind}: it needs {needs}; the checkpoint has {has}")


def check_fit(model: str, kind: str, config: dict[str, Any], tokenizer: Any | None) -> None:
    """Raises CheckpointMismatch unless a checkpoint (its config with the deployment's
    overrides applied, and its tokenizer, when there is one) can serve `kind`."""
    architectures = [str(a) for a in config.get("architectures") or []]
    shown = f"architectures {architectures or 'none'}"

    def refuse(needs: str, has: str = shown) -> NoReturn:
        raise CheckpointMismatch(model, kind, needs, has)

    if kind == "image_rank":
        if IMAGE_RANK_ARCHITECTURE not in architectures:
            refuse(f"the {IMAGE_RANK_ARCHITECTURE} architecture (a CLIP query and image tower with a score head)")
        _check_image_settings(config, refuse)
        return
    if kind == "absa":
        if not _ABSA & set(architectures):
            refuse(f"an aspect-sentiment architecture with a span head ({', '.join(sorted(ABSA_ARCHITECTURES))})")
        labels = len(config.get("id2label") or {})
        if labels < 2:
            refuse("a sentiment head of 2 or more labels (id2label)", f"{labels} label(s)")
        if tokenizer is not None and not getattr(tokenizer, "is_fast", False):
            refuse("a fast tokenizer (tokenizer.json): spans need character offsets", "a slow tokenizer only")
        return
    if kind != "rerank":
        raise ValueError(f"unknown model kind {kind!r}")
    for other, what in ((_ABSA, "an aspect-sentiment model: kind absa"), ({IMAGE_RANK_ARCHITECTURE}, "an image ranker: kind image_rank")):
        if other & set(architectures):
            refuse("a reranking checkpoint (a cross-encoder, a bi-encoder or ColBERT)", f"{shown}, {what}")
    try:
        settings = RerankSettings.from_hf_config(config)
    except ValueError as error:
        refuse("settings the rerank path can apply", str(error))
    mode = settings.mode
    classifier = any(a.endswith("ForSequenceClassification") for a in architectures)
    if mode is RerankMode.CROSS_ENCODER and not (classifier or config.get("is_original_qwen3_reranker")):
        refuse(
            "a classifier checkpoint (*ForSequenceClassification) for rerank mode cross_encoder; a bare "
            "encoder is served with rerank_mode bi_encoder"
        )
    if mode is RerankMode.BI_ENCODER and classifier:
        refuse("an encoder checkpoint for rerank mode bi_encoder; a classifier is served as cross_encoder")
    if mode is RerankMode.LATE_INTERACTION and not any("ColBERT" in a for a in architectures):
        refuse("a ColBERT checkpoint for rerank mode late_interaction")
    if tokenizer is not None:
        _check_tokenizer(config, tokenizer, refuse)


def _check_image_settings(config: dict[str, Any], refuse: Callable[[str, str], NoReturn]) -> None:
    """The image section with the deployment's values (limits, pools, where to decode): a value
    the image path cannot apply, or a decode GPU this process cannot see, refuses the model."""
    try:
        settings = ImageRankSettings.from_hf_config(config)
    except ValueError as error:
        refuse("image settings the image path can apply", str(error))
    problem = device_problem(settings.decode_device)
    if problem is not None:
        refuse(f"a device it can decode on ({CONFIG_KEY}.decode_device)", problem)


def _check_tokenizer(config: dict[str, Any], tokenizer: Any, refuse: Callable[[str, str], NoReturn]) -> None:
    try:
        SpecialTokenLayout.learn(tokenizer)
    except ValueError as error:
        refuse("a tokenizer whose special-token layout can be learned", str(error))
    for word in config.get("classifier_from_token") or []:
        ids = tokenizer(str(word), add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            refuse(f"one token for each classifier_from_token word ({word!r})", f"{len(ids)} tokens for it")
