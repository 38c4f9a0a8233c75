"""Model architectures the plugin adds to vLLM's registry."""

from __future__ import annotations

from vllm import ModelRegistry

PAIR_BERT_ARCHITECTURE = "ScoringPairBertForSequenceClassification"
COLBERT_ARCHITECTURE = "ScoringColBERTModel"
ABSA_BERT_ARCHITECTURE = "BertForAspectSentiment"
ABSA_MODERNBERT_ARCHITECTURE = "ModernBertForAspectSentiment"
ABSA_ARCHITECTURES = (ABSA_BERT_ARCHITECTURE, ABSA_MODERNBERT_ARCHITECTURE)
IMAGE_RANK_ARCHITECTURE = "ClipImageRanker"
# `float32_matmul_precision` that makes a packed model's float32 projections 3xTF32 Triton GEMMs
# (its section's `packing.float32_gemm`: scoring_plugin.packed.settings).
TF32X3 = "tf32x3"
_MODELS = {
    PAIR_BERT_ARCHITECTURE: "scoring_plugin.models.pair_bert:PairAwareBertForSequenceClassification",
    COLBERT_ARCHITECTURE: "scoring_plugin.models.colbert:ScoringColBERTModel",
    ABSA_BERT_ARCHITECTURE: "scoring_plugin.models.absa:BertForAspectSentiment",
    ABSA_MODERNBERT_ARCHITECTURE: "scoring_plugin.models.absa:ModernBertForAspectSentiment",
    IMAGE_RANK_ARCHITECTURE: "scoring_plugin.models.image_ranker:ClipImageRanker",
}


def register() -> None:
    """Our architectures, and each packed family's (:mod:`scoring_plugin.packed.families.registry`,
    imported here: it names architectures defined above)."""
    from scoring_plugin.packed.families.registry import FAMILIES

    supported = ModelRegistry.get_supported_archs()
    models = {**_MODELS, **{f.architecture: f.model for f in FAMILIES}}
    for architecture, qualname in models.items():
        if architecture not in supported:
            ModelRegistry.register_model(architecture, qualname)
