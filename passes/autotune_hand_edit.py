"""A cached decision edited by hand: whether the edited choice is used, and what the report says.

The user may edit a cache entry's top-level ``algorithm``/``options`` to pin
a node's choice. The tuner records its own choice in the entry's ``tuned``
field, so an edit is told from a choice made under another policy
(:func:`hand_edit`): it is used when the entry's measured row of it is
correct (and capturable where the step is replayed as CUDA graphs), the
report's notes saying so; otherwise a ``RuntimeWarning`` says why not
(:class:`HandEdit`'s ``message``) and names the choice used instead: the
pass warns once the memory-aware re-choice is made, and where that replaced
the rows' choice, the warning names the one that runs
(:meth:`HandEdit.instead_of_rows`). The memory-aware re-choice leaves a node
whose edit is used alone (:func:`pinned_by_hand`). Separate from the reuse of cached
decisions (``autotune_reuse``), which it builds on: this is the user's
override of that reuse, with its own messages.
"""

from __future__ import annotations

import attrs

from .autotune_choice import CaptureBlocker, captures_all
from .autotune_reuse import RECHOOSE_VERSION
from .report import Candidate

#: Words only the note of a hand edit used has (:func:`hand_edit`): an ``opgraph-bench`` column
#: repeats that note (``benchmarks/lowerings.py``; a used edit raises no warning, and is timed).
USED = "checked correct when tuned"


@attrs.frozen
class HandEdit:
    """A cache entry's top-level ``algorithm``/``options`` that differ from the
    choice made from its measured rows (:func:`hand_edit`).

    Attributes:
        algorithm, options: the entry's top-level choice, as edited.
        used: whether it replaces the rows' choice.
        measured: whether the entry has a row of it (checked and timed).
        message: what the report says (a note when ``used``; else a
            ``RuntimeWarning`` through ``AutotuneCache.warn``).
        rows_choice: the label of the choice made from the measured rows.
        instead: for an edit not used, the words of ``message`` naming
            ``rows_choice`` as the choice used instead ('' when ``used``).
    """

    algorithm: str
    options: dict
    used: bool
    measured: bool
    message: str
    rows_choice: str = ""
    instead: str = ""

    def instead_of_rows(self, label: str, how: str) -> str:
        """``message`` for an edit not used whose node runs ``label`` rather
        than :attr:`rows_choice`, ``how`` saying why (``'chosen for the memory
        peak (peak_tolerance 20 %)'``): the warning names the choice that runs,
        not one replaced after it was written."""
        return self.message.replace(self.instead, f"{label} used instead, {how} over {self.rows_choice}, "
                                                  "the measured candidates' own choice", 1)


