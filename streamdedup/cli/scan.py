"""``streamdedup scan``: judge a file of pages in one process, with the embedded engine."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from streamdedup.engine.dedup import ALGORITHMS, Deduplicator
from streamdedup.engine.records import DEFAULT_MAX_PAGE_BYTES, read_jsonl, read_pages
from streamdedup.engine.scan import report_bad, scan_pages
from streamdedup.index.tables import DESIGNS


def _check_k(ctx: click.Context, param: click.Parameter, value: int) -> int:
    if not 0 <= value <= 16:
        raise click.BadParameter(f"{value} is out of range; use a small number of bits such as 3 (0..16)")
    return value


def _check_threshold(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not 0.0 < value < 1.0:
        raise click.BadParameter(f"{value} is not a similarity; use a value between 0 and 1, e.g. 0.8")
    return value


@click.command()
@click.argument("input", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True, path_type=Path),
    default="-",
    show_default=True,
    help="Where to write verdict JSON lines.",
)
@click.option("--algorithm", "-a", type=click.Choice(ALGORITHMS), default="simhash", show_default=True)
@click.option(
    "--k",
    "-k",
    type=int,
    default=3,
    show_default=True,
    callback=_check_k,
    help="simhash: pages within k bits are near-duplicates.",
)
@click.option(
    "--design",
    type=click.Choice(sorted(DESIGNS, key=int)),
    default=None,
    help="Manku table design for k=3 (number of tables); default 16.",
)
@click.option(
    "--threshold",
    type=float,
    default=0.8,
    show_default=True,
    callback=_check_threshold,
    help="minhash/combined: resemblance needed for a near-duplicate.",
)
@click.option(
    "--num-perm",
    type=click.IntRange(16, 1024),
    default=128,
    show_default=True,
    help="minhash/combined: hash functions per signature.",
)
@click.option("--input-format", type=click.Choice(["auto", "jsonl", "warc"]), default="auto", show_default=True)
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=256, show_default=True)
@click.option("--max-page-bytes", type=click.IntRange(1), default=DEFAULT_MAX_PAGE_BYTES, show_default=True)
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
def scan(
    input: Path,
    output: Path,
    algorithm: str,
    k: int,
    design: str | None,
    threshold: float,
    num_perm: int,
    input_format: str,
    batch_size: int,
    max_page_bytes: int,
    progress: bool | None,
) -> None:
    """Judge every page of INPUT (JSON lines or WARC, '-' for JSON lines on stdin) against
    all earlier pages, and write one verdict per page as a JSON line."""
    if design is not None and k != 3:
        raise click.BadParameter("named designs are for k=3; drop --design or use --k 3", param_hint="--design")
    if str(input) != "-" and not input.exists():
        raise click.BadParameter(f"{input} does not exist", param_hint="INPUT")
    try:
        dedup = Deduplicator(algorithm, k=k, design=design, threshold=threshold, num_perm=num_perm)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if str(input) == "-":
        if input_format == "warc":
            raise click.BadParameter("WARC input must be a file", param_hint="--input-format")
        records = read_jsonl(sys.stdin.buffer, max_page_bytes)
    else:
        records = read_pages(input, input_format, max_page_bytes)
    show = sys.stderr.isatty() if progress is None else progress
    out = sys.stdout if str(output) == "-" else output.open("w", encoding="utf-8")
    try:
        with _progress(show, input) as bar:
            summary = scan_pages(records, dedup, out, batch_size, report_bad, on_progress=lambda n: bar.update(n))
    finally:
        if out is not sys.stdout:
            out.close()
    counts = ", ".join(f"{n} {verdict}" for verdict, n in sorted(summary.verdicts.items()))
    bad = sum(summary.bad.values())
    reasons = ", ".join(f"{n} {r}" for r, n in summary.bad.most_common())
    click.echo(
        f"scanned {summary.pages} pages: {counts or 'none'}"
        + (f"; skipped {bad} bad records ({reasons})" if bad else ""),
        err=True,
    )


def _progress(show: bool, input: Path):
    from tqdm import tqdm

    # Counted in pages; a file's page count is unknown until it is read, so no total.
    return tqdm(
        disable=not show,
        unit=" pages",
        desc=str(input.name or "stdin"),
        file=sys.stderr,
        dynamic_ncols=True,
        smoothing=0.1,
    )
