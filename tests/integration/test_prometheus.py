"""A real Prometheus (Debian's) scrapes a real worker while pages flow through the real broker;
every dashboard query and every alert is evaluated through Prometheus's HTTP API.

Alerts are quiet on a healthy worker, so each is checked two ways: every operand of its
expression (the series it compares) returns data, and the alerts this test can provoke do
fire: a burst of bad records (dead-letter spike), a tiny index memory limit (memory high), and
the worker stopped (worker down, no workers).  Only the ``for:`` delay is not waited out.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from deploy_files import dashboard_queries, iter_rules, local_prometheus_config
from kafka_broker import free_ports, unique_name
from stream_harness import StreamTopics, WorkerProcess, page_record, produce, wait_for_verdicts

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


def test_dashboard_and_alerts_against_a_real_prometheus(kafka, tmp_path):
    # the default topic names (the dashboard and the rules use them); a group of its own
    topics = StreamTopics(
        unique_name("prom"), "pages", "pages.unique", "pages.near-duplicate", "pages.verdicts", "pages.dead-letter", 2
    )
    worker = WorkerProcess(kafka, topics, tmp_path, env={"STREAMDEDUP_INDEX_MEMORY_LIMIT": "1000"})
    worker.start()
    prom = Prometheus(tmp_path, [f"127.0.0.1:{worker.web_port}"])
    try:
        prom.wait(lambda: [r["value"][1] for r in prom.query('up{job="streamdedup"}')] == ["1"], 30, "up == 1")
        good = [page_record(f"http://prom.test/{i}", f"<p>page {i} {'words of text ' * 30}</p>") for i in range(40)]
        bad = [(f"bad-{i}".encode(), b"not json at all") for i in range(60)]
        produce(kafka, topics.pages, good + bad)
        wait_for_verdicts(kafka, topics, len(good), dead_letters=len(bad))
        time.sleep(8)  # a few scrapes after the burst, and one gauge refresh (5 s)

        empty = [(title, ref, q) for title, ref, q in dashboard_queries() if not prom.query(q)]
        assert not empty, f"dashboard queries without data: {empty}"

        alerts = {r["alert"]: r["expr"] for r in iter_rules() if "alert" in r}
        assert len(alerts) >= 5
        for name, expr in alerts.items():
            prom.query(expr)  # valid, whatever it returns
            for part in operands(expr):
                if not part.startswith("absent("):  # absent() has data only when its series is gone
                    assert prom.query(part), f"{name}: {part!r} returns no data"
        for name in ("StreamdedupDeadLetterSpike", "StreamdedupIndexMemoryHigh"):
            assert prom.query(alerts[name]), f"{name} does not fire"
        for name in (
            "StreamdedupWorkerDown",
            "StreamdedupNoWorkers",
            "StreamdedupLagGrowing",
            "StreamdedupRecoveryStuck",
        ):
            assert not prom.query(alerts[name]), f"{name} fires on a healthy worker"

        assert worker.stop() == 0
        prom.wait(lambda: bool(prom.query(alerts["StreamdedupWorkerDown"])), 20, "the worker-down alert")
        assert prom.query(alerts["StreamdedupNoWorkers"])
    finally:
        prom.stop()
        worker.__exit__(None, None, None)


def test_promtool_accepts_the_operands_splitter_examples():
    # the splitter above decides what "every operand returns data" checks: pin its behaviour
    assert operands("a > 0 and changes(b[10m]) == 0") == ["a", "changes(b[10m])"]
    assert operands("sum(rate(x[5m])) / sum(rate(y[5m])) > 0.05") == ["sum(rate(x[5m])) / sum(rate(y[5m]))"]
    assert operands('up{job="s"} == 0') == ['up{job="s"}']
