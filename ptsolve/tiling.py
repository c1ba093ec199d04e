"""The tiling: the tile parameters one kernel of an operator is built with, and the facts every layer reads off it.

A tiling maps keys (``BM``, ``BN``, ``BK``, ``depth``, ``groups``, and the optional ``ctas``, ``pingpong``,
``cluster``, ``splits``, ``persistent``, ...) to positive integers. ``Tiling`` is that mapping with its derived
facts as properties. It stays a ``dict`` so that ``t["BM"]``, JSON, equality with plain dicts, pickling and every
cache key written from a tiling are exactly what they were when tilings were plain dicts; the functions below
accept any mapping, because tilings also arrive as plain dicts (JSON, KernelIR, hand plans).

This module is the bottom of the operator vocabulary: the IR, the cost model, the checks, the solvers and the
code generators read tilings through it, never through the operator builders (``ptsolve.ops``).
"""
from __future__ import annotations

from collections.abc import Mapping


def cdiv(a: int, b: int) -> int:
    """Ceiling of a / b for positive b: tiles needed to cover ``a`` in blocks of ``b``."""
    return -(-a // b)


class Tiling(dict[str, int]):
    """A tiling with its derived facts. Equal to, and serialised like, the plain dict of its keys."""

    __slots__ = ()

    @classmethod
    def of(cls, t: Mapping[str, int]) -> Tiling:
        """``t`` itself when it is a Tiling, else a Tiling of its items."""
        return t if isinstance(t, Tiling) else cls(t)

    @property
    def ctas(self) -> int:
        """CTAs of the kernel resident on one SM at once (key ``ctas``, default 1)."""
        return int(self.get("ctas", 1))

    @property
    def pingpong(self) -> bool:
        """Whether two consumer warpgroups alternate tiles (key ``pingpong``, default 0; GEMM): each runs its own
        tile with the graph's tasks, their main loops take the tensor cores in turn, and one's epilogue overlaps the
        other's main loop (CUTLASS's Hopper ping-pong kernel schedule)."""
        return bool(self.get("pingpong", 0))

    @property
    def cluster(self) -> int:
        """CTAs of a thread-block cluster (key ``cluster``, default 1; GEMM): the pair of M-neighbour tiles that
        share their B tile, each loading half of it by TMA multicast into both."""
        return int(self.get("cluster", 1))

    @property
    def slots(self) -> int:
        """Work units an SM runs at once, each one after another in its own slot (ptsolve.placement): the
        co-resident CTAs, times the two warpgroups of a ping-pong kernel, which run their tiles as two slots sharing
        the SM's tensor cores, copy engine and MUFU (the shared-unit floor of ptsolve.placement.shared_floor)."""
        return self.ctas * (2 if self.pingpong else 1)

    def kernel_groups(self, groups: int) -> int:
        """Consumer warpgroups of the kernel: the graph's ``groups`` (the warpgroups of one work unit), twice over
        for a ping-pong kernel (its registers and threads are those of both)."""
        return groups * (2 if self.pingpong else 1)


# The same facts of any mapping: tilings read from JSON, a KernelIR or a hand plan are plain dicts.

def ctas_of(tiling: Mapping[str, int]) -> int:
    """``Tiling.ctas`` of any mapping."""
    return Tiling.of(tiling).ctas


def pingpong_of(tiling: Mapping[str, int]) -> bool:
    """``Tiling.pingpong`` of any mapping."""
    return Tiling.of(tiling).pingpong


def cluster_of(tiling: Mapping[str, int]) -> int:
    """``Tiling.cluster`` of any mapping."""
    return Tiling.of(tiling).cluster


def slots_of(tiling: Mapping[str, int]) -> int:
    """``Tiling.slots`` of any mapping."""
    return Tiling.of(tiling).slots


def kernel_groups(groups: int, tiling: Mapping[str, int]) -> int:
    """``Tiling.kernel_groups`` of any mapping."""
    return Tiling.of(tiling).kernel_groups(groups)
