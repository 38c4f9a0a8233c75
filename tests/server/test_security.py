"""A hardened server: mutual TLS, bearer tokens (health exempt), reflection off, and tight
admission limits, checked from outside as a caller would meet them."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
import yaml
from google.protobuf import json_format
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from support.certs import Pki, make_pki
from support.servers import RunningServer, start_server, stop_server
from scoring.v1 import absa_pb2
from scoring_client import ScoringClient, ScoringError

TOKEN = "test-token-7f3a9"
REVIEW = "The food was delicious but the wait was far too long for a weekday lunch."


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def hardened(pki: Pki, demo_models: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    work = tmp_path_factory.mktemp("hardened")
    config = {
        "reflection": False,
        "tls": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
                "client_ca_file": str(pki.ca)},
        "auth": {"tokens": [TOKEN]},
        "models": [{
            "name": "absa-bert", "kind": "absa", "path": demo_models["absa-bert"].path,
            "dtype": "float32", "max_items_per_request": 64, "max_concurrent_requests": 2,
            "max_queued_items": 100, "retry_after_ms": 40,
            "engine_args": {"enforce_eager": True, "kv_cache_memory_bytes": 64 * 1024 * 1024},
        }],
    }
    (work / "server.yaml").write_text(yaml.safe_dump(config))
    server = start_server(
        ["--config", str(work / "server.yaml")], work / "server.log",
        wait_service="scoring.v1.AbsaService",
        client_kwargs=_tls(pki),
        http=True,
    )
    yield server
    assert stop_server(server) == 0, server.log_tail()


def _tls(pki: Pki, client_cert: bool = True) -> dict[str, object]:
    kwargs: dict[str, object] = {"root_certificates": pki.ca.read_bytes()}
    if client_cert:
        kwargs |= {"private_key": pki.client_key.read_bytes(), "certificate_chain": pki.client_cert.read_bytes()}
    return kwargs


def _request(pairs: int) -> absa_pb2.AnalyzeRequest:
    request = absa_pb2.AnalyzeRequest()
    for i in range(pairs):
        request.pairs.add(aspect=f"aspect {i}", review=REVIEW * 3)
    return request


def test_plaintext_and_certificate_less_clients_are_refused(hardened: RunningServer, pki: Pki) -> None:
    with ScoringClient(hardened.target, timeout=5) as plaintext:
        with pytest.raises(ScoringError) as err:
            plaintext.health()
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
    with ScoringClient(hardened.target, timeout=5, **_tls(pki, client_cert=False)) as no_cert:
        with pytest.raises(ScoringError) as err:
            no_cert.health()
        assert err.value.code == grpc.StatusCode.UNAVAILABLE


def test_a_token_is_required_except_for_health(hardened: RunningServer, pki: Pki) -> None:
    with ScoringClient(hardened.target, **_tls(pki)) as anonymous:
        assert anonymous.health("scoring.v1.AbsaService") == "SERVING"
        with pytest.raises(ScoringError) as err:
            anonymous.info()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert TOKEN not in err.value.details
    with ScoringClient(hardened.target, token="wrong", **_tls(pki)) as impostor:
        with pytest.raises(ScoringError) as err:
            impostor.analyze(pairs=[("food", REVIEW)])
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    with ScoringClient(hardened.target, token=TOKEN, **_tls(pki)) as caller:
        result = caller.analyze(pairs=[("food", REVIEW)])
        assert result.results[0].aspect == "food"
        info = caller.info().models[0]
        assert (info.max_concurrent_requests, info.max_queued_items) == (2, 100)


def test_reflection_can_be_switched_off(hardened: RunningServer, pki: Pki) -> None:
    credentials = grpc.ssl_channel_credentials(**{
        "root_certificates": pki.ca.read_bytes(),
        "private_key": pki.client_key.read_bytes(),
        "certificate_chain": pki.client_cert.read_bytes(),
    })
    with grpc.secure_channel(hardened.target, credentials) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as err:
            list(stub.ServerReflectionInfo(iter([request]), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10))
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_overload_is_refused_at_once_with_a_retry_hint(hardened: RunningServer, pki: Pki) -> None:
    def call(pairs: int) -> tuple[float, ScoringError | None]:
        with ScoringClient(hardened.target, token=TOKEN, timeout=120, **_tls(pki)) as client:
            started = time.monotonic()
            try:
                client.analyze(pairs=[(p.aspect, p.review) for p in _request(pairs).pairs])
                return time.monotonic() - started, None
            except ScoringError as error:
                return time.monotonic() - started, error

    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(call, [60] * 6 + [10] * 10))
    refused = [(t, e) for t, e in outcomes if e is not None]
    served = [t for t, e in outcomes if e is None]
    assert served and refused, outcomes
    for elapsed, error in refused:
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        assert error.retry_after_s == pytest.approx(0.04)
        assert elapsed < max(served), "a refusal must come before the admitted work finishes"
    reasons = " ".join(e.details for _, e in refused)
    assert "items queued" in reasons or "calls in flight" in reasons
    with ScoringClient(hardened.target, token=TOKEN, **_tls(pki)) as client:
        deadline = time.monotonic() + 10
        while client.info().models[0].pending_request_states and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.info().models[0].pending_request_states == 0
        assert len(client.analyze(pairs=[("food", REVIEW)] * 64).results) == 64  # recovers


def _https(server: RunningServer, pki: Pki, client_cert: bool = True) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if client_cert:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return httpx.Client(base_url=f"https://127.0.0.1:{server.http_port}", verify=context, timeout=120)


def test_the_http_door_has_the_same_tls_tokens_and_limits(hardened: RunningServer, pki: Pki) -> None:
    body = {"pairs": [{"aspect": "food", "review": REVIEW}]}
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{hardened.http_port}/health", timeout=5)
    with _https(hardened, pki, client_cert=False) as no_cert, pytest.raises(httpx.HTTPError):
        no_cert.get("/health")
    with _https(hardened, pki) as http:
        assert http.get("/health").status_code == 200  # exempt, as on gRPC
        anonymous = http.post("/scoring/v1/absa", json=body)
        assert anonymous.status_code == 401 and TOKEN not in anonymous.text
        assert http.post("/scoring/v1/absa", json=body, headers={"authorization": "Bearer wrong"}).status_code == 401
        answered = http.post("/scoring/v1/absa", json=body, headers={"authorization": f"Bearer {TOKEN}"})
        assert answered.status_code == 200, answered.text
        assert answered.json()["results"][0]["aspect"] == "food"


def test_http_overload_is_429_with_retry_after(hardened: RunningServer, pki: Pki) -> None:
    def call(pairs: int) -> httpx.Response:
        with _https(hardened, pki) as http:
            request = json_format.MessageToDict(_request(pairs))
            return http.post("/scoring/v1/absa", json=request, headers={"authorization": f"Bearer {TOKEN}"})

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(call, [60] * 6 + [10] * 10))
    refused = [r for r in replies if r.status_code != 200]
    assert refused and len(refused) < len(replies), [r.status_code for r in replies]
    for reply in refused:
        assert reply.status_code == 429, reply.text
        assert reply.headers["retry-after"] == "1"  # 40 ms, in whole seconds
        assert reply.json()["error_type"] == "RESOURCE_EXHAUSTED"
