"""``python -m streamdedup``: the command line."""

from streamdedup.cli import main

main()
