"""Every error streamdedup raises on purpose, in one hierarchy (the bottom layer: imports nothing).

::

    StreamdedupError
    ├── RecordError      a record or page that cannot be judged: (reason, message); the reason is
    │                    a dead-letter header value and a metric label (see REASONS)
    ├── SettingsError    a setting is invalid; the message names the flag and the env var
    ├── ClientError       Kafka cannot be used as configured; the message says what to do
    │   └── TopicError   the cluster's topics do not fit the settings
    └── SchemeError      stored state (changelog, snapshot) of another fingerprint scheme

>>> e = RecordError("empty", "page has no content")
>>> e.reason, str(e)
('empty', 'empty: page has no content')
>>> isinstance(e, ValueError), isinstance(TopicError("x"), StreamdedupError)
(True, True)
"""

from __future__ import annotations

__all__ = [
    "StreamdedupError",
    "RecordError",
    "SettingsError",
    "ClientError",
    "TopicError",
    "SchemeError",
    "PlanError",
    "REASONS",
]

#: Every reason a record can be rejected for (a metric label and a dead-letter header value).
#: ``empty``, ``binary``, ``not_text`` and ``unparsable`` come from the text extractor,
#: ``too_long`` is an id or URL over its limit (they travel inside the worker's internal messages),
#: ``too_large_for_topic`` a page whose output the topic refused (its ``max.message.bytes``),
#: ``internal_error`` from a worker bug (the record is kept on the dead-letter topic, not lost).
REASONS = (
    "not_utf8",
    "not_json",
    "not_object",
    "missing_field",
    "bad_field",
    "empty",
    "too_large",
    "too_long",
    "too_large_for_topic",
    "not_text",
    "binary",
    "undecodable",
    "unparsable",
    "bad_warc",
    "internal_error",
)


class StreamdedupError(Exception):
    """Base of every error raised by streamdedup on purpose."""


class RecordError(StreamdedupError, ValueError):
    """A record that cannot be a page, or a page whose content cannot be judged.

    ``reason`` is one of :data:`REASONS`; ``message`` says what is wrong in words.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message

    def __reduce__(self):  # survives pickling across the fingerprinting process pool
        return (type(self), (self.reason, self.message))


class SettingsError(StreamdedupError, ValueError):
    """A setting is invalid; the message names the flag and the env var and says how to fix it."""


class ClientError(StreamdedupError, RuntimeError):
    """Kafka cannot be used as configured (unreachable brokers, missing topic); the message says what to do."""


class TopicError(ClientError):
    """The cluster's topics do not fit the settings; the message says how to fix it."""


class SchemeError(StreamdedupError, ValueError):
    """Stored state was written with another fingerprint scheme (``streamdedup.fingerprinting.SCHEME``):
    fingerprints of two schemes never share an index.  The message says what to do."""

    def __init__(self, message: str, found: int, expected: int) -> None:
        super().__init__(message)
        self.found, self.expected = found, expected

    def __reduce__(self):
        return (type(self), (str(self), self.found, self.expected))


class PlanError(StreamdedupError, ValueError):
    """Stored shard rows were written by a worker of another shard plan (another --algorithm,
    --threshold, --num-perm, or combined --k): they cannot be read into this worker's index."""
