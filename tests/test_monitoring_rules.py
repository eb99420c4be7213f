"""The monitoring kit of ops/deploy/monitoring (issue 21, item 6): the alert rules and the scrape example pass
promtool, the Grafana dashboard has the shape Grafana imports and PromQL that parses, and every stator_* metric the
rules and the dashboard name is exported by a real running cluster, so renaming a metric fails here instead of
leaving an alert that never fires."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from client import AdminClient, Producer, PullConsumer

MONITORING = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ops", "deploy", "monitoring")
ALERTS = os.path.join(MONITORING, "alerts.yml")
DASHBOARD = os.path.join(MONITORING, "grafana-dashboard.json")
SCRAPE_CONFIG = os.path.join(MONITORING, "prometheus.yml")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
METRIC = re.compile(r"\bstator_[A-Za-z0-9_]+")
# A function of a counter's increase applied to a stator_* series: on a gauge it answers nonsense (a gauge that
# drops reads as a counter reset), and promtool cannot tell, since it does not know the metric's type.
COUNTER_FUNCTION = re.compile(r"\b(rate|irate|increase|resets)\(\s*(stator_[A-Za-z0-9_]+)")
# Grafana's own variables, which promtool does not know: replaced by what they stand for before parsing.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


def alert_rules() -> list[dict]:
    with open(ALERTS) as f:
        return [rule for group in yaml.safe_load(f)["groups"] for rule in group["rules"]]


def dashboard() -> dict:
    with open(DASHBOARD) as f:
        return json.load(f)


def dashboard_targets(d: dict) -> list[tuple[dict, dict]]:
    panels = d["panels"] + [p for row in d["panels"] if row["type"] == "row" for p in row.get("panels", [])]
    return [(p, t) for p in panels if p["type"] != "row" for t in p["targets"]]


def queries() -> list[tuple[str, str]]:
    """Every PromQL expression of the kit, with where it is used."""
    return [(rule["expr"], f"alert {rule['alert']}") for rule in alert_rules()] + \
        [(target["expr"], f"panel {panel['title']!r}") for panel, target in dashboard_targets(dashboard())]


def metric_names_used() -> dict[str, set[str]]:
    """Every stator_* name in an alert (its expression and the text an operator reads) or a dashboard query, with
    where it is used."""
    used: dict[str, set[str]] = {}
    for rule in alert_rules():
        for text in [rule["expr"], *rule.get("annotations", {}).values()]:
            for name in METRIC.findall(text):
                used.setdefault(name, set()).add(f"alert {rule['alert']}")
    for panel, target in dashboard_targets(dashboard()):
        for name in METRIC.findall(target["expr"]):
            used.setdefault(name, set()).add(f"panel {panel['title']!r}")
    return used


def test_promtool_passes_the_rules_and_the_scrape_example():
    rules = promtool("check", "rules", ALERTS)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    # The scrape example loads alerts.yml by a relative path: checking it checks that the two go together.
    config = promtool("check", "config", SCRAPE_CONFIG)
    assert config.returncode == 0, config.stdout + config.stderr
    assert "1 rule files found" in config.stdout + config.stderr
    with open(SCRAPE_CONFIG) as f:
        jobs = {job["job_name"]: job for job in yaml.safe_load(f)["scrape_configs"]}
    assert sorted(jobs) == ["stator-broker", "stator-meta"]
    for job in jobs.values():
        assert len(job["static_configs"][0]["targets"]) == 3


def test_alerts_cover_what_an_operator_is_paged_for():
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), names
    for wanted in ("StatorNoLeader", "StatorLeaderChanges", "StatorRaftFollowerLag", "StatorBrokerFenced",
                   "StatorBrokerSessionLost", "StatorConsumerLagGrowing", "StatorPopDeadLetters",
                   "StatorLimitRefusals", "StatorUnavailableRefusals"):
        assert wanted in names, wanted
    for r in rules:
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r["alert"]
        assert r["annotations"]["summary"], r["alert"]
    # Each signal is read from the metric that carries it.
    by_name = {r["alert"]: r["expr"] for r in rules}
    assert "stator_meta_is_leader" in by_name["StatorNoLeader"]
    assert 'stator_meta_raft_role_changes_total{role="leader"}' in by_name["StatorLeaderChanges"]
    assert "stator_meta_follower_lag_entries" in by_name["StatorRaftFollowerLag"]
    assert "stator_broker_consumer_lag_messages" in by_name["StatorConsumerLagGrowing"]
    assert "stator_pop_dlq_messages" in by_name["StatorPopDeadLetters"]
    for refusals in ("StatorLimitRefusals", "StatorUnavailableRefusals"):
        assert "stator_meta_http_refusals_total" in by_name[refusals]
        assert "stator_broker_http_refusals_total" in by_name[refusals]


def test_the_dashboard_is_grafana_json_with_queries_that_parse(tmp_path):
    d = dashboard()
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 30
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = d["panels"]
    assert panels and all(isinstance(p["id"], int) for p in panels)
    assert len({p["id"] for p in panels}) == len(panels), "panel ids are unique"
    for p in panels:
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["type"] in ("timeseries", "stat", "gauge", "table", "bargauge", "heatmap"), p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"] == p["datasource"], p["title"]
    assert len(dashboard_targets(d)) >= 20
    # promtool parses PromQL only in rule files: each query becomes a recording rule of its own.
    rules = []
    for i, (panel, target) in enumerate(dashboard_targets(d)):
        expr = target["expr"]
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"panel {panel['title']!r}: a variable promtool cannot check: {expr}"
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


async def scraped_names(session: aiohttp.ClientSession, url: str) -> dict[str, str]:
    """The metric names one /metrics answer declares or carries, each with its family's type: each family's name,
    each sample's name, and the names PromQL reads a counter or a histogram by even while it has no series yet (a
    labelled counter nothing incremented is declared with no sample)."""
    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=15)) as r:
        assert r.status == 200
        text = await r.text()
    names: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        names[family.name] = family.type
        names.update((s.name, family.type) for s in family.samples)
        if family.type == "counter":
            names[family.name + "_total"] = family.type
        elif family.type == "histogram":
            names.update((family.name + suffix, family.type) for suffix in ("_bucket", "_count", "_sum"))
    return names


async def test_every_metric_the_rules_and_dashboard_name_is_exported(full_cluster):
    c = full_cluster
    used = metric_names_used()
    assert len(used) >= 30, sorted(used)
    # Traffic that gives the per-topic, per-group and per-queue families series: sends, a pull group that commits
    # and leaves a lag, a pop group that acks.
    async with AdminClient(c.meta_urls, c.token("admin")) as admin:
        await admin.create_topic("watched", queues=3)
        async with Producer(c.meta_urls, c.token("client"), "watched") as producer:
            for i in range(12):
                await producer.send(f"message {i}")
        async with PullConsumer(c.meta_urls, c.token("client"), "watched", "readers") as consumer:
            got = []
            for _ in range(40):
                got += await consumer.poll(timeout_s=0.5)
                if len(got) >= 12:
                    break
            assert len(got) == 12
            await consumer.commit_positions()
        async with Producer(c.meta_urls, c.token("client"), "watched") as producer:
            await producer.send("unread")
        route = await admin.route("watched")
    popper = route["queues"][0]["address"]
    s, popped, _ = await c.call("POST", f"{popper}/v1/pop/watched", "client", json={"group": "poppers", "max": 10})
    assert s == 200 and popped["messages"], popped
    s, acked, _ = await c.call("POST", f"{popper}/v1/ack", "client",
                               json={"group": "poppers", "handles": [m["handle"] for m in popped["messages"]]})
    assert s == 200, acked

    urls = c.meta_urls + c.broker_urls
    assert len(urls) == 6

    exported: dict[str, str] = {}
    for url in urls:
        exported |= await scraped_names(c.session, url)
    missing = {name: sorted(where) for name, where in used.items() if name not in exported}
    assert not missing, f"named in ops/deploy/monitoring but exported by no process: {missing}"
    on_gauges = [(where, fn, name, exported[name]) for expr, where in queries()
                 for fn, name in COUNTER_FUNCTION.findall(expr) if exported[name] not in ("counter", "histogram")]
    assert not on_gauges, f"a counter's function applied to what is not a counter: {on_gauges}"
