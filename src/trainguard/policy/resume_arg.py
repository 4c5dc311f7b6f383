"""``--resume-arg``: the arguments that hand a restart its checkpoint, for jobs that do
not look for one themselves (decision 0142).

A template names ``{checkpoint}``; it is split as a shell would split it and appended
to the command of every restart that restores a checkpoint, the path substituted per
token (a path with spaces stays one argument). Attempt 0, and a restart that restores
nothing, run the command as written. Pure: the launcher (``trainguard run``'s local
cluster) applies it (decision 0393).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence


def resume_arg_tokens(template: str) -> tuple[str, ...]:
    """``--resume-arg`` split as a shell would; raises ``ValueError`` with the fix."""
    try:
        tokens = tuple(shlex.split(template))
    except ValueError as exc:
        raise ValueError(f"--resume-arg {template!r}: {exc}") from None
    if not tokens or not any("{checkpoint}" in t for t in tokens):
        raise ValueError(
            f"--resume-arg {template!r} must name {{checkpoint}}, e.g. "
            "'--resume_from_checkpoint {checkpoint}' or 'ckpt_path={checkpoint}'"
        )
    return tokens


def resume_command(
    command: Sequence[str], template: str | None, checkpoint: str | None
) -> tuple[str, ...]:
    """The command of an attempt: as written, plus ``--resume-arg`` when it restores
    ``checkpoint`` (substituted per token, so a path with spaces stays one argument)."""
    if template is None or checkpoint is None:
        return tuple(command)
    extra = tuple(t.replace("{checkpoint}", checkpoint) for t in resume_arg_tokens(template))
    return (*command, *extra)


__all__ = ["resume_arg_tokens", "resume_command"]
