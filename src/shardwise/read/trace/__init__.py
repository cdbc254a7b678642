"""``shardwise trace``: which documents, by file and line, a global step read.

:func:`trace` / :class:`Tracer` (:mod:`.core`), the look-ups they use (:mod:`.examples`,
:mod:`.lines`) and the per-step source mix behind ``trace --plot`` (:mod:`.plot`).
"""

from shardwise.read.trace.core import Piece, StepTrace, TracedExample, Tracer, trace
from shardwise.read.trace.lines import Where

__all__ = ["Piece", "StepTrace", "TracedExample", "Tracer", "Where", "trace"]
