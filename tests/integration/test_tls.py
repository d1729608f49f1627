"""streamdedup over the broker's real TLS listeners, and connection failures that name their cause.

End to end over SSL and over SASL_SSL: a worker (``streamdedup worker``), a Scrapy crawl through
the pipeline, one page sent with ``streamdedup produce``, and every verdict read back with
``streamdedup verdicts``, all of them talking TLS only (the broker's CA from ``kafka.ca_file``).

Then each failure a user meets, for the clients (``produce``, ``verdicts``, the Scrapy pipeline)
and the worker: a CA that did not sign the broker's certificate, the broker's ``EXPIRED`` listener
(its certificate ran out in 2020), a wrong SASL password over SASL_PLAINTEXT and SASL_SSL, and a
port that is not Kafka's (an HTTP server).  Each ends with exit status 1 and a message that names
the cause, long before the 30 s connect timeout (every run has a 25 s deadline).  A port that
accepts and never answers can only be told apart from a slow broker by waiting: here it is checked
through the library with a connect timeout shorter than the probe's silence limit (the CLI against
one, and the limit itself: tests/test_connect.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kafka_broker import unique_name  # tests/ is on sys.path (conftest.py)
from sites import dedup_site, html_urls, near_duplicate_pairs, serve_site
from stream_harness import StreamTopics, WorkerProcess
from test_scrapy import _crawl  # tests/integration/ is on sys.path too (pytest's rootdir-less import)

from streamdedup.crawler.client import PageProducer, VerdictConsumer
from streamdedup.errors import ClientError, TopicError
from streamdedup.settings import Settings
from streamdedup.stream.run import ensure_topics

pytestmark = pytest.mark.kafka

#: Every failing run must end well before the clients' 30 s connect timeout.
FAST = 25.0


# ---------------------------------------------------------------------------- helpers


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMDEDUP_")}
    env.update(extra)
    return env


def _cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamdedup", *args],
        env=_env(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _scrapy_settings(env: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()]


@pytest.fixture(scope="module")
def foreign_ca(tmp_path_factory) -> Path:
    """A CA certificate that signed nothing the broker has."""
    d = tmp_path_factory.mktemp("foreign-ca")
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"), "-days", "30", "-subj", "/CN=not the broker's CA",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return d / "ca.pem"


@contextmanager
def silent_port() -> Iterator[str]:
    """A TCP port that accepts connections and never says anything."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"127.0.0.1:{server.getsockname()[1]}"


# ---------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("listener", ["SSL", "SASL_SSL"])
def test_crawl_produce_worker_and_verdicts_over_tls(kafka, tmp_path, listener):
    tls = kafka.settings_env(listener)
    assert tls["STREAMDEDUP_SECURITY_PROTOCOL"] == listener and "STREAMDEDUP_SSL_CAFILE" in tls
    topics = StreamTopics.fresh(kafka, partitions=1)  # one partition: pages are judged in the order sent
    env = {**tls, **topics.env()}
    site = dedup_site()
    copy = {"url": "http://copy.test/heron", "content": site["/articles/heron.html"].body.decode()}
    (tmp_path / "copy.jsonl").write_text(json.dumps(copy) + "\n")
    with (
        WorkerProcess(kafka, topics, tmp_path / "worker", env=tls, brokers=tls["STREAMDEDUP_BROKERS"]),
        serve_site(site) as base_url,
    ):
        crawl = _crawl(tmp_path, base_url, *_scrapy_settings(env))
        assert crawl.returncode == 0, crawl.stderr[-3000:]
        sent = int(re.search(r"'streamdedup/pages_sent': (\d+)", crawl.stderr).group(1))
        produce = _cli(["produce", "copy.jsonl"], env, tmp_path, timeout=60)
        assert produce.returncode == 0, produce.stderr
        assert "sent 1 pages" in produce.stderr
        verdicts = _cli(
            ["verdicts", "--from-beginning", "--max", str(sent + 1), "--timeout", "60", "--format", "json"],
            env,
            tmp_path,
            timeout=90,
        )
        assert verdicts.returncode == 0, verdicts.stderr
    got = [json.loads(line) for line in verdicts.stdout.splitlines()]
    assert len(got) == sent + 1
    last = {v["id"]: v for v in got}
    assert set(last) == html_urls(site, base_url) | {copy["url"]}
    for pair in near_duplicate_pairs(base_url):  # of each pair the page fetched second is flagged
        flagged = [u for u in pair if last[u]["verdict"] == "near_duplicate"]
        assert len(flagged) == 1 and last[flagged[0]]["match_id"] in pair - {flagged[0]}, [last[u] for u in pair]
    # the page sent with `produce` after the crawl is matched with the crawled page it copies
    assert (last[copy["url"]]["verdict"], last[copy["url"]]["match_id"], last[copy["url"]]["distance"]) == (
        "near_duplicate",
        base_url + "/articles/heron.html",
        0,
    )


