"""The crawl-test site (tests/sites.py) is what it claims: its near-duplicate pairs are exactly the
pages the scan engine flags, and it serves what it holds."""

from __future__ import annotations

import itertools
import urllib.error
import urllib.request

import pytest
from sites import dedup_site, html_urls, near_duplicate_pairs, serve_site  # tests/ is on sys.path

from streamdedup.engine.dedup import Deduplicator
from streamdedup.engine.records import Page, page_text
from streamdedup.fingerprinting.pages import simhash_texts


def test_near_duplicate_pairs_are_exactly_what_scan_flags():
    site = dedup_site()
    base = "http://site"
    html = sorted(html_urls(site, base))
    pages = [
        Page(
            url,
            url,
            site[url.removeprefix(base)].body,
            "text/html",
            site[url.removeprefix(base)].content_type.partition("charset=")[2] or None,
        )
        for url in html
    ]
    verdicts = Deduplicator("simhash", k=3).process(html, html, [page_text(p) for p in pages])
    flagged = {frozenset((v.url, v.match_url)) for v in verdicts if v.verdict == "near_duplicate"}
    assert flagged == near_duplicate_pairs(base)
    # and not by a hair: the copies are within 2 bits (k is 3), every other two pages far apart
    prints = dict(zip(html, simhash_texts([page_text(p) for p in pages]).tolist()))
    for a, b in itertools.combinations(html, 2):
        distance = (prints[a] ^ prints[b]).bit_count()
        assert distance <= 2 if frozenset((a, b)) in flagged else distance >= 12, (a, b, distance)


def test_serve_site():
    site = dedup_site()
    with serve_site(site) as base:
        with urllib.request.urlopen(base + "/articles/cafe.html") as r:
            assert r.headers["Content-Type"] == "text/html; charset=ISO-8859-1"
            assert "café".encode("latin-1") in r.read()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/missing.html")
        assert e.value.code == 404
