"""What both callbacks share: turning a framework's loss into a number without a device sync."""

from __future__ import annotations

from typing import Any


def cheap_loss(value: Any) -> float | None:
    """``value`` as a float when that costs nothing, else None.

    A Python number is used as is; a one-element tensor only when it lives on the
    CPU: ``.item()`` on an accelerator tensor waits for the device, and a progress
    report must not slow the step it reports.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    device = getattr(value, "device", None)
    numel = getattr(value, "numel", None)
    if device is None or numel is None or getattr(device, "type", None) != "cpu":
        return None
    try:
        if numel() != 1:
            return None
        return float(value.detach().item())
    except Exception:  # an odd tensor subclass: no loss rather than a failed step
        return None


def total_steps(value: Any) -> dict[str, int]:
    """``{"total_steps": N}`` for a framework's positive step limit, else nothing (-1 and
    0 mean "no limit" to both frameworks)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return {"total_steps": value}
    return {}


def require(module: str, package: str, what: str) -> Any:
    """Import ``module`` or raise an ImportError naming the package to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{what} needs {package}, which is not installed: pip install {package} "
            "(trainguard itself does not depend on it)"
        ) from exc
