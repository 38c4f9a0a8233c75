"""Typed Python client of the scoring service; the raw stubs are in ``scoring.v1``."""

from scoring_client.client import (
    AnalyzeResult,
    AspectJudgement,
    Evidence,
    FieldViolation,
    ImageError,
    LongDocuments,
    RankedImage,
    RankImagesResult,
    RerankHit,
    RerankResult,
    ScoringClient,
    ScoringError,
)

__all__ = [
    "AnalyzeResult",
    "AspectJudgement",
    "Evidence",
    "FieldViolation",
    "ImageError",
    "LongDocuments",
    "RankedImage",
    "RankImagesResult",
    "RerankHit",
    "RerankResult",
    "ScoringClient",
    "ScoringError",
]
