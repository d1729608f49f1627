"""A real Prometheus (Debian's) scrapes a real worker; every dashboard query and every alert is
evaluated through Prometheus's HTTP API, and Prometheus's own ``promtool check metrics`` reads
the worker's live ``/metrics``.

* An idle healthy worker: every dashboard panel shows a number (no "No data"), no alert fires,
  and the scrape passes ``promtool check metrics``.
* A worker whose failures are provoked, one by one, with real records on the real broker: each
  alert's expression holds (only the ``for:`` delay is not waited out).  Provoked here:
  StreamdedupDeadLetterSpike (a burst of bad records), StreamdedupVerdictLatencyHigh (pages
  produced with a timestamp an hour old), StreamdedupErrors (undecodable records written to the
  internal answers topic), StreamdedupMemoryHigh and StreamdedupIndexMemoryHigh (limits set
  below what the worker holds), StreamdedupCheckLatencyHigh (checks that the worker's test hook
  answers 2 s late), StreamdedupWorkerDown and StreamdedupNoWorkers (the worker stopped).  Not provoked
  here, only in ``deploy/prometheus/alerts_test.yml`` (promtool test rules):
  StreamdedupLagGrowing (needs 10,000 records of lag growing for 15 minutes) and
  StreamdedupRecoveryStuck (needs a changelog that cannot be read).  Those are checked to be
  quiet with every operand of their expression returning data.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from aiokafka import AIOKafkaProducer
from deploy_files import DEPLOY, dashboard_queries, iter_rules, local_prometheus_config
from kafka_broker import free_ports, unique_name
from prometheus_client.parser import text_string_to_metric_families
from stream_harness import StreamTopics, WorkerProcess, page_record, produce, wait_for_verdicts

from streamdedup.stream.app import FAULT_ENV
from streamdedup.stream.metrics import PHASES

#: Alerts the real test provokes; the others are shown firing by promtool test rules only.
PROVOKED = {
    "StreamdedupDeadLetterSpike",
    "StreamdedupVerdictLatencyHigh",
    "StreamdedupErrors",
    "StreamdedupMemoryHigh",
    "StreamdedupIndexMemoryHigh",
    "StreamdedupCheckLatencyHigh",
    "StreamdedupWorkerDown",
    "StreamdedupNoWorkers",
}

pytestmark = pytest.mark.kafka


class Prometheus:
    def __init__(self, workdir, targets: list[str]) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: run deploy/local/install-debian-packages.sh (make install does)"
        self.port = free_ports(1)[0]
        (workdir / "prometheus.yml").write_text(local_prometheus_config(targets))
        self.log = open(workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.wait(lambda: self._get("/-/ready") is not None, 30, "Prometheus ready")

    def _get(self, path: str):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.read()
        except OSError:
            return None

    def query(self, expr: str) -> list:
        body = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert body is not None, f"Prometheus did not answer {expr!r}"
        data = json.loads(body)
        assert data["status"] == "success", (expr, data)
        return data["data"]["result"]

    @staticmethod
    def wait(cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def operands(expr: str) -> list[str]:
    """The top-level operands of comparisons and set operators, numbers left out."""
    expr = " ".join(expr.split())
    parts, depth, start, i = [], 0, 0, 0
    ops = re.compile(r"\s(and|or|unless)\s|==|!=|>=|<=|>|<")
    while i < len(expr):
        c = expr[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and (m := ops.match(expr, i)):
            parts.append(expr[start:i])
            start = i = m.end()
            continue
        i += 1
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip() and not re.fullmatch(r"[\d.e+-]+", p.strip())]


def alerts() -> dict[str, str]:
    return {r["alert"]: r["expr"] for r in iter_rules() if "alert" in r}


def finite(result: list) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def phase_sums(text: str) -> dict[str, tuple[float, float]]:
    """(count, sum) of each phase of streamdedup_page_phase_seconds, and of the verdict latency."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("streamdedup_page_phase_seconds_count", "streamdedup_verdict_latency_seconds_count"):
                key = sample.labels.get("phase", "latency")
                out[key] = (sample.value, out.get(key, (0.0, 0.0))[1])
            elif sample.name in ("streamdedup_page_phase_seconds_sum", "streamdedup_verdict_latency_seconds_sum"):
                key = sample.labels.get("phase", "latency")
                out[key] = (out.get(key, (0.0, 0.0))[0], sample.value)
    return out


