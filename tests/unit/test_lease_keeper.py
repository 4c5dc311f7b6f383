"""The controller lease never lapses on our own account (issue 30): a keeper thread
renews it between passes; a holder that stops renewing loses it to the next one, and a
keeper that finds another token drops the lease instead of taking it back."""

from __future__ import annotations

import time

from trainguard.controller.lease import LeaderElector, LeaseKeeper
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

TTL = 0.3


def test_the_keeper_renews_without_passes_and_a_stopped_holder_is_taken_over() -> None:
    store = Store.open(":memory:")
    fleet = FleetStore(store)
    mine = LeaderElector(fleet, "mine", ttl=TTL)
    theirs = LeaderElector(fleet, "theirs", ttl=TTL)
    fence = mine.ensure(time.time())
    assert fence is not None
    keeper = LeaseKeeper(mine, time.time)
    keeper.start()
    try:
        time.sleep(4 * TTL)  # a long step: no pass in between
        assert theirs.ensure(time.time()) is None  # still held, by us
        lease = fleet.lease.get_lease(mine.name)
        assert lease is not None and lease.holder == "mine" and lease.token == fence.token
        assert lease.valid_at(time.time())
    finally:
        keeper.stop()
    time.sleep(2 * TTL)  # nobody renews now: the lease expires
    taken = theirs.ensure(time.time())
    assert taken is not None and taken.token == fence.token + 1
    # Woken up (a paused holder), the keeper must not take it back: it drops ours.
    LeaseKeeper(mine, time.time).renew()
    assert mine.lease is None and mine.fence is None
    lease = fleet.lease.get_lease(mine.name)
    assert lease is not None and lease.holder == "theirs"
    store.close()
