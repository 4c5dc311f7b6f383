"""``trainguard run``'s recovery-policy options, derived from the policy schema.

One option per setting that run lets a user set (``RUN_SETTINGS`` of
:mod:`trainguard.model.policy_schema`), named after the setting
(``--hang-timeout-seconds``) and also under its older spelling
(``--hang-timeout``, ``FLAG_ALIASES``). A bad value is refused by the same check a
policy document gets, and the error names the option and the setting.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from trainguard.model.policy_schema import (
    BY_NAME,
    RUN_SETTINGS,
    SETTINGS,
    PolicyError,
    Setting,
)


def _value_type(s: Setting) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return s.from_text(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (policy setting {s.name})") from None

    parse.__name__ = s.name
    return parse


def shown_default(s: Setting) -> str:
    """run's value when the option is not given, in words."""
    value = s.run_value if s.run_value is not None else s.default
    if value is None:
        return s.keyword or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_policy_options(p: argparse.ArgumentParser) -> None:
    """run's options for the settings of ``RUN_SETTINGS``; each lands in ``args`` under
    the setting's name, ``None`` when not given."""
    group = p.add_argument_group("recovery policy (docs/control-plane.md#policy-settings)")
    for s in RUN_SETTINGS:
        help = f"{s.help} (default: {shown_default(s)})"
        if s.kind == "bool":
            group.add_argument(
                s.flag, *s.aliases, dest=s.name, action="store_true", default=None, help=help
            )
            continue
        metavar = "S" if s.unit == "s" else ("N" if s.kind == "int" else "X")
        group.add_argument(
            s.flag,
            *s.aliases,
            dest=s.name,
            type=_value_type(s),
            default=None,
            metavar=metavar,
            help=help,
        )


def policy_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line set, by name."""
    return {
        s.name: getattr(args, s.name) for s in RUN_SETTINGS if getattr(args, s.name) is not None
    }


def policy_error(exc: PolicyError) -> str:
    """A run policy error as the user reads it: the option, then the setting."""
    by_key = {s.key: s for s in SETTINGS}
    s = by_key.get(exc.field) or BY_NAME.get(exc.field)
    if s is None:
        return str(exc)
    option = s.flag if s.run_option else s.name
    return f"{option}: {exc.reason} (policy setting {s.name})"


__all__ = ["add_policy_options", "policy_error", "policy_values", "shown_default"]
