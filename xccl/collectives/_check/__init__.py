"""The collective-mismatch detector: ``xccl.init(check=True)`` or ``XCCL_CHECK=1``, cheap enough to leave on.

Every rank records each collective it issues *locally*: an interned fingerprint (op, group, tensors' dtypes and
shapes, reduce op, root, split sizes) in a bounded ring, and a rolling hash of the group's sequence of calls
(:mod:`._record`). A call that the group has made before costs a dict lookup and a few integer operations: no
communication, no lock, no string. Mismatches are found off that path, through the rendezvous store (a side
channel that never touches the collective stream, :mod:`._channel`):

* **the first call of its kind** on a group (a fingerprint new there: a new shape, op or reduce op, where most
  mismatches start) is compared with every member's call before it is issued (:mod:`._run`); ranks whose
  histories agree see the same calls as new, so they take this path together, once per distinct call;
* **in the background**, a thread per process publishes the rolling hashes every ``interval`` (0.5 s) and
  compares them with its ring neighbours'; hashes that differ make every member publish its recent steps, and
  the first step whose calls differ is reported (:mod:`._detector`, :mod:`._analysis`). This finds mismatches
  that do not stall (``SUM`` on one rank, ``MAX`` on another, the same shape);
* **when a wait stalls** past ``min(2 s, timeout / 4)``, the rank publishes the call it waits in and reads the
  records of the ranks it waits for: the same step called differently, or ranks waiting for each other in
  different groups (a call-order deadlock), is a mismatch;
* **when the backend fails** (gloo's size check, a peer's connection closing because of a mismatch), what the
  members published is consulted for a second before the fault is translated.

Whoever finds a mismatch publishes it once (the first verdict of a group stands) and every member raises the same
:class:`~xccl.CollectiveMismatch`, naming each rank's call: from the wait it is in, or at its next call. The
group cannot be used afterwards (its collectives may have been issued). A dead or silent peer is never a
mismatch: a verdict is drawn only from two readable calls that differ; the fault stays a
:class:`~xccl.PeerFailure` or :class:`~xccl.CollectiveTimeout`.

Not covered: point-to-point ``send``/``recv`` (no group-wide step); a mismatch between two calls that each rank
has already made on the group *and* whose sizes differ is found only after the backend moved data (on gloo, the
receiving process aborts: the survivors see the peer fail). Costs are measured by ``benchmarks/detector.py``
(``docs/performance.md``).
"""

from ._fingerprint import Call, decode, disagreement, encode
from ._run import CheckedWork, checked, hook

__all__ = ["Call", "CheckedWork", "checked", "decode", "disagreement", "encode", "hook"]
