"""The real grpcurl binary, reflection only (no proto files): what a person at a shell does."""

from __future__ import annotations

import json

from support.servers import RunningServer, grpcurl

def test_reflection_lists_and_describes_services(demo_server: RunningServer) -> None:
    listed = grpcurl(demo_server, "list")
    assert listed.returncode == 0, listed.stderr
    services = set(listed.stdout.split())
    assert {
        "scoring.v1.RerankService",
        "scoring.v1.InfoService",
        "scoring.v1.AbsaService",
        "scoring.v1.ImageRankService",
        "grpc.health.v1.Health",
    } <= services
    described = grpcurl(demo_server, "describe", "scoring.v1.RerankRequest")
    assert described.returncode == 0, described.stderr
    assert "repeated .scoring.v1.RerankDocument documents" in described.stdout


def test_rerank_call_from_json(demo_server: RunningServer) -> None:
    request = {
        "query": "how do cats sleep",
        "documents": [
            {"id": "a", "text": "The stock market closed higher."},
            {"id": "b", "text": "Cats sleep up to sixteen hours a day."},
            {"id": "c", "text": "Tomato soup with basil."},
        ],
        "topN": 2,
        "returnDocuments": True,
        "requestId": "grpcurl-1",
        "activation": "ACTIVATION_NONE",
    }
    done = grpcurl(demo_server, "scoring.v1.RerankService/Rerank", data=request)
    assert done.returncode == 0, done.stderr
    response = json.loads(done.stdout)
    # grpcurl prints proto field names
    assert response["request_id"] == "grpcurl-1", response
    assert response["model"] == "minilm" and response["dtype"] == "DTYPE_FLOAT32"
    results = response["results"]
    assert len(results) == 2 and results[0]["id"] == "b"
    assert results[0]["score"] >= results[1]["score"]
    assert results[0]["document"]["text"] == "Cats sleep up to sixteen hours a day."
    assert 0 < results[0]["score"] < 1


def test_health_check(demo_server: RunningServer) -> None:
    done = grpcurl(demo_server, "grpc.health.v1.Health/Check", data={"service": "scoring.v1.RerankService"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "SERVING"


def test_bad_request_shows_code_and_field(demo_server: RunningServer) -> None:
    done = grpcurl(demo_server, "scoring.v1.RerankService/Rerank", data={"query": "", "documents": [{"text": "x"}]})
    assert done.returncode != 0
    assert "InvalidArgument" in done.stderr and "query" in done.stderr


def test_info_call(demo_server: RunningServer) -> None:
    done = grpcurl(demo_server, "scoring.v1.InfoService/GetInfo")
    assert done.returncode == 0, done.stderr
    models = json.loads(done.stdout)["models"]
    assert {"minilm", "qwen3-reranker"} <= {m["name"] for m in models}
    # The demo's models are float32 with IEEE matmuls, and say so.
    assert {(m["dtype"], m["float32_matmul_precision"]) for m in models} == {
        ("DTYPE_FLOAT32", "FLOAT32_MATMUL_PRECISION_HIGHEST")
    }


def test_rank_images_from_json(demo_server: RunningServer) -> None:
    """Inline bytes are base64 in grpcurl's JSON; a broken image is that item's error."""
    import base64

    from scoring_server.demo.image_rank import sample_images

    images = sample_images(3)
    request = {
        "query": "cozy cafe interior",
        "images": [{"id": f"p{i}", "data": base64.b64encode(b).decode()} for i, b in enumerate(images)]
        + [{"id": "bad", "data": base64.b64encode(b"not an image").decode()}],
        "requestId": "grpcurl-img",
    }
    done = grpcurl(demo_server, "scoring.v1.ImageRankService/RankImages", data=request)
    assert done.returncode == 0, done.stderr
    response = json.loads(done.stdout)
    assert response["model"] == "image-ranker" and response["request_id"] == "grpcurl-img"
    results = response["results"]
    scored = [r for r in results if "error" not in r]
    assert sorted(r["id"] for r in scored) == ["p0", "p1", "p2"]
    assert [r["score"] for r in scored] == sorted((r["score"] for r in scored), reverse=True)
    assert results[-1]["id"] == "bad" and results[-1]["error"]["code"] == 3  # INVALID_ARGUMENT
    assert "images[3].data" in results[-1]["error"]["message"]
