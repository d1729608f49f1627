"""Readers for the deployment files in ``deploy/``, shared by ``test_deploy.py`` and by tests that
run a real Prometheus against a worker.

* :func:`dashboard_queries` gives every PromQL query of the Grafana dashboard with Grafana's
  variables replaced (``$__rate_interval`` -> ``1m`` ...), ready for Prometheus' HTTP API.
* :func:`local_prometheus_config` gives ``deploy/prometheus/prometheus.yml`` pointed at local
  targets (e.g. ``127.0.0.1:6066``) with the same rule files, as YAML text for a temporary file.
* :func:`promql_metric_names` / :func:`promql_label_names` pick the names out of a PromQL
  expression (a small lexer, good for the expressions here; promtool checks the syntax).
* :func:`known_metrics` lists every series name a worker can export, with its label names.

>>> sorted(promql_metric_names('sum by (le) (rate(a_bucket{job="x"}[5m])) / on(i) b_total offset 1h'))
['a_bucket', 'b_total']
>>> sorted(promql_label_names('sum by (le) (rate(a_bucket{job="x", stage=~"p.*"}[5m]))'))
['job', 'le', 'stage']
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "streamdedup.json"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
JOB = "streamdedup"  # the scrape job name the alerts and the dashboard select

#: Values for Grafana's built-in variables when a dashboard query is sent to Prometheus directly.
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}


# ---------------------------------------------------------------------------- dashboard


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for p in panels:
        yield p
        yield from iter_panels(p.get("panels", []))


def dashboard_variables(dashboard: dict[str, Any] | None = None, instance: str = ".*") -> dict[str, str]:
    """Values for every variable a query may use: Grafana's built-ins, the dashboard's constants,
    ``instance`` (the worker regex; all workers by default) and the data source."""
    d = dashboard or load_dashboard()
    values = dict(GRAFANA_BUILTINS)
    for v in d["templating"]["list"]:
        if v["type"] == "constant":
            values[v["name"]] = v["query"]
        elif v["type"] == "datasource":
            values[v["name"]] = v["current"]["value"]
    values["instance"] = instance
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace ``$name`` and ``${name}``; an unknown variable raises KeyError."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values[m.group(1) or m.group(2)], expr)


def dashboard_queries(instance: str = ".*") -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL with the variables replaced) for every query of the dashboard."""
    d = load_dashboard()
    values = dashboard_variables(d, instance)
    return [
        (p["title"], t["refId"], substitute(t["expr"], values))
        for p in iter_panels(d["panels"])
        for t in p.get("targets", [])
    ]


# ---------------------------------------------------------------------------- prometheus


def local_prometheus_config(targets: list[str], *, scrape_interval: str = "1s", evaluation_interval: str = "1s") -> str:
    """``deploy/prometheus/prometheus.yml`` scraping ``targets`` (e.g. ``["127.0.0.1:6066"]``) as job
    streamdedup, with its rule files by absolute path, for a Prometheus run from a temporary dir."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    config["global"].update(scrape_interval=scrape_interval, evaluation_interval=evaluation_interval)
    config["rule_files"] = [str(PROMETHEUS_CONFIG.parent / f) for f in config.get("rule_files", [])]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == JOB]
    job["static_configs"] = [{"targets": list(targets)}]
    config["scrape_configs"] = [job]
    return yaml.safe_dump(config, sort_keys=False)


def rule_files() -> list[Path]:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    return [PROMETHEUS_CONFIG.parent / f for f in config.get("rule_files", [])]


def iter_rules() -> Iterator[dict[str, Any]]:
    for path in rule_files():
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            yield from group["rules"]


# ---------------------------------------------------------------------------- PromQL lexing

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}
_GROUPING = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (identifiers that are not functions, keywords, label
    names or durations)."""
    s = _strip_strings(expr)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges and subqueries
    s = re.sub(_GROUPING, " ", s)
    s = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        before = s[m.start() - 1] if m.start() else " "
        if before.isdigit() or before in ".$":  # 1e3, 0.5e-3, a leftover $variable
            continue
        if s[m.end() :].lstrip().startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue  # a function or aggregation, or a keyword
        names.add(m.group(0))
    return names


def promql_label_names(expr: str) -> set[str]:
    """Label names used in matchers and in by/without/on/ignoring/group_* clauses."""
    s = _strip_strings(expr)
    names = {
        n
        for block in re.findall(r"\{([^}]*)\}", s)
        for n in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", block)
    }
    names |= {n.strip() for block in re.findall(_GROUPING, s) for n in block.split(",") if n.strip()}
    return names


def promql_label_values(expr: str, label: str) -> set[str]:
    """Values a label is matched against with ``=`` (not regexes)."""
    return set(re.findall(rf'\b{label}\s*=\s*"([^"]*)"', expr))


# ---------------------------------------------------------------------------- what a worker exports


def _series_names(family_name: str, kind: str) -> set[str]:
    suffixes = {
        "counter": ("_total",),  # no _created: the worker disables them (metrics.py)
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("", "_sum", "_count"),
        "info": ("_info",),
        "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    }.get(kind, ("",))
    return {family_name + s for s in suffixes}


def _collector_metrics(collectors: list[Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for c in collectors:
        labels = set(getattr(c, "_labelnames", ()))
        for family in c.collect() if not hasattr(c, "_labelnames") else c.describe():
            for name in _series_names(family.name, family.type):
                out[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    return out


def known_metrics() -> dict[str, set[str]]:
    """Every series name a worker can export -> its label names (without target labels): the
    metrics of ``streamdedup/stream/metrics.py``, faust's sensor metrics as it names them
    (``faust_metrics``, prefix ``streamdedup_faust``), and prometheus_client's default process, platform and GC collectors.
    All are built in fresh registries, so nothing here depends on a running worker."""
    from dataclasses import fields

    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    from streamdedup.stream.metrics import Metrics, faust_metrics

    ours = Metrics.create(CollectorRegistry())
    faust = list(faust_metrics(CollectorRegistry()))
    registry = CollectorRegistry()
    defaults = [
        ProcessCollector(registry=registry),
        PlatformCollector(registry=registry),
        GCCollector(registry=registry),
    ]
    out = _collector_metrics([getattr(ours, f.name) for f in fields(ours)])
    out |= _collector_metrics(faust)
    out |= _collector_metrics(defaults)
    return out


def load_yaml_documents(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
