"""The recovery policy's settings, declared once (decision 0444).

Every setting of a policy document is one field of :class:`PolicyDocument` whose
metadata holds its :class:`Setting`: the one name it has everywhere (the document,
the API, :class:`~trainguard.model.plan.RecoveryPolicy`, the docs), its type, unit,
bounds, help text, and whether ``trainguard run`` has an option for it. Parsing
(:func:`parse_document`), the JSON form (:meth:`PolicyDocument.to_json`), the API's
JSON Schema (:func:`json_schema`), run's options (``_commands/_policy_options.py``)
and the table in docs/control-plane.md (``scripts/gen-policy-docs.py``) are all read
off these declarations; a built-in default is ``RecoveryPolicy``'s own.

Two settings pairs sit under one document key (:data:`GROUPS`): ``backoff``
(``base_seconds``, ``max_seconds``; a bare number is the base) and ``devices``
(``min``, ``max``; a bare integer is a fixed count). Spellings other than a setting's
name are accepted only on run's command line, all listed in :data:`FLAG_ALIASES`.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from trainguard.model.plan import PLACEMENTS, RecoveryPolicy

_META = "setting"  # the dataclass field metadata key holding a field's Setting

# run's flags from before the settings had one name each: flag -> the setting it sets.
FLAG_ALIASES: dict[str, str] = {
    "--backoff": "backoff_base_seconds",
    "--hang-timeout": "hang_timeout_seconds",
    "--startup-timeout": "hang_startup_seconds",
    "--verify-window": "verify_window_seconds",
    "--approval-timeout": "approval_timeout_seconds",
}


class PolicyError(ValueError):
    """A policy document is malformed; ``field`` names the offending field (dotted path),
    ``reason`` what was wrong with it."""

    def __init__(self, field: str, message: str, *, policy: str | None = None) -> None:
        where = f"policy {policy!r}: " if policy else "policy: "
        super().__init__(f"{where}field {field!r}: {message}")
        self.field = field
        self.reason = message
        self.policy = policy


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Setting:
    """One policy setting: what a document, the API, run's options and the docs say of it."""

    name: str  # the one name: PolicyDocument's field, RecoveryPolicy's, the JSON key
    kind: str  # "int" | "float" | "bool" | "choice" | "text"
    help: str
    unit: str = ""
    minimum: float | None = None
    exclusive: bool = False  # the minimum itself is refused (> rather than >=)
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    keyword: str | None = None  # a word meaning "left unset" (hang_timeout_seconds: adaptive)
    path: str | None = None  # where a grouped setting sits in a document: backoff.base_seconds
    run_option: bool = False  # trainguard run has an option for it
    run_value: Any = None  # what run's own document sets without the option (None: nothing)
    decision: str = ""

    @property
    def key(self) -> str:
        """Where the setting sits in a document (its name unless grouped)."""
        return self.path or self.name

    @property
    def flag(self) -> str:
        """run's option for it: the name, dashed."""
        return "--" + self.name.replace("_", "-")

    @property
    def aliases(self) -> tuple[str, ...]:
        """Older spellings of :attr:`flag` run still accepts (:data:`FLAG_ALIASES`)."""
        return tuple(f for f, name in FLAG_ALIASES.items() if name == self.name)

    @property
    def default(self) -> Any:
        """The built-in value (``RecoveryPolicy``'s); ``None`` where there is none."""
        spec = RecoveryPolicy.__dataclass_fields__.get(self.name)
        return None if spec is None or spec.default is MISSING else spec.default

    def bounds(self) -> str:
        """The accepted values in words (errors, docs)."""
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "text":
            return "text"
        noun = "integer" if self.kind == "int" else "number"
        parts = []
        if self.minimum is not None and self.maximum is not None:
            op = "<" if self.exclusive else "<="
            parts.append(f"{self.minimum:g} {op} x <= {self.maximum:g}")
        elif self.minimum is not None:
            parts.append(f"{'>' if self.exclusive else '>='} {self.minimum:g}")
        text = f"{noun} {parts[0]}" if parts else noun
        return f"{text}, or {self.keyword!r}" if self.keyword else text

    def check(self, value: Any, *, policy: str | None = None) -> Any:
        """``value`` validated (an int for a float setting becomes a float); a
        :class:`PolicyError` naming :attr:`key` otherwise. ``None`` stays ``None``."""
        if value is None or (self.keyword is not None and value == self.keyword):
            return None
        where = self.key
        if self.kind == "text":
            if not isinstance(value, str):
                raise PolicyError(where, "must be a string", policy=policy)
            return value
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise PolicyError(
                    where, f"must be true or false, got {_describe(value)}", policy=policy
                )
            return value
        if self.kind == "choice":
            if value not in self.choices:
                raise PolicyError(
                    where,
                    f"must be one of {', '.join(self.choices)}, got {_describe(value)}",
                    policy=policy,
                )
            return value
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise PolicyError(
                    where, f"must be an {self.bounds()}, got {_describe(value)}", policy=policy
                )
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise PolicyError(where, f"must be a number, got {_describe(value)}", policy=policy)
        elif not math.isfinite(float(value)):
            raise PolicyError(where, f"must be a finite number, got {value}", policy=policy)
        low, high = self.minimum, self.maximum
        if low is not None and (value < low or (self.exclusive and value == low)):
            op = ">" if self.exclusive else ">="
            raise PolicyError(where, f"must be {op} {low:g}, got {value}", policy=policy)
        if high is not None and value > high:
            raise PolicyError(where, f"must be <= {high:g}, got {value}", policy=policy)
        return value if self.kind == "int" else float(value)

    def from_text(self, text: str) -> Any:
        """A command-line word as this setting's value (run's options); ``ValueError``
        with the reason when it is not one."""
        if self.keyword is not None and text == self.keyword:
            return None
        try:
            value: Any = int(text) if self.kind == "int" else float(text)
        except ValueError:
            raise ValueError(f"must be an {self.bounds()}, got {text!r}") from None
        try:
            return self.check(value)
        except PolicyError as exc:
            raise ValueError(exc.reason) from None


