"""The autotune cache: decisions persisted as human-readable JSON.

File format (``format`` guards against reading something else)::

    {"format": "opgraph-autotune/1",
     "entries": {
        "<key>": {"algorithm": "gemm", "options": {}, "time_ms": 1.9,
                  "candidates": [{"algorithm": "fft", "status": "ok", ...}, ...],
                  "rechoose": 1, "tuned": {"algorithm": "gemm", "options": {}},
                  "device": "NVIDIA H200", "versions": {"numpy": "2.4.0", ...}}}}

The key (:func:`cache_key`) spells out everything a decision depends on: the
op and its parameters, input shapes and dtypes, layout (the first input's, or
each input's where they differ, and the output's where it differs from inputs
that agree: :func:`key_layout`), precision, workspace
limit, device and device name, the competing rules and how each enumerates
its variants, for our generated kernels the fingerprint of the code that
writes them (``#`` and 12 hex digits: ``backends/cuda/kernel_sources.py``) or,
for the generator's element-wise and fused kernels, of the kernels it emits for
the node (``backends/cuda/codegen_sources.py``), and every library version. A key written
under other versions is therefore never looked up again (stale entries stay
in the file, harmless, until it is deleted). A decision whose key differs from
the node's only in those fingerprints (its kernels' code was edited since, or
it was written before fingerprints were kept) is :meth:`AutotuneCache.superseded`:
the node is tuned again, every candidate checked on the kernels as they are
now (a filled input's value too, ``Op.fills``), and the report's notes say so;
storing its new decision drops the superseded entry, from the file too at the
next save (:meth:`AutotuneCache.put`: with every input's layout in the key, a
key but for its fingerprints is one node's, so an edit of a generator leaves
no stale entries behind, though two checkouts of differing kernel code that share
one cache re-tune those nodes at each switch; an entry this compile found or
wrote is kept, and one another process wrote anew meanwhile survives the
merge). The workspace tie-break
(``policy.workspace_tolerance``) is not in the key: an entry keeps every
candidate's measurements, and the winner is chosen again from them under the
current tolerance (``passes.autotune_reuse.rechoose``). Nor is the memory-aware
re-choice (``policy.peak_tolerance``, ``passes/autotune_memory.py``): it
depends on the whole schedule, so each compile makes it again from the rows
and the entry keeps the time-based choice.

Hand edits: ``tuned`` is the tuner's own choice, written beside the top-level
``algorithm`` / ``options`` that a user may edit. A top-level choice unlike
``tuned`` naming another candidate whose row is correct (``ok``, or
``unverified``) is used instead of the choice made from the rows, and the
report's notes say so; one whose row is wrong, failed or over budget, that
has no row, or that cannot be captured when ``cuda_graph`` needs it, is not
used: a ``RuntimeWarning`` names the node, the edited choice, the choice
used instead (the one that runs, after the memory-aware re-choice) and why
(``passes.autotune_hand_edit.hand_edit``). An entry written
without ``tuned`` cannot tell an edit from a choice made under another
tolerance: its rows decide, and a top-level choice they override is
reported the same way.

Location: ``policy.cache``, else the environment variable ``OPGRAPH_CACHE``,
else ``~/.cache/opgraph/autotune.json``; ``off`` (or ``none``) keeps decisions
in memory only. An empty ``OPGRAPH_CACHE`` is the same as an unset one. Both
settings mean the same by one rule (:func:`locate`), the suffix compared in
any case:

* ``*.json``: that file, plain JSON;
* ``*.json.gz``: that file, gzip-compressed (read and written as such: the
  form a cache is carried between machines in, ``autotune-cache.json.gz``);
* a path ending in ``/``, an existing folder, or a name without a suffix
  (``~/.cache/opgraph``): a folder, whose ``autotune.json`` is the cache (a
  folder already there under a ``.json`` or ``.json.gz`` name is taken as a
  folder too, with a warning: an earlier opgraph made such folders from
  ``OPGRAPH_CACHE``);
* any other suffix (``cache.txt``, ``cache.gz``), or a name without a suffix
  where a file is already there: that file, plain JSON, with a
  ``RuntimeWarning`` saying so.

Robustness: writes are atomic (``opgraph.atomic_file.write_atomic``: a
temporary file in the same folder, then ``os.replace``; the file keeps its
permission bits, or gets the umask's when new, and a symbolic link is
followed to the file it names, which is replaced; a ``.json.gz`` file is
compressed whole, then written the same way), merged with whatever
another process wrote meanwhile; a
corrupt or foreign file (damaged or cut-short gzip data; not JSON), or valid JSON of the
wrong shape (``[]``: :func:`wrong_format`),
is reported (``warnings.warn`` naming it and what is wrong, in JSON's terms) and
rebuilt, never a crash (a file whose content is the other form than its name says, plain
JSON under ``*.json.gz`` as an older version wrote a policy cache of that name, or gzip under
``*.json``, is read by its content, said once, and written as its name says: never rebuilt as if
corrupt); an unwritable location is reported the same way; an
entry whose options its rule refuses (a hand-edited Winograd ``tile = 7``:
not one of the rule's variants for the node) is reported and re-tuned
(``passes.autotune_reuse.refused_options``), as is one with a row that
contradicts itself (``passes.autotune_reuse.row_problems``: a ``status``
missing or unknown, or an ``ok`` row whose own ``rel_error`` is above its own
``tolerance`` or NaN; a ``time_ms`` of 0 is a time, a no-op step's).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
import warnings
import zlib
from pathlib import Path
from typing import NamedTuple

from opgraph.atomic_file import write_atomic

FORMAT = "opgraph-autotune/1"
#: a generated kernel family's source fingerprint in a key (``autotune_contenders._stable_name``)
FINGERPRINT = re.compile(r"#[0-9a-f]{12}")
DEFAULT_PATH = "~/.cache/opgraph/autotune.json"
ENV_VAR = "OPGRAPH_CACHE"
#: the name of a gzip-compressed cache file ends so (compared in any case)
GZIP_SUFFIX = ".json.gz"
#: the cache file in a folder that a location names
FOLDER_FILE = "autotune.json"
_GZIP_MAGIC = b"\x1f\x8b"
#: gzip's default level: a third of level 9's time on a 24 MB cache, 8 % larger
_GZIP_LEVEL = 6


class Location(NamedTuple):
    """Where a cache setting puts the cache (:func:`locate`).

    Attributes:
        path: the cache file; None keeps decisions in memory only.
        warning: what a setting of no known kind was taken as (reported as a
            ``RuntimeWarning`` by :meth:`AutotuneCache.for_policy`), or None.
    """

    path: str | None
    warning: str | None = None


def gzipped(path: str | os.PathLike) -> bool:
    """Whether the cache file ``path`` is gzip-compressed: its name (not that
    of a symbolic link's target) ends in ``.json.gz``, in any case."""
    return os.fspath(path).lower().endswith(GZIP_SUFFIX)


def locate(value: str | os.PathLike, source: str) -> Location:
    """The cache file a setting names: the one rule for ``policy.cache`` and
    ``OPGRAPH_CACHE`` (module docstring, "Location"), so a path means the same
    from either. ``source`` names the setting in the warning
    (``'OPGRAPH_CACHE'``, ``'policy cache'``); blanks around ``value`` are
    dropped. A ``.json.gz`` path was a folder from ``OPGRAPH_CACHE`` and a
    plain-JSON file from the policy: both now read and write it gzipped."""
    text = os.fspath(value).strip()
    if text.lower() in ("off", "none"):
        return Location(None)
    path = os.path.expanduser(text)
    said = f"autotune cache: {source}={text!r}"
    inside = os.path.join(path, FOLDER_FILE)
    if path.endswith(("/", os.sep)):  # the user wrote a folder
        return Location(inside)
    name = os.path.basename(path).lower()
    if name.endswith((".json", GZIP_SUFFIX)):
        if not os.path.isdir(path):
            return Location(path)
        # an OPGRAPH_CACHE that did not end in .json made a folder of that name: keep its decisions
        gz = name.endswith(GZIP_SUFFIX)
        made = " (earlier opgraph versions made one of such an OPGRAPH_CACHE)" if gz else ""
        return Location(inside, f"{said} names a {'gzip-compressed' if gz else 'plain-JSON'} cache file by its "
                                f"suffix, but a folder is there{made}; taken as that folder: the cache is {inside}")
    suffix = os.path.splitext(name)[1]  # '' for '.cache' too: a dot file's name is no suffix
    if os.path.isdir(path) or not (suffix or os.path.exists(path)):
        return Location(inside)
    how = (f"has the suffix {suffix!r}, neither .json nor {GZIP_SUFFIX}" if suffix
           else "has no suffix, which names a folder, but a file is there")
    return Location(path, f"{said} {how}: taken as the plain-JSON cache file {path} (a name ending in "
                          f"{GZIP_SUFFIX} is a gzip-compressed one; a path ending in '/', or a name without "
                          f"a suffix, a folder that gets {FOLDER_FILE})")


def env_location() -> Location:
    """Where ``OPGRAPH_CACHE`` puts the cache (:func:`locate`), or the default
    file. An empty or blank ``OPGRAPH_CACHE`` counts as unset, as
    ``OPGRAPH_CACHE= cmd`` usually means "no override"."""
    env = (os.environ.get(ENV_VAR) or "").strip()
    return locate(env or DEFAULT_PATH, ENV_VAR)


def default_path() -> str | None:
    """The cache file from ``OPGRAPH_CACHE`` or the default (None for ``off``
    or ``none``): :func:`env_location`'s path."""
    return env_location().path


def key_layout(in_types, own: str | None = None) -> str:
    """The ``layout=`` field of a node's key (:func:`cache_key`); ``own`` is the node's output's
    layout (None for one without: not 4-D). When every input that has a layout shares the first
    input's (the common case), that one: ``NHWC``, or ``NCHW`` when the first has none (a 2-D
    value), or ``own`` for a node without inputs; the only form keys had before inputs could
    differ, so a carried cache's keys still hit. If then the output has a layout unlike that
    one, ``->`` and the output's (``NCHW->NHWC``: 2-D inputs reshaped into an NHWC value), so
    that it shares no key with the node of the same inputs writing the other layout; a node
    whose output has none or the inputs' (every node of a graph the layout pass stamped alike:
    all 4-D values of a graph without permutes, ConvNeXt's values between its permutes, all
    NCHW) keeps the key it always had.
    Else each input's layout in order, comma-separated, ``-`` for one without (``NHWC,NCHW``,
    ``-,NHWC,-``): two nodes differing only in a later input's layout never share a key, nor
    a key but for their kernels' fingerprints (:meth:`AutotuneCache.superseded`)."""
    if not in_types:
        return own or "NCHW"
    first = in_types[0].layout or "NCHW"
    if all(t.layout in (None, first) for t in in_types[1:]):
        return first if own in (None, first) else f"{first}->{own}"
    return ",".join(t.layout or "-" for t in in_types)


def cache_key(op, in_types, dtype, layout, policy, device, device_name, versions,
              candidates: str = "", out: str | None = None) -> str:
    """The key of one tuning decision (readable, order-stable)::

        <op> | in=(<in>, ...) | dtype=<dtype> | layout=<layout> | [out=<out> | ]precision=<precision> |
        workspace_limit=<limit> | device=<device>:<device name> | candidates=<candidates> | <name>=<version>;...

    (one line, each `` | `` one space either side). ``<op>`` is ``op.describe()``;
    each ``<in>`` an input's declared dtype and shape, ``float32[8x64x28x28]``
    (``x``-joined; a 0-D input ``float32[]``); ``<dtype>`` compile's dtype
    override, or ``declared``; ``<layout>`` :func:`key_layout` (the caller's:
    ``NHWC``, ``NHWC,NCHW`` where the inputs' layouts differ, ``NCHW->NHWC`` where
    the inputs share one and the output has another); ``<precision>``
    and ``<limit>`` the policy's (``None`` for no limit); the versions sorted by
    name (``versions``: the libraries', ``tune_clock``). The kernels' fingerprints
    (``#`` and 12 hex digits, :data:`FINGERPRINT`) are inside ``<candidates>``;
    the key without them is :func:`unfingerprinted`.

    ``candidates`` names the rules that compete and how each enumerates its
    variants, so a decision taken before a new candidate existed is not reused
    (``autotune_contenders.candidate_set``). ``out``: where the output will
    live when that is not a buffer of its own, e.g. its slice of a concat's
    buffer (``zero_copy.Home.describe()``: the candidates were timed writing
    there, and a strided write does not run at a dense one's speed), as
    ``| out=...``; None (a dense output) adds nothing, so the keys of dense
    decisions are those they always were."""
    ins = ", ".join(f"{t.dtype}[{'x'.join(map(str, t.shape))}]" for t in in_types)
    vers = ";".join(f"{k}={versions[k]}" for k in sorted(versions))
    into = "" if out is None else f"out={out} | "
    return (f"{op.describe()} | in=({ins}) | dtype={dtype or 'declared'} | layout={layout} | {into}"
            f"precision={policy.precision} | workspace_limit={policy.workspace_limit} | "
            f"device={device}:{device_name} | candidates={candidates} | {vers}")


_NUMBERS = ("time_ms", "min_ms", "workspace", "rel_error", "tolerance")


def entry_defect(entry) -> str | None:
    """What is wrong with ``entry``'s shape, in JSON's words, or None when it has
    the shape this module writes: an ``algorithm`` string, an ``options`` object
    and, if present, ``candidates`` as an array of rows, each with string
    ``algorithm`` / ``status`` / ``reason``, an object of ``options`` and numbers
    (or null) for the measurements (the tuner chooses again from those rows:
    ``passes.autotune_reuse.rechoose``). What the values say is checked when
    a node looks the entry up (``passes.autotune_reuse.row_problems``: a
    status unknown or missing, an ``ok`` row whose own ``rel_error`` is above
    its own ``tolerance``, a time that is not one), which reports it naming
    the node and the field, and re-tunes the node."""
    if not isinstance(entry, dict):
        return f"the entry is {_json_kind(entry)}, not an object"
    if not isinstance(entry.get("algorithm"), str):
        return f'its "algorithm" is {_json_kind(entry.get("algorithm"))}, not a string'
    if not isinstance(entry.get("options", {}), dict):
        return f'its "options" is {_json_kind(entry["options"])}, not an object'
    rows = entry.get("candidates", [])
    if not isinstance(rows, list):
        return f'its "candidates" is {_json_kind(rows)}, not an array'
    for i, r in enumerate(rows):
        where = f'its candidate row {i}'
        if not isinstance(r, dict):
            return f"{where} is {_json_kind(r)}, not an object"
        for field, kind, ok in (("algorithm", "a string", isinstance(r.get("algorithm"), str)),
                                ("options", "an object", isinstance(r.get("options", {}), dict)),
                                ("status", "a string", isinstance(r.get("status", "ok"), str)),
                                ("reason", "a string", isinstance(r.get("reason", ""), str))):
            if not ok:
                return f'{where}\'s "{field}" is {_json_kind(r.get(field))}, not {kind}'
        for k in _NUMBERS:
            if not (r.get(k) is None or (isinstance(r[k], (int, float)) and not isinstance(r[k], bool))):
                return f'{where}\'s "{k}" is {_json_kind(r[k])}, not a number or null'
    return None


def unfingerprinted(key: str) -> str:
    """``key`` without its kernel-source fingerprints (:data:`FINGERPRINT`)."""
    return FINGERPRINT.sub("", key)


def _json_kind(value) -> str:
    """What a JSON value is, in JSON's words: ``'an array'``, ``'a number'``, ..."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    if isinstance(value, (int, float)):
        return "a number"
    return "a string" if isinstance(value, str) else "null"


def wrong_format(data) -> str | None:
    """Why the parsed JSON ``data`` is not a cache file of :data:`FORMAT`, in
    JSON's terms, never Python's (``'is of the wrong format: an array, where
    ...'``); None when its shape is right (its entries are then checked one by
    one: :func:`entry_defect`)."""
    expected = f'an {FORMAT} file is an object with "format": "{FORMAT}" and an object "entries"'
    if not isinstance(data, dict):
        return f"is of the wrong format: {_json_kind(data)}, where {expected}"
    if data.get("format") != FORMAT:
        found = f'"format" is {json.dumps(data["format"])}' if "format" in data else 'no "format"'
        return f"is of the wrong format: {found}, where {expected}"
    if not isinstance(data.get("entries"), dict):
        found = f'"entries" is {_json_kind(data["entries"])}' if "entries" in data else 'no "entries"'
        return f"is of the wrong format: {found}, where {expected}"
    return None


def _parse(raw: bytes) -> tuple[object, str | None]:
    """``(data, None)``: the cache file's JSON, of the right shape; else
    ``(None, problem)``, in JSON's words (``'is corrupt: not JSON (...)'``)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return None, f"is corrupt: not UTF-8 text ({e.reason} at byte {e.start})"
    except ValueError as e:  # json.JSONDecodeError
        return None, f"is corrupt: not JSON ({e})"
    except RecursionError:
        return None, "is corrupt: JSON nested too deep to read"
    problem = wrong_format(data)
    return (None, problem) if problem is not None else (data, None)


def _gunzip(raw: bytes) -> tuple[bytes, str | None]:
    """``(text, None)``: the JSON bytes of gzip-compressed ``raw`` (it starts with gzip's magic
    bytes); ``(b"", problem)`` where the gzip data are damaged, in words rather than Python's
    exception names (the file is then rebuilt)."""
    try:
        return gzip.decompress(raw), None
    except EOFError:
        return b"", "is corrupt: its gzip data end early (cut short, as by an interrupted copy)"
    except (OSError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        words = str(e).split(": ", 1)[-1] if isinstance(e, zlib.error) else str(e)  # no 'Error -3 while ...'
        return b"", f"is corrupt: damaged gzip data ({words})"


def _same(a, b) -> bool:
    """Whether two entries are the same JSON (a NaN ``rel_error`` equals itself here)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _not_a_folder(path) -> str | None:
    """``'/a/b.json is a file, not a folder'`` for the first of ``path``'s folders that is a file
    (``mkdir(parents=True)`` then says ``[Errno 17] File exists``, which hides why), else None."""
    for folder in reversed(path.parents):
        if folder.exists() and not folder.is_dir():
            return f"{folder} is a file, not a folder"
    return None


class AutotuneCache:
    """Decisions by key, loaded from ``path`` (``None``: memory only).

    ``messages`` collects what was reported (corrupt file, write failure).
    """

    #: Seconds between the saves a long autotune makes on its way (:meth:`checkpoint`).
    CHECKPOINT_SECONDS = 30.0

    def __init__(self, path: str | os.PathLike | None, *, warning: str | None = None):
        self.path = None if path is None else Path(os.path.expanduser(str(path)))
        #: a ``.json.gz`` file: read and written gzip-compressed (:func:`gzipped`)
        self.compressed = self.path is not None and gzipped(self.path)
        self.messages: list[str] = []
        self.entries: dict[str, dict] = {}
        self.dirty: dict[str, dict] = {}
        #: the file was found corrupt (whole, or some entries): :meth:`save` writes it again even with
        #: nothing new, so that "it will be rebuilt" holds when every node had one candidate
        self.rebuild = False
        self._saved_at = time.monotonic()
        if warning is not None:  # what the setting was taken as: said before what reading the file finds
            self.warn(warning)
        if self.path is not None:
            self.entries = self._read(report=True)
        #: The keys of the entries read from the file and not put since: a hit
        #: on one reuses a decision timed by an earlier compile, not this one
        #: (``opgraph-bench --profile`` says so, naming the file).
        self.from_file: set[str] = set(self.entries)
        self._bare: dict[str, set[str]] | None = None  # unfingerprinted key -> keys (superseded)
        #: the keys this cache has put or found (:meth:`get`): never pruned as superseded, so two
        #: nodes whose keys differ in their fingerprints alone both keep their entries
        self._used: set[str] = set()
        #: superseded entries :meth:`put` dropped, by key: dropped from the file too at the next
        #: :meth:`save`, unless another process wrote that key anew meanwhile
        self.pruned: dict[str, dict] = {}

    @classmethod
    def for_policy(cls, policy) -> "AutotuneCache":
        """The cache ``policy.cache`` names, else ``OPGRAPH_CACHE`` or the default
        file, by one rule (:func:`locate`); a setting of no known kind is
        reported with what it was taken as."""
        where = locate(policy.cache, "policy cache") if policy.cache is not None else env_location()
        return cls(where.path, warning=where.warning)

    def warn(self, msg: str) -> None:
        """Report a problem with the file or an entry: a ``RuntimeWarning``, and
        kept in ``messages`` (the autotune pass copies them into its report).

        Every one is issued from this module, whoever noticed (this file, the
        autotune pass, a hand edit), so that one filter scoped to it hides or
        shows them all: ``warnings.filterwarnings('ignore',
        module='opgraph.passes.autotune_cache')``, ``-W
        ignore::RuntimeWarning:opgraph.passes.autotune_cache`` (a stacklevel
        of the caller's caller attributed the autotune pass's to
        ``opgraph.passes.base`` and a failed save's to ``opgraph.passes.autotune``)."""
        self.messages.append(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=1)

    def _read(self, report: bool) -> dict[str, dict]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            if report:
                self.warn(f"autotune cache {self.path} cannot be read ({e}); tuning from scratch")
            return {}
        # the content decides how it is read, the name how it is written: a file whose name and
        # content disagree (a plain cache an older version wrote under *.json.gz, a renamed copy,
        # a link named otherwise) is read as it is and said once, never rebuilt as if corrupt
        gzipped = raw[:2] == _GZIP_MAGIC
        raw, problem = _gunzip(raw) if gzipped else (raw, None)
        data, problem = (None, problem) if problem is not None else _parse(raw)
        if problem is None and report and gzipped != self.compressed:
            held, named = ("gzip-compressed", "plain JSON") if gzipped else ("plain JSON", "gzip-compressed")
            self.warn(f"autotune cache {self.path} holds {held} data where its name says {named} "
                      f"(*.json.gz: gzip): read as it is, and written as its name says from now on")
        if problem is not None:
            if report:
                self.warn(f"autotune cache {self.path} {problem}; it will be rebuilt")
                self.rebuild = True
            return {}
        entries = data["entries"]
        # one bad entry (a hand edit, another version's) costs its own decision, not the file's
        bad = {key: why for key, entry in entries.items() if (why := entry_defect(entry)) is not None}
        if bad and report:
            self.rebuild = True
            first = min(bad)
            self.warn(f"autotune cache {self.path}: {len(bad)} corrupt entr{'y' if len(bad) == 1 else 'ies'} "
                      f"dropped and tuned again (first: {first!r}: {bad[first]}); the other "
                      f"{len(entries) - len(bad)} kept")
        return {key: entry for key, entry in entries.items() if key not in bad}

    def get(self, key: str) -> dict | None:
        entry = self.entries.get(key)
        if entry is not None:
            self._used.add(key)
        return entry

    def superseded(self, key: str) -> str | None:
        """The key of an entry that ``key`` replaces, or None: one equal to it but for the
        kernel-source fingerprints (module docstring), so tuned on other kernel code; None for
        a key without fingerprints (then only its own entry decides)."""
        bare = unfingerprinted(key)
        if bare == key:
            return None
        return min((k for k in self._index().get(bare, ()) if k != key), default=None)

    def _index(self) -> dict[str, set[str]]:
        """Unfingerprinted key -> the keys of the entries held, built on first use (most
        compiles hit, or hold no fingerprint)."""
        if self._bare is None:
            self._bare = {}
            for k in self.entries:
                self._bare.setdefault(unfingerprinted(k), set()).add(k)
        return self._bare

    def put(self, key: str, entry: dict) -> None:
        """Store ``entry`` under ``key``, and drop the entries it supersedes: those whose key
        equals ``key`` but for the kernel-source fingerprints (:meth:`superseded`; with every
        input's layout in the key, :func:`key_layout`, such a key is the same node's decision
        tuned on other kernel code, never to be read again), except one this cache has put or
        found since it was opened (another node of this compile whose key differs in its
        fingerprints alone keeps its own). A key without fingerprints drops nothing. What is
        dropped leaves the file at the next :meth:`save` (:attr:`pruned`)."""
        entry = json.loads(json.dumps(entry, default=str))  # what a reload would give back
        bare = unfingerprinted(key)
        if bare != key:
            same = self._index().setdefault(bare, set())
            for old in sorted(same - self._used - {key}):
                self.pruned[old] = self.entries.pop(old)
                self.dirty.pop(old, None)
                self.from_file.discard(old)
                same.discard(old)
            same.add(key)
        elif self._bare is not None:
            self._bare.setdefault(bare, set()).add(key)
        self.entries[key] = entry
        self.dirty[key] = entry
        self.pruned.pop(key, None)
        self.from_file.discard(key)
        self._used.add(key)

    def checkpoint(self) -> None:
        """:meth:`save` when the last save is :data:`CHECKPOINT_SECONDS` old, so
        that a compile stopped before its end (a time limit, Ctrl-C: DenseNet-121
        was still autotuning after 240 s on the H200) keeps what it tuned and the
        next run resumes from there."""
        if time.monotonic() - self._saved_at >= self.CHECKPOINT_SECONDS:
            self.save()
            self._saved_at = time.monotonic()

    def save(self) -> None:
        """Merge the new decisions into the file, atomically: the file's entries as they are now
        (another process may have written some since it was read), those :meth:`put` since
        the last save over them, less the superseded entries :meth:`put` dropped. A dropped
        key is removed only while the file holds the entry dropped: one another process wrote
        anew meanwhile is its decision, and stays; so does every other key it wrote."""
        if self.path is None or not (self.dirty or self.rebuild):
            return
        merged = {**self._read(report=False), **self.dirty}
        for key, entry in self.pruned.items():
            if key in merged and _same(merged[key], entry):
                del merged[key]
        text = json.dumps({"format": FORMAT, "entries": merged}, indent=1, sort_keys=True)
        # mtime=0: the same decisions give the same bytes (no time stamp in the gzip header)
        data = gzip.compress(text.encode("utf-8"), _GZIP_LEVEL, mtime=0) if self.compressed else text
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, data, prefix=".autotune-")
            self.dirty, self.pruned, self.rebuild = {}, {}, False
        except OSError as e:
            self.warn(f"autotune cache {self.path} cannot be written ({_not_a_folder(self.path) or e}); "
                      "decisions kept in memory")


__all__ = ["entry_defect", "wrong_format", "unfingerprinted", "AutotuneCache", "cache_key", "key_layout",
           "default_path", "FORMAT",
           "FINGERPRINT", "ENV_VAR", "DEFAULT_PATH", "GZIP_SUFFIX", "FOLDER_FILE", "Location", "locate",
           "env_location", "gzipped"]
