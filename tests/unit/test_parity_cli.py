"""`scoring-parity` without an engine: a bad command line, checkpoint or inputs file exits 2 in
one line, every bad input line is named `FILE:LINE: message` (exit 2, no traceback) before any
engine starts, the plugin's own refusals (an over-long input) map back to their line, and the
Hugging Face references cut over-long input to exactly the tokens the served path keeps
(`--truncate`). The engine runs are in `tests/engine/test_parity_tool.py`."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from scoring_plugin.absa.encoding import PairEncoder
from scoring_plugin.absa.settings import AbsaSettings
from scoring_plugin.absa.types import AbsaInput, AbsaPairInput, flatten
from scoring_plugin.reference import rerank as reference_rerank
from scoring_plugin.reference.absa import AbsaReference
from scoring_plugin.rerank.prompts import PromptBuilder
from scoring_plugin.rerank.settings import QWEN3_DEFAULT_INSTRUCTION, PromptTemplate, RerankMode, RerankSettings
from scoring_plugin.rerank.types import RerankDocumentInput, RerankInput, TruncationOptions, TruncationSide
from scoring_server.demo import minilm_path
from scoring_server.parity.cli import main
from scoring_server.parity.inputs import BadInput, UsageError, check_planned
from support.servers import venv_tool

GOOD = {"query": "what is the capital of France", "documents": ["Paris", "Lyon"]}


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    """Enough of a rerank checkpoint for everything before an engine starts."""
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForSequenceClassification"]}))
    return path


def _inputs(tmp_path: Path, *lines: object) -> Path:
    """Each line a JSON value, or a str written as is."""
    path = tmp_path / "inputs.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines))
    return path


def _parity(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as stopped:
        main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return stopped.value.code, err.strip().splitlines()


# ------------------------------------------------------------------------ usage errors


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no checkpoint directory", "--checkpoint {missing}: no such directory"),
        ("no config.json", "no config.json"),
        ("config.json not JSON", "cannot read its config.json"),
        ("no inputs file", "--inputs {missing}: no such file"),
        ("hf-overrides not JSON", "--hf-overrides: not JSON: Expecting property name"),
        ("engine-args not an object", "--engine-args: must be a JSON object, not an array"),
        ("truncation side without consent", "need --truncate"),
        ("truncation limit below 1", "--truncation-max-tokens 0: must be at least 1"),
        ("invalid model settings", "max_model_len"),
    ],
)
def test_usage_errors_exit_2_in_one_line(
    tmp_path: Path, checkpoint: Path, capsys: pytest.CaptureFixture[str], case: str, expected: str
) -> None:
    missing = tmp_path / "missing"
    inputs = _inputs(tmp_path, GOOD)
    args: list[object] = ["--checkpoint", checkpoint, "--inputs", inputs]
    if case == "no checkpoint directory":
        args[1] = missing
    elif case == "no config.json":
        (checkpoint / "config.json").unlink()
    elif case == "config.json not JSON":
        (checkpoint / "config.json").write_text("{not json")
    elif case == "no inputs file":
        args[3] = missing
    else:
        args += {
            "hf-overrides not JSON": ["--hf-overrides", "{bad"],
            "engine-args not an object": ["--engine-args", "[1]"],
            "truncation side without consent": ["--truncation-side", "left"],
            "truncation limit below 1": ["--truncate", "--truncation-max-tokens", "0"],
            "invalid model settings": ["--max-model-len", "4"],
        }[case]
    code, err = _parity(capsys, *args)
    assert code == 2
    assert len(err) == 1 and err[0].startswith("scoring-parity: "), err
    assert expected.format(missing=missing) in err[0]


def test_argparse_errors_exit_2(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _parity(capsys, "--checkpoint", checkpoint)
    assert code == 2 and "--inputs" in err[-1]
    code, err = _parity(capsys, "--checkpoint", checkpoint, "--inputs", "x", "--truncation-side", "middle")
    assert code == 2 and "--truncation-side" in err[-1]


# --------------------------------------------------------------------- bad input lines


def test_every_bad_rerank_line_is_named(tmp_path: Path, checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = _inputs(
        tmp_path,
        GOOD,
        "",  # blank lines are skipped but counted
        '{"query": "q", "documents": ["a"]',
        [1, 2],
        {"documents": ["a"]},
        {"query": 7, "documents": "abc"},
        {"query": "q", "documents": ["a", None, 3]},
        {"query": "  ", "documents": []},
        GOOD,
    )
    code, err = _parity(capsys, "--checkpoint", checkpoint, "--inputs", inputs)
    assert code == 2
    assert err == [
        f"scoring-parity: {inputs}:3: not JSON: Expecting ',' delimiter (column 34)",
        f"scoring-parity: {inputs}:4: not a JSON object but an array",
        f"scoring-parity: {inputs}:5: missing `query`",
        f"scoring-parity: {inputs}:6: `query` must be a string, not a number; "
        "`documents` must be a list of strings, not a string",
        f"scoring-parity: {inputs}:7: `documents[1]` must be a string, not null (and 1 more)",
        f"scoring-parity: {inputs}:8: `query` must not be blank; `documents` must not be empty",
    ]


def test_every_bad_absa_line_is_named(tmp_path: Path, checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForAspectSentiment"]}))
    inputs = _inputs(
        tmp_path,
        {"aspect": "food", "review": "Great food."},
        {"review": "Great food."},
        {"aspect": "food", "review": ["Great food."]},
        {"aspect": "", "review": None},
    )
    code, err = _parity(capsys, "--checkpoint", checkpoint, "--inputs", inputs)
    assert code == 2
    assert err == [
        f"scoring-parity: {inputs}:2: missing `aspect`",
        f"scoring-parity: {inputs}:3: `review` must be a string, not an array",
        f"scoring-parity: {inputs}:4: `aspect` must not be blank; `review` must be a string, not null",
    ]


def test_every_bad_image_line_is_named(tmp_path: Path, checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "photo.jpg").write_bytes(b"not decoded before the engine starts")
    inputs = _inputs(
        tmp_path,
        {"query": "a red car", "images": ["photo.jpg"]},
        {"query": "a red car", "images": ["photo.jpg", "gone.jpg"]},
        {"query": "a red car", "images": "photo.jpg"},
        {"images": ["photo.jpg"]},
    )
    code, err = _parity(capsys, "--checkpoint", checkpoint, "--inputs", inputs, "--kind", "image_rank")
    assert code == 2
    assert err == [
        f"scoring-parity: {inputs}:2: `images[1]`: cannot read gone.jpg: No such file or directory",
        f"scoring-parity: {inputs}:3: `images` must be a list of strings, not a string",
        f"scoring-parity: {inputs}:4: missing `query`",
    ]


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_an_empty_inputs_file(tmp_path: Path, checkpoint: Path, capsys: pytest.CaptureFixture[str], content: str) -> None:
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text(content)
    code, err = _parity(capsys, "--checkpoint", checkpoint, "--inputs", inputs)
    assert code == 2
    assert err == [f"scoring-parity: {inputs}: no input lines (one JSON object per line)"]


def test_the_list_of_bad_lines_is_capped(tmp_path: Path, checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = _inputs(tmp_path, *([{"query": "q"}] * 25))
    code, err = _parity(capsys, "--checkpoint", checkpoint, "--inputs", inputs)
    assert code == 2 and len(err) == 21
    assert err[0] == f"scoring-parity: {inputs}:1: missing `documents`"
    assert err[19] == f"scoring-parity: {inputs}:20: missing `documents`"
    assert err[20] == f"scoring-parity: {inputs}: 5 more bad lines not shown"


def test_the_console_script_exits_2_without_a_traceback(tmp_path: Path, checkpoint: Path) -> None:
    inputs = _inputs(tmp_path, GOOD, "not json")
    done = subprocess.run(
        [venv_tool("scoring-parity"), "--checkpoint", str(checkpoint), "--inputs", str(inputs)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert f"scoring-parity: {inputs}:2: not JSON: Expecting value (column 1)" in done.stderr.splitlines()


# ------------------------------------------- the plugin's refusals, mapped to their lines


@pytest.fixture(scope="module")
def wordpiece():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(minilm_path())


class _Processor:
    """Plans as a processor does (here: with the plugin's own prompt builder or pair encoder)."""

    def __init__(self, plan: Any, max_model_len: int) -> None:
        self._plan = plan
        self.max_model_len = max_model_len
        self.held: set[str] = set()

    def parse_data(self, request: Any) -> Any:
        return request

    async def plan_async(self, request: Any, request_id: str, inline: bool = False) -> None:
        self.held.add(request_id)
        self._plan(request)

    def discard(self, request_id: str) -> None:
        self.held.discard(request_id)


def _cross_encoder(tokenizer: Any, limit: int) -> PromptBuilder:
    settings = RerankSettings(RerankMode.CROSS_ENCODER, PromptTemplate.TOKENIZER_PAIR, "i", 10)
    return PromptBuilder(tokenizer, settings, limit)


def _rerank(query: str, documents: list[str], truncation: TruncationOptions | None = None) -> RerankInput:
    return RerankInput(query, [RerankDocumentInput(text=d) for d in documents], truncation=truncation)


def test_an_over_long_input_is_named_by_its_line(wordpiece) -> None:  # type: ignore[no-untyped-def]
    processor = _Processor(_cross_encoder(wordpiece, 32).plan, 32)
    path = SimpleNamespace(processor=processor)
    long = "word " * 40
    requests = [(1, _rerank("q", ["short"])), (4, _rerank("q", ["short", long])), (6, _rerank("q", [long]))]
    with pytest.raises(BadInput) as bad:
        asyncio.run(check_planned(path, requests, None))
    assert [number for number, _ in bad.value.problems] == [4, 6]
    message = bad.value.problems[0][1]
    assert message.startswith("documents[1].text: the document needs 40 tokens but only 28 fit")
    assert message.endswith("shorten it or pass --truncate")
    assert not processor.held  # every plan thrown away

    with_consent = [(n, _rerank(r.query, [d.text for d in r.documents], TruncationOptions(None, TruncationSide.LEFT)))
                    for n, r in requests]
    resolved = asyncio.run(check_planned(path, with_consent, TruncationOptions(None, TruncationSide.LEFT)))
    assert resolved == TruncationOptions(32, TruncationSide.LEFT)  # the served limit, for the reference

    too_high = TruncationOptions(64, TruncationSide.RIGHT)
    with pytest.raises(UsageError, match=r"--truncation-max-tokens 64: must be between 1 and the model's limit of 32"):
        asyncio.run(check_planned(path, [(1, _rerank("q", ["short"], too_high))], too_high))
    assert not processor.held


def test_an_over_long_absa_pair_names_the_lines_field(wordpiece) -> None:  # type: ignore[no-untyped-def]
    encoder = PairEncoder(wordpiece, 32)
    processor = _Processor(lambda r: encoder.encode(flatten(r), r.truncation), 32)
    requests = [(2, AbsaInput(pairs=[AbsaPairInput("food", "good " * 40)]))]
    with pytest.raises(BadInput) as bad:
        asyncio.run(check_planned(SimpleNamespace(processor=processor), requests, None,
                                  field=lambda name: name.removeprefix("pairs[0].")))
    assert bad.value.problems == [
        (2, "review: the pair has 44 tokens, the model allows 32; pass --truncate to cut the review")
    ]


# ----------------------------- the references cut the tokens the served path cuts


class _Recorder:
    """Stands in for a checkpoint's model: records the token ids of each row it is given."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.rows: list[list[int]] = []

    def from_pretrained(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def eval(self) -> _Recorder:
        return self

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any) -> SimpleNamespace:
        self.rows += [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]
        n, width = input_ids.shape
        zeros = torch.zeros(n, width)
        return SimpleNamespace(logits=torch.zeros(n, 8), last_hidden_state=torch.zeros(n, width, 4),
                               sentiment_logits=torch.zeros(n, 3), start_logits=zeros, end_logits=zeros)


def _served(builder: PromptBuilder, request: RerankInput) -> list[list[int]]:
    plan = builder.plan(request)
    rows = [list(plan.prompts[i].token_ids) for i in plan.document_prompt]
    return rows + ([list(plan.prompts[plan.query_prompt].token_ids)] if plan.query_prompt is not None else [])


QUERY = "what is the capital of France"
DOCUMENTS = ["Paris", "the quick brown fox jumps over the lazy dog " * 12 + "zebra", "tiny " * 9]
LIMITS = [(None, 48), (20, 48)]  # (--truncation-max-tokens, the served limit)


@pytest.mark.parametrize("side", list(TruncationSide))
@pytest.mark.parametrize(("max_tokens", "served"), LIMITS)
@pytest.mark.parametrize("mode", [RerankMode.CROSS_ENCODER, RerankMode.BI_ENCODER])
def test_the_rerank_reference_keeps_the_served_tokens(  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch, wordpiece, mode: RerankMode, max_tokens: int | None, served: int,
    side: TruncationSide,
) -> None:
    recorder = _Recorder(wordpiece)
    monkeypatch.setattr(reference_rerank, "AutoTokenizer", SimpleNamespace(from_pretrained=lambda *a, **k: wordpiece))
    for name in ("AutoModel", "AutoModelForSequenceClassification"):
        monkeypatch.setattr(reference_rerank, name, recorder)
    query = QUERY + " and more" * 20 if mode is RerankMode.BI_ENCODER else QUERY  # embedded alone, cut too
    builder = PromptBuilder(wordpiece, RerankSettings(mode, PromptTemplate.TOKENIZER_PAIR, "i", 10), served)
    expected = _served(builder, _rerank(query, DOCUMENTS, TruncationOptions(max_tokens, side)))
    assert max(len(r) for r in expected) == (max_tokens or served)  # something was cut

    factory = reference_rerank.pair_cross_encoder if mode is RerankMode.CROSS_ENCODER else reference_rerank.bi_encoder
    factory(Path("unused"), TruncationOptions(max_tokens or served, side))(query, DOCUMENTS, True)
    got = recorder.rows if mode is RerankMode.CROSS_ENCODER else recorder.rows[1:] + recorder.rows[:1]
    assert got == expected


@pytest.mark.parametrize("side", list(TruncationSide))
@pytest.mark.parametrize(("max_tokens", "served"), [(None, 140), (120, 140)])
def test_the_qwen3_reference_keeps_the_served_tokens(  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, max_tokens: int | None, served: int, side: TruncationSide
) -> None:
    from scoring_server.demo import build_qwen3_tokenizer

    tokenizer = build_qwen3_tokenizer(tmp_path)
    recorder = _Recorder(tokenizer)
    monkeypatch.setattr(reference_rerank, "AutoTokenizer", SimpleNamespace(from_pretrained=lambda *a, **k: tokenizer))
    monkeypatch.setattr(reference_rerank, "Qwen3ForSequenceClassification", recorder)
    settings = RerankSettings(RerankMode.CROSS_ENCODER, PromptTemplate.QWEN3_RERANKER, QWEN3_DEFAULT_INSTRUCTION, 10)
    expected = _served(PromptBuilder(tokenizer, settings, served), _rerank(QUERY, DOCUMENTS, TruncationOptions(max_tokens, side)))
    assert max(len(r) for r in expected) == (max_tokens or served)

    reference_rerank.qwen3_seq_cls(Path("unused"), truncation=TruncationOptions(max_tokens or served, side))(
        QUERY, DOCUMENTS, True
    )
    assert recorder.rows == expected


@pytest.mark.parametrize("side", list(TruncationSide))
@pytest.mark.parametrize(("max_tokens", "served"), LIMITS)
def test_the_absa_reference_keeps_the_served_tokens(  # type: ignore[no-untyped-def]
    wordpiece, max_tokens: int | None, served: int, side: TruncationSide
) -> None:
    pairs = [("food", "The pasta was cold but the staff were friendly. " * 8), ("wait", "Short wait.")]
    truncation = TruncationOptions(max_tokens, side)
    served_pairs = PairEncoder(wordpiece, served).encode(
        flatten(AbsaInput(pairs=[AbsaPairInput(a, r) for a, r in pairs], truncation=truncation)), truncation
    )
    expected = [list(p.token_ids) for p in served_pairs]
    assert max(len(r) for r in expected) == (max_tokens or served)

    reference = AbsaReference.__new__(AbsaReference)  # the tokenizer and decoding, a recorder for the model
    reference.tokenizer = wordpiece
    reference.model = _Recorder(wordpiece)
    reference.settings = AbsaSettings(labels=("negative", "neutral", "positive"))
    judgements = reference.analyze(pairs, truncation=TruncationOptions(max_tokens or served, side))
    assert reference.model.rows == expected
    assert len(judgements) == len(pairs)
