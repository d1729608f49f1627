"""Smoke tests of the local Kafka broker (deploy/local/kafka.sh) and its test helper.

The broker is started once per session by the ``kafka`` fixture in conftest.py; topics and groups are unique per test, so tests never see each other's data.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.conn import create_conn
from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed
from kafka_broker import KAFKA_SH, free_ports, unique_name  # tests/ is on sys.path (conftest.py)

pytestmark = pytest.mark.kafka

SCRAM = ["SCRAM-SHA-256", "SCRAM-SHA-512"]


# ---------------------------------------------------------------------------- helpers


async def _produce(client_kwargs: dict, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(**client_kwargs, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send(topic, value=value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def _consume(
    client_kwargs: dict, topic: str, count: int, *, group_id: str | None = None, timeout: float = 20.0
) -> list[tuple[bytes | None, bytes | None, dict]]:
    """Read ``count`` records from the start of ``topic``.

    With ``group_id`` this joins a consumer group (subscribe + commit, like streamdedup's
    workers); without, it assigns partition 0 directly (no rebalance, fastest).
    """
    consumer = AIOKafkaConsumer(
        **client_kwargs,
        group_id=group_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    if group_id is None:
        await consumer.start()
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning()
    else:
        consumer.subscribe([topic])
        await consumer.start()
    out: list[tuple[bytes | None, bytes | None, dict]] = []
    try:
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                out.extend((r.key, r.value, dict(r.headers or ())) for r in records)
        if group_id is not None and out:
            await consumer.commit()
    finally:
        await consumer.stop()
    return out


def _messages(n: int, tag: str) -> list[tuple[bytes, bytes]]:
    return [(f"k{i}".encode(), f"{tag}-{i}".encode()) for i in range(n)]


# ---------------------------------------------------------------------------- tests


def test_plaintext_produce_consume_with_group(kafka):
    topic = kafka.create_topic(unique_name("plain"), partitions=1)
    group = unique_name("grp")
    sent = _messages(5, "plain")

    async def run():
        await _produce(kafka.client_kwargs(), topic, sent)
        got = await _consume(kafka.client_kwargs(), topic, len(sent), group_id=group)
        # The group's offsets were committed to __consumer_offsets.
        probe = AIOKafkaConsumer(**kafka.client_kwargs(), group_id=group, enable_auto_commit=False)
        await probe.start()
        try:
            committed = await probe.committed(TopicPartition(topic, 0))
        finally:
            await probe.stop()
        return got, committed

    got, committed = asyncio.run(run())
    assert [(k, v) for k, v, _ in got] == sent
    assert committed == len(sent)


def test_create_topic_partitions_and_config(kafka):
    name = unique_name("cfg")
    kafka.create_topic(name, partitions=3, config={"cleanup.policy": "compact"})

    async def describe():
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        admin = AIOKafkaAdminClient(**kafka.client_kwargs())
        await admin.start()
        try:
            (topic,) = await admin.describe_topics([name])
            (cfg,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
        finally:
            await admin.close()
        entries = {e[0]: e[1] for e in cfg.resources[0][4]}
        return len(topic["partitions"]), entries["cleanup.policy"]

    assert asyncio.run(describe()) == (3, "compact")


@pytest.mark.parametrize("mechanism", [*SCRAM, "PLAIN"])
def test_sasl_produce_consume(kafka, mechanism):
    topic = kafka.create_topic(unique_name(f"sasl-{mechanism.lower()}"))
    sent = _messages(3, mechanism)

    async def run():
        kw = kafka.client_kwargs(mechanism)
        await _produce(kw, topic, sent)
        return await _consume(kw, topic, len(sent))

    got = asyncio.run(run())
    assert [(k, v) for k, v, _ in got] == sent


@pytest.mark.parametrize("mechanism", [*SCRAM, "PLAIN"])
def test_sasl_wrong_password_is_rejected(kafka, mechanism, caplog):
    host, port = kafka.sasl_bootstrap.split(":")
    kw = kafka.client_kwargs(mechanism, password="not-the-password")
    kw.pop("bootstrap_servers")

    async def run():
        # The connection itself reports the broker's SASL_AUTHENTICATION_FAILED (error 58) ...
        with pytest.raises(SaslAuthenticationFailed, match="(?i)invalid (credentials|username or password)"):
            conn = await create_conn(host, int(port), **kw)
            conn.close()
        # ... which a producer surfaces as a failed bootstrap.
        producer = AIOKafkaProducer(**kafka.client_kwargs(mechanism, password="not-the-password"))
        try:
            with pytest.raises(KafkaConnectionError):
                await producer.start()
        finally:
            await producer.stop()

    asyncio.run(run())
    assert any("SaslAuthenticationFailed" in r.getMessage() for r in caplog.records)


def test_sasl_unknown_user_is_rejected(kafka):
    host, port = kafka.sasl_bootstrap.split(":")
    kw = kafka.client_kwargs("SCRAM-SHA-512")
    kw.pop("bootstrap_servers")
    kw["sasl_plain_username"] = "nobody"

    async def run():
        with pytest.raises(SaslAuthenticationFailed):
            conn = await create_conn(host, int(port), **kw)
            conn.close()

    asyncio.run(run())


def _kcat() -> str:
    path = shutil.which("kcat")
    if path is None:
        pytest.fail("kcat is not installed: run deploy/local/install-debian-packages.sh (apt-get install -y kcat)")
    return path


@pytest.mark.parametrize("listener", ["PLAINTEXT", "SCRAM-SHA-512", "SSL", "SASL_SSL"])
def test_kcat_produces_aiokafka_reads(kafka, listener):
    kcat = _kcat()
    topic = kafka.create_topic(unique_name("kcat"))
    if listener == "PLAINTEXT":
        conn = ["-b", kafka.bootstrap]
    elif listener == "SSL":  # librdkafka, another TLS stack, trusts the broker's CA too
        conn = ["-b", kafka.ssl_bootstrap, "-X", "security.protocol=SSL", "-X", f"ssl.ca.location={kafka.ca_file}"]
    else:
        tls = listener == "SASL_SSL"
        conn = [
            "-b", kafka.sasl_ssl_bootstrap if tls else kafka.sasl_bootstrap,
            "-X", f"security.protocol={'SASL_SSL' if tls else 'SASL_PLAINTEXT'}",
            "-X", "sasl.mechanism=SCRAM-SHA-512",
            "-X", f"sasl.username={kafka.sasl_user}",
            "-X", f"sasl.password={kafka.sasl_password}",
        ]  # fmt: skip
        if tls:
            conn += ["-X", f"ssl.ca.location={kafka.ca_file}"]
    lines = ["doc-1 first body", "doc-2 second body", "doc-3 third body"]
    subprocess.run(
        [kcat, *conn, "-P", "-t", topic, "-K", " ", "-H", "source=kcat", "-X", "acks=all"],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        timeout=30,
        capture_output=True,
    )

    got = asyncio.run(_consume(kafka.client_kwargs(), topic, len(lines)))
    assert [(k, v) for k, v, _ in got] == [tuple(s.encode() for s in line.split(" ", 1)) for line in lines]
    assert all(h == {"source": b"kcat"} for _, _, h in got)


@pytest.mark.parametrize("mechanism", [None, "SCRAM-SHA-256", "PLAIN"])
def test_tls_produce_consume(kafka, mechanism):
    """SSL (mechanism None) and SASL_SSL listeners, verified against the CA made at the broker's start."""
    topic = kafka.create_topic(unique_name("tls"))
    sent = _messages(3, mechanism or "ssl")
    kw = kafka.client_kwargs(mechanism, tls=True)
    assert kw["security_protocol"] == ("SASL_SSL" if mechanism else "SSL")
    assert kw["ssl_context"].verify_mode == ssl.CERT_REQUIRED and kw["ssl_context"].check_hostname

    async def run():
        await _produce(kw, topic, sent)
        return await _consume(kw, topic, len(sent), group_id=unique_name("tls-group"))

    got = asyncio.run(run())
    assert [(k, v) for k, v, _ in got] == sent


