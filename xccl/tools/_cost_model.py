"""Predicted communication time of one collective call, from a plugin's :class:`~xccl.plugin._cost.CostModel`."""

from __future__ import annotations

from dataclasses import dataclass

from ..ops._vocab import Collective
from ..plugin._cost import CostModel, bus_factor

__all__ = ["Prediction", "predict"]


@dataclass(frozen=True, slots=True)
class Prediction:
    """The predicted time of one call.

    Attributes:
        seconds: the prediction, or None when the model lacks a figure it needs.
        why: how it was computed, or which figure is unknown.
        source: the source of the figures used.
    """

    seconds: float | None
    why: str
    source: str = ""


def predict(model: CostModel | None, op: Collective, nbytes: int, group_size: int, *, intra_node: bool) -> Prediction:
    """``latency + nbytes * bus_factor(op, n) / busbw`` over the link the group uses.

    Args:
        model: the vendor's model (None: the plugin publishes none).
        op: the native op that runs (an emulated call is predicted part by part).
        nbytes: the bytes of one rank's buffer, as nccl-tests counts them (all_gather: the output's).
        group_size: the ranks in the group.
        intra_node: whether every rank of the group is on one node.
    """
    if model is None:
        return Prediction(None, "unknown: the plugin publishes no cost model")
    if group_size <= 1:
        return Prediction(0.0, "a group of one rank communicates nothing")
    link = "intra-node" if intra_node else "inter-node"
    cost = (model.intra if intra_node else model.inter).get(op)
    if cost is None:
        return Prediction(None, f"unknown: {model.generation} has no {link} figure for {op.value}")
    if cost.latency_us is None or cost.busbw_gbps is None:
        missing = "latency" if cost.latency_us is None else "bus bandwidth"
        return Prediction(None, f"unknown: {model.generation}'s {link} {missing} of {op.value}", cost.source)
    factor = bus_factor(op, group_size)
    seconds = cost.latency_us * 1e-6 + nbytes * factor / (cost.busbw_gbps * 1e9)
    why = (f"{cost.latency_us:g} us + {nbytes} B x {factor:.3g} / {cost.busbw_gbps:g} GB/s ({link}, "
           f"{model.generation})")
    return Prediction(seconds, why, cost.source)
