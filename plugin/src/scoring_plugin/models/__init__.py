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
# Set by the server for a model's engine processes (the packed models' kernel choices run
# there): TF32X3 lets float32 projections run as 3xTF32 Triton GEMMs where they time faster
# (scoring_plugin.models.tf32x3_gemm); anything else keeps cuBLAS's GEMM at vLLM's
# VLLM_FLOAT32_MATMUL_PRECISION.
FLOAT32_GEMM_VARIABLE = "SCORING_FLOAT32_GEMM"
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
