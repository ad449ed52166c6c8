"""The public collectives: where the eager path and the graph path meet.

Every function here has ``torch.distributed``'s signature and semantics and does one thing: while
``torch.compile`` traces, it hands over to the op's graph form (``xccl.graph``); otherwise it dispatches
(``xccl.collectives``). Both validate with the op's one description (``xccl.ops._specs``), so a bad call
raises the same typed error in both modes.

Each module's ``__all__`` lists its functions: torch's collectives, xccl's extensions (the coalesced and uneven
forms), point-to-point.
"""

from . import _collectives, _extensions, _p2p
from ._collectives import *  # noqa: F403
from ._extensions import *  # noqa: F403
from ._p2p import *  # noqa: F403

__all__ = [*_collectives.__all__, *_extensions.__all__, *_p2p.__all__]
