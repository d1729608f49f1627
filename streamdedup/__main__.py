"""``python -m streamdedup``: the command line."""

from .cli import main

main()
