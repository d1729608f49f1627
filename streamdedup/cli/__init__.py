"""The ``streamdedup`` command line: one module per command group, registered here.

Bad arguments get a one-line message that says how to fix them (click's usage errors), never
a traceback.  Every command's ``--help`` has a one-line summary for ``streamdedup --help``
(``short_help``), lists only the options the command uses, and ends with examples (``epilog``;
``tests/test_cli_help.py`` checks all three).
"""

from __future__ import annotations

import click

from streamdedup import __version__
from streamdedup.cli.crawler import produce, verdicts
from streamdedup.cli.scan import scan
from streamdedup.cli.worker import worker

__all__ = ["main"]


EPILOG = """Every command has its own --help; settings also come from STREAMDEDUP_* variables.

\b
Examples:
  streamdedup scan crawl.warc.gz -o verdicts.jsonl          # a file, no Kafka
  streamdedup worker --brokers kafka:9092 --partitions 8    # the stream worker
  streamdedup produce crawl.warc.gz --brokers kafka:9092    # feed it
  streamdedup verdicts --brokers kafka:9092 --from-beginning"""


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.version_option(__version__, prog_name="streamdedup")
def main() -> None:
    """Near-duplicate filter for web crawls: simhash (Manku) and MinHash-LSH, on Kafka."""


for _command in (scan, worker, produce, verdicts):
    main.add_command(_command)

if __name__ == "__main__":
    main()
