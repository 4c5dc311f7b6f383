"""Scenario files for ``trainguard simulate``: typed records and strict validation.

A scenario describes a cluster (nodes × GPUs, spare nodes), per-component
failure processes, the jobs that run on it, how fast failures are detected,
how long repairs and people take, and how trainguard's recovery policy is
configured. It is read from YAML; every problem is reported as a
:class:`ScenarioError` naming the offending field (``jobs[0].checkpoint.keep``),
so ``trainguard simulate`` can exit 2 with a message a person can act on.

All durations carry their unit in the key name (``_seconds``, ``_minutes``,
``_hours``); a distribution is written as a number (fixed) or one of
``{fixed: x}``, ``{uniform: [lo, hi]}``, ``{exponential: mean}``,
``{lognormal: {median: m, sigma: s}}``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from statistics import NormalDist
from typing import Any

import yaml

from trainguard.model.findings import Domain, IncidentKind
from trainguard.simulate.measured import Measured

SIGNALS = ("crash", "xid", "hang", "straggler", "sdc")
SCOPES = ("device", "node", "job")
POLICY_NAMES = ("restart", "requeue", "trainguard", "trainguard-job-interval")
DEFAULT_POLICIES = ("restart", "requeue", "trainguard")

_STD_NORMAL = NormalDist()


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; ``path`` names the field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


# --- distributions -------------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    """A non-negative duration distribution, sampled by inverse CDF from a uniform.

    Sampling from a caller-supplied uniform lets every policy see the *same*
    draw for the same fault (common random numbers), so differences between
    policies are the policies', not the dice's.
    """

    kind: str  # fixed | uniform | exponential | lognormal | adaptive (hang only)
    a: float
    b: float = 0.0

    def quantile(self, u: float) -> float:
        if self.kind == "adaptive":
            raise ValueError("the adaptive hang timeout depends on the job's step time")
        u = min(max(u, 1e-12), 1.0 - 1e-12)
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return self.a + (self.b - self.a) * u
        if self.kind == "exponential":
            return -self.a * math.log1p(-u)
        # lognormal: a = median, b = sigma
        return self.a * math.exp(self.b * _STD_NORMAL.inv_cdf(u))

    @property
    def mean(self) -> float:
        if self.kind == "adaptive":
            return math.nan
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return (self.a + self.b) / 2.0
        if self.kind == "exponential":
            return self.a
        return self.a * math.exp(self.b * self.b / 2.0)

    def scaled(self, factor: float) -> Dist:
        """The same shape in other units (hours → seconds)."""
        if self.kind == "lognormal":
            return Dist(self.kind, self.a * factor, self.b)
        return Dist(self.kind, self.a * factor, self.b * factor)

    def to_dict(self) -> dict[str, Any] | str:
        if self.kind == "adaptive":
            return "adaptive"
        if self.kind == "fixed":
            return {"fixed": self.a}
        if self.kind == "uniform":
            return {"uniform": [self.a, self.b]}
        if self.kind == "exponential":
            return {"exponential": self.a}
        return {"lognormal": {"median": self.a, "sigma": self.b}}


def fixed(value: float) -> Dist:
    return Dist("fixed", float(value))


# trainguard's adaptive hang timeout: resolved per job from its step time.
ADAPTIVE = Dist("adaptive", 0.0)


# --- records -------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int
    gpus_per_node: int
    spare_nodes: int = 0
    gpu_model: str = "H100"
    gpu_memory_mb: int = 81559

    @property
    def total_nodes(self) -> int:
        return self.nodes + self.spare_nodes

    @property
    def total_gpus(self) -> int:
        return self.total_nodes * self.gpus_per_node


@dataclass(frozen=True)
class ComponentSpec:
    """One failure process: where it strikes, how it shows, what it leaves behind.

    ``rate_per_second`` is per unit of ``scope``: per GPU (device), per node
    (node), or per running second of a job (job).
    """

    name: str
    label: str
    scope: str
    rate_per_second: float
    signal: str
    domain: Domain
    kind: IncidentKind
    xid: int | None = None
    hard_fraction: float = 0.0  # leaves the device/node unusable until repaired
    lemon_fraction: float = 0.0  # turns its device/node into a repeat offender
    deterministic_fraction: float = 0.0  # job scope: fails again at the same step
    culprit_known: float = 1.0  # chance the evidence names the device/host
    node_down: bool = False  # a hard fault the scheduler sees as the node dying
    reference_count: float | None = None  # the published count it was calibrated to


@dataclass(frozen=True)
class CheckpointSpec:
    interval_minutes: float
    blocking_seconds: float  # training stalls this long per checkpoint
    async_write_seconds: float = 0.0  # background completion; 0 = synchronous save
    keep: int = 10  # retention: newest complete checkpoints kept

    @property
    def interval_seconds(self) -> float:
        return self.interval_minutes * 60.0


@dataclass(frozen=True)
class JobSpec:
    name: str
    gpus: int
    step_seconds: float
    checkpoint: CheckpointSpec
    restart_seconds: float  # relaunch + rendezvous/collective init
    restore_seconds: float  # loading the checkpoint
    min_gpus: int | None = None  # elastic: trainguard may continue down to this many
    start_hours: float = 0.0
    work_hours: float | None = None  # ideal compute to finish; None = train to the horizon


@dataclass(frozen=True)
class RepairSpec:
    hours: Dist  # hardware repair (ticket to fixed part), all policies
    validation_hours: Dist  # trainguard's validation before return
    fixes_lemon: float = 0.8  # a repair finds and replaces the weak part
    validation_catches_lemon: float = 0.7  # validation fails a lemon the repair missed


@dataclass(frozen=True)
class OperationsSpec:
    """What people and the scheduler do (and how long it takes)."""

    manual_response_hours: Dist  # an operator notices, investigates and acts
    software_fix_hours: Dist  # a deterministic bug is fixed and deployed
    requeue_seconds: float = 60.0  # scheduler requeue to start, without the job's restart
    corrupt_restore_detect_seconds: float = 900.0  # diverging again after restoring bad state
    # Baselines: a person isolates a node after it failed this many times (0 = never).
    manual_isolation_after: int = 3


@dataclass(frozen=True)
class TrainguardSpec:
    checkpoint_interval: str = "advisor"  # "advisor" (Young/Daly) or "job"
    max_restarts: int = 10
    futile_after: int = 2
    backoff_base_seconds: float = 1.0
    backoff_max_seconds: float = 60.0
    allow_quarantine: bool = True


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration_days: float
    cluster: ClusterSpec
    jobs: tuple[JobSpec, ...]
    components: tuple[ComponentSpec, ...]
    detection: dict[str, Dist]  # trainguard's detectors, seconds
    baseline_detection: dict[str, Dist]  # without trainguard (torchrun / Slurm), seconds
    repair: RepairSpec
    operations: OperationsSpec
    trainguard: TrainguardSpec
    lemon_mtbf_hours: float = 12.0
    straggler_rate: float = 0.5  # progress rate of a job slowed by a straggler
    seed: int = 0
    trials: int = 1
    policies: tuple[str, ...] = DEFAULT_POLICIES
    calibration: dict[str, float] = field(default_factory=dict)
    source: str = ""
    measured: Measured | None = None  # benchmark figures for trainguard (--measured)

    @property
    def duration_seconds(self) -> float:
        return self.duration_days * 86400.0

    def component(self, name: str) -> ComponentSpec:
        for comp in self.components:
            if comp.name == name:
                return comp
        raise KeyError(name)


# --- reading -------------------------------------------------------------------------


class _Reader:
    """Reads one mapping, remembering which keys were used so unknown ones can be named."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ScenarioError(path or "scenario", f"expected a mapping, got {_typename(data)}")
        self.data = data
        self.path = path
        self.used: set[str] = set()

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, required: bool = False) -> Any:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if required:
                raise ScenarioError(self.sub(key), "required field is missing")
            return None
        return self.data[key]

    def number(
        self,
        key: str,
        default: float | None = None,
        *,
        required: bool = False,
        minimum: float | None = 0.0,
        positive: bool = False,
        maximum: float | None = None,
    ) -> float:
        value = self.raw(key, required=required and default is None)
        if value is None:
            assert default is not None
            return default
        return _number(value, self.sub(key), minimum=minimum, positive=positive, maximum=maximum)

    def optional_number(self, key: str, *, positive: bool = False) -> float | None:
        value = self.raw(key)
        if value is None:
            return None
        return _number(value, self.sub(key), minimum=0.0, positive=positive)

    def integer(
        self, key: str, default: int | None = None, *, minimum: int = 0, required: bool = False
    ) -> int:
        value = self.raw(key, required=required and default is None)
        if value is None:
            assert default is not None
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(self.sub(key), f"expected an integer, got {value!r}")
        if value < minimum:
            raise ScenarioError(self.sub(key), f"must be >= {minimum}, got {value}")
        return value

    def string(
        self, key: str, default: str | None = None, *, choices: Iterable[str] | None = None
    ) -> str:
        value = self.raw(key, required=default is None)
        if value is None:
            assert default is not None
            return default
        if not isinstance(value, str) or not value:
            raise ScenarioError(self.sub(key), f"expected a non-empty string, got {value!r}")
        if choices is not None and value not in tuple(choices):
            raise ScenarioError(
                self.sub(key), f"must be one of {', '.join(choices)}; got {value!r}"
            )
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ScenarioError(self.sub(key), f"expected true or false, got {value!r}")
        return value

    def fraction(self, key: str, default: float) -> float:
        return self.number(key, default, minimum=0.0, maximum=1.0)

    def dist(self, key: str, default: Dist | None = None) -> Dist:
        value = self.raw(key, required=default is None)
        if value is None:
            assert default is not None
            return default
        return parse_dist(value, self.sub(key))

    def mapping(self, key: str, *, required: bool = False) -> _Reader:
        value = self.raw(key, required=required)
        return _Reader({} if value is None else value, self.sub(key))

    def done(self) -> None:
        unknown = [k for k in self.data if k not in self.used]
        if unknown:
            expected = ", ".join(sorted(self.used)) or "nothing"
            raise ScenarioError(
                self.sub(str(unknown[0])),
                f"unknown key {unknown[0]!r} (expected one of: {expected})",
            )


