"""Send every page a Scrapy crawl fetches to streamdedup's pages topic.

Enable it in the project's settings.py (or a spider's ``custom_settings``)::

    ITEM_PIPELINES = {"streamdedup.crawler.scrapy_pipeline.StreamdedupPipeline": 300}
    STREAMDEDUP_BROKERS = "kafka-1:9092,kafka-2:9092"
    STREAMDEDUP_PAGES_TOPIC = "pages"          # optional; the default is "pages"

Every other streamdedup setting works the same way under its environment variable's name
(``STREAMDEDUP_SECURITY_PROTOCOL``, ``STREAMDEDUP_SASL_USERNAME``, ...; see ``streamdedup produce
--help``); the process environment is not read.  A bad setting, a broker that cannot be reached
or a missing pages topic stops the crawl at start with a message that names the problem.

What is sent: every downloaded HTML response (Scrapy's ``HtmlResponse``) with a 2xx status,
whatever the spider does with it.  Near-duplicate detection is about the pages fetched, not the
items a spider extracts, so spiders and items need no change: the pipeline hooks Scrapy's
``response_received`` signal and passes items through untouched (it is an item pipeline only
because that is where Scrapy users enable such components).  The record is the worker's JSON
record: ``url`` and ``id`` the response URL (after redirects); ``content`` the body decoded with
the charset of the HTTP ``Content-Type`` header (else ``<meta>``, else guessed -- the worker's
decoding, as for WARC bodies); ``content_type`` the MIME type; ``fetched_at`` the time the
response arrived (UTC).  A body the worker would refuse (empty, binary, too large) is not sent.

How: aiokafka runs on its own asyncio event loop in a background thread.  So the pipeline works
under any Twisted reactor, asyncio or not, and Kafka never runs on the crawl's loop.  Sends are
batched by the producer; when :data:`MAX_PENDING` pages are in flight the crawl waits for Kafka
(backpressure instead of unbounded memory).  Closing the spider waits until every page is
delivered.  Logging: aiokafka's loggers are kept at WARNING (at DEBUG, Scrapy's default log level,
its producer logs every record it sends, page content and all) unless
``STREAMDEDUP_LOG_LEVEL = "debug"`` asks for them, as the ``streamdedup`` commands do.  Crawl stats: ``streamdedup/pages_sent``, ``streamdedup/bytes_sent``,
``streamdedup/bad/<reason>`` (pages not sent), ``streamdedup/failed`` (delivery errors; the
first one is logged).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import Counter
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

from scrapy import signals
from scrapy.http import HtmlResponse, Response

from streamdedup.crawler.client import PageProducer
from streamdedup.engine.records import Page
from streamdedup.errors import RecordError
from streamdedup.settings import ENV_PREFIX, Settings

__all__ = ["MAX_PENDING", "StreamdedupPipeline", "quiet_kafka_logs"]

#: Pages handed to Kafka and not yet acknowledged, at most.
MAX_PENDING = 1000
#: Seconds to wait for the producer to start (its own connect and topic checks come first) or drain.
WAIT = 120.0
#: The loggers kept quiet unless STREAMDEDUP_LOG_LEVEL is debug.
KAFKA_LOGGERS = ("aiokafka",)

log = logging.getLogger(__name__)


def quiet_kafka_logs(settings: Settings) -> None:
    """aiokafka logs at WARNING and above, or at ``settings.log_level`` if that is higher; at
    every level with ``log_level == "debug"`` (then nothing is changed)."""
    if settings.log_level == "debug":
        return
    level = max(logging.WARNING, logging.getLevelName(settings.log_level.upper()))
    for name in KAFKA_LOGGERS:
        logging.getLogger(name).setLevel(level)


class StreamdedupPipeline:
    """Sends each HTML response of the crawl to the pages topic (see the module docstring)."""

    def __init__(self, settings: Settings, stats: Any) -> None:
        self.settings, self.stats = settings, stats
        quiet_kafka_logs(settings)
        self._slots = threading.BoundedSemaphore(MAX_PENDING)  # one taken per send not done yet
        self._bad: Counter[str] = Counter()  # (_bad and _failed change on the Kafka thread only)
        self._failed = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._producer = PageProducer(settings)

    @classmethod
    def from_crawler(cls, crawler: Any) -> StreamdedupPipeline:
        # a setting of None is one not given (``STREAMDEDUP_BROKERS = os.environ.get(...)`` unset)
        given = {
            name: crawler.settings[name]
            for name in crawler.settings
            if name.startswith(ENV_PREFIX) and crawler.settings[name] is not None
        }
        pipeline = cls(Settings.from_sources({}, given), crawler.stats)
        crawler.signals.connect(pipeline.response_received, signal=signals.response_received)
        return pipeline

    def open_spider(self, spider: Any = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="streamdedup-kafka", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._producer.start(), self._running_loop()).result(WAIT)
        except BaseException:
            self._stop_loop()
            raise

    def close_spider(self, spider: Any = None) -> None:
        # first every send (every slot back), then the producer: its stop() closes the batch
        # queue, and the sends still waiting for room in a full batch failed with ProducerClosed
        deadline = time.monotonic() + WAIT
        for _ in range(MAX_PENDING):
            if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
        try:
            asyncio.run_coroutine_threadsafe(self._producer.stop(), self._running_loop()).result(WAIT)
        finally:
            self._stop_loop()
        p = self._producer
        self.stats.set_value("streamdedup/pages_sent", p.pages_sent)
        self.stats.set_value("streamdedup/bytes_sent", p.bytes_sent)
        for reason, n in self._bad.items():
            self.stats.set_value(f"streamdedup/bad/{reason}", n)
        if self._failed:
            self.stats.set_value("streamdedup/failed", self._failed)
        log.info(
            "streamdedup: sent %d pages (%d bytes) to %r; %d not sent (bad), %d failed",
            p.pages_sent,
            p.bytes_sent,
            p.topic,
            sum(self._bad.values()),
            self._failed,
        )

    def process_item(self, item: Any, spider: Any = None) -> Any:
        return item

    def response_received(self, response: Response, request: Any, spider: Any) -> None:
        if not isinstance(response, HtmlResponse) or not 200 <= response.status < 300:
            return
        content_type = response.headers.get(b"Content-Type")
        page = Page(
            response.url,
            response.url,
            response.body,
            content_type.decode("latin-1") if content_type else None,
            None,
            datetime.now(UTC).isoformat(timespec="milliseconds"),
        )
        self._slots.acquire()  # blocks the crawl while MAX_PENDING pages are in flight
        sent = asyncio.run_coroutine_threadsafe(self._send(page), self._running_loop())
        sent.add_done_callback(functools.partial(self._done, url=response.url))

    async def _send(self, page: Page) -> None:
        await (await self._producer.send(page))  # queued, then delivered

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the pipeline's Kafka thread is not running (open_spider was not called)")
        return self._loop

    def _done(self, sent: Future, url: str) -> None:  # on the Kafka thread
        self._slots.release()
        error = sent.exception()
        if isinstance(error, RecordError):
            self._bad[error.reason] += 1
            log.debug("streamdedup: not sent %s: %s", url, error)
        elif error is not None:
            self._failed += 1
            if self._failed == 1:
                log.error(
                    "streamdedup: could not send %s to Kafka: %r (further failures are counted in the "
                    "stats as streamdedup/failed)",
                    url,
                    error,
                )

    def _stop_loop(self) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
