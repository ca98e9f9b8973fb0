"""`python -m substreams` is the `substreams` command."""

from substreams.cli.main import main

main()
