"""Kafka clients for crawlers and for streamdedup's results (aiokafka only, no faust).

:class:`PageProducer` sends pages to the pages topic in the worker's input format (key: page id;
value: the JSON record of :mod:`streamdedup.engine.records`).  :class:`VerdictConsumer` reads the
verdicts topic; :class:`OutputConsumer` reads the unique, near-duplicate and dead-letter topics
with their ``streamdedup-*`` headers parsed.  Both read committed records only (the worker
writes in transactions).

    settings = Settings.from_sources({"brokers": "127.0.0.1:9092"}, {})
    async with PageProducer(settings) as producer:
        await producer.send({"url": "http://a/x", "content": "<p>Hello</p>"})
        bad = await producer.send_many([page_a, page_b])  # Pages, dicts or JSON bytes; -> [(position, RecordError)]

    async with VerdictConsumer(settings, from_beginning=True) as verdicts:
        async for v in verdicts.read(idle_timeout=5):
            print(v.verdict, v.url, v.match_url)

    async with VerdictConsumer(settings, from_beginning=True) as verdicts:  # every verdict so far, then stop
        async for v in verdicts.read(until_end=True):
            print(v.verdict, v.url)

    async with OutputConsumer(settings, [settings.near_duplicate_topic]) as pages:
        async for p in pages:
            print(p.url, "~", p.match_url, p.distance)

A client that cannot connect raises :class:`ClientError` naming the cause: a refused login or
certificate, a port that is not Kafka's (one that accepts and stays silent too, after
:data:`PROBE_SILENCE` seconds rather than the whole :data:`CONNECT_TIMEOUT`), a listener of
another security protocol (:func:`connect`, which the worker's start uses too).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from streamdedup.engine.records import Page, page_from_json
from streamdedup.errors import ClientError, RecordError
from streamdedup.fingerprinting.text import Utf8Text, decode_body, text_mime
from streamdedup.pipeline.intake import fetched_ms
from streamdedup.settings import Settings

__all__ = [
    "ClientError",
    "EndNotReached",
    "OutputConsumer",
    "OutputRecord",
    "PageProducer",
    "VerdictConsumer",
    "VerdictRecord",
    "encode_page",
]

HEADER_PREFIX = "streamdedup-"
#: Seconds a client may take to connect (``connect_timeout``) by default: the CLI's.
CONNECT_TIMEOUT = 30.0


# ---------------------------------------------------------------------------- the input record


def encode_page(page: Page | Mapping[str, Any] | bytes, max_bytes: int) -> tuple[bytes, bytes]:
    """``(key, value)`` of a pages-topic record, checked as the worker checks it; raises :class:`RecordError`.

    A :class:`Page` with bytes content (a WARC or HTTP body) is decoded with its charset, else the
    one in its ``content_type``, as the worker decodes pages; the record's ``content_type`` is the
    bare MIME type.  A mapping is sent as JSON, and bytes (a JSON record, e.g. a line of a JSON-lines
    file) byte for byte: extra fields, which the worker passes on, are kept.

    >>> key, value = encode_page(Page("http://a/", "http://a/", "<p>caf\\xe9</p>".encode("latin-1"),
    ...                               "text/html", "ISO-8859-1", "2026-01-01T00:00:00Z"), 1024)
    >>> key, json.loads(value)["content"]
    (b'http://a/', '<p>café</p>')
    >>> encode_page({"url": "http://a/logo", "content": "x", "content_type": "image/png"}, 1024)
    Traceback (most recent call last):
    ...
    streamdedup.errors.RecordError: not_text: content type 'image/png' is neither HTML nor plain text
    """
    if isinstance(page, Page):
        mime = _mime(page.content_type)
        content = page.content
        if isinstance(content, Utf8Text):  # (a page read from a record: its text as UTF-8)
            content = content.text()
        elif not isinstance(content, str):
            try:
                content = decode_body(content, page.charset, page.content_type)
            except RecordError as e:
                raise RecordError(e.reason, e.message) from None
        page = {
            "url": page.url,
            "content": content,
            "content_type": mime or None,
            "fetched_at": page.fetched_at,
            "id": page.id,
        }
    if isinstance(page, bytes):
        value = page
    else:
        try:
            value = json.dumps(page, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate cannot be UTF-8: keep it as a \\u escape
            value = json.dumps(page, separators=(",", ":")).encode("ascii")
        except (TypeError, ValueError) as e:
            raise RecordError("bad_field", f"the record cannot be written as JSON ({e})") from None
    checked = page_from_json(value, max_bytes)
    _mime(checked.content_type)
    fetched_ms(checked.fetched_at, 0)  # the worker orders pages by it: refuse what it would refuse
    return checked.id.encode("utf-8", "surrogatepass"), value


def _mime(content_type: str | None) -> str:
    """The MIME type, if the worker takes it (HTML, plain text, or unknown: ""); else not_text."""
    try:
        return text_mime(content_type)
    except RecordError as e:
        raise RecordError(e.reason, e.message) from None


async def _start(client: AIOKafkaProducer | AIOKafkaConsumer, settings: Settings, timeout: float) -> None:
    await connect(client.start, client.stop, settings, timeout)


# ---------------------------------------------------------------------------- connecting

#: The probe's correlation id, b"\r\n\r\n": it ends an HTTP request's head, so a web server on the
#: port answers (400) at once, where it would otherwise wait for the end of a line that never comes.
_PROBE_ID = 0x0D0A0D0A
_PROBE_CLIENT = b"streamdedup-probe"
#: An ApiVersions v0 request, which every Kafka listener answers, SASL ones before the login too.
_PROBE_GRACE = 3.0  # seconds the probe may take to explain a failed start
#: Seconds a listener that accepted the probe's connection has to answer it (its TLS handshake,
#: then the ApiVersions request).  A Kafka broker answers ApiVersions without touching its logs,
#: in milliseconds; a port that says nothing for this long is taken for no Kafka listener, so a
#: silent port fails the start after this and not after the whole connect timeout.  The price: a
#: broker that stays silent as long (bound but still starting, or in a long pause) is named so
#: too.  A broker that answers in time keeps the whole timeout for the client's own start.
PROBE_SILENCE = 5.0
_PROBE = struct.pack(">ihhih", 10 + len(_PROBE_CLIENT), 18, 0, _PROBE_ID, len(_PROBE_CLIENT)) + _PROBE_CLIENT


async def connect(
    start: Callable[[], Awaitable[object]],
    stop: Callable[[], Awaitable[object]],
    settings: Settings,
    timeout: float,
    silence: float = PROBE_SILENCE,
) -> None:
    """Run an aiokafka client's ``start``; if it fails, ``stop`` it and raise :class:`ClientError` saying why.

    aiokafka's own exception says only "Unable to bootstrap" (the cause, e.g. a refused password
    or certificate, is in its log) and a port that is not Kafka's makes it wait for the whole
    timeout.  So the log's errors are collected while it starts, and beside it a probe sends one
    Kafka request to every broker: when none of them is a Kafka listener the start fails at once,
    with what answered instead (or, for a port that accepted and said nothing, after ``silence``
    seconds, :data:`PROBE_SILENCE` at most).
    """
    seen = _Collect()
    aiokafka_log = logging.getLogger("aiokafka")
    aiokafka_log.addHandler(seen)
    probes = [_Probe(b, settings.ssl_context()) for b in settings.brokers]
    deadline = time.monotonic() + timeout
    starting: asyncio.Future[Any] = asyncio.ensure_future(start())
    silence = min(silence, timeout)
    probing: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(p.run(silence) for p in probes)))
    try:
        await asyncio.wait({starting, probing}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done() and not (probing.done() and all(p.failure for p in probes)):
            await asyncio.wait({starting}, timeout=max(0.0, deadline - time.monotonic()))
        if starting.done() and starting.exception() is None:
            return
        error = starting.exception() if starting.done() else None
        if error is not None and not probing.done():  # the probe often says more ("closed" has many causes)
            await asyncio.wait({probing}, timeout=min(_PROBE_GRACE, max(0.0, deadline - time.monotonic())))
    finally:
        aiokafka_log.removeHandler(seen)
        for task in (probing, starting):
            if not task.done():
                task.cancel()
        await asyncio.gather(probing, starting, return_exceptions=True)
        if not (starting.done() and not starting.cancelled() and starting.exception() is None):
            await stop()
    raise ClientError(_explain(settings, seen.errors, probes, error, timeout)) from None


class _Probe:
    """One broker, asked one Kafka request (:data:`_PROBE`): ``failure`` says why it is no Kafka
    listener (or cannot be reached, or said nothing once connected); ``None`` while it waits, or
    when it answered as Kafka."""

    def __init__(self, broker: str, ssl_context: ssl.SSLContext | None) -> None:
        self.broker, self.ssl_context = broker, ssl_context
        self.failure: str | None = None
        self.connected = False  # TCP
        self.handshaken = False  # TLS, when it is asked for
        self.kafka = False  # it answered the probe as Kafka does

    async def run(self, silence: float) -> None:
        """Connect (for as long as it takes: the caller's timeout ends that), then give the listener
        ``silence`` seconds to answer before calling it silent."""
        host, _, port = self.broker.rpartition(":")
        tls = self.ssl_context is not None
        try:
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except (OSError, ValueError) as e:
            self.failure = _why(e, self.broker, tls)
            return
        self.connected = True
        try:
            async with asyncio.timeout(silence):
                await self._ask(host, reader, writer)
        except TimeoutError:
            self.failure = _silent([self.broker], tls and not self.handshaken, silence)
        except OSError as e:
            self.failure = _why(e, self.broker, tls)
        finally:
            writer.close()

    async def _ask(self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.ssl_context is not None:
            await writer.start_tls(self.ssl_context, server_hostname=host.strip("[]"))
        self.handshaken = True
        writer.write(_PROBE)
        await writer.drain()
        head = b""
        while len(head) < 8:  # the response's size and correlation id
            if not (chunk := await reader.read(8 - len(head))):
                break
            head += chunk
        if len(head) == 8:
            size, correlation = struct.unpack(">ii", head)
            if correlation == _PROBE_ID and 0 < size < 1 << 20:
                self.kafka = True
                return
            head += await _more(reader)
        if head[:1] in (b"\x15", b"\x16") and head[1:2] == b"\x03":  # a TLS record: an alert, or a hello
            self.failure = f"{self.broker} answered with TLS: a TLS listener? use --security-protocol SSL or SASL_SSL"
        elif head:
            self.failure = f"{self.broker} is not a Kafka listener: it answered {_show(head)}"
        else:
            self.failure = _closed(self.broker, False)


async def _more(reader: asyncio.StreamReader) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(72), 0.2)
    except (TimeoutError, OSError):
        return b""


def _show(data: bytes) -> str:
    """The start of what a non-Kafka server said, as text when it is text (``HTTP/1.1 400 ...``)."""
    text = data.decode("latin-1")
    if all(c.isprintable() or c in "\r\n\t" for c in text):
        return repr(" ".join(text.split())[:60])
    return repr(data[:24])


def _silent(brokers: list[str], no_handshake: bool, seconds: float) -> str:
    what = "completed no TLS handshake and " if no_handshake else ""
    return (
        f"{', '.join(brokers)} accepted the connection but {what}answered no Kafka request in "
        f"{seconds:g} s: is it a Kafka listener, of this --security-protocol?"
    )


def _closed(broker: str, tls: bool) -> str:
    if tls:
        return f"{broker} closed the connection during the TLS handshake: is it a TLS listener (SSL / SASL_SSL)?"
    return (
        f"{broker} closed the connection without a Kafka answer: is it a TLS or SASL listener that "
        "needs another --security-protocol?"
    )


def _why(error: BaseException, broker: str, tls: bool) -> str:
    """One broker's connection error in words, with what to check."""
    if isinstance(error, ssl.SSLCertVerificationError):
        reason = error.verify_message or error.reason or str(error)
        if "expired" in reason:
            hint = "the broker's certificate has expired: renew it (or check this machine's clock)"
        elif "not yet valid" in reason:
            hint = "the broker's certificate is not valid yet: check the clocks"
        elif "mismatch" in reason or "match" in reason:
            hint = "connect by a name the certificate holds, or set --ssl-check-hostname false"
        else:
            hint = "give the CA that signed the broker's certificate with --ssl-cafile / STREAMDEDUP_SSL_CAFILE"
        return f"{broker}: TLS certificate verify failed: {reason}; {hint}"
    if isinstance(error, ssl.SSLError):
        alert = str(error.reason or error)
        if "CERTIFICATE_REQUIRED" in alert:
            return (
                f"{broker} refused this client's certificate: it requires one ({alert}); "
                "give --ssl-certfile and --ssl-keyfile"
            )
        if "ALERT" in alert and ("CERTIFICATE" in alert or "UNKNOWN_CA" in alert):
            return (
                f"{broker} refused this client's certificate ({alert}); give --ssl-certfile and "
                "--ssl-keyfile from a CA the broker trusts"
            )
        if "WRONG_VERSION_NUMBER" in str(error) or "wrong version number" in str(error):
            return f"{broker} does not speak TLS ({error.reason}): is it a PLAINTEXT or SASL_PLAINTEXT listener?"
        if isinstance(error, ssl.SSLEOFError) or "EOF" in str(error):
            return _closed(broker, True)
        return f"{broker}: TLS handshake failed ({error.reason or error}); check the --ssl-* settings"
    if isinstance(error, SaslAuthenticationFailed):
        return (
            f"{broker}: authentication failed ({error}); check --sasl-username, the password "
            "(--sasl-password, STREAMDEDUP_SASL_PASSWORD or --sasl-password-file) and --sasl-mechanism"
        )
    if isinstance(error, UnsupportedSaslMechanismError | IllegalSaslStateError):
        return f"{broker}: the broker does not take this SASL mechanism ({error}); check --sasl-mechanism"
    if isinstance(error, ConnectionRefusedError):
        return f"{broker}: connection refused ({error}); {_CHECK}"
    if isinstance(error, socket.gaierror):
        return f"{broker}: unknown host ({error.strerror}); {_CHECK}"
    if isinstance(error, ConnectionError | EOFError | KafkaConnectionError) and (
        not str(error) or "closed" in str(error) or "reset" in str(error)
    ):
        return _closed(broker, tls)
    if isinstance(error, TimeoutError):
        return f"{broker}: no answer in time"
    return f"{broker}: {type(error).__name__}{f': {error}' if str(error) else ''}; {_CHECK}"


_CHECK = "check --brokers / STREAMDEDUP_BROKERS, that the broker is running, and the security settings"

#: What each kind of cause leads with, most specific first.
_KINDS = (
    "authentication failed",
    "certificate verify failed",
    "refused this client's certificate",
    "not a Kafka listener",
    "answered with TLS",
    "does not speak TLS",
    "TLS handshake failed",
    "closed the connection",
)


def _explain(
    settings: Settings,
    logged: list[tuple[str, BaseException | None]],
    probes: list[_Probe],
    error: BaseException | None,
    timeout: float,
) -> str:
    """Why the client could not start: aiokafka's logged errors (they name the broker), then the
    probes', then the exception; for silence, what is known of it."""
    tls = settings.security_protocol in ("SSL", "SASL_SSL")
    kafka = {p.broker for p in probes if p.kafka}
    # A request that timed out says no more than silence does: the probe tells what is known of it.
    timed_out = error is None or any(isinstance(e, TimeoutError) for _, e in logged)
    reasons = [_why(e, broker, tls) for broker, e in logged if e is not None and not isinstance(e, TimeoutError)]
    if "SASL" not in settings.security_protocol:  # Kafka that hangs up after one answer: it wants a login
        reasons = [
            f"{r.split(' ')[0]} answered a Kafka request and then closed the connection: a SASL listener? "
            f"use --security-protocol SASL_{'SSL' if tls else 'PLAINTEXT'} and the --sasl-* settings"
            if "closed the connection" in r and r.split(" ")[0] in kafka
            else r
            for r in reasons
        ]
    reasons += [p.failure for p in probes if p.failure]
    if not reasons and error is not None and not timed_out and not isinstance(error, TimeoutError):
        reasons.append(_why(error, ",".join(settings.brokers), tls))
    if not reasons:
        silent = [p for p in probes if p.connected and not p.kafka]
        if silent:
            reasons.append(_silent([p.broker for p in silent], tls and not all(p.handshaken for p in silent), timeout))
        else:
            reasons.append(f"no answer in {timeout:g} s; {_CHECK}")
    if timed_out and kafka:
        reasons.append(f"{', '.join(sorted(kafka))} answered as Kafka, but the client did not start in {timeout:g} s")
    reasons.sort(key=lambda r: next((i for i, k in enumerate(_KINDS) if k in r), len(_KINDS)))
    told: dict[str, str] = {}  # the most telling reason of each broker, as aiokafka or the probe saw it
    for r in reasons:
        told.setdefault(r.split(" ")[0].rstrip(":"), r)
    why = "; ".join(told.values())
    return f"cannot connect to Kafka at {','.join(settings.brokers)} ({settings.security_protocol}): {why}"


class _Collect(logging.Handler):
    """aiokafka's connection errors while a client starts: ``(broker, exception)`` as it logged them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.errors: list[tuple[str, BaseException | None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        error = args[-1] if args and isinstance(args[-1], BaseException) else None
        if error is None and record.levelno < logging.ERROR:
            return
        if len(args) == 3:  # 'Unable connect to "%s:%s": %s', host, port, err
            broker = f"{args[0]}:{args[1]}"
        elif len(args) == 2:  # "Unable connect to node with id %s: %s", node_id, err
            broker = f"node {args[0]}"
        else:
            broker = "Kafka"
        self.errors.append((broker, error if error is not None else _Logged(record.getMessage())))


class _Logged(Exception):
    """An error aiokafka logged without an exception object."""


# ---------------------------------------------------------------------------- producer


class PageProducer:
    """Sends pages to the pages topic; an async context manager.

    Records are batched by aiokafka (``linger_ms``, ``max_batch_bytes`` per partition) and sent
    with ``acks="all"`` and idempotence, so a retry does not write a page twice.  ``kafka_kwargs``
    go to :class:`aiokafka.AIOKafkaProducer` and override everything else, e.g.
    ``PageProducer(bootstrap_servers="127.0.0.1:9092", compression_type="gzip")``.
    ``pages_sent`` and ``bytes_sent`` count delivered records and their value bytes,
    ``pages_failed`` the records whose delivery failed (``first_failure``: the first error).  Leaving
    ``async with`` raises :class:`ClientError` if any delivery failed (and nothing else was raised),
    so a failure is never silent even when the delivery futures are not awaited.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        topic: str | None = None,
        linger_ms: int = 20,
        max_batch_bytes: int = 256 * 1024,
        connect_timeout: float = CONNECT_TIMEOUT,
        **kafka_kwargs: Any,
    ) -> None:
        settings = settings or Settings()
        self.topic = topic or settings.pages_topic
        self.max_bytes = settings.max_page_bytes
        self.pages_sent = self.bytes_sent = self.pages_failed = 0
        self.first_failure: BaseException | None = None
        self._settings = settings
        self._connect_timeout = connect_timeout
        # A record may be max_page_bytes plus its key and headers: let the broker's limit decide.
        self._kwargs = {
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": linger_ms,
            "max_batch_size": max_batch_bytes,
            "max_request_size": self.max_bytes + 64 * 1024,
            **settings.aiokafka_kwargs(),
            **kafka_kwargs,
        }
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect, and check that the pages topic exists (raises :class:`ClientError`).

        Without creating it: asking for one topic's metadata makes a broker with
        ``auto.create.topics.enable`` (the default) create it with its default partition count,
        which the worker then refuses (it must have --partitions)."""
        self._producer = AIOKafkaProducer(**self._kwargs)
        await _start(self._producer, self._settings, self._connect_timeout)
        try:
            cluster = await asyncio.wait_for(self._producer.client.fetch_all_metadata(), self._connect_timeout)
            if self.topic not in cluster.topics():
                raise ClientError(
                    f"topic {self.topic!r} does not exist; start the worker, which creates its topics with "
                    "--partitions, or check --pages-topic"
                )
            await asyncio.wait_for(self._producer.partitions_for(self.topic), self._connect_timeout)
        except (TimeoutError, KafkaError) as e:
            await self._producer.stop()
            raise ClientError(
                f"topic {self.topic!r} is not available ({type(e).__name__}); start the worker, "
                "which creates its topics, or check --pages-topic"
            ) from None
        except ClientError:
            await self._producer.stop()
            raise

    async def stop(self) -> None:
        """Send what is pending and disconnect."""
        if self._producer is not None:
            await self._producer.stop()

    async def __aenter__(self) -> PageProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        if self.pages_failed and exc[0] is None:
            raise ClientError(
                f"{self.pages_failed} pages could not be delivered to {self.topic!r} (the first: "
                f"{self.first_failure!r}); check the broker and the topic's limits, then send them again"
            )

    async def send(
        self, page: Page | Mapping[str, Any] | bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> asyncio.Future:
        """Queue one page (key: its id; see :func:`encode_page`); returns the delivery future (its result
        is an aiokafka ``RecordMetadata``).

        Raises :class:`RecordError` for a page the worker would refuse; such a page is not sent.
        Waits only when the batches are full.
        """
        assert self._producer is not None, "start the producer first (async with PageProducer(...))"
        key, value = encode_page(page, self.max_bytes)
        delivery = await self._producer.send(self.topic, value, key=key, headers=list(headers))
        delivery.add_done_callback(lambda f: self._count(f, len(value)))
        return delivery

    def _count(self, delivery: asyncio.Future, size: int) -> None:
        error = asyncio.CancelledError() if delivery.cancelled() else delivery.exception()
        if error is None:
            self.pages_sent += 1
            self.bytes_sent += size
            return
        self.pages_failed += 1
        if self.first_failure is None:
            self.first_failure = error

    async def send_many(self, pages: Iterable[Page | Mapping[str, Any] | bytes]) -> list[tuple[int, RecordError]]:
        """Send pages and wait until all are delivered; returns the refused ones as (position, error).

        A delivery failure (e.g. the broker is gone) raises the first error.
        """
        bad, deliveries = [], []
        for position, page in enumerate(pages):
            try:
                deliveries.append(await self.send(page))
            except RecordError as e:
                bad.append((position, e))
        await asyncio.gather(*deliveries)
        return bad

    async def flush(self) -> None:
        """Wait until every queued page is delivered or has failed."""
        assert self._producer is not None, "start the producer first"
        await self._producer.flush()


# ---------------------------------------------------------------------------- consumers


@dataclass(frozen=True, slots=True)
class VerdictRecord:
    """One record of the verdicts topic.  ``partition`` / ``offset``: the page's place in the pages topic."""

    id: str
    url: str
    verdict: str  # "unique" | "near_duplicate"
    fingerprint: str  # 16 lowercase hex digits
    match_id: str | None
    match_url: str | None
    distance: int | None
    partition: int
    offset: int
    cluster: str | None = None  # the bottom-n cluster key, 16 hex digits (None: no words, or keys off)

    @classmethod
    def from_json(cls, raw: bytes) -> VerdictRecord:
        """Raises ValueError for anything but a verdict.

        >>> VerdictRecord.from_json(b'{"id": "a", "url": "http://a/", "verdict": "unique", "fingerprint": '
        ...                         b'"00ff00ff00ff00ff", "match_id": null, "match_url": null, "distance": null, '
        ...                         b'"partition": 0, "offset": 7}').offset
        7
        """
        try:
            data = json.loads(raw)
        except RecursionError:  # (nested past the parser's recursion limit)
            raise ValueError("JSON nested too deeply") from None
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("id", "url", "verdict")):
            raise ValueError("no id, url and verdict")
        values: dict[str, Any] = {f.name: data.get(f.name) for f in fields(cls)}
        return cls(**values)


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One record of the unique, near-duplicate or dead-letter topic, its streamdedup headers parsed.

    ``value`` is the input record, unchanged; ``headers`` holds all headers, the input's too.
    """

    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes
    headers: dict[str, bytes]
    verdict: str | None = None
    fingerprint: str | None = None
    match_id: str | None = None
    match_url: str | None = None
    distance: int | None = None
    cluster: str | None = None  # the ``streamdedup-cluster`` header
    reason: str | None = None  # dead-letter only
    error: str | None = None  # dead-letter only

    @classmethod
    def from_kafka(
        cls,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]],
    ) -> OutputRecord:
        """Any record (a header without a value, a record without one, a distance that is no
        number: what other producers may write) gives one; what is not there is None.

        >>> r = OutputRecord.from_kafka("pages.near-duplicate", 0, 3, b"b", b'{"url": "http://a/b"}',
        ...                             [("streamdedup-verdict", b"near_duplicate"), ("streamdedup-distance", b"2")])
        >>> r.verdict, r.distance, r.url
        ('near_duplicate', 2, 'http://a/b')
        >>> r = OutputRecord.from_kafka("t", 0, 4, None, None, [("x", None), ("streamdedup-distance", b"two")])
        >>> r.value, r.headers["x"], r.distance
        (b'', b'', None)
        """
        hdrs = {name: v or b"" for name, v in headers}
        ours = {
            name.removeprefix(HEADER_PREFIX).replace("-", "_"): v.decode("utf-8", "replace")
            for name, v in hdrs.items()
            if name.startswith(HEADER_PREFIX)
        }
        distance = ours.pop("distance", None)
        distance = distance if distance is not None and distance.strip().lstrip("-").isdigit() else None
        known = {f.name for f in fields(cls)} - {"topic", "partition", "offset", "key", "value", "headers"}
        return cls(
            topic,
            partition,
            offset,
            None if key is None else key.decode("utf-8", "replace"),
            value or b"",
            hdrs,
            distance=int(distance) if distance is not None else None,
            **{k: v for k, v in ours.items() if k in known},
        )

    @property
    def url(self) -> str | None:
        """The page's URL from the input record, if it is a JSON object with one."""
        try:
            data = json.loads(self.value)
        except (ValueError, TypeError, RecursionError):  # (not JSON, or nested past the parser's limit)
            return None
        return data.get("url") if isinstance(data, dict) and isinstance(data.get("url"), str) else None


