"""Pre-flight checks: prove hardware healthy before a long job and before a device returns.

A signals-level layer (it touches hardware): it may import ``model``,
``diagnose`` and ``signals``, and is used by ``controller`` and the command line.
torch is imported lazily inside the checks that need it, so the control plane
imports this package without torch.

* :func:`run_preflight` runs the checks of a level on a set of devices and returns a
  :class:`PreflightReport` of :class:`CheckResult` records (pass / fail /
  not_applicable, with value, threshold, method and duration);
* :class:`PreflightOptions` says which level, backend, thresholds, kernel log,
  ``nvidia-smi -q`` capture, DCGM binary, dry-run command and injected faults;
* :func:`parse_nvidia_smi_q` and :func:`parse_dcgmi_diag` are the pure parsers;
* :func:`trainguard.preflight.gate.preflight_gate` is what ``trainguard run
  --preflight`` calls; ``trainguard validate`` reports through the control plane.

See ``docs/preflight.md``.
"""

from __future__ import annotations

from trainguard.preflight.dcgm import parse_dcgmi_diag
from trainguard.preflight.faults import FAULTS_ENV, Fault, parse_faults
from trainguard.preflight.levels import Level, LevelSpec, level_spec
from trainguard.preflight.nvsmi import NvidiaSmiParseError, parse_nvidia_smi_q
from trainguard.preflight.query import GpuQuery
from trainguard.preflight.results import CheckResult, CheckStatus, PreflightReport
from trainguard.preflight.runner import CHECKS, DEVICE_CHECKS, PreflightOptions, run_preflight
from trainguard.preflight.specs import KNOWN_DEVICES, Thresholds, device_spec, parse_overrides

__all__ = [
    "CHECKS",
    "DEVICE_CHECKS",
    "FAULTS_ENV",
    "KNOWN_DEVICES",
    "CheckResult",
    "CheckStatus",
    "Fault",
    "GpuQuery",
    "Level",
    "LevelSpec",
    "NvidiaSmiParseError",
    "PreflightOptions",
    "PreflightReport",
    "Thresholds",
    "device_spec",
    "level_spec",
    "parse_dcgmi_diag",
    "parse_faults",
    "parse_nvidia_smi_q",
    "parse_overrides",
    "run_preflight",
]