def _typename(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _number(
    value: Any,
    path: str,
    *,
    minimum: float | None = 0.0,
    positive: bool = False,
    maximum: float | None = None,
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(path, f"expected a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ScenarioError(path, f"must be a finite number, got {value!r}")
    if positive and number <= 0:
        raise ScenarioError(path, f"must be > 0, got {value!r}")
    if minimum is not None and number < minimum:
        raise ScenarioError(path, f"must be >= {minimum:g}, got {value!r} (negative?)")
    if maximum is not None and number > maximum:
        raise ScenarioError(path, f"must be <= {maximum:g}, got {value!r}")
    return number


def parse_dist(value: Any, path: str) -> Dist:
    """Parse a distribution; raises :class:`ScenarioError` naming ``path``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return fixed(_number(value, path))
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ScenarioError(
            path,
            "expected a number or one of {fixed: x}, {uniform: [lo, hi]}, "
            "{exponential: mean}, {lognormal: {median: m, sigma: s}}",
        )
    (kind, arg), *_ = value.items()
    sub = f"{path}.{kind}"
    if kind == "fixed":
        return fixed(_number(arg, sub))
    if kind == "exponential":
        return Dist("exponential", _number(arg, sub, positive=True))
    if kind == "uniform":
        if not isinstance(arg, list | tuple) or len(arg) != 2:
            raise ScenarioError(sub, "expected [low, high]")
        lo = _number(arg[0], f"{sub}[0]")
        hi = _number(arg[1], f"{sub}[1]")
        if hi < lo:
            raise ScenarioError(sub, f"high ({hi:g}) is below low ({lo:g})")
        return Dist("uniform", lo, hi)
    if kind == "lognormal":
        reader = _Reader(arg, sub)
        median = reader.number("median", required=True, positive=True)
        sigma = reader.number("sigma", required=True)
        reader.done()
        return Dist("lognormal", median, sigma)
    raise ScenarioError(
        path, f"unknown distribution {kind!r} (expected fixed, uniform, exponential, lognormal)"
    )


def _enum(reader: _Reader, key: str, enum: Any, default: str) -> Any:
    text = reader.string(key, default, choices=[e.value for e in enum])
    return enum(text)


def _read_cluster(r: _Reader) -> ClusterSpec:
    spec = ClusterSpec(
        nodes=r.integer("nodes", minimum=1, required=True),
        gpus_per_node=r.integer("gpus_per_node", minimum=1, required=True),
        spare_nodes=r.integer("spare_nodes", 0),
        gpu_model=r.string("gpu_model", "H100"),
        gpu_memory_mb=r.integer("gpu_memory_mb", 81559),
    )
    r.done()
    return spec


def _read_job(r: _Reader, cluster: ClusterSpec) -> JobSpec:
    name = r.string("name")
    gpus = r.integer("gpus", minimum=1, required=True)
    if gpus > cluster.nodes * cluster.gpus_per_node:
        raise ScenarioError(
            r.sub("gpus"),
            f"{gpus} GPUs do not fit on {cluster.nodes} nodes × {cluster.gpus_per_node}",
        )
    ck = r.mapping("checkpoint", required=True)
    checkpoint = CheckpointSpec(
        interval_minutes=ck.number("interval_minutes", required=True, positive=True),
        blocking_seconds=ck.number("blocking_seconds", required=True),
        async_write_seconds=ck.number("async_write_seconds", 0.0),
        keep=ck.integer("keep", 10, minimum=1),
    )
    ck.done()
    min_gpus: int | None = None
    if r.has("elastic"):
        el = r.mapping("elastic")
        min_gpus = el.integer("min_gpus", minimum=1, required=True)
        if min_gpus > gpus:
            raise ScenarioError(el.sub("min_gpus"), f"must be <= gpus ({gpus}), got {min_gpus}")
        el.done()
    else:
        r.raw("elastic")
    spec = JobSpec(
        name=name,
        gpus=gpus,
        step_seconds=r.number("step_seconds", required=True, positive=True),
        checkpoint=checkpoint,
        restart_seconds=r.number("restart_seconds", required=True),
        restore_seconds=r.number("restore_seconds", required=True),
        min_gpus=min_gpus,
        start_hours=r.number("start_hours", 0.0),
        work_hours=r.optional_number("work_hours", positive=True),
    )
    r.done()
    return spec


def _read_component(
    name: str, r: _Reader, cluster: ClusterSpec, calibration: dict[str, float]
) -> ComponentSpec:
    scope = r.string("scope", choices=SCOPES)
    has_count = r.has("count")
    has_mtbf = r.has("mtbf_hours")
    if has_count == has_mtbf:
        raise ScenarioError(
            r.sub("count"),
            "give exactly one of count (interruptions of the calibration job) or mtbf_hours",
        )
    count: float | None = None
    if has_count:
        count = r.number("count", required=True)
        if not calibration:
            raise ScenarioError(
                r.sub("count"), "count needs a top-level calibration: {gpus: N, days: D}"
            )
        hours = calibration["days"] * 24.0
        units = {
            "device": calibration["gpus"],
            "node": calibration["gpus"] / cluster.gpus_per_node,
            "job": 1.0,
        }[scope]
        rate = count / (units * hours * 3600.0)
    else:
        mtbf = r.number("mtbf_hours", required=True, positive=True)
        rate = 1.0 / (mtbf * 3600.0)
    signal = r.string("signal", choices=SIGNALS)
    default_domain = {"device": "hardware", "node": "node", "job": "application"}[scope]
    domain = _enum(r, "domain", Domain, default_domain)
    default_kind = {"xid": "xid", "hang": "hang"}.get(signal, "crash")
    kind = _enum(r, "kind", IncidentKind, default_kind)
    xid_value = r.raw("xid")
    if xid_value is not None and (isinstance(xid_value, bool) or not isinstance(xid_value, int)):
        raise ScenarioError(r.sub("xid"), f"expected an integer XID, got {xid_value!r}")
    spec = ComponentSpec(
        name=name,
        label=r.string("label", name.replace("_", " ")),
        scope=scope,
        rate_per_second=rate,
        signal=signal,
        domain=domain,
        kind=kind,
        xid=xid_value,
        hard_fraction=r.fraction("hard_fraction", 0.0),
        lemon_fraction=r.fraction("lemon_fraction", 0.0),
        deterministic_fraction=r.fraction("deterministic_fraction", 0.0),
        culprit_known=r.fraction("culprit_known", 1.0),
        node_down=r.boolean("node_down", False),
        reference_count=count,
    )
    r.done()
    if scope == "job" and (spec.hard_fraction or spec.lemon_fraction):
        raise ScenarioError(
            r.sub("hard_fraction"), "job-scope faults have no hardware to break or make a lemon"
        )
    if scope != "job" and spec.deterministic_fraction:
        raise ScenarioError(
            r.sub("deterministic_fraction"), "only job-scope (software) faults are deterministic"
        )
    return spec


def _read_detection(r: _Reader, defaults: Mapping[str, Dist] | None) -> dict[str, Dist]:
    out: dict[str, Dist] = dict(defaults or {})
    for signal in SIGNALS:
        if signal == "hang" and r.data.get("hang") == "adaptive":
            # trainguard's own adaptive hang timeout (diagnose.detectors.HangConfig).
            r.raw("hang")
            out["hang"] = ADAPTIVE
        elif r.has(signal) or defaults is None:
            out[signal] = r.dist(signal)
        else:
            r.raw(signal)
    r.done()
    return out


def parse_scenario(data: Any, source: str = "") -> Scenario:
    """Validate a scenario document (already parsed YAML) into a :class:`Scenario`."""
    r = _Reader(data, "")
    name = r.string("name")
    calibration: dict[str, float] = {}
    if r.has("calibration"):
        cal = r.mapping("calibration")
        calibration = {
            "gpus": cal.number("gpus", required=True, positive=True),
            "days": cal.number("days", required=True, positive=True),
        }
        if cal.has("interruptions"):
            calibration["interruptions"] = cal.number("interruptions")
        else:
            cal.raw("interruptions")
        cal.done()
    else:
        r.raw("calibration")
    cluster = _read_cluster(r.mapping("cluster", required=True))
    jobs_raw = r.raw("jobs", required=True)
    if not isinstance(jobs_raw, list) or not jobs_raw:
        raise ScenarioError("jobs", "expected a non-empty list of jobs")
    jobs = tuple(_read_job(_Reader(item, f"jobs[{i}]"), cluster) for i, item in enumerate(jobs_raw))
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ScenarioError("jobs", f"job names must be unique: {names}")
    total = sum(j.gpus for j in jobs)
    if total > cluster.nodes * cluster.gpus_per_node:
        raise ScenarioError(
            "jobs", f"the jobs need {total} GPUs; the cluster has {cluster.nodes} working nodes"
        )
    comps_reader = r.mapping("components", required=True)
    components = tuple(
        _read_component(
            str(key),
            _Reader(comps_reader.raw(str(key)), comps_reader.sub(str(key))),
            cluster,
            calibration,
        )
        for key in list(comps_reader.data)
    )
    if not components:
        raise ScenarioError("components", "at least one failure component is needed")
    detection = _read_detection(r.mapping("detection", required=True), None)
    baseline_detection = _read_detection(r.mapping("baseline_detection"), detection)
    rep = r.mapping("repair", required=True)
    repair = RepairSpec(
        hours=rep.dist("hours"),
        validation_hours=rep.dist("validation_hours", fixed(0.5)),
        fixes_lemon=rep.fraction("fixes_lemon", 0.8),
        validation_catches_lemon=rep.fraction("validation_catches_lemon", 0.7),
    )
    rep.done()
    ops = r.mapping("operations", required=True)
    operations = OperationsSpec(
        manual_response_hours=ops.dist("manual_response_hours"),
        software_fix_hours=ops.dist("software_fix_hours", fixed(24.0)),
        requeue_seconds=ops.number("requeue_seconds", 60.0),
        corrupt_restore_detect_seconds=ops.number("corrupt_restore_detect_seconds", 900.0),
        manual_isolation_after=ops.integer("manual_isolation_after", 3),
    )
    ops.done()
    tg = r.mapping("trainguard")
    trainguard = TrainguardSpec(
        checkpoint_interval=tg.string("checkpoint_interval", "advisor", choices=("advisor", "job")),
        max_restarts=tg.integer("max_restarts", 10),
        futile_after=tg.integer("futile_after", 2, minimum=1),
        backoff_base_seconds=tg.number("backoff_base_seconds", 1.0),
        backoff_max_seconds=tg.number("backoff_max_seconds", 60.0),
        allow_quarantine=tg.boolean("allow_quarantine", True),
    )
    tg.done()
    policies_raw = r.raw("policies")
    if policies_raw is None:
        policies: tuple[str, ...] = DEFAULT_POLICIES
    else:
        if not isinstance(policies_raw, list) or not policies_raw:
            raise ScenarioError("policies", "expected a non-empty list")
        for i, p in enumerate(policies_raw):
            if p not in POLICY_NAMES:
                raise ScenarioError(
                    f"policies[{i}]", f"unknown policy {p!r} (expected {', '.join(POLICY_NAMES)})"
                )
        policies = tuple(policies_raw)
    scenario = Scenario(
        name=name,
        description=r.string("description", ""),
        duration_days=r.number("duration_days", required=True, positive=True),
        cluster=cluster,
        jobs=jobs,
        components=components,
        detection=detection,
        baseline_detection=baseline_detection,
        repair=repair,
        operations=operations,
        trainguard=trainguard,
        lemon_mtbf_hours=r.number("lemon_mtbf_hours", 12.0, positive=True),
        straggler_rate=r.number("straggler_rate", 0.5, positive=True, maximum=1.0),
        seed=r.integer("seed", 0),
        trials=r.integer("trials", 1, minimum=1),
        policies=policies,
        calibration=calibration,
        source=source,
    )
    r.done()
    return scenario


def builtin_scenarios() -> list[str]:
    """Names accepted by ``trainguard simulate --scenario NAME``."""
    folder = resources.files("trainguard.simulate").joinpath("scenarios")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_scenario(path_or_name: str | Path) -> Scenario:
    """Load a scenario file, or a built-in scenario by name (``llama3``)."""
    text: str
    source: str
    path = Path(path_or_name)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ScenarioError("", f"cannot read {path}: {exc.strerror or exc}") from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScenarioError(
                "", f"{path} is not a text (UTF-8 YAML) file: undecodable byte at {exc.start}"
            ) from exc
        if "\x00" in text:
            raise ScenarioError("", f"{path} is a binary file (NUL bytes), not YAML")
        source = str(path)
    else:
        name = str(path_or_name)
        if name not in builtin_scenarios():
            raise ScenarioError(
                "",
                f"no built-in scenario {name!r} (have: {', '.join(builtin_scenarios())})",
            )
        resource = resources.files("trainguard.simulate").joinpath("scenarios", f"{name}.yaml")
        text = resource.read_text()
        source = f"builtin:{name}"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError("", f"{source} is not valid YAML: {exc}") from exc
    return parse_scenario(data, source=source)


def with_overrides(scenario: Scenario, **changes: Any) -> Scenario:
    """A copy with top-level fields replaced (``seed=``, ``trials=``, ``policies=``)."""
    from dataclasses import replace

    return replace(scenario, **changes)
