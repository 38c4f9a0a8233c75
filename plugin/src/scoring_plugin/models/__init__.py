"""Model architectures the plugin adds to vLLM's registry."""

from __future__ import annotations

from vllm import ModelRegistry

PAIR_BERT_ARCHITECTURE = "ScoringPairBertForSequenceClassification"
# Serves Qwen3ForSequenceClassification checkpoints with every pair of a call in one request.
PACKED_QWEN3_ARCHITECTURE = "ScoringPackedQwen3ForSequenceClassification"
COLBERT_ARCHITECTURE = "ScoringColBERTModel"
ABSA_BERT_ARCHITECTURE = "BertForAspectSentiment"
ABSA_MODERNBERT_ARCHITECTURE = "ModernBertForAspectSentiment"
# Serves ModernBertForAspectSentiment checkpoints with every pair of a call in one request.
PACKED_MODERNBERT_ABSA_ARCHITECTURE = "ScoringPackedModernBertForAspectSentiment"
# Per served kind: a checkpoint's architecture -> the one that serves it packed (`pack_pairs`).
PACKABLE_ARCHITECTURES = {
    "rerank": {"Qwen3ForSequenceClassification": PACKED_QWEN3_ARCHITECTURE},
    "absa": {ABSA_MODERNBERT_ARCHITECTURE: PACKED_MODERNBERT_ABSA_ARCHITECTURE},
}
ABSA_ARCHITECTURES = (ABSA_BERT_ARCHITECTURE, ABSA_MODERNBERT_ARCHITECTURE)
IMAGE_RANK_ARCHITECTURE = "ClipImageRanker"
# `float32_matmul_precision` that makes a packed model's float32 projections 3xTF32 Triton GEMMs
# (its section's `pooler_float32_gemm`: scoring_plugin.config_sections).
TF32X3 = "tf32x3"
_MODELS = {
    PAIR_BERT_ARCHITECTURE: "scoring_plugin.models.pair_bert:PairAwareBertForSequenceClassification",
    PACKED_QWEN3_ARCHITECTURE: "scoring_plugin.models.packed_qwen3:PackedQwen3ForSequenceClassification",
    COLBERT_ARCHITECTURE: "scoring_plugin.models.colbert:ScoringColBERTModel",
    ABSA_BERT_ARCHITECTURE: "scoring_plugin.models.absa:BertForAspectSentiment",
    ABSA_MODERNBERT_ARCHITECTURE: "scoring_plugin.models.absa:ModernBertForAspectSentiment",
    PACKED_MODERNBERT_ABSA_ARCHITECTURE: "scoring_plugin.models.packed_modernbert:PackedModernBertForAspectSentiment",
    IMAGE_RANK_ARCHITECTURE: "scoring_plugin.models.image_ranker:ClipImageRanker",
}


def register() -> None:
    supported = ModelRegistry.get_supported_archs()
    for architecture, qualname in _MODELS.items():
        if architecture not in supported:
            ModelRegistry.register_model(architecture, qualname)