def _setting(name: str, kind: str, help: str, **kw: Any) -> Any:
    return field(default=None, metadata={_META: Setting(name, kind, help, **kw)})


@dataclass(frozen=True)
class PolicyDocument:
    """A named, validated recovery policy: the settings a document sets, ``None`` for
    the rest (they take the operator default, the document named ``default``, then
    ``RecoveryPolicy``'s built-in value). ``min_devices == max_devices``: a fixed count.
    """

    name: str
    description: str | None = _setting("description", "text", "what the policy is for")
    max_restarts: int | None = _setting(
        "max_restarts",
        "int",
        "restarts allowed in a row without the job getting past its previous failure",
        minimum=0,
        run_option=True,
    )
    backoff_base_seconds: float | None = _setting(
        "backoff_base_seconds",
        "float",
        "base of the exponential backoff between restarts; the first is immediate",
        unit="s",
        minimum=0,
        path="backoff.base_seconds",
        run_option=True,
    )
    backoff_max_seconds: float | None = _setting(
        "backoff_max_seconds",
        "float",
        "cap of the backoff between restarts (a base above it raises it)",
        unit="s",
        minimum=0,
        path="backoff.max_seconds",
        run_option=True,
    )
    futile_after: int | None = _setting(
        "futile_after",
        "int",
        "the same application-error signature this many times in a row stops the job",
        minimum=1,
    )
    allow_quarantine: bool | None = _setting(
        "allow_quarantine", "bool", "a device the evidence blames may be quarantined"
    )
    min_devices: int | None = _setting(
        "min_devices",
        "int",
        "fewest devices the job accepts (elastic; unset: the job's own)",
        unit="devices",
        minimum=1,
        path="devices.min",
    )
    max_devices: int | None = _setting(
        "max_devices",
        "int",
        "devices the job wants (unset: the job's own)",
        unit="devices",
        minimum=1,
        path="devices.max",
    )
    hang_timeout_seconds: float | None = _setting(
        "hang_timeout_seconds",
        "float",
        "no progress for this long is a hang; adaptive: max(hang_floor_seconds, "
        "hang_multiple x the slowest recent step interval)",
        unit="s",
        minimum=0,
        exclusive=True,
        keyword="adaptive",
        run_option=True,
        decision="0130",
    )
    hang_floor_seconds: float | None = _setting(
        "hang_floor_seconds",
        "float",
        "adaptive hang allowance: max(floor, multiple x the slowest recent step interval)",
        unit="s",
        minimum=0,
        exclusive=True,
        run_option=True,
    )
    hang_multiple: float | None = _setting(
        "hang_multiple",
        "float",
        "adaptive hang allowance: the multiple of the slowest recent step interval",
        minimum=0,
        exclusive=True,
        run_option=True,
    )
    hang_startup_seconds: float | None = _setting(
        "hang_startup_seconds",
        "float",
        "hang allowance until an attempt's first two progress reports",
        unit="s",
        minimum=0,
        exclusive=True,
        run_option=True,
    )
    verify_window_seconds: float | None = _setting(
        "verify_window_seconds",
        "float",
        "after a restart, progress must continue this long at a plausible rate",
        unit="s",
        minimum=0,
        exclusive=True,
        run_option=True,
    )
    verify_min_rate_ratio: float | None = _setting(
        "verify_min_rate_ratio",
        "float",
        "a verified restart's step rate is at least this share of the one before the failure",
        minimum=0,
        exclusive=True,
        maximum=1.0,
        run_option=True,
    )
    placement: str | None = _setting(
        "placement",
        "choice",
        "device: any healthy devices; node: whole hosts",
        choices=PLACEMENTS,
    )
    isolate_network_after: int | None = _setting(
        "isolate_network_after",
        "int",
        "the same culprit of a collective timeout/error this many times is isolated",
        minimum=1,
        decision="0110",
    )
    max_checkpoint_age_seconds: float | None = _setting(
        "max_checkpoint_age_seconds",
        "float",
        "a newest valid checkpoint older than this raises the protection alert (unset: none)",
        unit="s",
        minimum=0,
        exclusive=True,
        decision="0251",
    )
    wait_for_capacity: bool | None = _setting(
        "wait_for_capacity",
        "bool",
        "too few devices while some could return: wait (true) or stop with the reason",
        run_value=False,
        decision="0381",
    )
    approvals: bool | None = _setting(
        "approvals",
        "bool",
        "a second failure of unknown cause waits for a person (true) or the policy "
        "decides alone, bounded by max_restarts (false)",
        run_option=True,
        run_value=False,
        decision="0425",
    )
    approval_timeout_seconds: float | None = _setting(
        "approval_timeout_seconds",
        "float",
        "an approval nobody answers in this long is a no (unset: no deadline)",
        unit="s",
        minimum=0,
        exclusive=True,
        run_option=True,
        run_value=3600.0,
        decision="0425",
    )
    series_same_failure_jobs: int | None = _setting(
        "series_same_failure_jobs",
        "int",
        "a job series (Slurm jobs of one name and user) whose last this many jobs failed "
        "the same way is stopped: its waiting jobs are cancelled",
        unit="jobs",
        minimum=1,
        decision="0502",
    )
    series_no_checkpoint_jobs: int | None = _setting(
        "series_no_checkpoint_jobs",
        "int",
        "a job series whose last this many jobs ended without a newer valid checkpoint "
        "than the job before them is stopped: its waiting jobs are cancelled",
        unit="jobs",
        minimum=1,
        decision="0502",
    )
    trend_window_seconds: float | None = _setting(
        "trend_window_seconds",
        "float",
        "the sliding window of the per-device rate rules (corrected AER, NVLink and ECC "
        "events, c10d connect retries)",
        unit="s",
        minimum=0,
        exclusive=True,
        decision="0515",
    )
    trend_threshold: int | None = _setting(
        "trend_threshold",
        "int",
        "correctable PCIe/AER, NVLink, host-memory or c10d-retry events of one device or "
        "host within the window that raise a trend finding",
        unit="events",
        minimum=1,
        decision="0515",
    )
    ecc_trend_threshold: int | None = _setting(
        "ecc_trend_threshold",
        "int",
        "ECC events of one GPU within the window (XID 63/64/92, retired or remapped pages, "
        "single-bit ECC errors) that raise a creeping-ECC finding and drain the card at the "
        "job's next checkpoint",
        unit="events",
        minimum=1,
        decision="0515",
    )

    def settings(self) -> Iterator[tuple[Setting, Any]]:
        """Each setting with this document's value (``None``: unset)."""
        for s in SETTINGS:
            yield s, getattr(self, s.name)

    def to_json(self) -> dict[str, Any]:
        """The document form :func:`parse_document` reads back (only what is set)."""
        out: dict[str, Any] = {"name": self.name}
        values = {s.name: v for s, v in self.settings()}
        for key in document_keys():
            group = GROUPS.get(key)
            if group is None:
                if values[key] is not None:
                    out[key] = values[key]
                continue
            part = {sub: values[n] for sub, n in group.members.items() if values[n] is not None}
            if not part:
                continue
            same = {values[n] for n in group.members.values()}
            out[key] = (
                values[group.shorthand[0]]
                if group.collapse and len(part) == len(group.members) and len(same) == 1
                else part
            )
        return out


