"""Model architectures the plugin adds to vLLM's registry."""

from __future__ import annotations

from vllm import ModelRegistry

PAIR_BERT_ARCHITECTURE = "ScoringPairBertForSequenceClassification"
# Serves Qwen3ForSequenceClassification checkpoints with every pair of a call in one request.
PACKED_QWEN3_ARCHITECTURE = "ScoringPackedQwen3ForSequenceClassification"
PACKABLE_ARCHITECTURES = {"Qwen3ForSequenceClassification": PACKED_QWEN3_ARCHITECTURE}
COLBERT_ARCHITECTURE = "ScoringColBERTModel"
ABSA_BERT_ARCHITECTURE = "BertForAspectSentiment"
ABSA_MODERNBERT_ARCHITECTURE = "ModernBertForAspectSentiment"
ABSA_ARCHITECTURES = (ABSA_BERT_ARCHITECTURE, ABSA_MODERNBERT_ARCHITECTURE)
IMAGE_RANK_ARCHITECTURE = "ClipImageRanker"
_MODELS = {
    PAIR_BERT_ARCHITECTURE: "scoring_plugin.models.pair_bert:PairAwareBertForSequenceClassification",
    PACKED_QWEN3_ARCHITECTURE: "scoring_plugin.models.packed_qwen3:PackedQwen3ForSequenceClassification",
    COLBERT_ARCHITECTURE: "scoring_plugin.models.colbert:ScoringColBERTModel",
    ABSA_BERT_ARCHITECTURE: "scoring_plugin.models.absa:BertForAspectSentiment",
    ABSA_MODERNBERT_ARCHITECTURE: "scoring_plugin.models.absa:ModernBertForAspectSentiment",
    IMAGE_RANK_ARCHITECTURE: "scoring_plugin.models.image_ranker:ClipImageRanker",
}


def register() -> None:
    supported = ModelRegistry.get_supported_archs()
    for architecture, qualname in _MODELS.items():
        if architecture not in supported:
            ModelRegistry.register_model(architecture, qualname)
