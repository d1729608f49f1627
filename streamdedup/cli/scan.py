"""``streamdedup scan``: judge a file of pages in one process, with the embedded engine."""

from __future__ import annotations

import gzip
import os
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO, cast

import click

from streamdedup.cli.options import SCAN, settings_from_click, settings_options
from streamdedup.engine.dedup import Deduplicator
from streamdedup.engine.records import DAMAGED_WARC, open_input, records_of, sniff_format
from streamdedup.engine.scan import report_bad, scan_pages

#: What scan's settings mean for a file (the same checks and messages as the worker's).
SCAN_HELP = {
    "algorithm": "simhash: 64-bit fingerprints, near-duplicates within --k bits (fast, the worker's test); "
    "minhash: estimated resemblance of word trigrams over --threshold (better recall); "
    "combined: simhash candidates confirmed by MinHash.",
    "batch_size": "Pages fingerprinted and judged together; larger is faster, up to a point, and holds more "
    "pages in memory.",
    "max_page_bytes": "Larger pages are skipped and reported as too_large.",
}


@click.command(
    short_help="Judge a file of pages (WARC or JSON lines) without Kafka.",
    epilog="""\b
Examples:
  streamdedup scan crawl.warc.gz -o verdicts.jsonl
  streamdedup scan pages.jsonl --algorithm minhash --threshold 0.9
  cat pages.jsonl | streamdedup scan - > verdicts.jsonl""",
)
@click.argument("input", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True, path_type=Path),
    default="-",
    show_default=True,
    help="Where to write verdict JSON lines.",
)
@click.option(
    "--input-format",
    type=click.Choice(["auto", "jsonl", "warc"]),
    default="auto",
    show_default=True,
    help='jsonl: one {"url", "content", ...} object per line (gzip too); warc: WARC / WARC.gz '
    "response records; auto: by the file name, then the first bytes (stdin: jsonl).",
)
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@settings_options(only=SCAN, help=SCAN_HELP)
def scan(input: Path, output: Path, input_format: str, progress: bool | None, **params: Any) -> None:
    """Judge every page of INPUT (JSON lines or WARC, '-' for JSON lines on stdin) against
    all earlier pages, and write one verdict per page as a JSON line."""
    settings = settings_from_click(params)  # the worker's checks and messages
    if str(input) != "-" and not input.exists():
        raise click.BadParameter(f"{input} does not exist", param_hint="INPUT")
    if "-" not in (str(input), str(output)) and output.exists() and os.path.samefile(input, output):
        # (opening the output for writing would empty the input before a record of it is read)
        raise click.BadParameter(f"{output} is the input file; write the verdicts to another", param_hint="--output")
    s = settings
    try:
        dedup = Deduplicator(
            s.algorithm, k=s.k, design=s.design, threshold=s.threshold, num_perm=s.num_perm, cluster_n=s.cluster_n
        )
    except ValueError as e:  # a threshold the permutations cannot band (the worker's message)
        raise click.BadParameter(
            f"{e} (for example --num-perm 512 --threshold 0.8)", param_hint="--threshold / --num-perm"
        ) from None
    if str(input) == "-" and input_format == "warc":
        raise click.BadParameter("WARC input must be a file", param_hint="--input-format")
    show = sys.stderr.isatty() if progress is None else progress
    where = "standard output" if str(output) == "-" else str(output)
    try:
        out = _Verdicts(sys.stdout if str(output) == "-" else output.open("w", encoding="utf-8"))
    except OSError as e:
        raise click.ClickException(f"cannot write the verdicts to {where} ({e.strerror or e})") from None
    try:
        with _records(input, input_format, s.max_page_bytes) as (records, position), _progress(show, input) as bar:
            summary = scan_pages(
                records,
                dedup,
                cast(TextIO, out),
                s.batch_size,
                report_bad,
                on_progress=lambda n: bar.advance(n, position()),
            )
        out.close()
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:  # (click made an EOFError a bare "Aborted!")
        raise click.ClickException(
            f"{input}: cannot be read to its end ({type(e).__name__}: {e}); the verdicts before that point "
            "are written. Check the file (a truncated or damaged gzip?) and its --input-format"
        ) from None
    except _WriteError as e:
        raise click.ClickException(
            f"cannot write the verdicts to {where} ({e.__cause__}); the verdicts written are incomplete"
        ) from None
    finally:
        out.close(quietly=True)
    counts = ", ".join(f"{n} {verdict}" for verdict, n in sorted(summary.verdicts.items()))
    bad = sum(summary.bad.values())
    reasons = ", ".join(f"{n} {r}" for r, n in summary.bad.most_common())
    click.echo(
        f"scanned {summary.pages} pages: {counts or 'none'}"
        + (f"; skipped {bad} bad records ({reasons})" if bad else ""),
        err=True,
    )
    if summary.bad["bad_warc"]:
        raise click.ClickException(DAMAGED_WARC)


@contextmanager
def _records(input: Path, fmt: str, max_page_bytes: int) -> Iterator[tuple[Any, Callable[[], int | None]]]:
    """The numbered records of INPUT, and a function giving the bytes of the file read so far
    (None for stdin and pipes).  The file is opened once, here, so that its raw position --
    compressed bytes for a .gz -- drives the progress bar's total and ETA, and so that a pipe
    given as a path (``<(zcat x)``) loses no bytes to a look at its first ones."""
    if str(input) == "-":
        yield records_of(sys.stdin.buffer, "jsonl", max_page_bytes), lambda: None
        return
    with open_input(input) as raw:
        fmt = sniff_format(input, raw) if fmt == "auto" else fmt
        yield records_of(raw, fmt, max_page_bytes), (raw.tell if raw.seekable() else lambda: None)


class _WriteError(Exception):
    """Writing the verdicts failed (its cause: the OSError)."""


class _Verdicts:
    """The verdicts' output: an OSError writing it (a full disk) is a :class:`_WriteError`, not
    one to take for the input's; closed once (stdout: flushed, left open)."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.closed = out, False

    def write(self, text: str) -> int:
        try:
            return self.out.write(text)
        except OSError as e:
            raise _WriteError() from e

    def close(self, quietly: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.out.flush()
            if self.out is not sys.stdout:
                self.out.close()
        except OSError as e:
            if not quietly:
                raise _WriteError() from e


class _Bar:
    """tqdm over the file's bytes (total and ETA) with the records read as a postfix; over
    records for stdin, whose size is unknown."""

    def __init__(self, show: bool, input: Path) -> None:
        from tqdm import tqdm

        self.size = input.stat().st_size if str(input) != "-" and input.is_file() else None
        self.pages = 0
        self.tqdm = tqdm(
            disable=not show,
            total=self.size,
            unit="B" if self.size else " pages",
            unit_scale=bool(self.size),
            desc=str(input.name or "stdin"),
            file=sys.stderr,
            dynamic_ncols=True,
            smoothing=0.1,
        )

    def advance(self, pages: int, position: int | None) -> None:
        self.pages += pages
        if self.size is None or position is None:
            self.tqdm.update(pages)
        else:
            self.tqdm.update(min(position, self.size) - self.tqdm.n)
            self.tqdm.set_postfix_str(f"{self.pages} records", refresh=False)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.size is not None and exc[0] is None:
            self.tqdm.update(self.size - self.tqdm.n)  # the reader may stop short of the last bytes' tell()
        self.tqdm.close()


def _progress(show: bool, input: Path) -> _Bar:
    return _Bar(show, input)
