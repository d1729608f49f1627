"""`streamdedup scan`, run as a user runs it: JSON lines and WARC in, verdict lines out."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from streamdedup import cluster_key, fingerprint, hamming
from streamdedup.cli import main

VOCAB = (
    "crawler page index shard table bits block probe fetch mirror session advert counter timestamp "
    "kafka topic worker stream verdict near duplicate unique simhash minhash shingle window "
    "river mountain harbour lantern garden violin cobalt saffron meadow glacier"
).split()


def article(seed: int, words: int = 400) -> str:
    rng = random.Random(seed)
    paras = [" ".join(rng.choice(VOCAB) for _ in range(50)) for _ in range(words // 50)]
    return "".join(f"<p>{p}.</p>\n" for p in paras)


def html(body: str, footer: str = "", nav: str = "<a href='/'>Home</a>") -> str:
    return (
        f"<!doctype html><html><head><title>t</title><script>var x=1;</script></head><body>"
        f"<nav>{nav}</nav><main>{body}</main><footer>{footer}</footer></body></html>"
    )


A, B = article(1), article(2)
PAGES = [
    {"url": "http://a.example/1", "content": html(A, "Visits: 1041")},
    {"url": "http://b.example/x", "content": html(B)},
    # A with another visit counter and nav: a near-duplicate of the first page
    {"url": "http://mirror.example/1?session=9", "content": html(A, "Visits: 1042", "<a href='/m'>Mirror</a>")},
    # markup-only change of A
    {"url": "http://a.example/1-print", "content": html(A.replace("<p>", "<p class='x'  >"), "Visits: 1041")},
    {"url": "http://b.example/x", "content": html(B)},  # a re-fetch of the same page
    {"url": "http://c.example/", "content": html(article(3))},
]


def jsonl(records: list, bad_line: bytes | None = None) -> bytes:
    lines = [json.dumps(r).encode() for r in records]
    if bad_line is not None:
        lines.insert(2, bad_line)
    return b"\n".join(lines) + b"\n"


def run_scan(tmp_path: Path, data: bytes, name: str = "in.jsonl", *args: str):
    src = tmp_path / name
    src.write_bytes(data)
    out = tmp_path / "verdicts.jsonl"
    result = CliRunner().invoke(main, ["scan", str(src), "--output", str(out), *args])
    verdicts = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return result, verdicts


def test_simhash_verdicts(tmp_path):
    result, v = run_scan(tmp_path, jsonl(PAGES))
    assert result.exit_code == 0, result.output
    assert [x["verdict"] for x in v] == ["unique", "unique", "near_duplicate", "near_duplicate", "unique", "unique"]
    assert v[2]["match_id"] == "http://a.example/1" and v[2]["match_url"] == "http://a.example/1"
    assert v[3]["match_id"] == "http://a.example/1" and v[3]["distance"] == 0  # markup-only: same bits
    assert set(v[0]) == {"id", "url", "verdict", "fingerprint", "cluster", "match_id", "match_url", "distance"}
    assert v[3]["cluster"] == v[0]["cluster"] == f"{cluster_key(PAGES[0]['content']):016x}"  # markup-only: same key
    assert v[4]["cluster"] == v[1]["cluster"] != v[0]["cluster"]
    assert all(len(x["cluster"]) == 16 for x in v)
    assert v[0]["match_id"] is None and v[0]["distance"] is None
    assert all(len(x["fingerprint"]) == 16 for x in v)
    assert v[4]["verdict"] == "unique"  # a re-fetch is never a duplicate of itself
    assert "scanned 6 pages: 2 near_duplicate, 4 unique" in result.output


def test_cluster_n_changes_the_key_and_zero_turns_it_off(tmp_path):
    _, v8 = run_scan(tmp_path, jsonl(PAGES), "in.jsonl", "--cluster-n", "8")
    assert (
        v8[0]["cluster"]
        == f"{cluster_key(PAGES[0]['content'], n=8):016x}"
        != f"{cluster_key(PAGES[0]['content']):016x}"
    )
    _, v0 = run_scan(tmp_path, jsonl(PAGES), "in.jsonl", "--cluster-n", "0")
    assert [x["cluster"] for x in v0] == [None] * len(PAGES)
    result, _ = run_scan(tmp_path, jsonl(PAGES), "in.jsonl", "--cluster-n", "-1")
    assert result.exit_code == 2 and "--cluster-n / STREAMDEDUP_CLUSTER_N: -1 is out of range" in result.output


def test_match_is_the_closest_earlier_page(tmp_path):
    # the first of a fixed list of small edits that lands 1..3 bits away (deterministic)
    base = fingerprint(html(A))
    edits = (A.replace(w, "zz", 1) for w in VOCAB)
    changed = next(e for e in edits if 0 < hamming(fingerprint(html(e)), base) <= 3)
    recs = [
        {"url": "u1", "content": html(changed)},
        {"url": "u2", "content": html(A)},
        {"url": "u3", "content": html(A)},
    ]
    _, v = run_scan(tmp_path, jsonl(recs))
    assert v[1]["match_id"] == "u1" and v[1]["distance"] > 0
    assert v[2]["match_id"] == "u2" and v[2]["distance"] == 0  # nearest wins over oldest


@pytest.mark.parametrize("algorithm", ["minhash", "combined"])
def test_other_algorithms(tmp_path, algorithm):
    result, v = run_scan(tmp_path, jsonl(PAGES), "in.jsonl", "--algorithm", algorithm)
    assert result.exit_code == 0, result.output
    assert [x["verdict"] for x in v] == ["unique", "unique", "near_duplicate", "near_duplicate", "unique", "unique"]
    assert v[3]["match_id"] == "http://a.example/1" and v[3]["distance"] == 0
    # minhash reports the estimated resemblance; combined ranks by the simhash distance only
    assert v[3].get("similarity") == (1.0 if algorithm == "minhash" else None)


def test_bad_record_is_reported_with_its_line_and_skipped(tmp_path):
    result, v = run_scan(tmp_path, jsonl(PAGES, bad_line=b"{oops"))
    assert result.exit_code == 0
    assert len(v) == len(PAGES)
    assert "record 3: skipped: not_json" in result.output
    assert "skipped 1 bad records (1 not_json)" in result.output


def test_binary_page_is_skipped(tmp_path):
    recs = PAGES[:2] + [{"url": "http://bin/", "content": "\x00\x01\x02" * 500 + "PNG"}]
    result, v = run_scan(tmp_path, jsonl(recs))
    assert len(v) == 2 and "record 3: skipped" in result.output


def test_warc_input(tmp_path):
    buf = io.BytesIO()
    w = WARCWriter(buf, gzip=True)
    for rec in PAGES:
        body = rec["content"].encode("cp1252")
        http = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=windows-1252")], protocol="HTTP/1.1")
        w.write_record(w.create_warc_record(rec["url"], "response", payload=io.BytesIO(body), http_headers=http))
    result, v = run_scan(tmp_path, buf.getvalue(), "crawl.warc.gz")
    assert result.exit_code == 0, result.output
    assert [x["verdict"] for x in v] == ["unique", "unique", "near_duplicate", "near_duplicate", "unique", "unique"]
    _, from_jsonl = run_scan(tmp_path, jsonl(PAGES))
    assert [x["fingerprint"] for x in v] == [x["fingerprint"] for x in from_jsonl]


def test_stdin_and_stdout(tmp_path):
    result = CliRunner().invoke(main, ["scan", "-"], input=jsonl(PAGES[:3]))
    lines = [json.loads(x) for x in result.stdout.splitlines()]
    assert [x["verdict"] for x in lines] == ["unique", "unique", "near_duplicate"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--k", "40"], "use a small number of bits"),
        (["--threshold", "1.5"], "use a similarity such as 0.8"),
        (["--algorithm", "lsh"], "not one of simhash|minhash|combined"),
        (["--k", "2", "--design", "20"], "named designs are for k=3"),
        (["--input-format", "pdf"], "'auto', 'jsonl', 'warc'"),
    ],
)
def test_bad_arguments_say_how_to_fix_them(tmp_path, args, message):
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl(PAGES[:1]))
    proc = subprocess.run(
        [sys.executable, "-m", "streamdedup", "scan", str(src), *args], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_missing_input_file(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "streamdedup", "scan", str(tmp_path / "nope.jsonl")], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_progress_bar_when_asked(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl(PAGES))
    proc = subprocess.run(
        [sys.executable, "-m", "streamdedup", "scan", str(src), "--progress", "-o", "/dev/null"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "6 pages" in proc.stderr


@pytest.mark.parametrize("algorithm", ["simhash", "minhash", "combined"])
def test_an_unchanged_refetch_keeps_the_place_of_its_first_fetch(algorithm):
    """a, then b (a copy of a), then a again unchanged: a is judged where it was first stored,
    before b, so only b is flagged (as the worker judges a replay); a changed re-fetch is new."""
    from streamdedup.engine.dedup import Deduplicator

    text, other = " ".join(article(1).split()[:300]), " ".join(article(2).split()[:300])
    d = Deduplicator(algorithm)
    got = d.process(["a", "b", "a"], ["ua", "ub", "ua"], [text, text, text])
    assert [(v.verdict, v.match_id) for v in got] == [("unique", None), ("near_duplicate", "a"), ("unique", None)]
    # in later batches too, and a re-fetch with other content is judged at its own place
    got = d.process(["a", "a"], ["ua", "ua"], [text, other])
    assert [(v.verdict, v.match_id) for v in got] == [("unique", None), ("unique", None)]
    assert [(v.verdict, v.match_id) for v in d.process(["c"], ["uc"], [other])] == [("near_duplicate", "a")]


def _damaged_gzip(path: Path, how: str) -> None:
    """A .jsonl.gz of 300 pages, cut in half (``truncated``) or with 8 bytes zeroed early in its
    deflate stream (``corrupt``: zlib's "invalid distance too far back")."""
    import gzip

    lines = b"".join(
        json.dumps({"url": f"http://a/{i}", "content": f"<p>page {i} " + f"w{i} " * 50 + "</p>"}).encode() + b"\n"
        for i in range(300)
    )
    raw = bytearray(gzip.compress(lines))
    if how == "truncated":
        raw = raw[: len(raw) // 2]
    else:
        raw[200:208] = b"\x00" * 8
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["truncated", "corrupt"])
def test_a_damaged_gzip_is_a_one_line_error_that_names_the_file(tmp_path, how):
    """(A truncated one ended with click's bare "Aborted!", a corrupt one with a zlib traceback.)"""
    src = tmp_path / "pages.jsonl.gz"
    _damaged_gzip(src, how)
    result = subprocess.run(
        [sys.executable, "-m", "streamdedup", "scan", str(src), "--output", str(tmp_path / "out.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert f"{src}: cannot be read to its end" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "Aborted!" not in result.stderr


def test_a_warc_cut_short_exits_with_an_error_after_the_verdicts_it_read(tmp_path):
    """(It exited 0: a script never saw that the rest of the file was not read.)"""
    from test_client import warc

    full = warc(
        ("http://a/1", "text/html", b"<p>" + b"one page of words " * 20 + b"</p>"),
        ("http://a/2", "text/html", b"<p>" + b"two " * 500 + b"</p>"),
        gzip=False,
    ).getvalue()
    result, verdicts = run_scan(tmp_path, full[: len(full) - 1000], "crawl.warc")
    assert result.exit_code == 1
    assert [v["id"] for v in verdicts] == ["http://a/1"]
    assert "1 bad_warc" in result.output and "damaged or cut short" in result.output


def _scan(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamdedup", "scan", *args], input=stdin, capture_output=True, timeout=120
    )


def test_an_output_that_is_the_input_is_refused_before_it_empties_the_input(tmp_path):
    """(``scan pages.jsonl -o pages.jsonl`` emptied pages.jsonl, and said "scanned 0 pages" with exit 0.)"""
    src, link = tmp_path / "pages.jsonl", tmp_path / "link.jsonl"
    src.write_bytes(jsonl(PAGES))
    link.symlink_to(src)
    for output in (src, link):
        proc = _scan(str(src), "-o", str(output))
        assert proc.returncode == 2 and b"is the input file" in proc.stderr and b"Traceback" not in proc.stderr
        assert src.read_bytes() == jsonl(PAGES)


@pytest.mark.parametrize("gz", [False, True], ids=["jsonl", "jsonl.gz"])
@pytest.mark.parametrize("fmt", [[], ["--input-format", "jsonl"]], ids=["auto", "jsonl"])
def test_a_pipe_given_as_a_path_is_read_whole(tmp_path, gz, fmt):
    """``scan <(zcat pages.jsonl.gz)``, ``/dev/stdin``: the file was opened once to look at its first
    bytes and again to read it; a pipe has no bytes to give twice (a traceback: not seekable)."""
    import gzip
    import os
    import threading

    fifo = tmp_path / "pages"
    os.mkfifo(fifo)
    data = jsonl(PAGES)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(gzip.compress(data) if gz else data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    out = tmp_path / "verdicts.jsonl"
    proc = _scan(str(fifo), *fmt, "-o", str(out))
    writer.join(10)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [p["url"] for p in PAGES]


def test_gzipped_json_lines_on_stdin_are_read():
    """(Every line was skipped as not_utf8.)"""
    import gzip

    proc = _scan("-", stdin=gzip.compress(jsonl(PAGES)))
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["id"] for line in proc.stdout.splitlines()] == [p["url"] for p in PAGES]


def test_json_lines_read_as_a_warc_are_an_error_not_zero_pages(tmp_path):
    """(warcio took each JSON line for an ARC header: "scanned 0 pages", exit 0.)"""
    src = tmp_path / "pages.warc"
    src.write_bytes(jsonl(PAGES))
    proc = _scan(str(src), "-o", str(tmp_path / "out.jsonl"))
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    assert b"bad_warc" in proc.stderr and b"not a WARC (JSON lines? then --input-format jsonl)" in proc.stderr


def test_a_threshold_the_permutations_cannot_band_says_how_to_fix_it(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl(PAGES[:1]))
    proc = _scan(str(src), "--algorithm", "minhash", "--threshold", "0.01")
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr
    assert b"--threshold / --num-perm" in proc.stderr and b"for example --num-perm 512 --threshold 0.8" in proc.stderr


@pytest.mark.parametrize("where", ["missing-dir", "full-file", "full-stdout"])
def test_verdicts_that_cannot_be_written_are_a_one_line_error(tmp_path, where):
    """(A missing directory and a full disk were tracebacks.)"""
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl(PAGES))
    if where == "full-stdout":
        with open("/dev/full", "wb") as full:
            proc = subprocess.run(
                [sys.executable, "-m", "streamdedup", "scan", str(src)],
                stdout=full,
                stderr=subprocess.PIPE,
                timeout=120,
            )
    else:
        out = tmp_path / "no/such/dir/out.jsonl" if where == "missing-dir" else Path("/dev/full")
        proc = _scan(str(src), "-o", str(out))
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"Error: cannot write the verdicts to " in proc.stderr
    if where != "missing-dir":
        assert b"No space left on device" in proc.stderr and b"incomplete" in proc.stderr


def test_the_settings_of_other_commands_in_the_environment_do_not_stop_scan(tmp_path):
    """A worker's environment (SASL without its mechanism, which only the worker's Kafka settings
    complete; a malformed worker-only value) stopped ``scan``, which talks to no Kafka; a
    misspelt STREAMDEDUP_* name still does."""
    import os

    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl(PAGES))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMDEDUP_")}
    worker = {"STREAMDEDUP_SECURITY_PROTOCOL": "SASL_SSL", "STREAMDEDUP_PARTITIONS": "eight"}
    proc = subprocess.run(
        [sys.executable, "-m", "streamdedup", "scan", str(src)], env={**env, **worker}, capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == len(PAGES)
    typo = subprocess.run(
        [sys.executable, "-m", "streamdedup", "scan", str(src)],
        env={**env, "STREAMDEDUP_PARTITONS": "4"},
        capture_output=True,
        timeout=120,
    )
    assert typo.returncode == 2 and b"did you mean STREAMDEDUP_PARTITIONS?" in typo.stderr
