"""``python -m opgraph.benchmarks``: the ``opgraph-bench`` command (:func:`.cli.main`,
``compare`` included), for an environment whose PATH lacks the console script
(a virtual environment not activated, an install with ``--no-deps`` scripts
elsewhere); the same flags, output and exit status."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
