"""A small web site for crawl tests, some of whose pages are near-copies of others.

    site = dedup_site()
    with serve_site(site) as base_url:           # http.server on 127.0.0.1, in a thread
        ... crawl base_url ...
    html_urls(site, base_url)                    # the pages a crawl must send (HTML, status 200)
    near_duplicate_pairs(base_url)               # {frozenset({url_a, url_b}), ...}

Of each near-duplicate pair the worker flags whichever was fetched later; which one that is
depends on the crawl order, so a pair is unordered.  Every other two HTML pages are far apart
(``tests/test_sites.py`` checks both with the ``scan`` engine).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["NEAR_DUPLICATES", "SitePage", "dedup_site", "html_urls", "near_duplicate_pairs", "serve_site"]


@dataclass(frozen=True)
class SitePage:
    body: bytes
    content_type: str = "text/html; charset=utf-8"

    @property
    def is_html(self) -> bool:
        return self.content_type.startswith("text/html")


#: (copy, original) paths: the copy has other page chrome and another visit counter (both dropped as
#: boilerplate), as mirrors and print versions do.  Its main text is the original's, so the pair is
#: flagged by any hash: a one-word change in a 220-word article is within k = 3 bits only about half
#: the time (bench/README.md measures simhash recall on such edits; this fixture is not the place).
NEAR_DUPLICATES = (("/mirror/kestrel.html", "/articles/kestrel.html"), ("/print/otter.html", "/articles/otter.html"))
ARTICLES = ("kestrel", "heron", "otter", "lynx")
PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)


def _words(seed: str, n: int = 220) -> list[str]:
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "tu", "ra", "so", "vi", "de", "pa", "gu", "fe", "zo", "bri", "sta", "quo"]
    vocabulary = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(900)})
    return [rng.choice(vocabulary) for _ in range(n)]


def _page(title: str, words: list[str], chrome: str, head: str = "") -> str:
    paragraphs = "".join(f"<p>{' '.join(words[i : i + 40])}.</p>" for i in range(0, len(words), 40))
    return (
        f"<!DOCTYPE html><html><head>{head}<title>{title}</title></head><body>"
        f"<nav><a href='/'>home</a> {chrome} menu</nav><main><h1>{title}</h1>{paragraphs}</main>"
        f"<footer>{chrome} footer, all rights reserved</footer></body></html>"
    )


def dedup_site() -> dict[str, SitePage]:
    """Path -> page: an index linking to everything, four distinct articles, two near-copies, a
    Latin-1 page served with ``charset=ISO-8859-1`` (and a wrong ``<meta>``), a PNG, and a link to a
    missing page (404)."""
    site: dict[str, SitePage] = {}
    for name in ARTICLES:
        site[f"/articles/{name}.html"] = SitePage(_page(name.title(), _words(name), "site").encode())
    site["/mirror/kestrel.html"] = SitePage(_page("Kestrel", _words("kestrel"), "mirror visited 1208 times").encode())
    site["/print/otter.html"] = SitePage(_page("Otter", _words("otter"), "print visited 77 times").encode())
    cafe = ["café", "crème", "déjà", "vu", "façade", "naïve"] + _words("cafe", 150)
    # Its <meta> is wrong (as on mislabelled sites): only the HTTP charset decodes it right.
    cafe_html = _page("Café", cafe, "site", head='<meta charset="windows-1251">')
    site["/articles/cafe.html"] = SitePage(cafe_html.encode("latin-1"), "text/html; charset=ISO-8859-1")
    site["/logo.png"] = SitePage(PNG, "image/png")
    links = "".join(f"<li><a href='{path}'>{path}</a></li>" for path in [*site, "/missing.html"])
    site["/"] = SitePage(f"<!DOCTYPE html><html><body><h1>Index</h1><ul>{links}</ul></body></html>".encode())
    return site


def html_urls(site: Mapping[str, SitePage], base_url: str) -> set[str]:
    """The URLs of the HTML pages (all served with status 200)."""
    return {base_url + path for path, page in site.items() if page.is_html}


def near_duplicate_pairs(base_url: str) -> set[frozenset[str]]:
    return {frozenset((base_url + a, base_url + b)) for a, b in NEAR_DUPLICATES}


@contextmanager
def serve_site(site: Mapping[str, SitePage]) -> Iterator[str]:
    """Serve ``site`` on 127.0.0.1 (a free port) in a thread; yields the base URL (no trailing slash)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = site.get(self.path)
            status, page = (200, page) if page else (404, SitePage(b"<html><body>not found</body></html>"))
            self.send_response(status)
            self.send_header("Content-Type", page.content_type)
            self.send_header("Content-Length", str(len(page.body)))
            self.end_headers()
            self.wfile.write(page.body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="test-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
