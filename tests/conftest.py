"""Shared fixtures.  Tests that need Kafka get a real Apache Kafka broker (KRaft, 127.0.0.1),
started once per session from deploy/local/kafka.sh; it is never skipped for being absent."""

from __future__ import annotations

import logging

import pytest
from kafka_broker import LocalKafka  # tests/ is on sys.path (pytest's rootdir-relative import)

from streamdedup.stream.logs import RateLimit


@pytest.fixture(scope="session")
def kafka():
    broker = LocalKafka()  # its own name, free ports, installs the jars if missing
    broker.start()  # raises KafkaBrokerError with the log's tail; never skips
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(autouse=True)
def no_rate_limit_left_behind():
    """A Worker built in the test process puts its :class:`RateLimit` on the Kafka clients'
    loggers (streamdedup/stream/logs.py), where it would outlive the test and drop a later test's
    lines of the same kind (the same message to the same broker within 10 s).  Taken off after
    each test."""
    yield
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        if isinstance(logger, logging.Logger):
            for f in [f for f in logger.filters if isinstance(f, RateLimit)]:
                logger.removeFilter(f)
