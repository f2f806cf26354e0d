"""The background sender: a bounded queue the caller appends to, and one thread that ships it.

The caller's thread only appends to a deque (`submit`). A named daemon thread, started on the first event,
turns queued items into serialized events, numbers them in batches (sequence numbers 1, 2, ... without
gaps) and streams them to the daemon over one gRPC write stream; an ack thread reads the acknowledgements.

Every numbered batch stays in the sender's *log* until the daemon acknowledges it, and is sent again after a
reconnect; the daemon drops what it already holds (it remembers each session's last sequence number on disk,
also across its own restart), so nothing is written twice and nothing acknowledged is lost. A batch of the
log lives in memory or, *spilled*, in the session's spool on local disk (`_spool`): when the daemon has not
acknowledged anything for `spool_after` seconds, when memory runs over `max_queue_bytes` (policy `spill`),
and when `close()` runs out of time. Spilled batches are read back to be sent when the daemon returns; a
spool left at exit is delivered later by `summaryd replay`.

The parts, each an object with one job, composed by `Sender` (`_sender`, the caller's side and the public
face): the `EventQueue` (`_queue`, events not yet numbered), the `Ledger` (`_ledger`, what became of every
accepted event), the `BatchLog` (`_batch_log`, numbered batches until acknowledged), the `Spiller`
(`_spiller`, batches to and from the spool), the `Connection` (`_connection`, the session over a `Transport`:
`_transport` says what one is, `_grpc_transport` is the one over gRPC), the `Status` (`_status`, closing,
failed, the last error) and the `SenderLoop` (`_loop`, the thread). `_items` and `_report` hold what the queue,
the log and the caller see. The settings come from `ClientOptions` (`summaryd.client._options`), made once.

Nothing here raises into the caller: failures are counted, logged at a limited rate and reported by
`flush`/`close`.
"""

from summaryd.client._options import OVERFLOW_POLICIES, Overflow
from summaryd.client._sender._items import EventSource, Queued
from summaryd.client._sender._report import DeliveryReport
from summaryd.client._sender._sender import Sender
from summaryd.v1.wire import REFUSED_SEQUENCE_KEY, VERSION

__all__ = [
    "OVERFLOW_POLICIES",
    "REFUSED_SEQUENCE_KEY",
    "VERSION",
    "DeliveryReport",
    "EventSource",
    "Overflow",
    "Queued",
    "Sender",
]