def test_the_tls_certificates_are_made_at_start(kafka):
    """A CA, a broker certificate for 127.0.0.1 / localhost, and one that expired in 2020 on EXPIRED."""
    ca = ssl.create_default_context(cafile=str(kafka.ca_file))
    for listener, expect in (("SSL", None), ("EXPIRED", "certificate has expired")):
        host, port = kafka.bootstrap_for(listener).split(":")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            if expect is None:
                with ca.wrap_socket(raw, server_hostname=host) as tls:
                    cert = tls.getpeercert()
                    assert ("IP Address", "127.0.0.1") in cert["subjectAltName"]
                    assert ("DNS", "localhost") in cert["subjectAltName"]
            else:
                with pytest.raises(ssl.SSLCertVerificationError, match=expect):
                    ca.wrap_socket(raw, server_hostname=host)
    assert kafka.client_cert_file.exists() and kafka.client_key_file.exists()
    # The private keys stay in a directory only the broker's user can read.
    assert kafka.ca_file.parent.stat().st_mode & 0o077 == 0


def test_kafka_sh_refuses_a_port_in_use(kafka):
    controller_port, sasl_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    env.update(
        KAFKA_NAME=unique_name("pytest-clash"),
        KAFKA_PORT=str(kafka.port),  # taken by the session broker
        KAFKA_CONTROLLER_PORT=str(controller_port),
        KAFKA_SASL_PORT=str(sasl_port),
    )
    proc = subprocess.run([str(KAFKA_SH), "start"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"port {kafka.port} (KAFKA_PORT) on 127.0.0.1 is already in use" in proc.stderr
    assert "KAFKA_PORT=" in proc.stderr


def test_status_reports_the_session_broker(kafka):
    assert kafka.is_running()
    status = kafka._kafka_sh("status", timeout=30).stdout
    assert f"SSL             127.0.0.1:{kafka.ssl_port}   CA {kafka.ca_file}" in status
    assert f"SASL_SSL        127.0.0.1:{kafka.sasl_ssl_port}" in status
    assert f"127.0.0.1:{kafka.expired_ssl_port}" in status
    assert kafka.version and kafka.version.startswith("3.9.")
