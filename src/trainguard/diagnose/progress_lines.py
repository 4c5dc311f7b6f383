"""Progress from a job's stock output: which lines count a training step, which only show life.

Pure code (no I/O, no clock). Jobs that do not use ``trainguard.train`` still print
progress, in the forms their frameworks print it; this module reads one line
(already split at ``\\n`` *and* ``\\r`` by :mod:`trainguard.signals.output`) and
answers with a :class:`ProgressReading` of one of two kinds:

* ``STEP`` — the line reports the job's global step counter, which a restart
  resumes from and verification compares against a checkpoint's step;
* ``LIVENESS`` — the line shows the job is working (a bar moved, a loss was
  logged, an epoch began) but its number is not the global step: a per-epoch
  batch index, an evaluation or data-loading bar, a bar that has just opened at
  ``0/N``. When unsure, a reading is liveness, never a step;
* ``CHECKPOINT`` — a line that would read as a step but says a checkpoint was loaded
  or saved at that step (torchtitan's ``Loading the checkpoint at step 40.``,
  Megatron's ``loading checkpoint from ... at iteration 40`` and ``saving checkpoint at
  iteration 40 ...``, the Trainer's ``Continuing training from global step 40``): no
  step was trained, so the first step after a restore is the first *trained* one
  (decision 0497). The number is the reading's ``count``, ``event`` says ``load`` or
  ``save``; a save shows the job working (:attr:`ProgressReading.is_liveness`), a load
  is start-up, as a banner is.

Forms recognised without configuration (each from what the framework prints):

=====================  =============================================================
form                   example, and the kind it gives
=====================  =============================================================
``pattern``            ``step=120 loss=2.31``, ``step: 7``, ``iteration 99``,
                       ``global step 250``, ``[5/10]`` -> step (or the user's
                       ``--progress-pattern``; then only that pattern gives steps)
``tqdm``               HF Trainer's training bar `` 42%|████▏     | 252/600 [00:10<00:14,
                       24.5it/s]`` -> step 252; the same bar at ``0/600`` (just opened),
                       bars with a description (``Map:``, ``Loading checkpoint
                       shards:``, ``Saving``, ``Validation``), units other than ``it``
                       (``examples/s``, ``B/s``), Lightning's ``Epoch 3:  40%|...| 4/10``
                       (a per-epoch batch index) and any bar other than the first
                       step-like one (HF's evaluation bar) -> liveness
``rich``               Lightning's Rich bar ``Epoch 3/9 ━━━━━━ 4/10 0:00:01 • ...`` ->
                       liveness (per-epoch)
``hf_log``             Trainer's log dict ``{'loss': '0.6931', 'learning_rate': '5e-05',
                       'epoch': '0.5'}`` -> liveness with loss and epoch; with a
                       ``'step'``/``'global_step'`` key -> step
``json``               ``{"step": 120, "loss": 2.3}`` (also ``global_step``,
                       ``iteration``, ``train/global_step``) -> step; a ``time`` (or
                       ``timestamp``) in Unix seconds is the job's own time of the
                       step (``at``, decision 0320), a ``rank`` the rank that said it
``megatron``           `` [..] iteration      120/   10000 | ... | lm loss: 2.3E+00 |``
                       -> step 120
``torchtitan``         ``step:  5  loss:  8.1234  memory: ...`` (ANSI colours removed)
                       -> step 5
``epoch``              ``Epoch [1/10], Step [100/600]``, ``Train Epoch: 1 [640/60000]``,
                       ``[GPU0] Epoch 6 | Batchsize: 32 | Steps: 64`` -> liveness with
                       the epoch
=====================  =============================================================

:class:`ProgressLineParser` keeps one piece of state: which bar is the step
counter (the first step-like bar seen); reset it with :meth:`ProgressLineParser.reset`.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass
from typing import Any

# "step 20.0" is no step counter: it is how Slurm names a job step (job 20, step 0:
# "*** STEP 20.0 ON n1 CANCELLED ...", printed into the job's output when it dies).
DEFAULT_PROGRESS_PATTERN = (
    r"(?i)(?:\b(?:step|iter(?:ation)?)\b\s*[=:#]?\s*(?P<step>\d++)(?!\.\d))"
    r"|(?:\[\s*(?P<frac>\d+)\s*/\s*\d+\s*\])"
)

_DIGIT = re.compile(r"[0-9]")
# A JSON or dict line longer than this is not a log record: do not parse it.
_MAX_RECORD = 8192


class ProgressKind(enum.Enum):
    STEP = "step"  # the global step counter
    LIVENESS = "liveness"  # the job is working; the number (if any) is not the global step
    CHECKPOINT = "checkpoint"  # a checkpoint loaded or saved at a step: no step trained


@dataclass(frozen=True)
class ProgressReading:
    """What one line of output says about progress."""

    kind: ProgressKind
    form: str  # "pattern", "tqdm", "rich", "hf_log", "json", "megatron", "torchtitan", "epoch"
    step: int | None = None  # the global step; set only when kind is STEP
    count: int | None = None  # a bar's or counter's current value, whatever it counts
    total: int | None = None  # its total, when printed
    epoch: float | None = None
    loss: float | None = None
    label: str = ""  # a bar's description
    # The job's own time of the step (a JSON record's Unix-seconds ``time``), and the
    # rank the record names: a step rate on the job's clock (decision 0320).
    at: float | None = None
    rank: int | None = None
    event: str = ""  # a CHECKPOINT reading's "load" or "save"
    grad_norm: float | None = None  # a record's ``grad_norm`` (training health, 0520)
    # A run's summary (Trainer's ``train_runtime`` record): its loss is the mean of the
    # whole run, no step's, and says nothing of training health.
    summary: bool = False

    @property
    def has_health(self) -> bool:
        """The line carries a step's loss or gradient norm (training health reads it)."""
        return not self.summary and (self.loss is not None or self.grad_norm is not None)

    @property
    def is_step(self) -> bool:
        return self.kind is ProgressKind.STEP

    @property
    def is_liveness(self) -> bool:
        """The job is working, and the line names no step it trained: a bar, a logged
        loss, a checkpoint being saved. Not a step (counted as one), not a checkpoint
        being loaded (start-up: a restart that loads is not yet training)."""
        return self.kind is ProgressKind.LIVENESS or (
            self.kind is ProgressKind.CHECKPOINT and self.event == "save"
        )

    @property
    def token(self) -> tuple[object, ...]:
        """What the reading shows; equal tokens are the same frame drawn again."""
        return (self.form, self.label, self.count, self.total, self.epoch, self.loss)


