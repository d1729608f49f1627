"""``streamdedup worker``: run a stream worker of the consumer group."""

from __future__ import annotations

import click

from streamdedup.cli.options import settings_from_click, settings_options
from streamdedup.errors import TopicError


@click.command(
    short_help="Run a stream worker of the consumer group (judges the pages topic).",
    epilog="""/metrics (Prometheus) and POST /check are served on --web-host:--web-port.

\b
Examples:
  streamdedup worker --brokers kafka-1:9092,kafka-2:9092 --partitions 8
  STREAMDEDUP_BROKERS=kafka:9092 STREAMDEDUP_DATA_DIR=/var/lib/streamdedup streamdedup worker""",
)
@settings_options
def worker(**params) -> None:
    """Run a stream worker: judge the pages topic, route pages to the unique, near-duplicate,
    verdicts and dead-letter topics.  Start as many as the pages topic has partitions; they
    share the index (sharded by simhash block, or by LSH band for --algorithm minhash and
    combined) through the consumer group --app-id."""
    settings = settings_from_click(params)
    from streamdedup.stream.app import band_scheme

    try:
        band_scheme(settings)
    except ValueError as e:  # a threshold the permutations cannot band
        raise click.BadParameter(
            f"{e} (for example --num-perm 512 --threshold 0.8)", param_hint="--threshold / --num-perm"
        ) from None
    from streamdedup.stream.run import run_worker

    try:
        run_worker(settings)
    except TopicError as e:
        raise click.ClickException(str(e)) from None
