"""``python -m search``: the command line."""

from search.cli import main

main()
