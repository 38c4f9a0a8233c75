"""The ``image_ranker`` IO processor: a query and images (bytes or URLs) in, images by score out.

Driven by our gRPC server (:meth:`plan_async`, :meth:`post_process`, :meth:`discard` on every
exit path). Images are fetched and decoded in the loader's pools, which calls share fairly; an
image that cannot be loaded becomes that item's error and the others are still ranked, while a
call whose images would decode to more than `max_pixels_per_request` is refused whole. Each distinct file is one
engine request (one vision-tower pass), shared by every duplicate of it in the call.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.inputs import TokensPrompt
from vllm.outputs import PoolingRequestOutput
from vllm.pooling_params import PoolingParams
from vllm.renderers import BaseRenderer

from scoring_plugin.checkpoint_fit import check_fit
from scoring_plugin.config_sections import as_dict
from scoring_plugin.errors import FieldViolation, InvalidInputError, NonFiniteOutputError, text_violations
from scoring_plugin.image_rank.fetch import url_problem
from scoring_plugin.image_rank.loader import ImageLoader, LoadedImages
from scoring_plugin.image_rank.settings import ImageRankSettings
from scoring_plugin.image_rank.types import ImageLoadError, ImageRankInput, ImageRankOutput, RankedImage
from scoring_plugin.io_processors.base import ScoringIOProcessor
from scoring_plugin.io_processors.engine_request import EngineRequest
from scoring_plugin.models.image_ranker import IMAGE_RANK_TASK, marker_range
from scoring_plugin.rerank.types import TruncationSide

MAX_URL_CHARS = 4096


@dataclass(frozen=True, slots=True)
class _RequestState:
    request: ImageRankInput
    loaded: LoadedImages
    query_tokens: int


class ImageRankerIOProcessor(ScoringIOProcessor[ImageRankInput, ImageRankOutput, _RequestState]):
    input_type = ImageRankInput

    def __init__(self, vllm_config: VllmConfig, renderer: BaseRenderer) -> None:
        super().__init__(vllm_config, renderer)
        hf_config = vllm_config.model_config.hf_config
        check_fit(vllm_config.model_config.served_model_name, "image_rank", as_dict(hf_config), None)
        self.settings = ImageRankSettings.from_hf_config(hf_config)
        self.max_model_len = self.settings.max_text_tokens
        self._tokenizer = renderer.get_tokenizer()
        self._loader = ImageLoader(self.settings)
        self._markers = itertools.cycle(range(marker_range(hf_config.text_config.vocab_size)))
        self._marker_lock = threading.Lock()

    # ------------------------------------------------------------------ input

    def text_chars(self, request: ImageRankInput) -> int:
        return len(request.query)

    def validate(self, request: ImageRankInput) -> None:
        limits = self.settings
        violations: list[FieldViolation] = []
        violations += text_violations("query", request.query, limits.max_query_chars)
        if not request.images:
            violations.append(FieldViolation("images", "at least one image is required"))
        elif len(request.images) > limits.max_images:
            violations.append(
                FieldViolation("images", f"{len(request.images)} images exceed the limit of {limits.max_images}")
            )
        if request.top_n is not None and request.top_n < 1:
            violations.append(FieldViolation("top_n", "must be at least 1 when set"))
        for i, image in enumerate(request.images):
            if (image.data is None) == (image.url is None):
                violations.append(FieldViolation(f"images[{i}]", "set exactly one of data or url"))
            elif image.data is not None and not image.data:
                violations.append(FieldViolation(f"images[{i}].data", "must not be empty"))
            elif image.url is not None:
                violations += _url_violations(f"images[{i}].url", image.url)
        if violations:
            raise InvalidInputError(violations)

    # --------------------------------------------------------------- planning

    async def plan_async(self, request: ImageRankInput, request_id: str, inline: bool = False) -> list[EngineRequest]:
        """Loads the images and stores the request's state; the caller must pop or discard it.
        Loading fetches and decodes in threads whatever `inline` says."""
        text_ids = self._query_ids(request)
        loaded = await self._loader.load(request.images)
        self._states.put(request_id, _RequestState(request, loaded, len(text_ids)))
        padded = torch.zeros(self.settings.max_text_tokens, dtype=torch.int64)
        padded[: len(text_ids)] = torch.tensor(text_ids, dtype=torch.int64)
        params = self._pooling_params()
        with self._marker_lock:
            markers = [next(self._markers) for _ in loaded.pixels]
        return [
            EngineRequest(
                TokensPrompt(
                    prompt_token_ids=[marker],
                    multi_modal_data={
                        "image": {
                            "pixel_values": torch.from_numpy(pixels),
                            "text_ids": padded,
                            "text_len": torch.tensor(len(text_ids), dtype=torch.int64),
                            "marker": torch.tensor(marker, dtype=torch.int64),
                        }
                    },
                ),
                params,
            )
            for pixels, marker in zip(loaded.pixels, markers)
        ]

    def _query_ids(self, request: ImageRankInput) -> list[int]:
        ids: list[int] = self._tokenizer(request.query, add_special_tokens=True)["input_ids"]
        limit = self.settings.max_text_tokens
        truncation = request.truncation
        if truncation is not None and truncation.max_tokens is not None:
            limit = min(limit, truncation.max_tokens)
        if len(ids) <= limit:
            return ids
        if truncation is None:
            raise InvalidInputError.single(
                "query", f"{len(ids)} tokens exceed the limit of {limit}; set truncation to allow cutting it"
            )
        if limit < 2:
            raise InvalidInputError.single("truncation.max_tokens", "must leave room for the query's special tokens")
        # Keep the tokenizer's first and last special tokens; cut the text between them.
        if truncation.side is TruncationSide.LEFT:
            return [ids[0], *ids[len(ids) - limit + 1 :]]
        return [*ids[: limit - 1], ids[-1]]

    def _pooling_params(self) -> PoolingParams:
        return PoolingParams(task=IMAGE_RANK_TASK)

    # ------------------------------------------------- vLLM's standard path

    def pre_process(
        self, prompt: ImageRankInput, request_id: str | None = None, **kwargs: Any
    ) -> Sequence[TokensPrompt]:
        raise NotImplementedError(
            "the image_ranker processor loads images asynchronously; it is driven by the scoring gRPC server"
        )

    # ----------------------------------------------------------------- output

    def post_process(
        self,
        model_output: Sequence[PoolingRequestOutput],
        request_id: str | None = None,
        **kwargs: Any,
    ) -> ImageRankOutput:
        state = self._states.pop(self._required_id(request_id))
        loaded = state.loaded
        if len(model_output) != len(loaded.pixels):
            raise ValueError(f"expected {len(loaded.pixels)} outputs, got {len(model_output)}")
        scores = [float(o.outputs.data.float().reshape(-1)[0]) for o in model_output]
        if not all(math.isfinite(s) for s in scores):
            raise NonFiniteOutputError("the model produced a non-finite score")
        ranked, failed = [], []
        for index, (image, file) in enumerate(zip(state.request.images, loaded.file_of_image)):
            if isinstance(file, ImageLoadError):
                failed.append(RankedImage(index, image.id, None, file))
            else:
                ranked.append(RankedImage(index, image.id, scores[file]))
        ranked.sort(key=lambda r: (-r.score, r.index))  # type: ignore[operator]
        if state.request.top_n is not None:
            ranked = ranked[: state.request.top_n]
        return ImageRankOutput(
            results=ranked + failed,
            prompt_tokens=state.query_tokens * len(loaded.pixels),
            engine_requests=len(loaded.pixels),
        )


def _url_violations(field: str, url: str) -> list[FieldViolation]:
    if len(url) > MAX_URL_CHARS:
        return [FieldViolation(field, f"longer than {MAX_URL_CHARS} characters")]
    problem = url_problem(url)
    return [] if problem is None else [FieldViolation(field, problem)]
