"""How a served model reranks: section ``scoring_rerank`` of its Hugging Face config (see
:mod:`scoring_plugin.config_sections`). Anything absent is inferred from the architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from scoring_plugin.config_sections import (
    as_dict,
    overrides_key,
    read_section,
)
from scoring_plugin.packed.settings import PackedSettings
from scoring_plugin.rerank.scores import (
    ActivationChoice,
    checkpoint_activation,
    label_names,
    num_labels_of,
    score_label,
)
from scoring_plugin.rerank.types import Activation

CONFIG_KEY = "scoring_rerank"
OVERRIDES_KEY = overrides_key(CONFIG_KEY)
DEFAULT_MAX_DOCUMENTS = 1000
# Text limits, in code points, checked before anything is tokenized: a call's tokenizing time
# follows its characters, and a long text is mostly cut at the model's token limit anyway. A
# document's token ids become Python integers in one call that holds the GIL, during which the
# event loop (health checks included) waits: at a token a character (CJK, small vocabularies)
# this bound keeps each such wait to milliseconds. 8,192-token models read about 32k characters
# of English.
DEFAULT_MAX_QUERY_CHARS = 32_768
DEFAULT_MAX_DOCUMENT_CHARS = 32_768
# Long documents (requests' long_documents): windows one call and one document may hold. Each
# window is an engine prompt, so a call's windows bound its engine work the way max_documents
# does for documents scored whole.
DEFAULT_MAX_WINDOWS_PER_CALL = 2048
DEFAULT_MAX_WINDOWS_PER_DOCUMENT = 64
QWEN3_DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


class RerankMode(str, Enum):
    CROSS_ENCODER = "cross_encoder"
    BI_ENCODER = "bi_encoder"
    LATE_INTERACTION = "late_interaction"

    @property
    def pooling_task(self) -> str:
        return _TASKS[self]


_TASKS = {
    RerankMode.CROSS_ENCODER: "classify",
    RerankMode.BI_ENCODER: "embed",
    RerankMode.LATE_INTERACTION: "token_embed",
}


class PromptTemplate(str, Enum):
    # The tokenizer's own pair layout, e.g. [CLS] query [SEP] document [SEP] with token types.
    TOKENIZER_PAIR = "tokenizer_pair"
    # Qwen3-Reranker's chat prompt with <Instruct>/<Query>/<Document> sections.
    QWEN3_RERANKER = "qwen3_reranker"


@dataclass(frozen=True, slots=True)
class RerankSettings:
    mode: RerankMode
    template: PromptTemplate
    instruction: str
    max_documents: int
    max_query_chars: int = DEFAULT_MAX_QUERY_CHARS
    max_document_chars: int = DEFAULT_MAX_DOCUMENT_CHARS
    max_windows_per_call: int = DEFAULT_MAX_WINDOWS_PER_CALL
    max_windows_per_document: int = DEFAULT_MAX_WINDOWS_PER_DOCUMENT
    # A packed model's settings (scoring_plugin.packed.settings); the defaults for any other.
    packing: PackedSettings = PackedSettings()
    # Cross-encoders: the classifier's labels and the one whose logit is the score.
    num_labels: int = 1
    score_label: int = 0
    score_label_name: str = ""
    # What a request that names no activation gets, and where that came from (GetInfo).
    default_activation: ActivationChoice = ActivationChoice(Activation.NONE, "similarity score")

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> RerankSettings:
        raw = as_dict(hf_config)
        own = read_section(raw, CONFIG_KEY)
        architectures = [str(a) for a in raw.get("architectures") or []]
        # Qwen3 checkpoints, also when served by the packed variant of their architecture.
        is_qwen3 = any(a.startswith("Qwen3") or "PackedQwen3" in a for a in architectures)
        mode = RerankMode(own["mode"]) if "mode" in own else _infer_mode(architectures, raw)
        if "template" in own:
            template = PromptTemplate(own["template"])
        elif is_qwen3 and mode is RerankMode.CROSS_ENCODER:
            template = PromptTemplate.QWEN3_RERANKER
        else:
            template = PromptTemplate.TOKENIZER_PAIR
        max_documents = int(own.get("max_documents", DEFAULT_MAX_DOCUMENTS))
        if max_documents < 1:
            raise ValueError(f"{CONFIG_KEY}.max_documents must be >= 1, got {max_documents}")
        limits = {key: int(own.get(key, default)) for key, default in (
            ("max_query_chars", DEFAULT_MAX_QUERY_CHARS), ("max_document_chars", DEFAULT_MAX_DOCUMENT_CHARS),
            ("max_windows_per_call", DEFAULT_MAX_WINDOWS_PER_CALL),
            ("max_windows_per_document", DEFAULT_MAX_WINDOWS_PER_DOCUMENT))}
        for key, value in limits.items():
            if value < 1:
                raise ValueError(f"{CONFIG_KEY}.{key} must be >= 1, got {value}")
        cross_encoder = mode is RerankMode.CROSS_ENCODER
        num_labels = num_labels_of(raw) if cross_encoder else 1
        if not cross_encoder and str(own.get("activation", "none")).lower() != "none":
            raise ValueError(f"{CONFIG_KEY}.activation: a {mode.value} model's similarity takes no activation")
        label = score_label(raw, own, CONFIG_KEY, num_labels) if cross_encoder else 0
        names = label_names(raw, num_labels)
        return cls(
            mode=mode,
            template=template,
            instruction=str(own.get("instruction", QWEN3_DEFAULT_INSTRUCTION)),
            max_documents=max_documents,
            **limits,
            packing=PackedSettings.from_section(own, CONFIG_KEY),
            num_labels=num_labels,
            score_label=label,
            score_label_name=names[label] if cross_encoder else "",
            default_activation=(
                checkpoint_activation(raw, own, CONFIG_KEY, num_labels)
                if cross_encoder
                else ActivationChoice(Activation.NONE, f"{mode.value} similarity")
            ),
        )

    @property
    def takes_instruction(self) -> bool:
        """Whether the prompt has an instruction slot a request may fill (GetInfo)."""
        return self.template is PromptTemplate.QWEN3_RERANKER

    @property
    def default_instruction(self) -> str:
        """The instruction a request without one gets; empty for prompts without the slot."""
        return self.instruction if self.takes_instruction else ""


def _infer_mode(architectures: list[str], raw: dict[str, Any]) -> RerankMode:
    if any("ColBERT" in a for a in architectures):
        return RerankMode.LATE_INTERACTION
    if raw.get("is_original_qwen3_reranker") or any(
        a.endswith("ForSequenceClassification") for a in architectures
    ):
        return RerankMode.CROSS_ENCODER
    return RerankMode.BI_ENCODER