@dataclass(frozen=True)
class Group:
    """Settings that share one document key: ``backoff: {base_seconds, max_seconds}``."""

    key: str
    members: dict[str, str]  # sub-key -> setting name
    shorthand: tuple[str, ...]  # the settings a bare value sets
    collapse: bool  # equal values are written back as the bare value
    required: str | None  # the sub-key a mapping must have
    fallback: dict[str, str]  # a sub-key left out takes another's value
    order: tuple[str, str, str]  # (sub-key, ">=" | "<=", other sub-key)


GROUPS: dict[str, Group] = {
    "backoff": Group(
        "backoff",
        {"base_seconds": "backoff_base_seconds", "max_seconds": "backoff_max_seconds"},
        shorthand=("backoff_base_seconds",),
        collapse=False,
        required=None,
        fallback={},
        order=("max_seconds", ">=", "base_seconds"),
    ),
    "devices": Group(
        "devices",
        {"min": "min_devices", "max": "max_devices"},
        shorthand=("min_devices", "max_devices"),
        collapse=True,
        required="max",
        fallback={"min": "max"},
        order=("min", "<=", "max"),
    ),
}

SETTINGS: tuple[Setting, ...] = tuple(
    f.metadata[_META] for f in fields(PolicyDocument) if _META in f.metadata
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
RUN_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.run_option)