# --- preprocessing ---------------------------------------------------------------------

# CSI sequences (colours, cursor moves) and OSC titles: torchtitan colours its
# metrics line, and an escape glued to a word hides the word boundary.
_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_RANK = re.compile(r"^\s*\[(?:rank|default)\d+\]:\s?")


def clean_line(line: str) -> str:
    """The line without ANSI escapes and torchrun's ``[rankN]:`` prefix."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return _RANK.sub("", line, count=1)


# --- numbers -------------------------------------------------------------------------------


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and value >= 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


# --- records: JSON lines and Trainer's log dicts -------------------------------------------

_STEP_KEYS = ("global_step", "step", "iteration", "iter", "num_steps", "train_step")
_LOSS_KEYS = ("loss", "train_loss", "lm_loss", "training_loss")
_LOG_KEYS = ("loss", "learning_rate", "lr", "grad_norm", "epoch", "train_loss", "eval_loss")
# Trainer prints str(dict) of its logs; since transformers 5 floats are pre-formatted
# strings ('0.6931'). A value is a quoted string, a number, or numpy's repr of one.
_PY_PAIR = re.compile(
    r"""['"](?P<key>[^'"]{1,80})['"]\s*:\s*(?:np\.\w+\()?"""
    r"""(?P<value>'[^']*'|"[^"]*"|[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf)|True|False|None)"""
)


def _key_name(key: str) -> str:
    # "train/global_step" and "trainer.global_step" name the same counter.
    return re.split(r"[/.]", key.strip().lower())[-1]


_TIME_KEYS = ("time", "timestamp")
# A "time" below this (2001-09-09) is not a Unix time: frameworks log a step's duration
# as "time" too (mmengine's 0.21), and a duration is no clock.
_MIN_UNIX_TIME = 1e9


