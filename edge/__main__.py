"""``python -m edge`` is ``edgekit``."""

from edge.cli import main

main()