def promtool_check_metrics(text: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run deploy/local/install-debian-packages.sh"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"promtool check metrics (exit {r.returncode}):\n{r.stdout}{r.stderr}"


def post_check(port: int, record: dict) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/check", data=json.dumps(record).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status


def produce_at(kafka, topic: str, records: list[dict], timestamp_ms: int) -> None:
    """Pages with a Kafka timestamp of our choosing (the crawler's produce time, as the worker reads it)."""

    async def run() -> None:
        p = AIOKafkaProducer(**kafka.client_kwargs())
        await p.start()
        try:
            for r in records:
                await p.send(topic, json.dumps(r).encode(), key=r["url"].encode(), timestamp_ms=timestamp_ms)
            await p.flush()
        finally:
            await p.stop()

    asyncio.run(run())


def default_topics() -> StreamTopics:
    # the default topic names (the dashboard and the rules use them); a group of its own
    return StreamTopics(
        unique_name("prom"), "pages", "pages.unique", "pages.near-duplicate", "pages.verdicts", "pages.dead-letter", 2
    )


def test_an_idle_healthy_worker_shows_numbers_fires_nothing_and_passes_promtool(kafka, tmp_path):
    topics = default_topics()
    worker = WorkerProcess(kafka, topics, tmp_path)
    worker.start()
    prom = Prometheus(tmp_path, [f"127.0.0.1:{worker.web_port}"])
    try:
        prom.wait(lambda: [r["value"][1] for r in prom.query('up{job="streamdedup"}')] == ["1"], 30, "up == 1")
        panels: dict[str, list[str]] = {}
        for title, _, q in dashboard_queries():
            panels.setdefault(title, []).append(q)

        def blank() -> list[str]:
            return [t for t, qs in panels.items() if not any(finite(prom.query(q)) for q in qs)]

        # rate windows need two scrapes, the gauges a refresh (5 s): poll until every panel has a number
        try:
            prom.wait(lambda: not blank(), 60, "a number in every panel")
        except AssertionError:
            raise AssertionError(f"panels showing 'No data' on an idle healthy worker: {blank()}") from None

        for name, expr in alerts().items():
            assert not prom.query(expr), f"{name} fires on an idle healthy worker"
        promtool_check_metrics(scrape(worker.web_port))
    finally:
        prom.stop()
        worker.__exit__(None, None, None)


def test_each_alert_fires_when_its_failure_is_provoked(kafka, tmp_path):
    topics = default_topics()
    env = {"STREAMDEDUP_INDEX_MEMORY_LIMIT": "1000", "STREAMDEDUP_MEMORY_LIMIT": "50000000"}  # below what it holds
    env[FAULT_ENV] = "check:id=slow-check"
    worker = WorkerProcess(kafka, topics, tmp_path, env=env)
    worker.start()
    prom = Prometheus(tmp_path, [f"127.0.0.1:{worker.web_port}"])
    rules = alerts()

    def fires(name: str) -> bool:
        return bool(prom.query(rules[name]))

    try:
        prom.wait(lambda: [r["value"][1] for r in prom.query('up{job="streamdedup"}')] == ["1"], 30, "up == 1")
        good = [page_record(f"http://prom.test/{i}", f"<p>page {i} {'words of text ' * 30}</p>") for i in range(40)]
        produce(kafka, topics.pages, good)
        wait_for_verdicts(kafka, topics, len(good))
        # every page's latency split into its phases: each phase once a page, and they add up
        prom.wait(lambda: phase_sums(scrape(worker.web_port))["latency"][0] >= len(good), 30, "every latency observed")
        sums = phase_sums(scrape(worker.web_port))
        assert {p: sums[p][0] for p in PHASES} == dict.fromkeys(PHASES, len(good))
        assert all(total >= 0 for _, total in sums.values())
        assert sum(sums[p][1] for p in PHASES) == pytest.approx(sums["latency"][1], abs=0.05)
        assert post_check(worker.web_port, page_record("http://prom.test/check", "<p>page 1</p>")) == 200

        # while pages flow every dashboard query has data, and every operand of every alert (the
        # series it compares; absent() has data only when its series is gone)
        def missing() -> list:
            out = [(title, ref, q) for title, ref, q in dashboard_queries() if not prom.query(q)]
            for name, expr in rules.items():
                prom.query(expr)  # valid, whatever it returns
                out += [
                    (name, part) for part in operands(expr) if not part.startswith("absent(") and not prom.query(part)
                ]
            return out

        try:  # the gauges refresh every 5 s, rates need two scrapes
            prom.wait(lambda: not missing(), 30, "data in every dashboard query and alert operand")
        except AssertionError:
            raise AssertionError(f"without data: {missing()}") from None

        # healthy so far: only the limit alerts (provoked by the configuration) fire
        assert fires("StreamdedupIndexMemoryHigh") and fires("StreamdedupMemoryHigh")
        quiet = set(rules) - {"StreamdedupIndexMemoryHigh", "StreamdedupMemoryHigh"}
        assert not [n for n in quiet if fires(n)], "alerts firing on a healthy worker"

        # a burst of bad records
        bad = [(f"bad-{i}".encode(), b"not json at all") for i in range(60)]
        produce(kafka, topics.pages, bad)
        prom.wait(lambda: fires("StreamdedupDeadLetterSpike"), 60, "the dead-letter alert")

        # pages produced an hour ago: their verdicts are an hour late
        late = [page_record(f"http://prom.test/late/{i}", f"<p>late {i} {'other words ' * 30}</p>") for i in range(5)]
        produce_at(kafka, topics.pages, late, int((time.time() - 3600) * 1000))
        prom.wait(lambda: fires("StreamdedupVerdictLatencyHigh"), 60, "the verdict latency alert")

        # records a worker cannot decode on its internal answers topic: the answers stage fails
        assert not fires("StreamdedupErrors")
        produce(kafka, f"{topics.app_id}-answers", [(b"junk", b"not a batch of answers")])
        prom.wait(lambda: fires("StreamdedupErrors"), 60, "the errors alert")
        (err,) = prom.query(rules["StreamdedupErrors"])
        assert err["metric"]["stage"] == "answers"

        # checks answered late: the worker's test hook holds the answer to a check whose page holds
        # "slow-check" for 2 s (a backlog in the fingerprinting pool made this happen, but the compiled
        # fingerprint path works through any backlog a test can produce in well under the 1 s threshold)
        assert not fires("StreamdedupCheckLatencyHigh")
        slow = page_record("http://prom.test/slow-check", "<p>" + " ".join(f"c{j}" for j in range(300)) + "</p>")
        with ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(lambda _: post_check(worker.web_port, slow), range(4)))
        assert statuses == [200] * 4
        prom.wait(lambda: fires("StreamdedupCheckLatencyHigh"), 60, "the /check latency alert")

        promtool_check_metrics(scrape(worker.web_port))  # with every label child the traffic made

        assert worker.stop() == 0
        prom.wait(lambda: fires("StreamdedupWorkerDown"), 20, "the worker-down alert")
        assert fires("StreamdedupNoWorkers")
    finally:
        prom.stop()
        worker.__exit__(None, None, None)


def test_every_alert_is_provoked_here_or_by_promtool():
    tests = yaml.safe_load((DEPLOY / "prometheus" / "alerts_test.yml").read_text())
    by_promtool = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert set(alerts()) == by_promtool, "every alert is shown firing by promtool test rules"
    assert PROVOKED <= set(alerts())


def test_promtool_accepts_the_operands_splitter_examples():
    # the splitter above decides what "every operand returns data" checks: pin its behaviour
    assert operands("a > 0 and changes(b[10m]) == 0") == ["a", "changes(b[10m])"]
    assert operands("sum(rate(x[5m])) / sum(rate(y[5m])) > 0.05") == ["sum(rate(x[5m])) / sum(rate(y[5m]))"]
    assert operands('up{job="s"} == 0') == ['up{job="s"}']
