"""``streamdedup produce`` and ``streamdedup verdicts``: the crawler's side of the stream worker.

Both take the connection settings (``--brokers``, the security options) and their own topics,
as flags or ``STREAMDEDUP_*`` variables; they are registered on the ``main`` group by
``streamdedup.cli``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import re
import sys
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, BinaryIO, cast

import click
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordListTooLargeError

from streamdedup.cli.options import PRODUCE, VERDICTS, settings_from_click, settings_options
from streamdedup.crawler.client import (
    EndNotReached,
    OutputConsumer,
    OutputRecord,
    PageProducer,
    VerdictConsumer,
    VerdictRecord,
)
from streamdedup.engine.records import (
    DAMAGED_WARC,
    Page,
    bounded_lines,
    buffered,
    gunzipped,
    open_input,
    records_of,
    sniff_format,
)
from streamdedup.errors import ClientError, RecordError
from streamdedup.settings import Settings


@contextmanager
def _kafka_logging(settings: Settings) -> Iterator[None]:
    """aiokafka's log stays out of the output (a failure is reported in one line) unless --log-level debug."""
    if settings.log_level == "debug":
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        yield
        return
    log, quiet = logging.getLogger("aiokafka"), logging.NullHandler()
    propagate, log.propagate = log.propagate, False
    log.addHandler(quiet)
    try:
        yield
    finally:
        log.removeHandler(quiet)
        log.propagate = propagate


# ---------------------------------------------------------------------------- produce


@dataclass
class ProduceReport:
    connected: bool = False
    pages: int = 0
    bytes: int = 0
    seconds: float = 0.0
    bad: Counter = field(default_factory=Counter)  # by reason
    failed: int = 0
    first_failure: str = ""

    def summary(self, topic: str) -> str:
        """
        >>> ProduceReport(True, 3, 1200, 0.31, Counter({"not_json": 2, "empty": 1})).summary("pages")
        "sent 3 pages (1,200 bytes) to 'pages' in 0.3 s; skipped 3 bad records (2 not_json, 1 empty)"
        """
        line = f"sent {self.pages} pages ({self.bytes:,} bytes) to {topic!r} in {self.seconds:.1f} s"
        if n := sum(self.bad.values()):
            line += f"; skipped {n} bad records ({', '.join(f'{k} {r}' for r, k in self.bad.most_common())})"
        return line


@click.command(
    short_help="Send pages (WARC or JSON lines) to the pages topic.",
    epilog="""\b
Examples:
  streamdedup produce crawl-*.warc.gz --brokers kafka:9092
  zcat pages.jsonl.gz | streamdedup produce - --pages-topic crawl.pages""",
)
@click.argument(
    "files",
    metavar="FILE...",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path),
)
@click.option(
    "--input-format",
    type=click.Choice(["auto", "jsonl", "warc"]),
    default="auto",
    show_default=True,
    help="auto: by the file name, then the first bytes (stdin: JSON lines).",
)
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@settings_options(
    only=PRODUCE,
    help={"max_page_bytes": "Larger pages are reported and not sent (set it as the worker's, which refuses them)."},
)
def produce(files: tuple[Path, ...], input_format: str, progress: bool | None, **params: object) -> None:
    """Send the pages of FILE... to the pages topic, for the stream worker to judge.

    FILE is JSON lines (optionally gzipped; '-' for stdin), sent as they are, or WARC / WARC.gz,
    whose HTML and text responses are sent decoded.  Bad records are reported on stderr with their
    line or record number and skipped.
    """
    settings = settings_from_click(params)
    show = sys.stderr.isatty() if progress is None else progress
    report = ProduceReport()
    try:
        with _kafka_logging(settings):
            asyncio.run(_produce(settings, files, input_format, show, report))
    except ClientError as e:
        raise click.ClickException(str(e)) from None
    finally:
        if report.connected:
            click.echo(report.summary(settings.pages_topic), err=True)
    if report.failed:
        raise click.ClickException(
            f"{report.failed} pages were not delivered ({report.first_failure}); check "
            "the broker and the topic's limits, then send them again"
        )
    if report.bad["bad_warc"]:
        raise click.ClickException(DAMAGED_WARC)


async def _produce(settings: Settings, files: tuple[Path, ...], fmt: str, show: bool, report: ProduceReport) -> None:
    t0, producer = time.monotonic(), PageProducer(settings)
    try:
        await producer.start()  # (not ``async with``: the report below says which deliveries failed)
        try:
            report.connected = True
            await _send_files(producer, files, fmt, show, report)
        finally:
            await producer.stop()
    finally:  # (also after a failure: the summary says what did get through)
        report.pages, report.bytes, report.seconds = producer.pages_sent, producer.bytes_sent, time.monotonic() - t0


