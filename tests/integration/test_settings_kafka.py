"""Settings against the real broker: SCRAM-SHA-256/512 over SASL_PLAINTEXT, SSL and SASL_SSL on
its TLS listeners (``--ssl-cafile``, a client certificate), through aiokafka (``aiokafka_kwargs()``)
and through faust's own driver (``faust_broker_url()`` and ``faust_credentials()``), and a wrong
password failing clearly in both."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import faust
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError
from kafka_broker import unique_name  # tests/ is on sys.path (conftest.py)

from streamdedup.crawler.client import PageProducer
from streamdedup.errors import ClientError
from streamdedup.settings import Settings
from streamdedup.stream.connection import faust_broker_url, faust_credentials

pytestmark = pytest.mark.kafka

SCRAM = ["SCRAM-SHA-256", "SCRAM-SHA-512"]


def _settings(kafka, mechanism: str, *, password: str | None = None, env: dict | None = None) -> Settings:
    flags = {
        "brokers": f"kafka://{kafka.sasl_bootstrap}",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_username": kafka.sasl_user,
        "sasl_password": None if env else (password or kafka.sasl_password),
        "app_id": unique_name("settings"),
    }
    return Settings.from_sources(flags, env or {})


async def _read_one(settings: Settings, topic: str, timeout: float = 15.0):
    consumer = AIOKafkaConsumer(**settings.aiokafka_kwargs(), group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                return records[0]
        raise AssertionError(f"nothing arrived on {topic} in {timeout}s")
    finally:
        await consumer.stop()


def _faust_app(settings: Settings) -> faust.App:
    return faust.App(
        unique_name(settings.app_id),
        broker=faust_broker_url(settings),
        broker_credentials=faust_credentials(settings),
        web_enabled=False,
        autodiscover=False,
        env={},  # faust would otherwise let BROKER_URL etc. in os.environ override these arguments
    )


@pytest.mark.parametrize("mechanism", SCRAM)
def test_aiokafka_with_settings(kafka, mechanism, tmp_path):
    # SCRAM-SHA-512 takes the password from a file named in the environment, as in production.
    env = None
    if mechanism == "SCRAM-SHA-512":
        (tmp_path / "password").write_text(kafka.sasl_password + "\n")
        env = {"STREAMDEDUP_SASL_PASSWORD_FILE": str(tmp_path / "password")}
    settings = _settings(kafka, mechanism, env=env)
    topic = kafka.create_topic(unique_name("settings-aiokafka"))

    async def run():
        producer = AIOKafkaProducer(**settings.aiokafka_kwargs(), acks="all")
        await producer.start()
        try:
            assert producer.client._sasl_mechanism == mechanism
            await producer.send_and_wait(topic, b"via-aiokafka", key=b"k")
        finally:
            await producer.stop()
        return await _read_one(settings, topic)

    record = asyncio.run(run())
    assert (record.key, record.value) == (b"k", b"via-aiokafka")


@pytest.mark.parametrize("mechanism", SCRAM)
def test_faust_producer_with_settings(kafka, mechanism):
    settings = _settings(kafka, mechanism)
    topic = kafka.create_topic(unique_name("settings-faust"))

    async def run():
        app = _faust_app(settings)
        assert app.conf.broker_credentials is not None
        producer = app.producer
        await producer.start()
        try:
            # The broker's SASL listener also takes PLAIN, so a successful send alone would not
            # show that SCRAM was used: check what faust's driver handed to aiokafka.
            client = producer._producer.client
            assert (client._security_protocol, client._sasl_mechanism) == ("SASL_PLAINTEXT", mechanism)
            await producer.send_and_wait(topic, b"k", b"via-faust", partition=None, timestamp=None, headers=None)
        finally:
            await producer.stop()
        return await _read_one(settings, topic)

    record = asyncio.run(run())
    assert (record.key, record.value) == (b"k", b"via-faust")


@pytest.mark.parametrize("mechanism", SCRAM)
def test_wrong_password_fails_clearly(kafka, mechanism, caplog):
    settings = _settings(kafka, mechanism, password="not-the-password")

    async def run():
        producer = AIOKafkaProducer(**settings.aiokafka_kwargs(), request_timeout_ms=10_000)
        try:
            with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
                await producer.start()
        finally:
            await producer.stop()
        faust_producer = _faust_app(settings).producer
        try:
            with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
                await faust_producer.start()
        finally:
            await faust_producer.stop()

    asyncio.run(run())
    failures = [r.getMessage() for r in caplog.records if "SaslAuthenticationFailed" in r.getMessage()]
    # One from aiokafka directly, one from faust's driver, both naming the SCRAM mechanism in use.
    assert len(failures) >= 2, failures
    assert all(f"invalid credentials with SASL mechanism {mechanism}" in m for m in failures), failures


# ---------------------------------------------------------------------------- TLS


def _tls_settings(kafka, listener: str, **flags: str) -> Settings:
    """Settings for the broker's SSL or SASL_SSL listener, trusting its CA (``--ssl-cafile``)."""
    given = {
        "brokers": kafka.bootstrap_for(listener),
        "security_protocol": listener,
        "ssl_cafile": str(kafka.ca_file),
        "app_id": unique_name("settings-tls"),
    }
    if listener == "SASL_SSL":
        given.update(sasl_mechanism="SCRAM-SHA-256", sasl_username=kafka.sasl_user, sasl_password=kafka.sasl_password)
    return Settings.from_sources({**given, **flags}, {})


