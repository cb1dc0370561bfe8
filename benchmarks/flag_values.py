"""How ``opgraph-bench`` (and ``opgraph-bench compare``) says a flag's value is
wrong: one short line naming the flag, the value, the allowed names and a
close one (:func:`unknown_value`), below a one-line usage
(:class:`BriefUsageParser`); argparse's own error printed the whole usage and
``invalid choice: 'nhcw' (choose from 'nchw', 'nhwc')``, a Python tuple with
no close name."""

from __future__ import annotations

import argparse
import sys
import textwrap

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


def one_of(allowed, what: str, fold_case: bool = False, meant: dict | None = None):
    """The ``type`` of a flag that takes one of ``allowed``: the value (lower-cased
    with ``fold_case``), or :func:`unknown_value`'s error. Given beside
    ``choices=allowed`` (which ``--help`` lists), it runs first, so the error is
    this one, with its close name, not argparse's ``invalid choice``. ``meant``:
    words that are not close in spelling to the name they mean (``gpu`` ->
    ``cuda``), suggested instead of the spelling's closest name."""
    def parse(text: str) -> str:
        value = text.lower() if fold_case else text
        if value not in allowed:
            if meant and value.lower() in meant:
                raise argparse.ArgumentTypeError(f"unknown {what} {value!r} (did you mean "
                                                 f"{meant[value.lower()]!r}?); choose from {', '.join(allowed)}")
            raise unknown_value(what, value, allowed)
        return value
    return parse


def given_twice(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The error for a flag that takes one value and is given more than once in
    ``argv`` with different values, or None. argparse keeps the last value of a flag whose action
    stores one (``--model L4 --model L5`` ran L5 alone, saying nothing); a flag
    that collects (``append``, ``extend``) or a switch (``store_true``) may
    repeat. A flag's value may follow it or be joined by ``=``; argparse's
    abbreviations of long flags count as the flag."""
    single = {option: action for action in parser._actions if action.option_strings and action.nargs is None
              and not isinstance(action, (argparse._AppendAction, argparse._ExtendAction))
              for option in action.option_strings}
    seen: dict[str, str] = {}
    i = 0
    while i < len(argv):
        name, joined, value = argv[i].partition("=")
        if name == "--":
            break
        every = parser._option_string_actions  # exact names first, as argparse resolves them
        matches = [name] if name in every else \
            [o for o in every if name.startswith("--") and len(name) > 2 and o.startswith(name)]
        if len({id(every[o]) for o in matches}) != 1 or matches[0] not in single:
            i += 1
            continue
        action = single[matches[0]]
        if not joined:  # the value is the next word
            value = argv[i + 1] if i + 1 < len(argv) else ""
            i += 1
        i += 1
        if action.dest in seen and seen[action.dest] != value:  # the same value again changes nothing
            flag = "/".join(action.option_strings)
            listed = "," in str(action.metavar or "")
            hint = f"; give one list: {flag} {seen[action.dest]},{value}" if listed else ""
            return f"argument {flag}: given twice ({seen[action.dest]!r}, then {value!r}): only one would be used{hint}"
        seen[action.dest] = value
    return None


def unknown_flags(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """The error for the words argparse did not recognise (``extras``): each
    unknown flag with the closest of the parser's flags
    (:func:`opgraph.errors.did_you_mean`), ``unknown flag '--mdoel' (did you
    mean '--model'?)``, where argparse said ``unrecognized arguments: --mdoel
    alexnet`` and no more (Python 3.11's argparse has no ``suggest_on_error``).
    The words after an unknown flag are taken for its values and not named
    again; words before any flag keep argparse's wording."""
    flags = [w for w in extras if w.startswith("-") and w != "-" and not _number(w)]
    if not flags:
        return f"unrecognized arguments: {' '.join(extras)}"
    known = list(parser._option_string_actions)
    bare = lambda flag: flag.lstrip("-")  # noqa: E731  (the dashes alone made '--help' close to '--mdoel')
    named = ", ".join(f"{w.partition('=')[0]!r}{did_you_mean(w.partition('=')[0], known, bare)}" for w in flags)
    stray = extras[:extras.index(flags[0])]  # before the first unknown flag: not its values
    tail = f"; unrecognized arguments: {' '.join(stray)}" if stray else ""
    return f"unknown flag{'s' if len(flags) > 1 else ''} {named}{tail}"


def _number(word: str) -> bool:
    """Whether ``word`` is a negative number (a value, not a flag)."""
    try:
        float(word)
    except ValueError:
        return False
    return True


class ParagraphFormatter(argparse.HelpFormatter):
    """argparse's help layout, with the description and epilog filled paragraph
    by paragraph (a blank line between them) and never broken at a hyphen:
    argparse's own cut ``opgraph-bench`` and ``--format`` across lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(textwrap.fill(" ".join(paragraph.split()), width, initial_indent=indent,
                                          subsequent_indent=indent, break_on_hyphens=False)
                            for paragraph in text.split("\n\n"))


class BriefUsageParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage error is a short usage line and the
    error: argparse's own printed the whole usage (20 lines, every flag) above
    the one line that said what was wrong. ``--help`` keeps the full usage.
    An unknown flag is named with the closest known one (:func:`unknown_flags`).
    ``brief``: what the short line shows after the program's name (default
    ``[FLAGS ...]``; a command with required arguments names them)."""

    def __init__(self, *args, brief: str = "[FLAGS ...]", **kwargs):
        super().__init__(*args, **kwargs)
        self.brief = brief

    def parse_args(self, args=None, namespace=None):
        """argparse's ``parse_args``, an unknown flag's error offering the close one."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unknown_flags(self, extras))
        return parsed

    def parse_known_args(self, args=None, namespace=None):
        """argparse's parse, then :func:`given_twice`'s check of ``args``."""
        parsed, extras = super().parse_known_args(args, namespace)
        repeated = given_twice(self, sys.argv[1:] if args is None else list(args))
        if repeated:
            self.error(repeated)
        return parsed, extras

    def error(self, message: str):
        """Print ``usage: PROG BRIEF; PROG --help lists them`` (``brief``) and
        ``PROG: error: MESSAGE`` to standard error.

        Raises:
            SystemExit: always, status 2 (argparse's status of a usage error).
        """
        self.exit(2, f"usage: {self.prog} {self.brief}; {self.prog} --help lists them\n"
                     f"{self.prog}: error: {message}\n")


__all__ = ["unknown_value", "one_of", "given_twice", "unknown_flags", "BriefUsageParser", "ParagraphFormatter"]
