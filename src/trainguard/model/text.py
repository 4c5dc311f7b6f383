"""Making untrusted text safe to show on a terminal.

Log lines, agent reports and job output reach people through ``classify``,
``diagnose``, ``report``, ``incidents``, ``audit`` and every table. A line that
carries terminal control sequences could set the window title, clear the
screen, move the cursor or fake whole lines of output. :func:`visible` turns
every such character into a visible escape instead, so what is shown is what
was recorded. JSON output is never passed through here: JSON escapes control
characters itself and must stay exact.
"""

from __future__ import annotations

import re

# C0 controls (ESC, CR, BS, NUL, and also TAB and LF, which would break a field or fake a
# line), DEL and the C1 controls (0x9b is a one-byte CSI on some terminals); the Unicode
# line and paragraph separators; the bidirectional embeddings, overrides and isolates
# (text that displays in a different order than it reads); lone surrogates (from bytes
# decoded with surrogateescape: printing one raises UnicodeEncodeError).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group(0)
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object) -> str:
    """``text`` as one line with every control character written as a visible escape."""
    s = text if isinstance(text, str) else str(text)
    return _UNSAFE.sub(_escape, s)