def document_keys() -> tuple[str, ...]:
    """The top-level keys of a document besides ``name``, in the declared order."""
    keys: list[str] = []
    for s in SETTINGS:
        key = s.key.split(".")[0]
        if key not in keys:
            keys.append(key)
    return tuple(keys)


def _check_name(data: Mapping[str, Any], name: str | None) -> str:
    doc_name = data.get("name", name)
    if doc_name is None:
        raise PolicyError("name", "is required", policy=name)
    if not isinstance(doc_name, str) or not doc_name.strip() or len(doc_name) > 100:
        raise PolicyError(
            "name", f"must be a non-empty string, got {_describe(doc_name)}", policy=name
        )
    if any(c.isspace() or c in "/:" for c in doc_name):
        raise PolicyError(
            "name", f"must not contain spaces, '/' or ':', got {doc_name!r}", policy=name
        )
    if name is not None and doc_name != name:
        raise PolicyError(
            "name", f"is {doc_name!r} but the document is stored as {name!r}", policy=name
        )
    return doc_name


def _parse_group(group: Group, value: Any, pname: str) -> dict[str, Any]:
    subs = ", ".join(group.members)
    for key in value:
        if key not in group.members:
            raise PolicyError(
                f"{group.key}.{key}", f"is not a {group.key} field ({subs})", policy=pname
            )
    if group.required is not None and value.get(group.required) is None:
        raise PolicyError(
            f"{group.key}.{group.required}", "is required for an elastic range", policy=pname
        )
    got: dict[str, Any] = {}
    # A sub-key another falls back to is checked first: its error is the one to fix.
    for sub in sorted(group.members, key=lambda k: k in group.fallback):
        raw = value.get(sub)
        if raw is None and sub in group.fallback:
            raw = value.get(group.fallback[sub])
        got[sub] = BY_NAME[group.members[sub]].check(raw, policy=pname)
    sub, op, other = group.order
    a, b = got[sub], got[other]
    if a is not None and b is not None and (a < b if op == ">=" else a > b):
        raise PolicyError(
            f"{group.key}.{sub}",
            f"must be {op} {group.key}.{other} ({b:g}), got {a:g}",
            policy=pname,
        )
    return {group.members[s]: v for s, v in got.items()}