# ---------------------------------------------------------------------------- failures, named


def _failure_env(kafka, cause: str, foreign_ca: Path, http_port: str) -> tuple[dict[str, str], str]:
    """(settings, what the message must say) for one cause of failure."""
    if cause == "foreign CA":
        env = {**kafka.settings_env("SSL"), "STREAMDEDUP_SSL_CAFILE": str(foreign_ca)}
        return env, "TLS certificate verify failed: unable to get local issuer certificate"
    if cause == "expired certificate":
        return kafka.settings_env("EXPIRED"), "TLS certificate verify failed: certificate has expired"
    if cause.startswith("wrong password"):
        env = {**kafka.settings_env(cause.split()[-1]), "STREAMDEDUP_SASL_PASSWORD": "not-the-password"}
        return env, "authentication failed"
    assert cause == "HTTP port"
    return {"STREAMDEDUP_BROKERS": http_port}, f"{http_port} is not a Kafka listener: it answered"


CAUSES = ["foreign CA", "expired certificate", "wrong password SASL_PLAINTEXT", "wrong password SASL_SSL", "HTTP port"]


@pytest.mark.parametrize("cause", CAUSES)
@pytest.mark.parametrize("program", ["produce", "verdicts", "worker", "scrapy"])
def test_a_connection_failure_names_its_cause_at_once(kafka, tmp_path, foreign_ca, program, cause):
    topics = StreamTopics.fresh(kafka, partitions=1)  # (they exist: only the connection can fail)
    (tmp_path / "page.jsonl").write_text(json.dumps({"url": "http://a.test/", "content": "<p>a page</p>"}) + "\n")
    with serve_site(dedup_site()) as base_url:
        env, expected = _failure_env(kafka, cause, foreign_ca, base_url.removeprefix("http://"))
        env = {**env, **topics.env(), "STREAMDEDUP_DATA_DIR": str(tmp_path / "data")}
        if program == "scrapy":
            run = _crawl(tmp_path, base_url, *_scrapy_settings(env))
            out = run.stderr
            assert "ClientError: cannot connect to Kafka at " in out
            assert "downloader/response_count" not in out  # stopped before fetching anything
        else:
            args = {"produce": ["produce", "page.jsonl"], "verdicts": ["verdicts"], "worker": ["worker"]}[program]
            run = _cli(args, env, tmp_path, timeout=FAST)
            out = run.stderr
            assert "Traceback" not in out
            assert f"Error: cannot connect to Kafka at {env['STREAMDEDUP_BROKERS']} " in out
    assert run.returncode == 1, out[-3000:]
    assert expected in out, out[-3000:]


@pytest.mark.parametrize("client", ["producer", "consumer", "worker start"])
def test_a_port_that_never_answers_is_named_after_the_timeout(client):
    with silent_port() as port:
        settings = Settings.from_sources({"brokers": port}, {})

        async def start() -> None:
            if client == "producer":
                await PageProducer(settings, connect_timeout=1.5).start()
            elif client == "consumer":
                await VerdictConsumer(settings, connect_timeout=1.5).start()
            else:
                await ensure_topics(settings, timeout=1.5)

        with pytest.raises(ClientError) as failure:
            asyncio.run(asyncio.wait_for(start(), FAST))
    assert f"{port} accepted the connection but answered no Kafka request in 1.5 s" in str(failure.value)
    assert client != "worker start" or isinstance(failure.value, TopicError)


def test_plaintext_to_the_tls_listener_and_tls_to_the_plaintext_one_say_so(kafka):
    async def fail(settings: Settings) -> str:
        with pytest.raises(ClientError) as failure:
            await asyncio.wait_for(PageProducer(settings, topic=unique_name("none")).start(), FAST)
        return str(failure.value)

    plain_to_tls = asyncio.run(fail(Settings.from_sources({"brokers": kafka.ssl_bootstrap}, {})))
    assert "answered with TLS: a TLS listener? use --security-protocol SSL or SASL_SSL" in plain_to_tls
    tls_to_plain = asyncio.run(
        fail(
            Settings.from_sources(
                {"brokers": kafka.bootstrap, "security_protocol": "SSL", "ssl_cafile": str(kafka.ca_file)}, {}
            )
        )
    )
    assert "closed the connection during the TLS handshake: is it a TLS listener" in tls_to_plain
    no_login = asyncio.run(fail(Settings.from_sources({**_flags(kafka.settings_env("SASL_SSL")), **_NO_SASL}, {})))
    assert "answered a Kafka request and then closed the connection: a SASL listener?" in no_login
    assert "use --security-protocol SASL_SSL" in no_login


_NO_SASL = {"security_protocol": "SSL", "sasl_mechanism": None, "sasl_username": None, "sasl_password": None}


def _flags(env: dict[str, str]) -> dict[str, str | None]:
    return {k.removeprefix("STREAMDEDUP_").lower(): v for k, v in env.items()}
