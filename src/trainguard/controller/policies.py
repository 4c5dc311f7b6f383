"""Recovery policy documents (YAML or JSON): parse, validate, layer, resolve.

A job opts into a named policy; operators set defaults in the policy named
``default``. Everything a document leaves out comes from the default document,
then from :class:`~trainguard.model.plan.RecoveryPolicy`'s built-in values. The
format (every field optional)::

    name: big-pretrain                  # required when stored through the API
    description: 8-GPU pre-training, elastic down to 4
    max_restarts: 5                     # integer >= 0
    backoff: {base_seconds: 10, max_seconds: 300}   # or a number: the base
    futile_after: 2                     # integer >= 1
    allow_quarantine: true
    devices: 8                          # fixed count, or {min: 4, max: 8} (elastic)
    hang_timeout_seconds: 600           # number > 0, or "adaptive" (the default)
    hang_floor_seconds: 60              # adaptive: max(floor, multiple x slowest step
    hang_multiple: 10                   #   interval); start-up allowance until two
    hang_startup_seconds: 600           #   progress points are seen (numbers > 0)
    verify_window_seconds: 60           # number > 0
    verify_min_rate_ratio: 0.3          # 0 < x <= 1
    placement: node                     # "device" (any healthy devices) or "node" (whole hosts)
    isolate_network_after: 2            # integer >= 1: the same culprit of a collective
                                        # timeout/error this many times is isolated (0110)
    wait_for_capacity: true             # too few devices, some could return: wait (true)
                                        # or stop the job with the reason (false; 0381)
    approvals: true                     # a second failure of unknown cause waits for a
                                        # person (true) or the policy decides alone,
                                        # bounded by max_restarts (false; 0425)
    approval_timeout_seconds: 3600      # number > 0: no answer by then is a no (default:
                                        # no deadline)

Every error names the field (``backoff.base_seconds``) and what was wrong with
it; an unknown field is an error (with the nearest known name), so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from trainguard.model.fleet import PolicyDocument
from trainguard.model.plan import PLACEMENTS, RecoveryPolicy

DEFAULT_POLICY = "default"
MAX_DOCUMENT_BYTES = 64 * 1024

_FIELDS = (
    "name",
    "description",
    "max_restarts",
    "backoff",
    "futile_after",
    "allow_quarantine",
    "devices",
    "hang_timeout_seconds",
    "hang_floor_seconds",
    "hang_multiple",
    "hang_startup_seconds",
    "verify_window_seconds",
    "verify_min_rate_ratio",
    "placement",
    "isolate_network_after",
    "max_checkpoint_age_seconds",
    "wait_for_capacity",
    "approvals",
    "approval_timeout_seconds",
)


class PolicyError(ValueError):
    """A policy document is malformed; ``field`` names the offending field (dotted path)."""

    def __init__(self, field: str, message: str, *, policy: str | None = None) -> None:
        where = f"policy {policy!r}: " if policy else "policy: "
        super().__init__(f"{where}field {field!r}: {message}")
        self.field = field
        self.policy = policy


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(value: Any, field: str, name: str | None, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(
            field, f"must be an integer >= {minimum}, got {_describe(value)}", policy=name
        )
    if value < minimum:
        raise PolicyError(field, f"must be >= {minimum}, got {value}", policy=name)
    return value


def _bool(value: Any, field: str, name: str | None) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(field, f"must be true or false, got {_describe(value)}", policy=name)
    return value


def _number(
    value: Any,
    field: str,
    name: str | None,
    *,
    minimum: float,
    strict: bool,
    maximum: float | None = None,
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyError(field, f"must be a number, got {_describe(value)}", policy=name)
    number = float(value)
    if not math.isfinite(number):
        raise PolicyError(field, f"must be a finite number, got {value}", policy=name)
    if number < minimum or (strict and number == minimum):
        op = ">" if strict else ">="
        raise PolicyError(field, f"must be {op} {minimum:g}, got {value}", policy=name)
    if maximum is not None and number > maximum:
        raise PolicyError(field, f"must be <= {maximum:g}, got {value}", policy=name)
    return number


def parse_policy(data: Any, *, name: str | None = None) -> PolicyDocument:
    """Validate a policy mapping (already parsed from YAML/JSON) into a :class:`PolicyDocument`.

    ``name`` is used when the document has none (and must match when it has one).
    Raises :class:`PolicyError` naming the field.
    """
    if not isinstance(data, Mapping):
        raise PolicyError(
            "(document)", f"must be a mapping of fields, got {_describe(data)}", policy=name
        )
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
    pname = doc_name
    for key in data:
        if key not in _FIELDS:
            close = difflib.get_close_matches(str(key), _FIELDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PolicyError(str(key), f"is not a policy field{hint}", policy=pname)

    out: dict[str, Any] = {"name": pname}
    if "description" in data and data["description"] is not None:
        if not isinstance(data["description"], str):
            raise PolicyError("description", "must be a string", policy=pname)
        out["description"] = data["description"]
    if data.get("max_restarts") is not None:
        out["max_restarts"] = _int(data["max_restarts"], "max_restarts", pname, 0)
    if data.get("futile_after") is not None:
        out["futile_after"] = _int(data["futile_after"], "futile_after", pname, 1)
    if data.get("allow_quarantine") is not None:
        out["allow_quarantine"] = _bool(data["allow_quarantine"], "allow_quarantine", pname)
    if data.get("wait_for_capacity") is not None:
        out["wait_for_capacity"] = _bool(data["wait_for_capacity"], "wait_for_capacity", pname)
    if data.get("approvals") is not None:
        out["approvals"] = _bool(data["approvals"], "approvals", pname)
    if data.get("approval_timeout_seconds") is not None:
        out["approval_timeout_seconds"] = _number(
            data["approval_timeout_seconds"],
            "approval_timeout_seconds",
            pname,
            minimum=0,
            strict=True,
        )
    backoff = data.get("backoff")
    if backoff is not None:
        if isinstance(backoff, Mapping):
            for key in backoff:
                if key not in ("base_seconds", "max_seconds"):
                    raise PolicyError(
                        f"backoff.{key}",
                        "is not a backoff field (base_seconds, max_seconds)",
                        policy=pname,
                    )
            if backoff.get("base_seconds") is not None:
                out["backoff_base_seconds"] = _number(
                    backoff["base_seconds"], "backoff.base_seconds", pname, minimum=0, strict=False
                )
            if backoff.get("max_seconds") is not None:
                out["backoff_max_seconds"] = _number(
                    backoff["max_seconds"], "backoff.max_seconds", pname, minimum=0, strict=False
                )
            base, cap = out.get("backoff_base_seconds"), out.get("backoff_max_seconds")
            if base is not None and cap is not None and cap < base:
                raise PolicyError(
                    "backoff.max_seconds",
                    f"must be >= backoff.base_seconds ({base:g}), got {cap:g}",
                    policy=pname,
                )
        else:
            out["backoff_base_seconds"] = _number(
                backoff, "backoff", pname, minimum=0, strict=False
            )
    devices = data.get("devices")
    if devices is not None:
        if isinstance(devices, Mapping):
            for key in devices:
                if key not in ("min", "max"):
                    raise PolicyError(
                        f"devices.{key}", "is not a devices field (min, max)", policy=pname
                    )
            if "max" not in devices or devices["max"] is None:
                raise PolicyError("devices.max", "is required for an elastic range", policy=pname)
            hi = _int(devices["max"], "devices.max", pname, 1)
            lo = _int(devices.get("min", hi), "devices.min", pname, 1)
            if lo > hi:
                raise PolicyError(
                    "devices.min", f"must be <= devices.max ({hi}), got {lo}", policy=pname
                )
            out["min_devices"], out["max_devices"] = lo, hi
        else:
            n = _int(devices, "devices", pname, 1)
            out["min_devices"] = out["max_devices"] = n
    hang = data.get("hang_timeout_seconds")
    if hang is not None and hang != "adaptive":
        out["hang_timeout_seconds"] = _number(
            hang, "hang_timeout_seconds", pname, minimum=0, strict=True
        )
    for key in ("hang_floor_seconds", "hang_multiple", "hang_startup_seconds"):
        if data.get(key) is not None:
            out[key] = _number(data[key], key, pname, minimum=0, strict=True)
    if data.get("verify_window_seconds") is not None:
        out["verify_window_seconds"] = _number(
            data["verify_window_seconds"], "verify_window_seconds", pname, minimum=0, strict=True
        )
    if data.get("verify_min_rate_ratio") is not None:
        out["verify_min_rate_ratio"] = _number(
            data["verify_min_rate_ratio"],
            "verify_min_rate_ratio",
            pname,
            minimum=0,
            strict=True,
            maximum=1.0,
        )
    placement = data.get("placement")
    if placement is not None:
        if placement not in PLACEMENTS:
            raise PolicyError(
                "placement",
                f"must be one of {', '.join(PLACEMENTS)}, got {_describe(placement)}",
                policy=pname,
            )
        out["placement"] = placement
    if data.get("isolate_network_after") is not None:
        out["isolate_network_after"] = _int(
            data["isolate_network_after"], "isolate_network_after", pname, 1
        )
    if data.get("max_checkpoint_age_seconds") is not None:
        # Read by the checkpoint-protection view and alert, not by decide() (0251).
        out["max_checkpoint_age_seconds"] = _number(
            data["max_checkpoint_age_seconds"],
            "max_checkpoint_age_seconds",
            pname,
            minimum=0,
            strict=True,
        )
    return PolicyDocument(**out)


def load_policy_text(text: str | bytes, *, name: str | None = None) -> PolicyDocument:
    """Parse YAML or JSON text (JSON is YAML) and validate it."""
    import yaml

    if isinstance(text, bytes):
        if len(text) > MAX_DOCUMENT_BYTES:
            raise PolicyError(
                "(document)", f"is larger than {MAX_DOCUMENT_BYTES} bytes", policy=name
            )
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PolicyError("(document)", f"is not UTF-8: {exc}", policy=name) from exc
    if len(text) > MAX_DOCUMENT_BYTES:
        raise PolicyError("(document)", f"is larger than {MAX_DOCUMENT_BYTES} bytes", policy=name)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError("(document)", f"is not valid YAML/JSON: {exc}", policy=name) from exc
    return parse_policy(data, name=name)


def policy_to_json(doc: PolicyDocument) -> str:
    return json.dumps(doc.to_json(), sort_keys=True)


def merge(base: PolicyDocument | None, override: PolicyDocument | None) -> PolicyDocument | None:
    """``override``'s set fields over ``base``'s (the job's document over the default)."""
    if base is None:
        return override
    if override is None:
        return base
    changes = {
        f.name: getattr(override, f.name)
        for f in fields(PolicyDocument)
        if getattr(override, f.name) is not None
    }
    return replace(base, **changes)


def resolve(
    doc: PolicyDocument | None, *, need: int, min_need: int | None = None
) -> RecoveryPolicy:
    """The :class:`RecoveryPolicy` ``decide()`` gets for a job needing ``need`` devices.

    A document's elasticity overrides the job's own ``need``/``min_need``.
    """
    policy = RecoveryPolicy(need=need, min_need=min_need)
    if doc is None:
        return policy
    changes: dict[str, Any] = {}
    for src, dst in (
        ("max_restarts", "max_restarts"),
        ("backoff_base_seconds", "backoff_base_seconds"),
        ("backoff_max_seconds", "backoff_max_seconds"),
        ("futile_after", "futile_after"),
        ("allow_quarantine", "allow_quarantine"),
        ("hang_timeout_seconds", "hang_timeout_seconds"),
        ("hang_floor_seconds", "hang_floor_seconds"),
        ("hang_multiple", "hang_multiple"),
        ("hang_startup_seconds", "hang_startup_seconds"),
        ("verify_window_seconds", "verify_window_seconds"),
        ("verify_min_rate_ratio", "verify_min_rate_ratio"),
        ("placement", "placement"),
        ("isolate_network_after", "isolate_network_after"),
        ("wait_for_capacity", "wait_for_capacity"),
        ("approvals", "approvals"),
        ("approval_timeout_seconds", "approval_timeout_seconds"),
    ):
        value = getattr(doc, src)
        if value is not None:
            changes[dst] = value
    if doc.max_devices is not None:
        changes["need"] = doc.max_devices
        changes["min_need"] = (
            None if doc.min_devices in (None, doc.max_devices) else doc.min_devices
        )
    if (
        "backoff_base_seconds" in changes
        and "backoff_max_seconds" not in changes
        and changes["backoff_base_seconds"] > policy.backoff_max_seconds
    ):
        changes["backoff_max_seconds"] = changes["backoff_base_seconds"]
    return replace(policy, **changes)


__all__ = [
    "DEFAULT_POLICY",
    "PolicyError",
    "load_policy_text",
    "merge",
    "parse_policy",
    "policy_to_json",
    "resolve",
]
