"""The fencing rule of run leases, by the holder's own clock: no store needed (the bucket side is in
`test_fencing`)."""

from __future__ import annotations

import json

from summaryd.server.leases import Lease, margin


def lease(renewed: float, files: tuple[tuple[str, str], ...] = ()) -> Lease:
    return Lease("run", "a", "127.0.0.1:1", 1e9, "etag", files, renewed=renewed)


def test_a_lease_is_written_under_only_until_its_write_began_plus_the_lease_less_the_margin() -> None:
    duration = 6.0
    assert margin(duration) == 1.0 and margin(30.0) == 5.0
    live = lease(renewed=100.0)
    assert live.live(100.0, duration) and live.live(104.99, duration)
    # Past that, another daemon may judge it expired: a holder woken from a pause writes nothing under it.
    assert not live.live(105.0, duration) and not live.live(150.0, duration)
    # A lease read from the bucket (not written by this daemon) is never written under.
    assert not lease(renewed=0.0).live(0.0, duration)


def test_a_lease_names_one_file_per_directory_and_its_document_keeps_the_names() -> None:
    named = lease(100.0).naming("run", "events.out.tfevents.1").naming("run/w0", "events.out.tfevents.2")
    renamed = named.naming("run", "events.out.tfevents.3")
    assert renamed.files == (("run", "events.out.tfevents.3"), ("run/w0", "events.out.tfevents.2"))
    doc = json.loads(renamed.document())
    assert doc["files"] == [["run", "events.out.tfevents.3"], ["run/w0", "events.out.tfevents.2"]]
    assert "unfenced" not in doc
