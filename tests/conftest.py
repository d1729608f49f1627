"""Shared fixtures.  Tests that need Kafka get a real Apache Kafka broker (KRaft, 127.0.0.1),
started once per session from deploy/local/kafka.sh; it is never skipped for being absent."""

from __future__ import annotations

import pytest
from kafka_broker import LocalKafka  # tests/ is on sys.path (pytest's rootdir-relative import)


@pytest.fixture(scope="session")
def kafka():
    broker = LocalKafka()  # its own name, free ports, installs the jars if missing
    broker.start()  # raises KafkaBrokerError with the log's tail; never skips
    try:
        yield broker
    finally:
        broker.stop()
