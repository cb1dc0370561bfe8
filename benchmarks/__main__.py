"""``python -m opgraph.benchmarks``: the ``opgraph-bench`` command (:func:`.cli.main`,
``compare`` included), for an environment whose PATH lacks the console script
(a virtual environment not activated, an install with ``--no-deps`` scripts
elsewhere); the same flags, output and exit status. Its ``--help``, usage
errors and error lines name it as it was invoked (``python -m
opgraph.benchmarks``, :func:`.cli.python_m`), not as the console script a
user without it cannot type."""

import sys

from .cli import main, python_m

if __name__ == "__main__":
    sys.exit(main(prog=python_m(__spec__.name)))
