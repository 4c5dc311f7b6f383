"""The recovery engine behind ``Reconciler``, split by concept (decision 0211).

One class chain, each part in its own module and building on the one before:
``core`` (state, shared store reads) -> ``evidence`` (output following,
findings, attribution) -> ``health`` (inventory, health enforcement, idle-card
quarantine) -> ``attempts`` (attempt sync, failure detection) -> ``snapshot``
(decide()'s and step()'s snapshots, planning) -> ``actions`` (each action kind
against the scheduler) -> ``executor`` (the one executor of step()'s steps);
``controller/reconcile.py`` is the pass driver on top. The engine imports no
driver, no ``api`` and no concrete scheduler (tests/unit/test_layering.py).
"""