def hand_edit(entry: dict, rows: list[Candidate], algorithm: str | None, options: dict,
              workspace_tolerance: float, capture_blocker: CaptureBlocker = captures_all) -> HandEdit | None:
    """The hand edit of a cached decision's top-level choice, or None.

    ``rows``, ``algorithm`` and ``options`` are :func:`rechoose`'s answer for
    ``entry``. An entry the tuner writes records its own choice in ``tuned``
    (``{"algorithm": ..., "options": ...}``); a top-level ``algorithm`` /
    ``options`` unlike it was edited in the file, and is used (``used``; the
    rows' choice is then marked ``ok`` and the edited row ``chosen``, each
    ``reason`` saying so) when the entry has a row of exactly that choice
    whose status is correct (``ok``, or ``unverified`` for an op without a
    reference rule), and, by ``capture_blocker`` (policy ``cuda_graph``:
    :func:`choose`), that can be captured into a CUDA graph unless the rows'
    choice cannot either. Otherwise the rows' choice stands and ``message``
    says why the edit is not used. None when nothing conflicts: an entry
    without the ``rechoose`` tag (its top-level choice is used as written
    anyway), a top-level choice equal to ``tuned`` or to the rows' choice.

    An entry without a valid ``tuned`` (written before opgraph recorded it)
    cannot tell an edit from a choice made under another
    ``workspace_tolerance`` or ``cuda_graph``: the rows' choice stands, as the
    cache's documented re-choosing says, and ``message`` says so.
    """
    if entry.get("rechoose") != RECHOOSE_VERSION:
        return None
    edited_alg, edited_opts = entry.get("algorithm"), dict(entry.get("options", {}))
    if (edited_alg, edited_opts) == (algorithm, options):
        return None
    tuned = _tuned_choice(entry)
    valid = tuned is not None
    if (edited_alg, edited_opts) == tuned:
        return None
    e_label = Candidate(edited_alg, edited_opts).label
    best = next((c for c in rows if c.status == "chosen"), None)
    b_label = best.label if best is not None else Candidate(algorithm, options).label
    row = next((c for c in rows if c.algorithm == edited_alg and c.options == edited_opts), None)
    instead = f"{b_label} chosen from the entry's measured candidates instead"

    def no(why: str) -> HandEdit:
        return HandEdit(edited_alg, edited_opts, False, row is not None, why, b_label, instead)

    if not valid:
        return no(f"the entry's choice {e_label} is not used: {instead} (workspace_tolerance "
                  f"{workspace_tolerance:g}); the entry has no \"tuned\" record of the tuner's own "
                  "choice (written before opgraph kept one), so a hand edit cannot be told from a choice "
                  "made under another workspace_tolerance or cuda_graph: pin a choice with the policy's "
                  "force, or delete the entry and edit the one re-tuning writes")
    tail = f"; {instead} (set algorithm/options back to \"tuned\" to silence this)"
    if row is None:
        measured = ", ".join(c.label for c in rows if c.status not in ("excluded", "declined"))
        return no(f"hand-edited choice {e_label} is not used: it is not among the entry's measured "
                  f"candidates ({measured}){tail}")
    if row.status not in ("ok", "unverified"):
        return no(f"hand-edited choice {e_label} is not used: its measured row is {row.status}"
                  + (f" ({row.reason})" if row.reason else "") + tail)
    edit_blocker = capture_blocker(edited_alg, edited_opts)
    if edit_blocker is not None and capture_blocker(algorithm, options) is None:
        return no(f"hand-edited choice {e_label} is not used: it cannot be captured into a CUDA graph "
                  f"({edit_blocker}) and the step is replayed as CUDA graphs (cuda_graph){tail}")
    if best is not None:
        best.status = "ok"
        best.reason = "; ".join(filter(None, [best.reason, f"the measurements' choice; the cache entry's "
                                                          f"hand-edited {e_label} is used instead"]))
    row.status = "chosen"
    row.reason = "; ".join(filter(None, [row.reason, f"hand-edited in the autotune cache (the measurements "
                                                    f"choose {b_label})"]))
    at = f"{row.time_ms:.3f} ms" if row.time_ms is not None else "untimed"
    than = f" ({best.time_ms:.3f} ms)" if best is not None and best.time_ms is not None else ""
    return HandEdit(edited_alg, edited_opts, True, True,
                    f"hand-edited choice {e_label} used ({at}, {USED}); "
                    f"the measurements alone choose {b_label}{than}", b_label)


def _tuned_choice(entry: dict) -> tuple[str, dict] | None:
    """``(algorithm, options)`` of a cache entry's ``tuned`` record (the
    tuner's own choice), or None where it has no valid one (written before
    opgraph kept it)."""
    tuned = entry.get("tuned")
    if not (isinstance(tuned, dict) and isinstance(tuned.get("algorithm"), str)
            and isinstance(tuned.get("options", {}), dict)):
        return None
    return tuned["algorithm"], dict(tuned.get("options", {}))


def pinned_by_hand(entry: dict, algorithm: str | None, options: dict) -> bool:
    """Whether ``algorithm``/``options``, the choice a node runs from cache
    ``entry``, is the entry's top-level choice edited by hand (unlike its
    ``tuned`` record: :func:`hand_edit`), whether the edit overrides the
    choice made from the rows or agrees with it. The memory-aware re-choice
    leaves such a node alone: the user asked for that choice."""
    top = (entry.get("algorithm"), dict(entry.get("options", {})))
    tuned = _tuned_choice(entry)
    return tuned is not None and top != tuned and (algorithm, dict(options)) == top


__all__ = ["USED", "HandEdit", "hand_edit", "pinned_by_hand"]
