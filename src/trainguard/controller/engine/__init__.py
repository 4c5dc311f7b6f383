"""The recovery engine behind ``Reconciler``: components, composed (decisions 0211, 0430).

``core`` (the shared services and store reads, :class:`~.core.EngineCore`; every
component is a :class:`~.core.Part` over it); ``evidence`` (output following,
findings, attribution), ``health`` (inventory, health enforcement, idle-card
quarantine), ``attempts`` (attempt sync, failure detection), ``snapshot`` (the
planner: decide()'s and step()'s snapshots, the recorded plan), ``actions`` (each
action kind against the scheduler) and ``executor`` (the one executor of step()'s
steps) are separate objects; ``controller/reconcile.py`` composes them and drives
the pass. Each keeps its own caches (they only save work); what one pass shares
travels in its :class:`~.context.PassContext`. The engine imports no driver, no
``api`` and no concrete scheduler (tests/unit/test_layering.py).
"""