def _job_time(named: dict[str, Any]) -> float | None:
    for key in _TIME_KEYS:
        t = _as_float(named.get(key))
        if t is not None and math.isfinite(t) and t >= _MIN_UNIX_TIME:
            return t
    return None


def _from_record(record: dict[str, Any], form: str) -> ProgressReading | None:
    named: dict[str, Any] = {}
    for key, value in record.items():
        named.setdefault(_key_name(str(key)), value)
    epoch = _as_float(named.get("epoch"))
    loss = next((_as_float(named[k]) for k in _LOSS_KEYS if k in named), None)
    grad_norm = _as_float(named.get("grad_norm"))
    for key in _STEP_KEYS:
        step = _as_int(named.get(key))
        if step is not None:
            timed = form == "json"  # Trainer's dicts carry no clock
            return ProgressReading(
                ProgressKind.STEP,
                form,
                step=step,
                count=step,
                epoch=epoch,
                loss=loss,
                at=_job_time(named) if timed else None,
                rank=_as_int(named.get("rank")) if timed else None,
                grad_norm=grad_norm,
            )
    if any(k in named for k in _LOG_KEYS):
        return ProgressReading(
            ProgressKind.LIVENESS,
            form,
            epoch=epoch,
            loss=loss,
            grad_norm=grad_norm,
            summary="train_runtime" in named,
        )
    return None


def _read_record(text: str) -> ProgressReading | None:
    s = text.strip()
    if not (s.startswith("{") and s.endswith("}")) or len(s) > _MAX_RECORD:
        return None
    try:
        data = json.loads(s)
    except ValueError:
        data = None
    if isinstance(data, dict):
        return _from_record(data, "json")
    pairs: dict[str, Any] = {}
    for m in _PY_PAIR.finditer(s):
        value = m.group("value")
        if value[:1] in "'\"":
            value = value[1:-1]
        pairs.setdefault(m.group("key"), value)
    return _from_record(pairs, "hf_log") if pairs else None


# --- progress bars -------------------------------------------------------------------------

_SCALED = r"\d+(?:\.\d+)?[kMGTPEZY]?"
# tqdm's default layout "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<
# {remaining}, {rate_fmt}{postfix}]" (Lightning's BAR_FORMAT is the same with rate_noinv).
_TQDM = re.compile(
    r"^(?P<desc>.*?)\s*(?P<pct>\d{1,3})%\|(?P<bar>[^|]*)\|\s*"
    rf"(?P<n>{_SCALED})/(?P<total>{_SCALED}|\?)\s*(?:\[(?P<meta>[^\]]*)\]?)?"
)
# Without a total: "{desc}: {n_fmt}{unit} [{elapsed}, {rate_fmt}{postfix}]".
_TQDM_NO_TOTAL = re.compile(
    rf"^(?P<desc>.*?)\s*(?P<n>{_SCALED})(?P<unit>[A-Za-z_]+) "
    r"\[(?P<meta>\d+:\d\d(?::\d\d)?(?:,[^\]]*)?)\]?"
)
# tqdm's rate_fmt is "{rate:5.2f}{unit}/s" or "{1/rate:5.2f}s/{unit}"; datasets' unit
# carries a leading space ("12345.67 examples/s").
_RATE_UNIT = re.compile(
    r"(?:\?|\d+(?:\.\d+)?[kMGTPEZY]?) ?(?P<unit>[A-Za-z_]+)/s|s/(?P<inv>[A-Za-z_]+)"
)
_POSTFIX_PAIR = re.compile(r"(?P<key>[\w/.]+)\s*[=:]\s*(?P<value>[-+]?\d+\.?\d*(?:[eE][-+]?\d+)?)")
# Descriptions under which a bar counts optimizer steps; any other description
# (Map, Saving, Loading checkpoint shards, Validation, Evaluating, Writing, ...) is
# some other work, and a description naming an epoch marks a per-epoch bar.
_STEP_DESC = re.compile(
    r"^(?:train(?:ing)?|steps?|iter(?:ation)?s?|global[ _]?steps?|optimi[sz]ation steps?|"
    r"updates?|train steps?|training steps?)?$",
    re.IGNORECASE,
)
_STEP_UNITS = frozenset({"it", "step", "steps", "iter", "iters"})
_EPOCH = re.compile(r"(?i)\bepoch\b\s*[:=#]?\s*\[?\s*(?P<epoch>\d+)")
# Rich draws bars with these box characters (Lightning's RichProgressBar among others).
_RICH_BAR = re.compile(r"[━╸╺╾╼]{2,}|[━╸╺]\s")
_RICH_COUNT = re.compile(r"(?P<n>\d+)/(?P<total>\d+|--)")
_RICH_METRIC = re.compile(r"(?P<key>[\w/.]*loss)\s*:\s*(?P<value>[-+]?\d+\.?\d*(?:[eE][-+]?\d+)?)")