async def _send_files(
    producer: PageProducer, files: tuple[Path, ...], fmt: str, show: bool, report: ProduceReport
) -> None:
    from tqdm import tqdm

    with tqdm(disable=not show, unit=" pages", file=sys.stderr, dynamic_ncols=True, smoothing=0.1) as bar:
        for path in files:
            name = "stdin" if str(path) == "-" else str(path)
            bar.set_description_str(Path(name).name)
            number, unit, opened = 0, "line", None
            try:
                # (opened once: a pipe given as a path, <(zcat x), has no bytes to give twice)
                raw: BinaryIO
                if name == "stdin":
                    raw, file_fmt = sys.stdin.buffer, "jsonl" if fmt == "auto" else fmt
                else:
                    opened = open_input(path)
                    raw, file_fmt = opened, sniff_format(path, opened) if fmt == "auto" else fmt
                unit = "record" if file_fmt == "warc" else "line"
                for count, (number, item) in enumerate(_read(raw, file_fmt, producer.max_bytes), 1):
                    where = f"{name}: {unit} {number}"
                    try:
                        if isinstance(item, RecordError):
                            raise item  # (a record the reader refused: reported like one the producer refuses)
                        delivery = await producer.send(item)
                    except RecordError as e:
                        _skip(report, bar, where, e.reason, str(e))
                    else:
                        delivery.add_done_callback(functools.partial(_delivered, report, bar, where))
                    bar.update()
                    if count % 64 == 0:
                        await asyncio.sleep(0)  # let the sender task run while batches fill
            except (OSError, EOFError, zlib.error) as e:
                raise click.ClickException(
                    f"{name}: cannot be read after {unit} {number} ({e}); "
                    "check the file (a truncated gzip?) and its --input-format"
                ) from None
            except KafkaError as e:
                raise ClientError(
                    f"Kafka failed while sending {name} at {unit} {number} ({e!r}); check the "
                    "broker, then send the rest again"
                ) from None
            finally:
                if opened is not None:
                    opened.close()
        await producer.flush()


def _read(raw: BinaryIO, fmt: str, max_bytes: int) -> Iterator[tuple[int, Page | RecordError | bytes]]:
    """Numbered records of an opened input: a WARC's responses as pages (or errors); JSON lines
    (gunzipped when they start as gzip does) as they are, so that fields beyond the contract's
    reach the worker's outputs (``encode_page`` checks them)."""
    if fmt == "warc":
        yield from records_of(raw, "warc", max_bytes)
        return
    with gunzipped(buffered(raw)) as lines:
        yield from _lines(lines, max_bytes)


def _lines(stream: IO[bytes], max_bytes: int) -> Iterator[tuple[int, bytes | RecordError]]:
    for number, line in enumerate(bounded_lines(cast(BinaryIO, stream), max_bytes), start=1):
        if isinstance(line, RecordError):
            yield number, line
        elif line.strip():
            yield number, line.rstrip(b"\r\n")


def _skip(report: ProduceReport, bar, where: str, reason: str, message: str) -> None:
    report.bad[reason] += 1
    bar.write(f"{where}: skipped: {message}", file=sys.stderr)


def _delivered(report: ProduceReport, bar, where: str, delivery: asyncio.Future) -> None:
    error = delivery.exception() if not delivery.cancelled() else asyncio.CancelledError()
    if isinstance(error, (MessageSizeTooLargeError, RecordListTooLargeError)):
        _skip(
            report,
            bar,
            where,
            "too_large",
            "too_large: the broker refused the record as too large; raise the "
            "topic's max.message.bytes or lower --max-page-bytes",
        )
    elif error is not None:
        report.failed += 1
        report.first_failure = report.first_failure or f"{where}: {error!r}"


# ---------------------------------------------------------------------------- verdicts

TOPICS = {
    "verdicts": "verdicts_topic",
    "unique": "unique_topic",
    "near-duplicate": "near_duplicate_topic",
    "dead-letter": "dead_letter_topic",
}