class EndNotReached(ClientError):
    """``read(until_end=True)`` waited ``idle_timeout`` seconds for a record before the end: the
    records read are not all there were.  ``behind``: each partition not read to its end, with
    (its position, its end)."""

    def __init__(self, behind: Mapping[TopicPartition, tuple[int, int]], partitions: int, seconds: float) -> None:
        self.behind, self.partitions, self.seconds = dict(behind), partitions, seconds
        where = ", ".join(
            f"{tp.topic}[{tp.partition}] at offset {at} of {end}" for tp, (at, end) in self.behind.items()
        )
        super().__init__(
            f"{len(self.behind)} of {partitions} partitions not read to their end after {seconds:g} s "
            f"without a new record ({where})"
        )


class _TopicReader:
    """Reads topics from the beginning or the end (no group), or as consumer group ``group_id``."""

    def __init__(
        self,
        settings: Settings | None,
        topics: Sequence[str],
        *,
        group_id: str | None = None,
        from_beginning: bool = False,
        connect_timeout: float = CONNECT_TIMEOUT,
        **kafka_kwargs: Any,
    ) -> None:
        settings = settings or Settings()
        self.topics = tuple(topics)
        self._group_id, self._from_beginning = group_id, from_beginning
        self._settings, self._connect_timeout = settings, connect_timeout
        self._kwargs = {
            "isolation_level": "read_committed",
            "group_id": group_id,
            "enable_auto_commit": group_id is not None,
            "auto_offset_reset": "earliest" if from_beginning else "latest",
            **settings.aiokafka_kwargs(),
            **kafka_kwargs,
        }
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        """Connect and take position; raises :class:`ClientError` if a topic does not exist."""
        consumer = self._consumer = AIOKafkaConsumer(**self._kwargs)
        await _start(consumer, self._settings, self._connect_timeout)
        try:
            cluster = await consumer._client.fetch_all_metadata()  # (consumer.topics(), with the partitions)
            if missing := [t for t in self.topics if t not in cluster.topics()]:
                raise ClientError(
                    f"topic {missing[0]!r} does not exist; check the topic setting, or start the "
                    "worker, which creates its topics"
                )
            # (after the check: asking for a topic's metadata may create it)
            if self._group_id is not None:
                consumer.subscribe(self.topics)
            else:
                # every partition is ours, assigned by hand: a subscription without a group makes
                # a new assignment whenever the topics' partitions change (one added, a topic
                # gone a moment from the metadata), and that resets every position: records read
                # again or skipped.  Then take position now, not at the first fetch.
                consumer.assign(
                    [TopicPartition(t, p) for t in self.topics for p in sorted(cluster.partitions_for_topic(t) or ())]
                )
                if {tp.topic for tp in consumer.assignment()} != set(self.topics):
                    raise ClientError(f"no partitions of {', '.join(self.topics)} known; check the broker")
                await (consumer.seek_to_beginning if self._from_beginning else consumer.seek_to_end)()
        except BaseException:
            await consumer.stop()
            raise

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __aiter__(self):
        return self.read()

    async def read(
        self, max_records: int | None = None, idle_timeout: float | None = None, *, until_end: bool = False
    ) -> AsyncIterator:
        """Records as they come; stops after ``max_records``, or ``idle_timeout`` seconds without one.

        ``until_end``: stops too once every partition is read up to the end it had when ``read``
        began, its last committed record (as ``kcat -C -e`` does; records written since are not
        waited for).  From the end (without ``from_beginning``) that is at once.  Reaching it is
        the only way to stop without ``idle_timeout``; ``idle_timeout`` seconds without a record
        before it raise :class:`EndNotReached` (a read cut short is not every record).  Not with
        a ``group_id``, whose partitions are the group's to share.
        """
        assert self._consumer is not None, "start the consumer first (async with ...)"
        ends = await self._ends() if until_end else {}
        limit = dict(ends)  # (``ends`` shrinks to the partitions still behind)
        partitions, count, last = len(ends), 0, time.monotonic()
        while max_records is None or count < max_records:
            if until_end:
                behind = await self._behind(ends)
                if done := [tp for tp in ends if tp not in behind]:
                    self._consumer.pause(*done)  # (no more fetches of what would be dropped below)
                if not (ends := behind):
                    return
            batches = await self._consumer.getmany(timeout_ms=200, max_records=max_records and max_records - count)
            for tp, messages in batches.items():
                for m in messages:
                    # a fetch returns what a partition holds when it is made: records written
                    # since the start are past the end (also in a partition read to it before)
                    if until_end and m.offset >= limit.get(tp, 0):
                        continue
                    yield self._parse(m)
                    count, last = count + 1, time.monotonic()
            if idle_timeout is not None and time.monotonic() - last >= idle_timeout:
                if until_end and (ends := await self._behind(ends)):
                    raise EndNotReached(
                        {tp: (await self._consumer.position(tp), end) for tp, end in sorted(ends.items())},
                        partitions,
                        idle_timeout,
                    )
                return

    async def _ends(self) -> dict[TopicPartition, int]:
        """The end of every partition of the topics: the offset after its last committed record.

        aiokafka's ``end_offsets`` asks the partitions' leaders for their "latest" offset
        (ListOffsets, timestamp -1) with the consumer's isolation level; under read_committed a
        broker answers with the partition's last stable offset: the first offset of the oldest
        transaction still open on it, else its high watermark (the offset after its last record,
        a transaction's commit or abort marker included).  A read_committed fetch returns nothing
        beyond it (records after an open transaction wait for it, even committed ones), so every
        end is one a reader reaches.  Markers and aborted records take offsets too and are passed
        over: a position can pass the last record's offset + 1, so :meth:`_behind` compares
        positions, not the offsets of the records read.
        """
        assert self._consumer is not None
        if self._group_id is not None:
            raise ValueError("until_end reads every partition of the topics: not with a group_id (a group shares them)")
        try:
            return await self._consumer.end_offsets(sorted(self._consumer.assignment()))
        except KafkaError as e:
            raise ClientError(f"cannot ask for the end of {', '.join(self.topics)} ({e!r}); check the broker") from None

    async def _behind(self, ends: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The partitions of ``ends`` whose position has not reached their end."""
        assert self._consumer is not None
        return {tp: end for tp, end in ends.items() if await self._consumer.position(tp) < end}

    def _parse(self, m: Any) -> Any:
        raise NotImplementedError


class VerdictConsumer(_TopicReader):
    """Yields :class:`VerdictRecord` from the verdicts topic; an async context manager and iterator.

    ``from_beginning``: every verdict kept, else only new ones; ``group_id``: resume where that
    consumer group stopped (committing as it reads).
    """

    def __init__(self, settings: Settings | None = None, *, topic: str | None = None, **kwargs: Any) -> None:
        super().__init__(settings, [topic or (settings or Settings()).verdicts_topic], **kwargs)

    def _parse(self, m: Any) -> VerdictRecord:
        try:
            return VerdictRecord.from_json(m.value)
        except (ValueError, TypeError) as e:
            raise ClientError(
                f"{m.topic}[{m.partition}] offset {m.offset} is not a verdict ({e}); is "
                "--verdicts-topic the worker's verdicts topic?"
            ) from None


class OutputConsumer(_TopicReader):
    """Yields :class:`OutputRecord` from the unique, near-duplicate or dead-letter topics (any of them)."""

    def _parse(self, m: Any) -> OutputRecord:
        return OutputRecord.from_kafka(m.topic, m.partition, m.offset, m.key, m.value, m.headers)