def _unscaled(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _loss_in(text: str, pattern: re.Pattern[str]) -> float | None:
    for m in pattern.finditer(text):
        if m.group("key").lower().split("/")[-1].endswith("loss"):
            return float(m.group("value"))
    return None


def _epoch_in(text: str) -> float | None:
    m = _EPOCH.search(text)
    return float(m.group("epoch")) if m else None


# --- explicit step forms -------------------------------------------------------------------

# Megatron's training_log: " [when] iteration      120/   10000 | consumed samples: ...".
_MEGATRON = re.compile(r"\biteration\s+(?P<n>\d+)\s*/\s*(?P<total>\d+)\s*\|")
_MEGATRON_LOSS = re.compile(r"\blm loss:\s*(?P<loss>[-+]?\d+\.?\d*(?:[eE][-+]?\d+)?)")
# torchtitan's metrics line: "step:  5  loss:  8.1234  memory: ...".
_TITAN = re.compile(r"\bstep:\s*(?P<n>\d+)\s+loss:\s*(?P<loss>[-+]?\d+\.?\d*(?:[eE][-+]?\d+)?)")
# A counter with its total next to an epoch ("Epoch [1/10], Step [100/600]", MNIST's
# "Train Epoch: 1 [640/60000 (1%)]") counts within the epoch.
_RATIO = re.compile(r"(?P<n>\d+)\s*/\s*(?P<total>\d+)")
# "global step N" / "global_step=N" names the global counter even next to an epoch
# (Lightning's ModelCheckpoint: "Epoch 0, global step 50: 'val_loss' reached ...").
_GLOBAL_STEP = re.compile(r"(?i)\bglobal[ _]step\b\s*[=:#]?\s*(?P<n>\d+)")
_GENERIC_LOSS = re.compile(r"(?i)\bloss\b\s*[=:]?\s*(?P<loss>[-+]?\d+\.?\d*(?:[eE][-+]?\d+)?)")


_CHECKPOINT_NAME = re.compile(
    r"[\w.=~+-]*\.(?:ckpt|pt|pth|bin|safetensors|distcp|pkl)\b|\bcheckpoint-\d+\b"
)


# A checkpoint loaded or saved (decision 0497): a verb and "checkpoint" in one line, or
# the Trainer's "Continuing training from global step N" (its resume banner).
_CKPT_NOUN = re.compile(r"(?i)\b(?:checkpoint|ckpt)s?\b")
_CKPT_VERB = re.compile(
    r"(?i)\b(?:(?P<load>load(?:s|ed|ing)?|restor(?:e|es|ed|ing)|resum(?:e|es|ed|ing))"
    r"|(?P<save>sav(?:e|es|ed|ing)|writ(?:e|es|ing|ten)|stag(?:e|ed|ing)))\b"
)
_CONTINUING = re.compile(r"(?i)\bcontinuing training from\b")


def checkpoint_event(text: str) -> str:
    """``"load"`` or ``"save"`` when ``text`` says a checkpoint was loaded or saved, else ``""``."""
    if _CONTINUING.search(text):
        return "load"
    if _CKPT_NOUN.search(text) is None:
        return ""
    verb = _CKPT_VERB.search(text)
    if verb is None:
        return ""
    return "load" if verb.group("load") else "save"


def _loss(text: str) -> float | None:
    m = _GENERIC_LOSS.search(text)
    return float(m.group("loss")) if m else None


class ProgressLineParser:
    """Read the progress a line of job output reports (see the module docstring).

    ``pattern`` (``--progress-pattern``) replaces the stock step forms: its named
    group ``step``, else its first non-empty group, is the step; the other forms
    still give liveness. :meth:`read` returns the full :class:`ProgressReading`;
    :meth:`parse` only the step, for callers that need nothing else.
    """

    def __init__(self, pattern: str | None = None) -> None:
        try:
            self.regex = re.compile(pattern or DEFAULT_PROGRESS_PATTERN)
        except re.error as exc:
            raise ValueError(f"bad progress pattern {pattern!r}: {exc}") from exc
        if self.regex.groups == 0:
            raise ValueError(f"progress pattern {pattern!r} needs a group capturing the step")
        self.custom = pattern is not None
        # (description with digits blanked, total) of the bar that counts steps.
        self._step_bar: tuple[str, str] | None = None

    def reset(self) -> None:
        """Forget which bar counts steps (e.g. before a different command runs)."""
        self._step_bar = None

    def parse(self, line: str) -> int | None:
        """The global step the line reports, or None (also for liveness-only lines)."""
        reading = self.read(line)
        return reading.step if reading is not None and reading.is_step else None

    def read(self, line: str) -> ProgressReading | None:
        """What the line says about progress, or None when it says nothing."""
        if "\r" in line:
            # Not split upstream: the last drawn segment is what the terminal shows.
            for part in reversed(line.split("\r")):
                if part.strip():
                    line = part
                    break
        text = clean_line(line)
        if _DIGIT.search(text) is None:
            return None
        if self.custom:
            step = self._match(text)
            if step is not None:
                return ProgressReading(
                    ProgressKind.STEP, "pattern", step=step, count=step, loss=_loss(text)
                )
            stock = self._stock(text)
            if stock is not None and stock.is_step:
                return _as_liveness(stock)
            return stock
        return self._stock(text)

    def _match(self, text: str) -> int | None:
        m = self.regex.search(text)
        if not m:
            return None
        value = m.groupdict().get("step")
        if value is None:
            value = next((g for g in m.groups() if g is not None), None)
        return _as_int(value)

    def _stock(self, text: str) -> ProgressReading | None:
        reading = self._stock_forms(text)
        if reading is None or not reading.is_step or reading.form in ("json", "tqdm"):
            return reading
        if reading.loss is not None:
            return reading  # a loss was computed: a step was trained, whatever else is said
        event = checkpoint_event(text)
        if not event:
            return reading
        return ProgressReading(
            ProgressKind.CHECKPOINT,
            reading.form,
            count=reading.step,
            total=reading.total,
            epoch=reading.epoch,
            event=event,
        )

    def _stock_forms(self, text: str) -> ProgressReading | None:
        # Every line of output passes here: substring tests (C speed) decide which
        # patterns can match at all, so an ordinary log line costs a few microseconds.
        if text.lstrip().startswith("{"):
            record = _read_record(text)
            if record is not None:
                return record
        bar = self._bar(text)
        if bar is not None:
            return bar
        if "." in text or "checkpoint-" in text:
            # A checkpoint's name is not progress: "Restoring states from the checkpoint
            # path at out/epoch=0-step=20.ckpt" says nothing about the step now running.
            text = _CHECKPOINT_NAME.sub(" ", text)
        low = text.lower()
        has_step, has_iter, has_epoch = "step" in low, "iter" in low, "epoch" in low
        if not (has_step or has_iter or has_epoch or "[" in text or self.custom):
            return None
        if has_iter and (m := _MEGATRON.search(text)) is not None:
            lm = _MEGATRON_LOSS.search(text)
            n = int(m.group("n"))
            return ProgressReading(
                ProgressKind.STEP,
                "megatron",
                step=n,
                count=n,
                total=int(m.group("total")),
                loss=float(lm.group("loss")) if lm else None,
            )
        if has_step and (m := _TITAN.search(text)) is not None:
            n = int(m.group("n"))
            return ProgressReading(
                ProgressKind.STEP, "torchtitan", step=n, count=n, loss=float(m.group("loss"))
            )
        if has_step and (m := _GLOBAL_STEP.search(text)) is not None:
            n = int(m.group("n"))
            return ProgressReading(
                ProgressKind.STEP, "pattern", step=n, count=n, epoch=_epoch_in(text)
            )
        epoch = _EPOCH.search(text) if has_epoch else None
        if epoch is not None:
            # Everything counted next to an epoch is counted within it, unless it is
            # a bare "step N" without a total (a global counter printed per epoch).
            rest = text[: epoch.start()] + " " + text[epoch.end() :]
            ratio = _RATIO.search(rest)
            step = None if ratio else self._match(rest)
            if step is not None:
                return ProgressReading(
                    ProgressKind.STEP,
                    "pattern",
                    step=step,
                    count=step,
                    epoch=float(epoch.group("epoch")),
                    loss=_loss(text),
                )
            return ProgressReading(
                ProgressKind.LIVENESS,
                "epoch",
                count=int(ratio.group("n")) if ratio else None,
                total=int(ratio.group("total")) if ratio else None,
                epoch=float(epoch.group("epoch")),
                loss=_loss(text),
            )
        step = self._match(text)
        if step is not None:
            return ProgressReading(
                ProgressKind.STEP, "pattern", step=step, count=step, loss=_loss(text)
            )
        return None

    def _bar(self, text: str) -> ProgressReading | None:
        m = _TQDM.search(text) if "%|" in text else None
        if m is not None:
            meta = m.group("meta") or ""
            rate = _RATE_UNIT.search(meta)
            # No readable rate: the unit is unknown, so the bar is not taken for steps.
            unit = (rate.group("unit") or rate.group("inv")) if rate else ""
            return self._classify_bar(m.group("desc"), m.group("n"), m.group("total"), unit, meta)
        m = _TQDM_NO_TOTAL.search(text) if " [" in text and "/" in text else None
        if m is not None:
            return self._classify_bar(
                m.group("desc"), m.group("n"), None, m.group("unit"), m.group("meta")
            )
        rich = _RICH_BAR.search(text) if ("━" in text or "╸" in text or "╺" in text) else None
        if rich is not None:
            # The count follows the bar ("Epoch 3/9 ━━━ 4/10"): the epoch's own "3/9" is not it.
            count = _RICH_COUNT.search(text, rich.end())
            return ProgressReading(
                ProgressKind.LIVENESS,
                "rich",
                count=int(count.group("n")) if count else None,
                total=_unscaled(count.group("total")) if count else None,
                epoch=_epoch_in(text),
                loss=_loss_in(text, _RICH_METRIC),
                label=text[: rich.start()].strip(),
            )
        return None

    def _classify_bar(
        self, desc: str, n_text: str, total_text: str | None, unit: str, meta: str
    ) -> ProgressReading:
        form = "tqdm"
        label = desc.strip().rstrip(":").strip()
        n = _unscaled(n_text)
        total = _unscaled(total_text) if total_text else None
        loss = _loss_in(meta, _POSTFIX_PAIR)
        epoch = _epoch_in(label)
        live = ProgressReading(
            ProgressKind.LIVENESS, form, count=n, total=total, epoch=epoch, loss=loss, label=label
        )
        step_like = (
            n is not None
            # Without a total only a bar that says it counts steps is taken for steps.
            and (total is not None if total_text else label != "")
            and unit in _STEP_UNITS
            and epoch is None
            and _STEP_DESC.match(label) is not None
        )
        if not step_like or n is None:
            return live
        key = (re.sub(r"\d+", "#", label.lower()), total_text or "")
        if self._step_bar is None:
            # The first step-like bar is the step counter; HF's evaluation bar, also
            # without a description, opens later and stays liveness.
            self._step_bar = key
        if key != self._step_bar or n == 0:
            # 0/N is a bar that has just opened: nothing done yet, not "step 0".
            return live
        return ProgressReading(
            ProgressKind.STEP, form, step=n, count=n, total=total, loss=loss, label=label
        )


def _as_liveness(reading: ProgressReading) -> ProgressReading:
    return ProgressReading(
        ProgressKind.LIVENESS,
        reading.form,
        count=reading.count,
        total=reading.total,
        epoch=reading.epoch,
        loss=reading.loss,
        label=reading.label,
        grad_norm=reading.grad_norm,
        summary=reading.summary,
    )


__all__ = [
    "DEFAULT_PROGRESS_PATTERN",
    "ProgressKind",
    "ProgressLineParser",
    "ProgressReading",
    "checkpoint_event",
    "clean_line",
]
