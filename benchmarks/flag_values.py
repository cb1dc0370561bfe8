"""How ``opgraph-bench`` (and ``opgraph-bench compare``) says a flag's value is
wrong: one short line naming the flag, the value, the allowed names and a
close one (:func:`unknown_value`), below a one-line usage
(:class:`BriefUsageParser`); argparse's own error printed the whole usage and
``invalid choice: 'nhcw' (choose from 'nchw', 'nhwc')``, a Python tuple with
no close name."""

from __future__ import annotations

import argparse

from opgraph.errors import did_you_mean


def unknown_value(what: str, values, allowed, listed: str | None = None) -> argparse.ArgumentTypeError:
    """The error of a flag's unknown value(s) (a string or a list of them):
    ``unknown layout 'nhcw' (did you mean 'nhwc'?); choose from nchw, nhwc``,
    one line (argparse puts ``argument --layout:`` before it, naming the
    flag). Each value is compared with ``allowed``
    (:func:`opgraph.errors.did_you_mean`); ``listed`` is what the message
    lists, when that is more than ``allowed`` joined."""
    values = [values] if isinstance(values, str) else list(values)
    named = ", ".join(f"{v!r}{did_you_mean(v, allowed)}" for v in values)
    return argparse.ArgumentTypeError(f"unknown {what} {named}; choose from {listed or ', '.join(allowed)}")


def one_of(allowed, what: str, fold_case: bool = False):
    """The ``type`` of a flag that takes one of ``allowed``: the value (lower-cased
    with ``fold_case``), or :func:`unknown_value`'s error. Given beside
    ``choices=allowed`` (which ``--help`` lists), it runs first, so the error is
    this one, with its close name, not argparse's ``invalid choice``."""
    def parse(text: str) -> str:
        value = text.lower() if fold_case else text
        if value not in allowed:
            raise unknown_value(what, value, allowed)
        return value
    return parse


class BriefUsageParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage error is a short usage line and the
    error: argparse's own printed the whole usage (20 lines, every flag) above
    the one line that said what was wrong. ``--help`` keeps the full usage."""

    def error(self, message: str):
        """Print ``usage: PROG [FLAGS ...]; PROG --help lists them`` and
        ``PROG: error: MESSAGE`` to standard error.

        Raises:
            SystemExit: always, status 2 (argparse's status of a usage error).
        """
        self.exit(2, f"usage: {self.prog} [FLAGS ...]; {self.prog} --help lists them\n"
                     f"{self.prog}: error: {message}\n")


__all__ = ["unknown_value", "one_of", "BriefUsageParser"]
