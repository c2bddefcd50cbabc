"""Failure triage: a one-line summary per failure, signatures, groups of failures with one cause, what the
problems of a group share, and the optional triage file that labels a signature.

Everything here reads report records (plain dicts, see reports/README.md), so reports from older runs and
other machines are triaged by the code that renders them.

* :func:`summary` is a failure's first informative line: terminal colour codes stripped, exception module
  paths shortened, empty exception headers (``DSLRuntimeError:`` with the text on the next line) joined to
  the line that says something, and an oracle disagreement said as the quantities that failed and by how
  much (``dq 85x, dk 68x, dv 218x the allowance``).
* :func:`signature` is that summary with what varies between occurrences of one cause taken out (numbers,
  quoted values, the sizes of an oracle disagreement), prefixed by backend and outcome. Failures with one
  signature form a :class:`Group`; :func:`shared_properties` says what all its problems have in common that
  the backend's passing problems do not all have.
* A triage file (JSON, or TOML where ``tomllib`` exists) maps signatures to a label and an upstream link::

      {"entries": [{"match": "fa4 crash: forward: CUDA error: an illegal memory access",
                    "label": "FA4 sm_90 forward faults when head_dim < head_dim_v",
                    "link": "https://github.com/Dao-AILab/flash-attention/issues/..."}]}

  ``signature`` (a group id, as the report prints it, or the whole signature text) or ``match`` (a regular
  expression searched in the signature text) selects the groups; ``label`` is required, ``link`` and
  ``note`` are optional. Signatures leave out the numbers of one occurrence, so the file keeps matching
  across runs.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..problem import expand_lengths

FAILING = ("crash", "fail", "timeout")
SEVERITY = {"crash": 0, "fail": 1, "timeout": 2}
SUMMARY_LIMIT = 240
SIGNATURE_LIMIT = 160
# A shared property is shown when at most this share of the backend's passing problems has it too.
TELLING_SHARE = 0.5

# CSI / OSC / two-character escape sequences, and what is left of an SGR colour code whose ESC byte was
# lost on the way (``[91m[1merror``).
ANSI = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
ORPHAN_SGR = re.compile(r"\[(?:(?:\d{1,3};)*\d{1,3})?m(?=[\[\w\s:]|$)")
# Lines that never say what went wrong: traceback frames, CUDA's standard advice, hypothesis's notes.
NOISE = re.compile(
    r"^(Traceback \(most recent call last\):|File \".*\", line \d+|Search for `cuda|CUDA kernel errors might be"
    r"|For debugging consider passing CUDA_LAUNCH_BLOCKING|Compile with `TORCH_USE_CUDA_DSA`|Failing test case:"
    r"|Falsifying example|You can reproduce this test case|Draw \d+ \(|Explanation:|The above exception was"
    r"|During handling of the above exception|-->\s|\|\s|[+|]?[-=+ ]*$|\^+$|~+\^*~*$)"
)
# A leading exception name, module path included: ``cutlass._mlir.ir.MLIRError:``.
EXC_HEAD = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Z]\w*(?:Error|Exception|Fault|Failure|Warning|Group|Interrupt))\s*:\s*")
# What MLIR-style and DSL diagnostics put before the text.
DIAG_PREFIX = re.compile(r"^(?:internal |fatal )?(?:compiler )?(?:error|Error|ERROR)(?:\[[^\]]*\])?(?:: unknown)?\s*:\s*")
DEVICE_FAULT_PHASE = re.compile(r"^(?:(?P<backend>\S+) )?(?P<phase>forward|backward|call)\s*:\s*")
DISAGREES = re.compile(r"disagrees with the float64 oracle")
VERDICT_LINE = re.compile(r"^\s*(\w+): FAIL, observed error (\S+), allowed (\S+)")
DIED = re.compile(r"^worker '[^']*' crashed while running")
DISTINCT = re.compile(r"Hypothesis found (\d+) distinct failures")


# -- one failure ----------------------------------------------------------------------------------------
def strip_ansi(text: str | None) -> str:
    """``text`` without terminal escape codes (and without the remains of ones whose ESC byte was lost)."""
    if not text:
        return ""
    return ORPHAN_SGR.sub("", ANSI.sub("", text))


def _shorten(text: str, limit: int = SUMMARY_LIMIT) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return (cut if len(cut) > limit // 2 else text[:limit]).rstrip(" ,;:") + " …"


def fmt_times(budget: float) -> str:
    """A budget (observed / allowed) as a multiple of the allowance: ``85x``, ``8.5x``, ``NaN``."""
    if budget is None or (isinstance(budget, float) and math.isnan(budget)):
        return "NaN"
    if budget == math.inf:
        return "inf (NaN or inf in the output)"
    return f"{budget:.0f}x" if budget >= 10 else f"{budget:.2g}x"


def failed_quantities(record: dict) -> list[tuple[str, float]]:
    """``(quantity, budget used)`` of every verdict outside tolerance: from the record's verdicts, else
    parsed from the failure text."""
    found = [(v["quantity"], v.get("budget_used")) for v in record.get("verdicts") or [] if v.get("ok") is False]
    if found:
        return found
    for line in strip_ansi(record.get("message")).splitlines():
        m = VERDICT_LINE.match(line)
        if m:
            try:
                observed, allowed = float(m.group(2)), float(m.group(3))
                budget = observed / allowed if allowed else math.inf
            except ValueError:
                budget = math.inf
            found.append((m.group(1), math.inf if math.isnan(budget) else budget))
    return found


def _informative_line(text: str, backend: str | None) -> str:
    """The first line of ``text`` that says what went wrong, with the exception names before it."""
    heads: list[str] = []
    phase = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or NOISE.match(line):
            continue
        while True:
            m = EXC_HEAD.match(line)
            if m:
                if m.group(1) != "DeviceFault":
                    heads.append(m.group(1))
                line = line[m.end():]
                if m.group(1) == "DeviceFault":
                    p = DEVICE_FAULT_PHASE.match(line)
                    if p and (p.group("backend") in (None, backend) or backend is None):
                        phase, line = p.group("phase"), line[p.end():]
                continue
            d = DIAG_PREFIX.match(line)
            if d:
                line = line[d.end():]
                continue
            break
        line = line.strip()
        if not line:
            continue  # an empty header: the text follows on a later line
        if line.endswith(":") and len(line) < 60:
            heads.append(line[:-1])  # "Operation creation failed:" says where, the next line says what
            continue
        return _compose(heads, line, phase)
    return _compose(heads, "", phase)


def _compose(heads: list[str], line: str, phase: str | None) -> str:
    names = [h for h in heads if re.fullmatch(r"\w+", h)]
    words = [h for h in heads if not re.fullmatch(r"\w+", h)]
    if line and re.match(r"(?i)\S*\s?(error|exception)\b", line):
        names = []  # "CUDA error: ..." names itself; "AcceleratorError: CUDA error: ..." only repeats it
    elif len(names) > 2:
        names = [names[0], names[-1]]
    text = ": ".join([*dict.fromkeys(names), *words, *([line] if line else [])])
    return f"{phase}: {text}" if phase else text


def summary(record: dict, limit: int = SUMMARY_LIMIT) -> str:
    """A failure's first informative line (see the module docstring), at most ``limit`` characters."""
    outcome, backend = record.get("outcome"), record.get("backend")
    message = strip_ansi(record.get("message"))
    reason = strip_ansi(record.get("reason"))
    if outcome == "timeout" or not message.strip() or DIED.match(message.strip()):
        return _shorten(reason or _informative_line(message, backend) or outcome or "failed", limit)
    bad = failed_quantities(record)
    distinct = DISTINCT.search(message)
    if bad and (DISAGREES.search(message) or distinct):
        sizes = ", ".join(f"{q} {fmt_times(b)}" for q, b in bad)
        lead = f"Hypothesis found {distinct.group(1)} distinct failures; one disagrees" if distinct else "disagrees"
        return _shorten(f"{lead} with the float64 oracle: {sizes} the allowance", limit)
    line = _informative_line(message, backend)
    return _shorten(line or reason or "failed", limit)


