"""Settings against the real broker: SCRAM-SHA-256/512 over SASL_PLAINTEXT, through aiokafka
(``aiokafka_kwargs()``) and through faust's own driver (``faust_broker_url()`` and
``faust_credentials()``), and a wrong password failing clearly in both."""

from __future__ import annotations

import asyncio
import time

import faust
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError
from kafka_broker import unique_name  # tests/ is on sys.path (conftest.py)

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
