"""A real Scrapy crawl (``scrapy runspider`` in a subprocess) of the test site (tests/sites.py) with
the streamdedup pipeline enabled by settings only: every HTML page fetched arrives on the pages
topic, keyed by URL, with its content decoded by the HTTP charset; nothing else arrives; a broker
that cannot be reached stops the crawl with a message."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from kafka_broker import unique_name  # tests/ is on sys.path (conftest.py)
from sites import SitePage, dedup_site, html_urls, serve_site
from topics import read_topic

pytestmark = pytest.mark.kafka

SPIDER = '''
import scrapy


class SiteSpider(scrapy.Spider):
    """Follows every link; the spider knows nothing of streamdedup."""

    name = "site"
    custom_settings = {"ITEM_PIPELINES": {"streamdedup.scrapy_pipeline.StreamdedupPipeline": 300}}

    def __init__(self, base, paths="/", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [base + path for path in paths.split(",")]

    def parse(self, response):
        if isinstance(response, scrapy.http.HtmlResponse):
            yield from response.follow_all(css="a")
            yield {"url": response.url}
'''


def _crawl(tmp_path: Path, base_url: str, *settings: str, paths: str = "/") -> subprocess.CompletedProcess:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "spider.py").write_text(SPIDER)
    args = [
        sys.executable,
        "-m",
        "scrapy",
        "runspider",
        "spider.py",
        "-a",
        f"base={base_url}",
        "-a",
        f"paths={paths}",
        "-s",
        "LOG_LEVEL=DEBUG",
        "-s",
        "TELNETCONSOLE_ENABLED=False",
        "-s",
        "REMOTE_CONTROL_ENABLED=False",
    ]
    for setting in settings:
        args += ["-s", setting]
    return subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "reactor", ["twisted.internet.asyncioreactor.AsyncioSelectorReactor", "twisted.internet.epollreactor.EPollReactor"]
)
def test_every_html_page_crawled_arrives(kafka, tmp_path, reactor):
    topic = kafka.create_topic(unique_name("scrapy-pages"), partitions=2)
    site = dedup_site()
    with serve_site({**site, "/empty.html": SitePage(b"  ")}) as base_url:  # HTML, 200, but nothing to judge
        crawl = _crawl(
            tmp_path,
            base_url,
            f"STREAMDEDUP_BROKERS={kafka.bootstrap}",
            f"STREAMDEDUP_PAGES_TOPIC={topic}",
            f"TWISTED_REACTOR={reactor}",
            paths="/,/empty.html",
        )
    assert crawl.returncode == 0, crawl.stderr[-3000:]
    assert f"Using reactor: {reactor}" in crawl.stderr

    records = read_topic(kafka, topic)
    # The index is fetched twice (Scrapy does not filter its start URL), the PNG and the 404 never.
    assert {r.key.decode() for r in records} == html_urls(site, base_url)
    assert "'streamdedup/pages_sent': %d" % len(records) in crawl.stderr
    assert "'streamdedup/bad/empty': 1" in crawl.stderr
    for r in records:
        page = json.loads(r.value)
        path = page["url"].removeprefix(base_url)
        charset = site[path].content_type.partition("charset=")[2]
        assert page["id"] == page["url"] == r.key.decode()
        assert page["content"] == site[path].body.decode(charset), path
        assert page["content_type"] == "text/html"
        assert datetime.fromisoformat(page["fetched_at"]).tzinfo is not None
    cafe = next(json.loads(r.value) for r in records if r.key.endswith(b"/articles/cafe.html"))
    assert "café crème déjà vu façade naïve" in cafe["content"]  # served as ISO-8859-1, decoded by its header


def test_unreachable_broker_stops_the_crawl(tmp_path):
    with serve_site(dedup_site()) as base_url:
        crawl = _crawl(tmp_path, base_url, "STREAMDEDUP_BROKERS=127.0.0.1:1")
    assert crawl.returncode == 1
    assert "ClientError: cannot connect to Kafka at 127.0.0.1:1" in crawl.stderr
    assert "downloader/response_count" not in crawl.stderr  # stopped before fetching anything


def test_a_scrapy_crawl_through_a_worker_flags_the_near_duplicates(kafka, tmp_path):
    from sites import near_duplicate_pairs
    from stream_harness import StreamTopics, WorkerProcess, wait_for_verdicts

    topics = StreamTopics.fresh(kafka, partitions=1)  # one partition: pages are judged in crawl order
    site = dedup_site()
    with WorkerProcess(kafka, topics, tmp_path / "worker"), serve_site(site) as base_url:
        crawl = _crawl(
            tmp_path, base_url, f"STREAMDEDUP_BROKERS={kafka.bootstrap}", f"STREAMDEDUP_PAGES_TOPIC={topics.pages}"
        )
        assert crawl.returncode == 0, crawl.stderr[-3000:]
        sent = len(read_topic(kafka, topics.pages))
        out = wait_for_verdicts(kafka, topics, sent)
    verdicts = {k: v[-1] for k, v in out["verdicts"].items()}
    assert set(verdicts) == html_urls(site, base_url)
    pairs = near_duplicate_pairs(base_url)
    assert pairs
    for pair in pairs:  # of each pair, the page fetched second is flagged, matched with the other
        flagged = [u for u in pair if verdicts[u]["verdict"] == "near_duplicate"]
        assert len(flagged) == 1, (pair, [verdicts[u] for u in pair])
        (other,) = pair - {flagged[0]}
        assert verdicts[flagged[0]]["match_id"] == other and verdicts[flagged[0]]["distance"] <= 3
    in_pairs = set().union(*pairs)
    assert all(v["verdict"] == "unique" for u, v in verdicts.items() if u not in in_pairs)


#: In every article's body (its footer), never in Scrapy's own log lines.
BODY_TEXT = "all rights reserved"


def test_a_default_crawl_logs_no_page_content(kafka, tmp_path):
    """Scrapy's default LOG_LEVEL is DEBUG; aiokafka's producer logs every record at DEBUG.  The
    pipeline keeps the aiokafka loggers at WARNING unless STREAMDEDUP_LOG_LEVEL=debug asks."""
    topic = kafka.create_topic(unique_name("scrapy-quiet"), partitions=1)
    settings = (f"STREAMDEDUP_BROKERS={kafka.bootstrap}", f"STREAMDEDUP_PAGES_TOPIC={topic}")
    with serve_site(dedup_site()) as base_url:
        quiet = _crawl(tmp_path / "quiet", base_url, *settings)
        loud = _crawl(tmp_path / "loud", base_url, *settings, "STREAMDEDUP_LOG_LEVEL=debug")
    assert quiet.returncode == 0 and loud.returncode == 0, quiet.stderr[-3000:] + loud.stderr[-3000:]
    assert len(html_urls(dedup_site(), base_url)) <= int(
        re.findall(r"'streamdedup/pages_sent': (\d+)", quiet.stderr)[0]
    )
    assert "DEBUG: Crawled (200)" in quiet.stderr  # Scrapy's own DEBUG log is untouched
    assert BODY_TEXT not in quiet.stderr
    assert not [line for line in quiet.stderr.splitlines() if "[aiokafka" in line and "DEBUG" in line]
    assert [line for line in loud.stderr.splitlines() if "[aiokafka" in line and "DEBUG" in line], "asked for"
    assert len(quiet.stderr) < len(loud.stderr) / 2


def test_closing_the_spider_delivers_the_pages_still_waiting_to_be_sent(kafka):
    """Closing stopped the producer at once: sends still waiting for room in a full batch (pages
    of a few hundred KiB, or a crawl faster than Kafka) failed with ProducerClosed and their
    pages were lost, though the pipeline promises to wait until every page is delivered."""
    from scrapy.http import HtmlResponse, Request
    from scrapy.settings import Settings as ScrapySettings
    from scrapy.statscollectors import MemoryStatsCollector

    from streamdedup.crawler.scrapy_pipeline import StreamdedupPipeline
    from streamdedup.settings import Settings

    topic = kafka.create_topic(unique_name("scrapy-close"), partitions=1)
    stats = MemoryStatsCollector(type("Crawler", (), {"settings": ScrapySettings(), "stats": None})())
    settings = Settings.from_sources({}, {"STREAMDEDUP_BROKERS": kafka.bootstrap, "STREAMDEDUP_PAGES_TOPIC": topic})
    pipeline = StreamdedupPipeline(settings, stats)
    pipeline.open_spider()
    urls = [f"http://close.test/{i}" for i in range(60)]
    for i, url in enumerate(urls):
        body = f"<p>page {i} " + " ".join(f"word{j}" for j in range(20_000)) + "</p>"  # ~170 KB
        response = HtmlResponse(url, body=body.encode(), headers={"Content-Type": "text/html; charset=utf-8"})
        pipeline.response_received(response, Request(url), None)
    pipeline.close_spider()  # at once: most sends are still waiting
    assert stats.get_value("streamdedup/failed") is None
    assert stats.get_value("streamdedup/pages_sent") == len(urls)
    assert sorted(r.key.decode() for r in read_topic(kafka, topic)) == sorted(urls)