@click.command(
    short_help="Print the worker's verdicts (or its routed pages, or dead letters).",
    epilog="""\b
Examples:
  streamdedup verdicts --brokers kafka:9092 --from-beginning
  streamdedup verdicts --topic dead-letter --from-beginning --max 10
  streamdedup verdicts --format json --timeout 30 > verdicts.jsonl
  streamdedup verdicts --from-beginning --until-end --format json > verdicts.jsonl""",
)
@click.option(
    "--topic",
    "which",
    type=click.Choice(list(TOPICS)),
    default="verdicts",
    show_default=True,
    help="Which output to read; its name comes from the matching --*-topic setting.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["human", "json"]),
    default="human",
    show_default=True,
    help="human: one line per page; json: one JSON object per line (for the output topics with "
    "every header, without the page itself).",
)
@click.option("--from-beginning", is_flag=True, help="Start at the oldest record kept (default: new ones only).")
@click.option("--max", "max_records", type=click.IntRange(min=1), default=None, help="Stop after N records.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    callback=lambda ctx, param, value: _finite(value),
    help="Stop after SECONDS without a new record.",
)
@click.option(
    "--until-end",
    is_flag=True,
    help="Stop once every partition is read up to the end it had when the command started (the last "
    "committed record: read_committed), not waiting for records written since.  Use it with "
    "--from-beginning: from the end it stops at once, printing nothing.  With --timeout, SECONDS "
    "without a new record before the end are an error: exit status 1.",
)
@settings_options(only=VERDICTS)
def verdicts(
    which: str,
    fmt: str,
    from_beginning: bool,
    max_records: int | None,
    timeout: float | None,
    until_end: bool,
    **params: object,
) -> None:
    """Print the worker's verdicts as they come (or, with --topic, the pages it routed, and the dead letters).

    Human output: one line per page, e.g. ``near_duplicate  d=2  http://a/x  ~ http://a/y``.
    """
    settings = settings_from_click(params)
    topic = getattr(settings, TOPICS[which])
    try:
        with _kafka_logging(settings):
            n = asyncio.run(
                _tail(settings, topic, which == "verdicts", fmt, from_beginning, max_records, timeout, until_end)
            )
    except ClientError as e:
        raise click.ClickException(str(e)) from None
    if timeout is not None and not until_end and (max_records is None or n < max_records):
        click.echo(f"stopped after {timeout:g} s without a new record ({n} shown)", err=True)


def _finite(seconds: float | None) -> float | None:
    """(click's FloatRange takes nan and inf: a wait without an end.)"""
    if seconds is not None and not math.isfinite(seconds):
        raise click.BadParameter(f"{seconds} is not a number of seconds; use e.g. 10", param_hint="--timeout")
    return seconds


async def _tail(
    settings: Settings,
    topic: str,
    is_verdicts: bool,
    fmt: str,
    from_beginning: bool,
    max_records: int | None,
    timeout: float | None,
    until_end: bool = False,
) -> int:
    reader = (
        VerdictConsumer(settings, topic=topic, from_beginning=from_beginning)
        if is_verdicts
        else OutputConsumer(settings, [topic], from_beginning=from_beginning)
    )
    n = 0
    async with reader:
        try:
            async for record in reader.read(max_records, timeout, until_end=until_end):
                line = human_line(record) if fmt == "human" else json.dumps(as_json(record), ensure_ascii=False)
                try:
                    click.echo(line)
                except OSError as e:  # (a full disk; a closed pipe is click's and ends quietly)
                    raise ClientError(
                        f"cannot write to standard output ({e.strerror or e}) after {n} records"
                    ) from None
                n += 1
        except EndNotReached as e:  # (a read cut short: not a success)
            raise ClientError(f"stopped before the end: {e}; {n} shown") from None
    return n


def human_line(r: VerdictRecord | OutputRecord) -> str:
    """One line per page: verdict, distance, URL, the URL it copies (and, from an output topic, the fingerprint).

    >>> human_line(VerdictRecord("x", "http://a/x", "near_duplicate", "00000000000000ff", "y", "http://a/y", 2, 0, 9))
    'near_duplicate  d=2  http://a/x  ~ http://a/y'
    >>> human_line(OutputRecord("pages.dead-letter", 0, 4, "k", b"{", {}, reason="not_json", error="not JSON"))
    'not_json        k  not JSON'
    """
    if isinstance(r, OutputRecord) and r.verdict is None:
        return _printable(f"{r.reason or '?':<14}  {r.key}  {r.error or ''}")
    line = f"{r.verdict:<14}  " + (f"d={r.distance}  " if r.distance is not None else "")
    page = r.url or ((r.key or "?") if isinstance(r, OutputRecord) else r.id)
    line += page + (f"  ~ {r.match_url}" if r.match_url else "")
    return _printable(line + (f"  fp={r.fingerprint}" if isinstance(r, OutputRecord) else ""))


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(line: str) -> str:
    """``line`` with its control characters escaped: a URL with a line end in it (the worker
    takes any string) made two lines of one page, or a forged one; an escape sequence would
    drive the terminal.

    >>> _printable("unique  http://a/x\\nnear_duplicate  d=0  http://evil/\\x1b[2J")
    'unique  http://a/x\\\\nnear_duplicate  d=0  http://evil/\\\\x1b[2J'
    """
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), line)


def as_json(r: VerdictRecord | OutputRecord) -> dict:
    """A verdict as the worker wrote it; an output record with its headers, and the page's size, not the page."""
    if isinstance(r, VerdictRecord):
        return asdict(r)
    out = {k: v for k, v in asdict(r).items() if k not in ("value", "headers")}
    out["url"] = r.url
    out["value_bytes"] = len(r.value)
    out["headers"] = {k: v.decode("utf-8", "replace") for k, v in r.headers.items()}
    return out