def _bare(group: Group, value: Any, pname: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in group.shorthand:
        try:
            out[n] = BY_NAME[n].check(value, policy=pname)
        except PolicyError as exc:
            raise PolicyError(group.key, exc.reason, policy=pname) from None
    return out


def parse_document(data: Any, *, name: str | None = None) -> PolicyDocument:
    """A policy mapping (already read from YAML/JSON) validated into a
    :class:`PolicyDocument`. ``name`` is used when the document has none (and must
    match when it has one). Raises :class:`PolicyError` naming the field; an unknown
    field is an error with the nearest known name, so a typo never silently falls
    back to a default."""
    if not isinstance(data, Mapping):
        raise PolicyError(
            "(document)", f"must be a mapping of fields, got {_describe(data)}", policy=name
        )
    pname = _check_name(data, name)
    known = ("name", *document_keys())
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PolicyError(str(key), f"is not a policy field{hint}", policy=pname)
    out: dict[str, Any] = {}
    for key in known[1:]:
        value = data.get(key)
        if value is None:
            continue
        group = GROUPS.get(key)
        if group is None:
            out[key] = BY_NAME[key].check(value, policy=pname)
        elif isinstance(value, Mapping):
            out.update(_parse_group(group, value, pname))
        else:
            out.update(_bare(group, value, pname))
    return PolicyDocument(name=pname, **out)


def run_document(
    values: Mapping[str, Any], *, name: str, description: str | None = None
) -> PolicyDocument:
    """``trainguard run``'s policy: ``values`` (setting name -> value, what its options
    set) over run's own values (:attr:`Setting.run_value`), validated as a document is;
    the :class:`PolicyError` names the setting's document key."""
    for key in values:
        if key not in BY_NAME or not BY_NAME[key].run_option:
            options = ", ".join(s.name for s in RUN_SETTINGS)
            raise PolicyError(key, f"is not a setting of run ({options})", policy=name)
    # Each of run's settings is pinned (given, run's own, else the built-in value) so
    # that a `default` document in a state database serve shares never changes a run.
    given = {k: v for k, v in values.items() if v is not None}
    flat = {s.name: s.default for s in RUN_SETTINGS if s.default is not None}
    flat.update({s.name: s.run_value for s in SETTINGS if s.run_value is not None})
    flat.update(given)
    for group in GROUPS.values():
        # A pinned bound the user's value crosses follows it (run --backoff 120: the
        # cap is 120, as for a document that sets only the base).
        sub, op, other = (group.members.get(k, k) for k in group.order)
        a, b = flat.get(sub), flat.get(other)
        if (
            a is not None
            and b is not None
            and sub not in given
            and (a < b if op == ">=" else a > b)
        ):
            flat[sub] = b
    return parse_document(PolicyDocument(name=name, description=description, **flat).to_json())


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a policy document (the API's ``PolicyIn.policy``)."""

    def one(s: Setting) -> dict[str, Any]:
        schema: dict[str, Any]
        if s.kind == "bool":
            schema = {"type": "boolean"}
        elif s.kind in ("text", "choice"):
            schema = {"type": "string"}
            if s.choices:
                schema["enum"] = list(s.choices)
        else:
            schema = {"type": "integer" if s.kind == "int" else "number"}
            if s.minimum is not None:
                schema["exclusiveMinimum" if s.exclusive else "minimum"] = s.minimum
            if s.maximum is not None:
                schema["maximum"] = s.maximum
        if s.keyword is not None:
            schema = {"anyOf": [schema, {"const": s.keyword}]}
        schema["description"] = s.help + (" (seconds)" if s.unit == "s" else "")
        return schema

    props: dict[str, Any] = {"name": {"type": "string", "description": "the policy's name"}}
    for key in document_keys():
        group = GROUPS.get(key)
        if group is None:
            props[key] = one(BY_NAME[key])
            continue
        mapping = {
            "type": "object",
            "additionalProperties": False,
            "properties": {sub: one(BY_NAME[n]) for sub, n in group.members.items()},
        }
        props[key] = {"anyOf": [mapping, one(BY_NAME[group.shorthand[0]])]}
    return {"type": "object", "additionalProperties": False, "properties": props}


__all__ = [
    "BY_NAME",
    "FLAG_ALIASES",
    "GROUPS",
    "RUN_SETTINGS",
    "SETTINGS",
    "Group",
    "PolicyDocument",
    "PolicyError",
    "Setting",
    "document_keys",
    "json_schema",
    "parse_document",
    "run_document",
]