_NUMBER = re.compile(r"\b\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\b")
_QUOTED = re.compile(r"'[^']{0,400}'|\"[^\"]{0,400}\"")


def signature_text(record: dict) -> str:
    """What identifies a failure's cause across problems and runs: backend, outcome and the summary with
    numbers, quoted values, problems and addresses taken out (an oracle disagreement: its quantities)."""
    bad = failed_quantities(record)
    text = summary(record, limit=100_000)  # cut after the numbers are out, so the cut does not move
    if bad and "float64 oracle" in text:
        text = "disagrees with the float64 oracle: " + ", ".join(q for q, _ in bad)
    else:
        text = re.sub(r"Problem\([^)]*\)", "Problem(…)", text)
        text = re.sub(r"0x[0-9a-fA-F]+", "0x…", text)
        text = _QUOTED.sub("'…'", text)
        text = _shorten(_NUMBER.sub("N", text), SIGNATURE_LIMIT)
    return f"{record.get('backend')} {record.get('outcome')}: {text}"


def signature_id(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


# -- what a group's problems share ----------------------------------------------------------------------
def _value_dim(p: dict) -> int | None:
    return p.get("head_dim") if p.get("head_dim_v") is None else p.get("head_dim_v")


def _lengths(p: dict, side: str) -> list[int]:
    return list(expand_lengths(p.get(f"seqlens_{side}")))


PREDICATES: list[tuple[str, object]] = [
    ("head_dim < head_dim_v", lambda p: p["head_dim"] < _value_dim(p)),
    ("head_dim > head_dim_v", lambda p: p["head_dim"] > _value_dim(p)),
    ("head_dim_v != head_dim", lambda p: p["head_dim"] != _value_dim(p)),
    ("head_dim_v == head_dim", lambda p: p["head_dim"] == _value_dim(p)),
    ("MQA (one KV head, several query heads)", lambda p: p["heads_kv"] == 1 < p["heads_q"]),
    ("GQA (heads_q > heads_kv)", lambda p: p["heads_q"] > p["heads_kv"]),
    ("heads_q == heads_kv", lambda p: p["heads_q"] == p["heads_kv"]),
    ("head_dim not a multiple of 32", lambda p: p["head_dim"] % 32 != 0),
    ("broadcast-Q", lambda p: bool(p.get("broadcast_q"))),
    ("every key length 0", lambda p: bool(_lengths(p, "k")) and not any(_lengths(p, "k"))),
    ("every query length 0", lambda p: bool(_lengths(p, "q")) and not any(_lengths(p, "q"))),
    ("a zero-length sequence", lambda p: 0 in _lengths(p, "k") or 0 in _lengths(p, "q")),
    ("no zero-length sequence", lambda p: 0 not in _lengths(p, "k") + _lengths(p, "q")),
    ("Lq != Lk in some sequence", lambda p: _lengths(p, "q") != _lengths(p, "k")),
    ("one sequence", lambda p: len(_lengths(p, "k")) == 1),
    ("causal", lambda p: p.get("causal") not in (None, "none")),
    ("not causal", lambda p: p.get("causal") in (None, "none")),
]
VALUE_FIELDS = ("dtype", "head_dim", "head_dim_v", "causal", "heads_q", "heads_kv")
# How the caller handed the tensors over and what values they hold: a non-default value all of a group
# shares is usually the cause, so these come first among equally telling properties.
TENSOR_FIELDS = ("offsets_layout", "offsets_dtype", "layout", "grad_layout", "values")
# A shown property makes these ones redundant.
IMPLIES = {"head_dim < head_dim_v": ("head_dim_v != head_dim",), "head_dim > head_dim_v": ("head_dim_v != head_dim",),
           "MQA (one KV head, several query heads)": ("GQA (heads_q > heads_kv)",),
           "every key length 0": ("a zero-length sequence",), "every query length 0": ("a zero-length sequence",)}


def _holds(fn, p: dict) -> bool:
    try:
        return bool(fn(p))
    except (KeyError, TypeError, ValueError):
        return False


def _same_values(problems: list[dict], keys) -> list[tuple[str, object]]:
    """``key = value`` for each of ``keys`` whose value every problem shares."""
    found = []
    for key in keys:
        values = {json.dumps(p.get(key)) for p in problems}
        if len(values) == 1 and problems[0].get(key) is not None:
            value = problems[0][key]
            found.append((f"{key} = {value}", lambda p, k=key, v=value: p.get(k) == v))
    return found


def _candidates(problems: list[dict]) -> list[tuple[str, object]]:
    predicates = [(name, fn) for name, fn in PREDICATES if all(_holds(fn, p) for p in problems)]
    return _same_values(problems, TENSOR_FIELDS) + predicates + _same_values(problems, VALUE_FIELDS)


@dataclass
class Shared:
    """A property every problem of a group has, and how many of the backend's passing problems have it."""

    text: str
    passing_with: int
    passing: int

    def __str__(self) -> str:
        if not self.passing:
            return self.text
        return f"{self.text} (passing problems: {self.passing_with} of {self.passing})"


def shared_properties(problems: list[dict], passing: list[dict], limit: int = 3) -> list[Shared]:
    """Properties all ``problems`` have, most telling first: those that the fewest of ``passing`` (the
    backend's passing problems) have. A property that more than ``TELLING_SHARE`` of the passing problems
    have too says little and is left out; without passing problems to compare, the properties are listed
    as they are."""
    problems = [p for p in problems if p]
    if not problems:
        return []
    scored = []
    for order, (name, fn) in enumerate(_candidates(problems)):
        with_it = sum(_holds(fn, p) for p in passing)
        if passing and with_it > TELLING_SHARE * len(passing):
            continue
        # shares within one tenth of each other are equally telling: the candidates' order decides (the
        # caller's tensor layouts first, a usual cause when a whole group shares one)
        share = with_it / len(passing) if passing else 0.0
        scored.append((int(share * 10), order, Shared(name, with_it, len(passing))))
    scored.sort(key=lambda s: (s[0], s[1]))
    shown: list[Shared] = []
    hidden: set[str] = set()
    for _, _, s in scored:
        if s.text in hidden:
            continue
        shown.append(s)
        hidden.update(IMPLIES.get(s.text, ()))
    shown = [s for s in shown if s.text not in hidden]
    return shown[:limit]


# -- groups ---------------------------------------------------------------------------------------------
@dataclass
class Group:
    """Failing records with one signature."""

    signature: str
    records: list[dict]
    shared: list[Shared] = field(default_factory=list)
    label: str | None = None
    link: str | None = None
    note: str | None = None

    @property
    def id(self) -> str:
        return signature_id(self.signature)

    @property
    def backend(self) -> str:
        return self.records[0].get("backend")

    @property
    def outcome(self) -> str:
        return self.records[0].get("outcome")

    @property
    def summary(self) -> str:
        return summary(self.records[0])

    @property
    def summaries(self) -> list[str]:
        """The distinct summaries of the group's failures (they differ in numbers only)."""
        return list(dict.fromkeys(summary(r) for r in self.records))

    @property
    def problems(self) -> list[dict]:
        return [r["problem"] for r in self.records if r.get("problem")]

    def shared_text(self) -> str:
        """``all 9: head_dim < head_dim_v (0 of 35 passing problems)``, or '' when nothing is shared."""
        n = len(self.problems)
        if n < 2 or not self.shared:
            return ""
        head = f"all {n}" if n == len(self.records) else f"all {n} with a known problem (of {len(self.records)})"
        return f"{head}: " + "; ".join(map(str, self.shared))

    def smallest(self) -> dict | None:
        """The record whose problem is smallest (fewest tokens, then fewest sequences): the one to attach."""
        with_problem = [r for r in self.records if r.get("problem")]
        if not with_problem:
            return None
        return min(with_problem, key=lambda r: (sum(_lengths(r["problem"], "q")) + sum(_lengths(r["problem"], "k")),
                                                len(_lengths(r["problem"], "k"))))

    def as_dict(self) -> dict:
        return {"id": self.id, "signature": self.signature, "backend": self.backend, "outcome": self.outcome,
                "summary": self.summary, "count": len(self.records), "checks": [r.get("id") for r in self.records],
                "shared": [{"property": s.text, "passing_with": s.passing_with, "passing": s.passing}
                           for s in self.shared],
                "label": self.label, "link": self.link, "note": self.note}


def _record_order(r: dict) -> tuple:
    return r.get("feature") or "", r.get("dtype") or ""


def groups(records: list[dict], triage: list[dict] | None = None) -> list[Group]:
    """The failing records (fail, crash, timeout) grouped by signature, loudest and largest first, each
    with its shared properties and, where a triage entry matches, its label and link."""
    by_sig: dict[str, list[dict]] = {}
    for r in records:
        if r.get("outcome") in FAILING:
            by_sig.setdefault(signature_text(r), []).append(r)
    passing: dict[str, list[dict]] = {}
    for r in records:
        if r.get("outcome") == "pass" and r.get("problem"):
            passing.setdefault(r.get("backend"), []).append(r["problem"])
    out = []
    for sig, members in by_sig.items():
        g = Group(sig, sorted(members, key=_record_order))
        g.shared = shared_properties(g.problems, passing.get(g.backend, []))
        entry = match_triage(g, triage or [])
        if entry:
            g.label, g.link, g.note = entry.get("label"), entry.get("link"), entry.get("note")
        out.append(g)
    out.sort(key=lambda g: (SEVERITY.get(g.outcome, 9), -len(g.records), g.backend or "", g.signature))
    return out


# -- the triage file ------------------------------------------------------------------------------------
class TriageFileError(ValueError):
    """A triage file this code cannot use; the message names the file and the field."""


def load_triage_file(path: str | Path) -> list[dict]:
    """The entries of a triage file (format in the module docstring), checked."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TriageFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if path.suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise TriageFileError(f"{path}: TOML needs Python 3.11 or later; write the file as JSON") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise TriageFileError(f"{path}: not valid TOML ({exc})") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise TriageFileError(f"{path}: not valid JSON ({exc})") from None
    return check_entries(data.get("entries") if isinstance(data, dict) else None, str(path))


def check_entries(entries, where: str) -> list[dict]:
    if not isinstance(entries, list):
        raise TriageFileError(f"{where}: field 'entries' must be a list of {{signature | match, label, link}}")
    checked = []
    for i, entry in enumerate(entries):
        at = f"{where}: entries[{i}]"
        if not isinstance(entry, dict):
            raise TriageFileError(f"{at} must be an object")
        if not isinstance(entry.get("label"), str) or not entry["label"].strip():
            raise TriageFileError(f"{at}: field 'label' is required (a non-empty string)")
        if not entry.get("signature") and not entry.get("match"):
            raise TriageFileError(f"{at}: give field 'signature' (a group id or signature text) or 'match' (a regex)")
        for key in ("signature", "match", "link", "note"):
            if entry.get(key) is not None and not isinstance(entry[key], str):
                raise TriageFileError(f"{at}: field {key!r} must be a string")
        if entry.get("match"):
            try:
                re.compile(entry["match"])
            except re.error as exc:
                raise TriageFileError(f"{at}: field 'match' is not a valid regular expression ({exc})") from None
        if entry.get("link") and not re.match(r"https?://", entry["link"]):
            raise TriageFileError(f"{at}: field 'link' must be an http(s) URL")
        checked.append({k: entry.get(k) for k in ("signature", "match", "label", "link", "note") if entry.get(k)})
    return checked


def match_triage(group: Group, entries: list[dict]) -> dict | None:
    for entry in entries:
        sig = entry.get("signature")
        if sig and sig in (group.id, group.signature):
            return entry
        if entry.get("match") and re.search(entry["match"], group.signature):
            return entry
    return None
