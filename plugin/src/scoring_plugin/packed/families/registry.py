"""The packed families: the one interface the IO processors and the server know the packed
path by.

A family is a model that scores every pair of a call in one engine request. What the rest of
the system needs to know of it is declared here, nothing else: which checkpoint architectures
it serves for which kind, the plugin architecture that serves them packed, whether the pairs of
a call share a prompt head computed once (causal models: the head's states cannot depend on
what follows it), whether each pair's token types travel with the request (BERT's second
segment), and which scoring heads it has. Everything a family shares with the others (the
packing plan, pair attention, graphs, kernel choices) lives in :mod:`scoring_plugin.packed`;
a new family is a module in this package and one entry below.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scoring_plugin.models import ABSA_BERT_ARCHITECTURE, ABSA_MODERNBERT_ARCHITECTURE, PAIR_BERT_ARCHITECTURE


@dataclass(frozen=True, slots=True)
class PackedFamily:
    architecture: str  # the plugin architecture that serves the family packed
    model: str  # "module:Class" of that architecture
    kind: str  # the served kind: "rerank" or "absa"
    serves: tuple[str, ...]  # checkpoint architectures (config.json's, or the deployment's override)
    # Causal: the prompt head every pair of a call starts with is computed once and shared;
    # otherwise every segment of a packed request is a whole pair.
    shares_head: bool
    # The request carries where each pair's token type 1 starts (packed.plan.TYPE_STARTS_KEY).
    token_types: bool
    # Cross-encoders of one label only (a head built for one logit); else any number of labels.
    one_label: bool = False


QWEN3 = PackedFamily(
    architecture="ScoringPackedQwen3ForSequenceClassification",
    model="scoring_plugin.packed.families.qwen3:PackedQwen3ForSequenceClassification",
    kind="rerank",
    serves=("Qwen3ForSequenceClassification",),
    shares_head=True,
    token_types=False,
    one_label=True,
)
BERT = PackedFamily(
    architecture="ScoringPackedBertForSequenceClassification",
    model="scoring_plugin.packed.families.bert:PackedBertForSequenceClassification",
    kind="rerank",
    serves=(
        "BertForSequenceClassification",
        PAIR_BERT_ARCHITECTURE,
        "XLMRobertaForSequenceClassification",
        "RobertaForSequenceClassification",
    ),
    shares_head=False,
    token_types=True,
)
MODERNBERT = PackedFamily(
    architecture="ScoringPackedModernBertForSequenceClassification",
    model="scoring_plugin.packed.families.modernbert:PackedModernBertForSequenceClassification",
    kind="rerank",
    serves=("ModernBertForSequenceClassification",),
    shares_head=False,
    token_types=False,
)
MODERNBERT_ABSA = PackedFamily(
    architecture="ScoringPackedModernBertForAspectSentiment",
    model="scoring_plugin.packed.families.modernbert:PackedModernBertForAspectSentiment",
    kind="absa",
    serves=(ABSA_MODERNBERT_ARCHITECTURE,),
    shares_head=False,
    token_types=False,
)
BERT_ABSA = PackedFamily(
    architecture="ScoringPackedBertForAspectSentiment",
    model="scoring_plugin.packed.families.bert:PackedBertForAspectSentiment",
    kind="absa",
    serves=(ABSA_BERT_ARCHITECTURE,),
    shares_head=False,
    token_types=True,
)
FAMILIES = (QWEN3, BERT, MODERNBERT, MODERNBERT_ABSA, BERT_ABSA)
PACKED_KINDS = tuple(sorted({f.kind for f in FAMILIES}))


def family_for(kind: str, architectures: Iterable[str]) -> PackedFamily | None:
    """The family that packs a checkpoint of these architectures served as ``kind``, if any."""
    names = list(architectures)
    return next((f for f in FAMILIES if f.kind == kind and any(a in f.serves for a in names)), None)


def serving(architectures: Iterable[str]) -> PackedFamily | None:
    """The family whose packed architecture is among these (an engine's served config)."""
    names = set(architectures)
    return next((f for f in FAMILIES if f.architecture in names), None)


def packable(kind: str) -> list[str]:
    """The checkpoint architectures served packed as ``kind``."""
    return sorted(a for f in FAMILIES if f.kind == kind for a in f.serves)


def packed_architectures(kind: str) -> set[str]:
    return {f.architecture for f in FAMILIES if f.kind == kind}
