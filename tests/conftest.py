"""Test-suite root. Its presence puts ``tests/`` on ``sys.path`` (pytest's
default import mode), so helper modules here (``bf16_asserts``) are shared by
the test folders."""
