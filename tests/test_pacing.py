"""The daemon paces its clients, and real client processes follow it; a flush or a close never waits it out.

The daemon here paces at once and hard (`--pace-messages 0.001`: any message is over it; `--pace-max-linger
3600`): each client is asked to let a partial batch wait some 1,000 s, and allows it (`max_linger_secs=3600`).
Each of two `SummaryWriter` processes then holds a new scalar back (the pacing followed: the client's own
linger is 50 ms), and `flush(timeout=60)` and `close(timeout=60)` deliver everything well within a linger.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _support import start_daemon, steps_in
from summaryd.client._options import ClientOptions
from summaryd.client._sender._pacing import Pacing
from summaryd.server.sessions.pacing import MANY_STREAMS, PACED_IN_FLIGHT, STARVED_HOLD, STARVED_LAG, Pacer

CLIENT = textwrap.dedent(
    """
    import json, sys, time
    from summaryd.client import SummaryWriter

    address, rank = sys.argv[1], int(sys.argv[2])
    writer = SummaryWriter("paced", address=address, worker=f"rank-{rank}", world_size=2, max_linger_secs=3600)
    for step in range(3):  # each flush waits for its ack, the first of which tells the pacing
        writer.add_scalar("loss", float(step), step)
        assert writer.flush(timeout=60).undelivered == 0
        time.sleep(0.6)  # past the daemon's window: it counts the messages a second
    writer.add_scalar("loss", 3.0, 3)
    time.sleep(2.0)  # 40 times the client's own linger: unpaced, the scalar would have been acknowledged
    held = writer.flush().undelivered  # what is known now; the flush sends it at once
    flushed = writer.flush(timeout=60)
    for step in range(4, 8):
        writer.add_scalar("loss", float(step), step)
    closed = writer.close(timeout=60)
    print(json.dumps({"held": held, "flushed": flushed.undelivered, "closed": closed.ok}))
    """
)


def test_clients_follow_the_pacing_and_flush_and_close_never_wait_it_out(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--pace-messages", "0.001", "--pace-max-linger", "3600")
    try:
        clients = [
            subprocess.Popen(
                [sys.executable, "-c", CLIENT, daemon.address, str(rank)], stdout=subprocess.PIPE, text=True
            )
            for rank in range(2)
        ]
        results = [json.loads(client.communicate(timeout=120)[0].strip().splitlines()[-1]) for client in clients]
        assert [client.returncode for client in clients] == [0, 0]
    finally:
        daemon.stop()
    for rank, result in enumerate(results):
        assert result == {"held": 1, "flushed": 0, "closed": True}, f"rank {rank}"
        assert steps_in(daemon.logdir / "paced" / f"rank-{rank}") == list(range(8))


def test_a_daemon_paces_only_past_half_its_rate_and_lifts_it_below_a_quarter() -> None:
    now = [0.0]
    pacer = Pacer(1000.0, clock=lambda: now[0])
    for _ in range(MANY_STREAMS - 1):
        pacer.opened()
    assert (pacer.pacing.linger_seconds, pacer.pacing.max_in_flight) == (0.0, 0)
    for _ in range(256 - MANY_STREAMS + 1):  # many streams: fewer batches in flight at once, no linger yet
        pacer.opened()
    assert (pacer.pacing.linger_seconds, pacer.pacing.max_in_flight) == (0.0, PACED_IN_FLIGHT)

    def feed(messages: int) -> None:  # one second of `messages`
        for _ in range(messages):
            now[0] += 1.0 / messages
            pacer.took()

    feed(400)  # under half the rate: the clients' own linger
    assert (pacer.pacing.linger_seconds, pacer.pacing.max_in_flight) == (0.0, PACED_IN_FLIGHT)
    feed(1280)  # 256 ranks at 5 steps/s: about 256 / 1000 s each, the next step
    assert (pacer.pacing.linger_seconds, pacer.pacing.max_in_flight) == (0.3, PACED_IN_FLIGHT)
    told = pacer.version
    feed(300)  # paced, above a quarter: it stays, and no stream is told again
    assert pacer.pacing.linger_seconds == 0.3 and pacer.version == told
    feed(200)
    assert pacer.pacing.linger_seconds == 0.0 and pacer.version == told + 1


def test_a_daemon_starved_of_cpu_paces_though_it_takes_few_messages() -> None:
    """The messages taken are what a starved daemon got round to: its late event loop says more was offered."""
    now = [0.0]
    pacer = Pacer(1000.0, clock=lambda: now[0])
    for _ in range(1024):
        pacer.opened()
    for _ in range(50):  # 100 messages a second taken: a tenth of the pace, under half of it
        now[0] += 0.01
        pacer.took()
    assert pacer.pacing.linger_seconds == 0.0
    pacer.lagged(0.1)  # a loop a little late is no sign
    assert pacer.pacing.linger_seconds == 0.0
    pacer.lagged(STARVED_LAG)
    # 1,024 streams over a pace of 1,000: 1 s (1,024 messages a second, within a quarter over the pace)
    assert (pacer.pacing.linger_seconds, pacer.pacing.max_in_flight) == (1.0, PACED_IN_FLIGHT)
    now[0] += STARVED_HOLD / 2  # the calm the pacing brings does not lift it within the hold
    pacer.lagged(0.0)
    assert pacer.pacing.linger_seconds == 1.0
    now[0] += STARVED_HOLD
    pacer.lagged(0.0)
    assert pacer.pacing.linger_seconds == 0.0


def test_the_users_bound_caps_the_linger_and_reads_its_variable() -> None:
    options = ClientOptions.make(address="localhost:6065", environ={"SUMMARYD_MAX_LINGER": "0.5"})
    assert options.max_linger_secs == 0.5
    pacing = Pacing(options)
    pacing.advise(2.0, 2)
    assert (pacing.linger_secs, pacing.max_in_flight) == (0.5, 2)
    pacing.advise(0.0, 0)  # the daemon lifted it: the client's own settings again
    assert (pacing.linger_secs, pacing.max_in_flight) == (options.linger_secs, options.max_in_flight)
    with pytest.raises(ValueError, match="SUMMARYD_MAX_LINGER"):
        ClientOptions.make(address="localhost:6065", environ={"SUMMARYD_MAX_LINGER": "soon"})
