"""ImageRankService end to end on the demo server's real CPU engine: parity with the Hugging Face
reference (bytes and URLs), single vs batched, duplicates, per-image errors from a local HTTP
server, request validation, deadlines, and nothing left behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
import torch

from support.servers import DEMO_DIR, RunningServer, tool_env
from support.image_server import ImageServer, png_header_only
from scoring.v1 import image_rank_pb2
from scoring_client import ScoringClient, ScoringError
from scoring_plugin.reference.image_rank import ImageRankReference
from scoring_server.demo.image_rank import QUERIES, sample_images

MODEL = "image-ranker"
ATOL = 1e-4


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    return sample_images(12, seed=7)


@pytest.fixture(scope="module")
def reference() -> ImageRankReference:
    return ImageRankReference(DEMO_DIR / MODEL)


@pytest.fixture(scope="module")
def image_server(images: list[bytes]) -> Iterator[ImageServer]:
    with ImageServer(images).running() as server:
        yield server


def _by_index(result) -> dict[int, float]:  # type: ignore[no-untyped-def]
    return {r.index: r.score for r in result.results if r.error is None}


@pytest.mark.parametrize("query", QUERIES)
def test_scores_equal_the_hugging_face_reference(
    client: ScoringClient, reference: ImageRankReference, images: list[bytes], query: str
) -> None:
    result = client.rank_images(query, images, model=MODEL)
    expected = reference.score(query, images)
    got = _by_index(result)
    assert len(got) == len(images)
    for i, score in enumerate(expected):
        assert got[i] == pytest.approx(score, abs=ATOL), i
    assert [r.index for r in result.results] == sorted(range(len(images)), key=lambda i: -expected[i])
    assert result.dtype == "DTYPE_FLOAT32" and result.model == MODEL


def test_single_and_batched_and_url_scores_agree(
    client: ScoringClient, images: list[bytes], image_server: ImageServer
) -> None:
    batched = _by_index(client.rank_images(QUERIES[0], images))
    for i, image in enumerate(images[:6]):
        alone = _by_index(client.rank_images(QUERIES[0], [image]))[0]
        assert alone == pytest.approx(batched[i], abs=1e-5)
    urls = [image_server.url(f"/img/{i}") for i in range(len(images))]
    by_url = _by_index(client.rank_images(QUERIES[0], urls))
    assert by_url == pytest.approx(batched, abs=1e-5)


def test_duplicates_score_identically_and_run_once(
    client: ScoringClient, images: list[bytes], image_server: ImageServer
) -> None:
    """Rule 3: the same image twice in one batch (bytes, and a URL serving the same bytes)."""
    plain = _by_index(client.rank_images(QUERIES[1], images[:4]))
    mixed = [images[0], images[1], images[0], image_server.url("/img/0"), images[2], images[1], images[3]]
    request = image_rank_pb2.RankImagesRequest(query=QUERIES[1])
    for item in mixed:
        request.images.add(**({"data": item} if isinstance(item, bytes) else {"url": item}))
    response = client.image_rank_stub.RankImages(request, timeout=60)
    assert response.usage.engine_requests == 4
    scores = {r.index: r.score for r in response.results}
    assert scores[0] == scores[2] == scores[3] and scores[1] == scores[5]
    assert [scores[0], scores[1], scores[4], scores[6]] == pytest.approx(
        [plain[0], plain[1], plain[2], plain[3]], abs=1e-5
    )


FAILING = {
    "/missing": "NOT_FOUND",
    "/error": "UNAVAILABLE",
    "/html": "INVALID_ARGUMENT",
    "/slow": "DEADLINE_EXCEEDED",
    "/trickle": "DEADLINE_EXCEEDED",
    "/huge-declared": "INVALID_ARGUMENT",
    "/huge-undeclared": "INVALID_ARGUMENT",
    "/broken": "UNAVAILABLE",
    "/truncated": "INVALID_ARGUMENT",
    "/bomb": "INVALID_ARGUMENT",
    "/gif": "INVALID_ARGUMENT",
    "/redirect-private": "PERMISSION_DENIED",
    "/redirect-loop": "UNAVAILABLE",
}


def test_failed_images_are_item_errors_and_the_rest_is_ranked(
    client: ScoringClient, images: list[bytes], image_server: ImageServer
) -> None:
    good = [images[0], image_server.url("/redirect-ok"), images[2]]
    bad = [image_server.url(path) for path in FAILING] + [
        png_header_only(50_000, 50_000), b"\x00" * 10, "http://169.254.169.254/x.png", "http://10.9.8.7/x.jpg",
    ]
    expected_codes = [*FAILING.values(), "INVALID_ARGUMENT", "INVALID_ARGUMENT", "PERMISSION_DENIED", "PERMISSION_DENIED"]
    started = time.monotonic()
    result = client.rank_images(QUERIES[2], good + bad, timeout=30)
    assert time.monotonic() - started < 10  # the 2 s download cap, not the slow servers, sets the pace
    scored = [r for r in result.results if r.error is None]
    failed = [r for r in result.results if r.error is not None]
    assert sorted(r.index for r in scored) == [0, 1, 2]
    reference = _by_index(client.rank_images(QUERIES[2], [images[0], images[1], images[2]]))
    assert {r.index: r.score for r in scored} == pytest.approx(reference, abs=1e-5)
    assert [r.index for r in failed] == list(range(3, 3 + len(bad)))
    assert [r.error.code for r in failed] == expected_codes  # type: ignore[union-attr]
    for r in failed:
        assert f"images[{r.index}]." in r.error.message and r.score is None  # type: ignore[union-attr]


def test_image_errors_are_counted_by_reason(client: ScoringClient, demo_server: RunningServer, images: list[bytes]) -> None:
    def count(reason: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{demo_server.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        line = f'scoring_image_errors_total{{model="{MODEL}",reason="{reason}"}} '
        return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(line))

    before = count("invalid_image"), count("url_forbidden")
    client.rank_images(QUERIES[0], [images[0], b"junk", b"more junk", "http://10.1.1.1/a.png"])
    assert (count("invalid_image"), count("url_forbidden")) == (before[0] + 2, before[1] + 1)


def test_top_n_keeps_the_best_and_all_errors(client: ScoringClient, images: list[bytes]) -> None:
    full = client.rank_images(QUERIES[0], images[:6])
    top = client.rank_images(QUERIES[0], images[:6] + [b"junk"], top_n=2, ids=[f"i{i}" for i in range(7)])
    assert [r.index for r in top.results[:2]] == [r.index for r in full.results[:2]]
    assert top.results[2].id == "i6" and top.results[2].error is not None and len(top.results) == 3


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda r: r.images.add(data=b"x"), "query"),
        (lambda r: setattr(r, "query", "a photo"), "images"),
        (lambda r: (setattr(r, "query", "q"), r.images.add()), "images[0]"),
        (lambda r: (setattr(r, "query", "q"), r.images.add(url="ftp://127.0.0.1/a.png")), "images[0].url"),
        (lambda r: (setattr(r, "query", "q"), r.images.add(url="file:///etc/passwd")), "images[0].url"),
        (lambda r: (setattr(r, "query", "q"), r.images.add(data=b"")), "images[0].data"),
        (lambda r: (setattr(r, "query", "q"), [r.images.add(data=b"x") for _ in range(65)]), "images"),
        (lambda r: (setattr(r, "query", "q"), r.images.add(data=b"x"), setattr(r, "top_n", 0)), "top_n"),
        (lambda r: (setattr(r, "query", "word " * 100), r.images.add(data=b"x")), "query"),
        (lambda r: (setattr(r, "query", "q" * 2001), r.images.add(data=b"x")), "query"),
    ],
    ids=["no-query", "no-images", "no-source", "ftp", "file", "empty-bytes", "too-many", "top-n-0",
         "query-too-long-tokens", "query-too-long-chars"],
)
def test_bad_requests_name_the_field(client: ScoringClient, build, field: str) -> None:  # type: ignore[no-untyped-def]
    request = image_rank_pb2.RankImagesRequest()
    build(request)
    with pytest.raises(ScoringError) as err:
        client._call(client.image_rank_stub.RankImages, request, 30)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.fields


def test_long_query_is_cut_when_the_request_allows(client: ScoringClient, images: list[bytes]) -> None:
    result = client.rank_images("word " * 100, images[:2], truncate="right")
    assert len(_by_index(result)) == 2 and result.prompt_tokens == 2 * 32


def test_deadline_while_downloading_is_deadline_exceeded(
    client: ScoringClient, images: list[bytes], image_server: ImageServer
) -> None:
    started = time.monotonic()
    with pytest.raises(ScoringError) as err:
        client.rank_images(QUERIES[0], [images[0], image_server.url("/slow")], timeout=0.8)
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 3


def test_info_advertises_image_limits_and_nothing_is_left_behind(client: ScoringClient) -> None:
    time.sleep(2.5)  # downloads abandoned by the deadline test end within the 2 s cap
    model = next(m for m in client.info().models if m.name == MODEL)
    assert model.max_items_per_request == 64 and model.image_size == 32
    assert model.max_image_bytes > 0 and model.max_image_pixels > 0 and model.fetch_timeout_ms == 2000
    assert model.image_decode_device == "cpu"  # Pillow, as the Hugging Face processor: the default
    assert model.pending_request_states == 0 and model.engine_requests_in_flight == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for hosts without a GPU")
def test_a_gpu_decode_without_a_gpu_is_refused_at_start() -> None:
    """`decode_device: cuda` where no GPU is visible: exit 1 with one line naming the model,
    the setting and the reason, before any engine starts."""
    overrides = json.dumps({"scoring_image_rank_overrides": {"decode_device": "cuda"}})
    done = subprocess.run(
        [sys.executable, "-m", "scoring_server", "--model-path", str(DEMO_DIR / "image-ranker"),
         "--model-name", "img", "--model-kind", "image_rank", "--dtype", "float32", "--hf-overrides", overrides,
         "--port", "0"],
        capture_output=True, text=True, timeout=300, env=tool_env(),
    )
    assert done.returncode == 1
    assert "model 'img' cannot be served as image_rank" in done.stderr
    assert "scoring_image_rank.decode_device is 'cuda' but no CUDA GPU is visible" in done.stderr
    assert "Traceback" not in done.stderr
    assert "Initializing a V1 LLM engine" not in done.stdout + done.stderr
