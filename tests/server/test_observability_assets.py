"""The Grafana dashboard and Prometheus alert rules in deploy/observability, validated offline:
structure (what Grafana and Prometheus require), and every metric and label they use checked
against a live /metrics scrape of the demo server, so a renamed metric cannot leave a silent
panel or an alert that never fires. (`promtool` is not available offline; where it is,
`promtool check rules deploy/observability/prometheus-rules.yaml` applies too.)"""

from __future__ import annotations

import json
import re

import grpc
import pytest
import yaml

from support.metrics import metric_lines, scrape
from support.servers import REPO, RunningServer
from scoring.v1 import absa_pb2, absa_pb2_grpc, rerank_pb2, rerank_pb2_grpc

ASSETS = REPO / "deploy" / "observability"
RULES = yaml.safe_load((ASSETS / "prometheus-rules.yaml").read_text())
DASHBOARD = json.loads((ASSETS / "grafana-dashboard.json").read_text())
_PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "rate", "irate", "increase", "deriv", "histogram_quantile",
    "min_over_time", "max_over_time", "avg_over_time", "absent", "clamp_min",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "offset", "inf", "nan", "e",
}
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCHERS = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^}]*)\}")
_IDENT = re.compile(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)")
_DURATION = re.compile(r"^\d+[smhd]$")


@pytest.fixture(scope="module")
def exported(demo_server: RunningServer, channel: grpc.Channel) -> dict[str, set[str]]:
    """Metric name -> label names, after successful and failed calls of every scoring RPC."""
    rerank = rerank_pb2_grpc.RerankServiceStub(channel)
    rerank.Rerank(rerank_pb2.RerankRequest(query="q", documents=[rerank_pb2.RerankDocument(text="d")]), timeout=60)
    absa = absa_pb2_grpc.AbsaServiceStub(channel)
    absa.Analyze(absa_pb2.AnalyzeRequest(pairs=[absa_pb2.AbsaPair(aspect="food", review="good food")]), timeout=60)
    with pytest.raises(grpc.RpcError):
        absa.Analyze(absa_pb2.AnalyzeRequest(), timeout=60)
    names: dict[str, set[str]] = {}
    for name, labels, _ in metric_lines(scrape(demo_server)):
        names.setdefault(name, set()).update(labels)
    return names


def _check_expr(expr: str, exported: dict[str, set[str]]) -> set[str]:
    """Asserts the expression only uses exported metrics and their labels; returns the labels
    its result can carry (for alert templates)."""
    assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges, subqueries
    grouping = {label.strip() for group in _GROUPING.findall(text) for label in group.split(",") if label.strip()}
    matched_labels: set[str] = set()
    for _, body in _MATCHERS.findall(text):
        matched_labels |= {m.split("=")[0].split("!")[0].strip() for m in body.split(",") if m.strip()}
    bare = _MATCHERS.sub(lambda m: m.group(1) or "", _GROUPING.sub("", text))
    metrics = {
        name for name in _IDENT.findall(bare)
        if name not in _PROMQL_WORDS and not name.startswith("__")
    }
    assert metrics, f"no metric in {expr!r}"
    unknown = metrics - set(exported)
    assert not unknown, f"{expr!r} uses metrics the server does not export: {sorted(unknown)}"
    available = set().union(*(exported[m] for m in metrics))
    missing = (grouping | matched_labels) - available
    assert not missing, f"{expr!r} uses labels its metrics lack: {sorted(missing)}"
    return grouping if "by" in text or "without" in text else available


def test_rules_are_well_formed_and_use_exported_metrics(exported: dict[str, set[str]]) -> None:
    (group,) = RULES["groups"]
    assert group["name"] and group["rules"]
    names = [rule["alert"] for rule in group["rules"]]
    assert len(set(names)) == len(names)
    assert {"ScoringHighErrorRatio", "ScoringLatencyOverBudget", "ScoringEngineNotServing",
            "ScoringRequestStateGrowing"} <= set(names)
    for rule in group["rules"]:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", rule["alert"])
        assert _DURATION.match(rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"page", "ticket"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        labels = _check_expr(rule["expr"], exported)
        templated = set(re.findall(r"\$labels\.(\w+)", json.dumps(rule["annotations"])))
        assert templated <= labels, f"{rule['alert']}: templates use {templated - labels}"


def test_dashboard_is_well_formed_and_uses_exported_metrics(exported: dict[str, set[str]]) -> None:
    assert DASHBOARD["uid"] and DASHBOARD["title"] and DASHBOARD["schemaVersion"] >= 30
    variables = {v["name"] for v in DASHBOARD["templating"]["list"]}
    assert {"datasource", "service", "model"} <= variables
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in DASHBOARD["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, f"{panel['title']}: undefined variables {used - variables}"
            _check_expr(target["expr"].replace("$__rate_interval", "5m"), exported)
    for variable in DASHBOARD["templating"]["list"]:
        if variable["type"] == "query":
            metric, label = re.fullmatch(r"label_values\((\S+), (\w+)\)", variable["query"]).groups()
            assert label in exported[metric], variable["query"]


def test_checker_rejects_unknown_metrics_and_labels(exported: dict[str, set[str]]) -> None:
    """Guards the checks above: they must fail on the mistakes they exist to catch."""
    with pytest.raises(AssertionError, match="does not export"):
        _check_expr("rate(scoring_requests_totl[5m])", exported)
    with pytest.raises(AssertionError, match="lack"):
        _check_expr("sum by (modle) (rate(scoring_requests_total[5m]))", exported)
