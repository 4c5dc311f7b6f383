"""What ``trainguard run`` tells the person its job waits for: the command that answers.

The engine asks for an approval as serve does (a pending row under the plan action's
key, audited as requested, decisions 0341, 0346); the audit line says *that* it asks.
A local run has no dashboard and no API, so the person needs the command line that
answers it, with the state database this run uses. That hint is the driver's alone
(serve's users answer through the API or ``trainguard approve`` against their own
database), so it is formatted here, once per approval per driver, from the pass
report's ``waiting`` ids: a run resumed while an approval is still pending prints it
again, as the question is still open (decision 0393).
"""

from __future__ import annotations

import shlex

from trainguard.model.fleet import Approval


def approval_prompt(approval: Approval, state: str, timeout: float | None = None) -> str:
    """The line that asks a person, naming the command that answers the question and,
    with a deadline, how long the question stays open (no answer is a no, 0425)."""
    where = f"incident {approval.incident_id}: " if approval.incident_id is not None else ""
    until = "" if timeout is None else f"; no answer in {timeout:g} s is a no"
    return (
        f"trainguard: {where}the {approval.kind} waits for a person: {approval.why}; "
        f"answer with `trainguard approve {approval.id} --state {shlex.quote(state)} "
        f"--reason ...` (add --deny to refuse){until}"
    )


__all__ = ["approval_prompt"]
