"""The rate limit on the Kafka clients' warnings and errors (streamdedup/stream/logs.py)."""

from __future__ import annotations

import logging

import pytest

from streamdedup.stream.logs import RateLimit, install


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def captured():
    """A logger with the filter and a handler that keeps the formatted lines."""
    clock = Clock()
    limit = RateLimit(interval=10.0, clock=clock)
    logger = logging.getLogger("test_logs.aiokafka.client")
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(level=logging.DEBUG)
    logger.addHandler(handler)
    logger.addFilter(limit)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, lines, clock, limit
    logger.removeHandler(handler)
    logger.removeFilter(limit)


def test_one_line_per_node_per_interval_with_the_count_of_the_rest(captured):
    logger, lines, clock, limit = captured
    for _ in range(1000):  # an outage: two nodes, the same error again and again
        logger.error("Unable connect to node with id %s: %s", 1, "Connect call failed")
        logger.error("Unable connect to node with id %s: %s", 2, "Connect call failed")
        clock.now += 0.005  # 5 s in all
    assert lines == [
        "Unable connect to node with id 1: Connect call failed",
        "Unable connect to node with id 2: Connect call failed",
    ]
    assert limit.suppressed_total == 1998
    clock.now = 1010.0  # the interval is over: the next line of a kind says how many were dropped
    logger.error("Unable connect to node with id %s: %s", 1, "Connect call failed")
    assert (
        lines[-1]
        == "Unable connect to node with id 1: Connect call failed (999 similar lines suppressed in the last 10s)"
    )
    logger.error("Unable connect to node with id %s: %s", 1, "Connect call failed")
    assert len(lines) == 3  # and a new interval starts


def test_different_errors_and_quiet_levels_are_not_hidden(captured):
    logger, lines, clock, _ = captured
    logger.error("Unable connect to node with id %s: %s", 1, "refused")
    logger.error("Failed fetch messages from %s: %s", 1, "NodeNotReady")  # another kind
    logger.warning("Unable connect to node with id %s: %s", 1, "refused")  # another level
    for i in range(5):
        logger.info("Discovered coordinator %s", i)  # below WARNING: every line
    logger.error("Heartbeat failed")  # no arguments
    logger.error("Heartbeat failed")
    assert len(lines) == 3 + 5 + 1


def test_the_suppressed_line_keeps_percent_signs_and_mapping_args(captured):
    logger, lines, clock, _ = captured
    logger.error("at 100%% for %(node)s", {"node": "n1"})
    logger.error("at 100%% for %(node)s", {"node": "n1"})
    clock.now += 11
    logger.error("at 100%% for %(node)s", {"node": "n1"})
    assert lines == ["at 100% for n1", "at 100% for n1 (1 similar lines suppressed in the last 11s)"]


def test_install_covers_child_loggers_once():
    child = logging.getLogger("aiokafka.conn")  # exists once aiokafka is imported
    import aiokafka  # noqa: F401

    first = install(interval=10.0)
    second = install(interval=10.0)
    try:
        assert second in child.filters and first not in child.filters
        assert [f for f in logging.getLogger("aiokafka.consumer.fetcher").filters if isinstance(f, RateLimit)] == [
            second
        ]
    finally:
        for name in list(logging.Logger.manager.loggerDict):
            logger = logging.getLogger(name)
            for f in [f for f in logger.filters if isinstance(f, RateLimit)]:
                logger.removeFilter(f)


def test_a_line_with_the_count_formats_under_modes_formatter(captured):
    """faust's workers log through mode's formatter, which re-wraps and re-formats the args."""
    import io

    from mode.utils.logging import ExtensionFormatter

    logger, lines, clock, limit = captured
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger.addHandler(handler)
    try:
        for _ in range(3):
            logger.warning("Heartbeat failed for group %s because it is rebalancing", "g1")
        clock.now += 10
        logger.warning("Heartbeat failed for group %s because it is rebalancing", "g1")
    finally:
        logger.removeHandler(handler)
    text = ExtensionFormatter(stream=io.StringIO(), fmt="%(message)s").format(records[-1])
    assert (
        text == "Heartbeat failed for group g1 because it is rebalancing (2 similar lines suppressed in the last 10s)"
    )