@pytest.mark.parametrize("listener", ["SSL", "SASL_SSL"])
def test_aiokafka_over_tls_with_settings(kafka, listener):
    settings = _tls_settings(kafka, listener)
    topic = kafka.create_topic(unique_name("settings-tls"))

    async def run():
        producer = AIOKafkaProducer(**settings.aiokafka_kwargs(), acks="all")
        await producer.start()
        try:
            assert producer.client._security_protocol == listener
            await producer.send_and_wait(topic, b"over-tls", key=b"k")
        finally:
            await producer.stop()
        return await _read_one(settings, topic)

    record = asyncio.run(run())
    assert (record.key, record.value) == (b"k", b"over-tls")


@pytest.mark.parametrize("listener", ["SSL", "SASL_SSL"])
def test_faust_producer_over_tls_with_settings(kafka, listener):
    settings = _tls_settings(kafka, listener)
    topic = kafka.create_topic(unique_name("settings-faust-tls"))

    async def run():
        producer = _faust_app(settings).producer
        await producer.start()
        try:
            client = producer._producer.client
            assert client._security_protocol == listener and client._ssl_context is not None
            await producer.send_and_wait(topic, b"k", b"via-faust-tls", partition=None, timestamp=None, headers=None)
        finally:
            await producer.stop()
        return await _read_one(settings, topic)

    record = asyncio.run(run())
    assert (record.key, record.value) == (b"k", b"via-faust-tls")


def test_a_client_certificate_is_offered_and_verified_by_the_broker(kafka, tmp_path):
    """The broker checks a client certificate it is offered (ssl.client.auth=requested): one from its
    CA is let in, one from another CA is refused, so --ssl-certfile / --ssl-keyfile really reach it."""
    topic = kafka.create_topic(unique_name("settings-mtls"))
    ours = _tls_settings(kafka, "SSL", ssl_certfile=str(kafka.client_cert_file), ssl_keyfile=str(kafka.client_key_file))
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(tmp_path / "other.key"), "-out", str(tmp_path / "other.pem"), "-days", "1",
            "-subj", "/CN=stranger",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    stranger = _tls_settings(
        kafka, "SSL", ssl_certfile=str(tmp_path / "other.pem"), ssl_keyfile=str(tmp_path / "other.key")
    )

    async def run():
        async with PageProducer(ours, topic=topic) as producer:
            await (await producer.send({"url": "http://mtls.test/", "content": "<p>signed</p>"}))
        with pytest.raises(ClientError, match="refused this client's certificate"):
            await PageProducer(stranger, topic=topic).start()

    asyncio.run(run())
    assert json.loads(asyncio.run(_read_one(ours, topic)).value)["url"] == "http://mtls.test/"


def test_the_broker_certificate_names_the_host(kafka):
    """--ssl-check-hostname (on by default) holds: the certificate is for 127.0.0.1 and localhost."""
    port = kafka.ssl_port
    by_name = _tls_settings(kafka, "SSL", brokers=f"localhost:{port}")
    assert by_name.ssl_context().check_hostname

    async def run():
        consumer = AIOKafkaConsumer(**by_name.aiokafka_kwargs())
        await consumer.start()
        try:
            return await consumer.topics()
        finally:
            await consumer.stop()

    assert isinstance(asyncio.run(run()), set)
