"""Where a judged record goes, and with which headers: the worker's output contract.

* A page goes to the unique or the near-duplicate topic: key = page id, value = the input
  bytes unchanged, the input's headers kept, plus ``streamdedup-verdict``,
  ``streamdedup-fingerprint`` (16 hex digits), ``streamdedup-cluster`` (the bottom-n cluster
  key, 16 hex digits; absent for a page without words or with ``--cluster-n 0``) and, for a near-duplicate,
  ``streamdedup-match-id``, ``streamdedup-match-url``, ``streamdedup-distance`` (the simhash
  Hamming distance to the match) and, in the minhash mode, ``streamdedup-similarity`` (the
  estimated resemblance, 4 decimals).
* Every page also gets one compact JSON record on the verdicts topic, keyed by page id.
* A bad record goes to the dead-letter topic as it came (its own key, the input bytes and
  headers), and ``streamdedup-reason`` (a code) and ``streamdedup-error`` (a sentence).
* A dead letter that the dead-letter topic itself refuses (too large for its
  ``max.message.bytes``) is sent shrunk rather than lost: first the first
  :data:`TRUNCATED_BYTES` of the value, then (refused again) no value, the key cut to 1 KiB
  and only streamdedup's headers; both carry ``streamdedup-truncated`` = the original size.

>>> from streamdedup.pipeline.pending import Waiting
>>> w = Waiting(0, 7, b"k", b"{...}", page_id="a", url="http://a/", fingerprint=255)
>>> [(o.topic, o.headers[0]) for o in outputs(w, Topics())]
[('pages.unique', ('streamdedup-verdict', b'unique')), ('pages.verdicts', ('streamdedup-verdict', b'unique'))]
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from streamdedup.engine.dedup import Verdict
from streamdedup.engine.records import MAX_ID_BYTES, MAX_URL_BYTES
from streamdedup.fingerprinting.simhash import to_hex
from streamdedup.pipeline.pending import Waiting

__all__ = [
    "safe_key",
    "match_distance",
    "HEADER_PREFIX",
    "TRUNCATED_BYTES",
    "OUTPUT_OVERHEAD_BYTES",
    "Topics",
    "Output",
    "outputs",
    "verdict_record",
]

HEADER_PREFIX = "streamdedup-"
#: How much of a refused dead letter's value is kept (shrink level 1).
TRUNCATED_BYTES = 64 * 1024
#: What a page's copy on an output topic may add to the page itself: the key (its id), the
#: match's id and URL headers, the fixed headers, the record and batch framing.  Input
#: headers are not bounded here; a page with huge ones is refused by the topic and becomes a
#: ``too_large_for_topic`` dead letter.
OUTPUT_OVERHEAD_BYTES = MAX_ID_BYTES + MAX_ID_BYTES + MAX_URL_BYTES + 4096


@dataclass(frozen=True)
class Topics:
    unique: str = "pages.unique"
    near_duplicate: str = "pages.near-duplicate"
    verdicts: str = "pages.verdicts"
    dead_letter: str = "pages.dead-letter"


@dataclass(frozen=True)
class Output:
    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


def verdict_record(w: Waiting) -> dict:
    """The compact verdict of a judged page (the verdicts topic's value): the fields ``scan``
    writes, and where the page was read from."""
    best = w.best
    # a judged page has all four (only dead letters lack them)
    assert w.page_id is not None and w.url is not None and w.verdict is not None and w.fingerprint is not None
    v = Verdict(
        w.page_id,
        w.url,
        w.verdict,
        w.fingerprint,
        best[4] if best else None,
        best[5] if best else None,
        match_distance(w),
        similarity=w.similarity if best else None,
        cluster=w.cluster,
    )
    return {**v.to_dict(), "partition": w.partition, "offset": w.offset}


def match_distance(w: Waiting) -> int | None:
    """The Hamming distance of the page's simhash to its match's (the answer's rank in the simhash
    mode; the band modes rank by something else)."""
    return None if w.best is None or w.fingerprint is None else (w.fingerprint ^ w.best[3]).bit_count()


def safe_key(key: str) -> str:
    """A header key as it can be written: itself, or, if it holds bytes that were not UTF-8
    (read with ``surrogateescape``), those bytes as ``\\xNN`` escapes.

    >>> safe_key("crawler-run"), safe_key(b"\\xff\\xfe-k".decode("utf-8", "surrogateescape"))
    ('crawler-run', '\\\\xff\\\\xfe-k')
    """
    if key.isascii():
        return key
    try:
        key.encode("utf-8")
        return key
    except UnicodeEncodeError:
        return key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def outputs(w: Waiting, topics: Topics, shrink: int = 0) -> list[Output]:
    """The records to send for one done record, in order.

    ``shrink`` (dead letters only): 0 as it came, 1 the value cut to :data:`TRUNCATED_BYTES`,
    2 no value, the key cut to 1 KiB and no input headers.
    """
    kept = [(safe_key(k), v) for k, v in w.headers if not k.startswith(HEADER_PREFIX)]  # never trust upstream verdicts
    if w.reason is not None:
        key, value = w.key, w.value
        ours = [
            ("streamdedup-reason", w.reason.encode()),
            ("streamdedup-error", (w.error or "")[:2000].encode("utf-8", "replace")),
        ]
        if shrink:
            ours.append(("streamdedup-truncated", str(len(w.value)).encode()))
            value = w.value[:TRUNCATED_BYTES] if shrink == 1 else b""
            if shrink >= 2:
                key, kept = (key[:1024] if key is not None else None), []
        return [Output(topics.dead_letter, key, value, kept + ours)]
    assert w.page_id is not None and w.verdict is not None and w.fingerprint is not None  # judged, as above
    # intake refuses ids and urls that are not valid UTF-8; "replace" keeps a bug from writing invalid bytes
    key = w.page_id.encode("utf-8", "replace")
    ours = [("streamdedup-verdict", w.verdict.encode()), ("streamdedup-fingerprint", to_hex(w.fingerprint).encode())]
    if w.cluster is not None:
        ours.append(("streamdedup-cluster", to_hex(w.cluster).encode()))
    if w.best is not None:
        _, _, _, _, match_id, match_url = w.best
        ours += [
            ("streamdedup-match-id", match_id.encode("utf-8", "replace")),
            ("streamdedup-match-url", match_url.encode("utf-8", "replace")),
            ("streamdedup-distance", str(match_distance(w)).encode()),
        ]
        if w.similarity is not None:
            ours.append(("streamdedup-similarity", f"{w.similarity:.4f}".encode()))
    target = topics.unique if w.best is None else topics.near_duplicate
    record = json.dumps(verdict_record(w), ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
    return [Output(target, key, w.value, kept + ours), Output(topics.verdicts, key, record, ours)]
