"""The ``streamdedup`` command line: one module per command group, registered here.

Bad arguments get a one-line message that says how to fix them (click's usage errors), never
a traceback.
"""

from __future__ import annotations

import click

from streamdedup import __version__
from streamdedup.cli.crawler import produce, verdicts
from streamdedup.cli.scan import scan
from streamdedup.cli.worker import worker

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="streamdedup")
def main() -> None:
    """Near-duplicate filter for web crawls: simhash (Manku) and MinHash-LSH, on Kafka."""


for _command in (scan, worker, produce, verdicts):
    main.add_command(_command)

if __name__ == "__main__":
    main()
