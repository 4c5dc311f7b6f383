"""torchelastic's failure summary: which rank each of its lines is about, and which one it
names as the first failure.

After ``ChildFailedError`` torchrun prints one entry per failed rank::

    Failures:
    [1]:
      time      : 2026-12-04_17:27:34
      host      : localhost
      rank      : 1 (local_rank: 1)
      exitcode  : -15 (pid: 13075)  (SIGTERM)
    ------------------------------------------
    Root Cause (first observed failure):
    [0]:
      ...
      exitcode  : -9 (pid: 13074)  (SIGKILL)

The ``exitcode :`` and ``traceback :`` lines of an entry inherit its host, rank and
time. An entry under "Root Cause (first observed failure)" is marked ``root_cause``
(the rank torchrun saw die first: the culprit candidate); one under "Failures:" is
marked ``elastic_failure`` (often a rank torchrun itself sent SIGTERM after the first
death). Pure: one summary's state, fed line by line by the classifier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from trainguard.model.signature import LineMatch

MAX_SUMMARY_LINES = 400

_FIELD_RE = re.compile(r"^\s+(?P<key>time|host|rank)\s*:\s*(?P<value>\S+)")
_ENTRY_RE = re.compile(r"^\[\d+\]:\s*$")
_ROOT_CAUSE_RE = re.compile(r"^\s*Root Cause \(first observed failure\):\s*$")
_FAILURES_RE = re.compile(r"^\s*(?:Other )?Failures:\s*$")


@dataclass
class ElasticSummary:
    """The entry being read of one stream's failure summary."""

    opened: int
    host: str | None = None
    rank: int | None = None
    timestamp: str | None = None
    section: str | None = None  # "root_cause" / "elastic_failure": the heading above
    done: bool = False  # the summary ended: the classifier forgets it

    def line(self, body: str, lineno: int, match: LineMatch | None) -> LineMatch | None:
        """Take one line of the summary's stream; ``match`` with the entry's fields."""
        if lineno - self.opened > MAX_SUMMARY_LINES:
            self.done = True
            return match
        if _ROOT_CAUSE_RE.match(body) or _FAILURES_RE.match(body):
            self.section = "root_cause" if _ROOT_CAUSE_RE.match(body) else "elastic_failure"
            self.host = self.rank = self.timestamp = None
            return match
        if _ENTRY_RE.match(body):
            self.host = self.rank = self.timestamp = None
            return match
        fm = _FIELD_RE.match(body)
        if fm:
            key, value = fm.group("key"), fm.group("value")
            if key == "host":
                self.host = value
            elif key == "rank" and value.isdigit():
                self.rank = int(value)
            elif key == "time":
                self.timestamp = value
            return match
        if body.startswith("=====") and lineno - self.opened > 2 and self.host is not None:
            self.done = True
            return match
        if match is None:
            return None
        details = dict(match.details)
        details["elastic_summary"] = True
        if self.section is not None:
            details[self.section] = True
        return replace(
            match,
            rank=self.rank if self.rank is not None else match.rank,
            host=self.host or match.host,
            timestamp=self.timestamp or match.timestamp,
            details=details,
        )
