"""Split-KV decode in the serving layer (dense attention of at most ``DECODE_MAX_SEQ_Q`` query positions): classes by
dtype, head_dim, causal and the consumer warpgroups a packed query tile needs, and the binaries each chooses from
per shape (``decode_variants``). A shape's pieces per query tile (which do not change the binary) and its binary are
chosen by the cost model: the classes' solved programs re-timed on the shape's graph for every piece count
(``decode_pick``). A softcap (Gemma-2's capped scores) is a variant of every class, ``.../softcap``: its plain class's
schedule with the cap in its parameters (``OpClasses.derived``: the tanh changes no task's place in the loop), its
kernel built with the cap, its value a launch argument; the shape's pieces are chosen on the graph with the cap (the
tanh priced on the SFU), so a softcap decode step keeps the split over the KV cache."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from ptsolve.errors import PtsolveError, ShapeError

from . import prepared
from .attention import attention_class
from .classes import DTYPES, HW, OpClasses, ShapeClass, register
from .kernels import kernel
from .table import class_program

# iterations of a piece replayed when a decode shape is re-timed, each further one adds the loop's period (a 128k
# cache re-timed in ~10 ms instead of ~0.5 s; the same prediction, tests/serve/test_shape_classes.py)
DECODE_REPLAY_TRIPS = 16
DECODE_REP_SPLITS = 16  # pieces of the decode classes' representative (1 batch x 8 kv heads: 128 piece CTAs)

DECODE_MAX_SEQ_Q = 16  # query positions up to which attention runs the split-KV decode kernel
# head dims the split-KV kernel covers; short queries of the others run the prefill kernel (ptsolve.torch)
DECODE_HEAD_DIMS = (64, 128)


def decode_class(dtype: str, head_dim: int, causal: bool, heads: int, kv_heads: int, seq_q: int,
                 softcap: bool = False) -> ShapeClass:
    """The split-KV decode class of a shape (seq_q <= DECODE_MAX_SEQ_Q): one consumer warpgroup when a query tile
    packs at most 64 rows (the GQA group's heads times the positions), else two; ``softcap``: the class's softcap
    variant (its kernel caps the scores); ShapeError for a head_dim or dtype the kernels do not cover."""
    attention_class(dtype, head_dim, causal, heads, kv_heads)  # the same checks
    if head_dim not in DECODE_HEAD_DIMS:
        raise ShapeError(f"head_dim={head_dim}: the split-KV decode kernel covers head_dim {DECODE_HEAD_DIMS}; "
                         "ptsolve.torch.flash_attention runs short queries of other head dims with the prefill kernel")
    if not 1 <= seq_q <= DECODE_MAX_SEQ_Q:
        raise ShapeError(f"seq_q={seq_q}: the split-KV decode kernel takes 1..{DECODE_MAX_SEQ_Q} query positions")
    groups = 1 if heads // kv_heads * seq_q <= 64 else 2
    return ShapeClass("flash_decode", dtype, int(head_dim), bool(causal), groups=groups, softcap=bool(softcap))


# head dims whose one-warpgroup decode class also has a two-CTAs-per-SM binary: with D 128 the output accumulator
# alone takes 64 of a thread's 128 registers and no such tiling compiles without spills or a serialised wgmma
DECODE_CTAS2_HEAD_DIMS = (64,)


def decode_variants(c: ShapeClass) -> list[ShapeClass]:
    """The binaries a decode class chooses from per shape (``decode_pick``): its own (one CTA per SM, the register
    file reallocated to the consumers) and
    - with one consumer warpgroup and a head dim of DECODE_CTAS2_HEAD_DIMS, two resident CTAs per SM (half the
      register file each: a CTA's fill and drain overlap the other's loop, and a grid of a few hundred short pieces
      fits one wave; bench study torch_decode);
    - with one consumer warpgroup, persistent CTAs (one per SM, each dealing itself (batch, kv head) tiles: the
      producer loads a tile's first K/V blocks while the consumers finish the previous one), for shapes whose tiles
      each take one piece and outnumber the SMs (batch-64 Llama: bench study torch_decode);
    - with two consumer warpgroups (more than 64 packed rows), the one-warpgroup class's own binary, the rows cut
      into 64-row query tiles (twice the CTAs, each K/V tile read by both, the second from L2): Falcon-7B's 71 heads
      per kv head at short caches or batch 1 (bench study torch_decode wg: b1 k1000 7.5 -> 6.2 us). Not its
      two-CTA binary: with two query tiles of one kv head the model's picks of it measured 11-17% slower than the
      two-warpgroup binary on 4 of 19 Falcon shapes (same run)."""
    if c.groups == 1 and c.ctas <= 1 and not c.persistent:
        return [c, *([dataclasses.replace(c, ctas=2)] if c.head_dim in DECODE_CTAS2_HEAD_DIMS else []),
                dataclasses.replace(c, persistent=1)]
    if c.groups == 2 and c.ctas <= 1 and not c.persistent:
        return [c, dataclasses.replace(c, groups=1)]
    return [c]


def _key(c: ShapeClass) -> str:
    return (f"flash_decode/{c.dtype}/d{c.head_dim}/{'causal' if c.causal else 'full'}/wg{c.groups}"
            + (f"/ctas{c.ctas}" if c.ctas > 1 else "") + ("/persistent" if c.persistent else "")
            + ("/softcap" if c.softcap else ""))


def _representative(c: ShapeClass) -> dict[str, Any]:
    # a long cache few (batch, kv head) rows share, so the class's program splits keys; a persistent class's: a
    # batch whose tiles, one piece each, outnumber the SMs
    heads, kv, sq = (32, 8, 4 if c.causal else 1) if c.groups == 1 else (71, 1, 2 if c.causal else 1)
    batch, skv = (64, 2048) if c.persistent else (1, 16384)
    return {"batch": batch, "heads": heads, "kv_heads": kv, "seq_q": sq, "seq_kv": skv, "head_dim": c.head_dim,
            "causal": c.causal, "dtype": c.dtype}


def _fix(c: ShapeClass) -> dict[str, int]:
    """The class's warpgroups and CTAs per SM, and several pieces, so the program has the several-piece epilogue the
    generic kernel runs (a shape's pieces are chosen per shape, ``decode_splits``); a persistent class one piece."""
    return ({"groups": c.groups, "splits": 1 if c.persistent else DECODE_REP_SPLITS, "ctas": max(1, c.ctas)}
            | ({"persistent": 1} if c.persistent else {}))


def _classes() -> list[ShapeClass]:
    out: list[ShapeClass] = []
    for d in DTYPES:
        for hd in DECODE_HEAD_DIMS:
            for causal in (False, True):
                for w in (1, 2):
                    # a two-warpgroup class's variants include the one-warpgroup class, listed already
                    out += [v for v in decode_variants(ShapeClass("flash_decode", d, hd, causal, groups=w))
                            if v not in out]
    return out


# the cap a softcap variant's schedule carries in its parameters (Gemma-2's attn_logit_softcapping): its value changes
# no cost and the generic kernel takes the call's as a launch argument
DECODE_REP_SOFTCAP = 50.0


def _variants() -> list[ShapeClass]:
    """Every table class's softcap variant (``precompile`` compiles them; the table holds none)."""
    return [dataclasses.replace(c, softcap=True) for c in _classes()]


def _derived(c: ShapeClass) -> tuple[ShapeClass, dict[str, Any]] | None:
    """A softcap variant runs its plain class's schedule with the cap in its parameters: rowmax's tanh is a few SFU
    cycles per score within the softmax the schedule already places (the shape's pieces are chosen on the graph with
    it, ``decode_retime``)."""
    return (dataclasses.replace(c, softcap=False), {"softcap": DECODE_REP_SOFTCAP}) if c.softcap else None


register("flash_decode", OpClasses(key=_key, representative=_representative, classes=_classes, fix=_fix,
                                   keeps_program=True, derived=_derived, variants=_variants))


def _kv_bucket(blocks: int) -> int:
    """The key-block count a decode shape's pieces are chosen at: the next of 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14,
    16, 20, 24, 28, 32, 40, ... (four steps per doubling), so a cache that grows by a token per call is re-timed once
    every ~20% of length, not every call."""
    if blocks <= 8:
        return blocks
    step = 1 << (blocks.bit_length() - 3)  # a quarter of the power of two at or below blocks
    return -(-blocks // step) * step


_SPLITS: dict[tuple[Any, ...], tuple[float, int]] = {}


def decode_bucketed(c: ShapeClass, p: dict[str, Any]) -> dict[str, Any]:
    """Decode shape ``p`` with its cache length rounded up to ``_kv_bucket`` of class ``c``'s key blocks: the shape
    ``decode_splits`` re-times, so that a growing cache re-times rarely."""
    bn = class_program(c).graph.tiling["BN"]
    return dict(p, seq_kv=max(p["seq_kv"], _kv_bucket(-(-p["seq_kv"] // bn)) * bn))


def decode_retime(c: ShapeClass, p: dict[str, Any], splits: int, hw: Any) -> float:
    """Predicted µs of class ``c``'s binary on decode shape ``p`` (as given) in ``splits`` pieces on the hardware
    table ``hw``: the class's program re-timed on the shape's graph (``ptsolve.simulate``, timed mode: every task at
    its planned cycle or as soon as its inputs and units allow; a piece replayed for DECODE_REPLAY_TRIPS iterations
    and extended by the loop's period)."""
    from ptsolve.ops import make
    from ptsolve.simulate import simulate

    prog = class_program(c)
    g = make("flash_decode", **p).graph(dict(prog.graph.tiling, splits=splits), hw)
    return simulate(dataclasses.replace(prog, graph=g), hw, max_trips=DECODE_REPLAY_TRIPS).kernel_us


def _decode_best(c: ShapeClass, p: dict[str, Any], sm_margin: int = 0) -> tuple[float, int]:
    """(predicted µs, pieces) of ``decode_splits``."""
    from ptsolve.hw import load as load_hw
    from ptsolve.ops.decode import split_counts

    q = decode_bucketed(c, p)
    key = (c, p["batch"], p["heads"], p["kv_heads"], p["seq_q"], q["seq_kv"], sm_margin)
    got = _SPLITS.get(key)
    if got is None:
        t, hw = class_program(c).graph.tiling, load_hw(HW)  # the hardware read once, not per candidate
        if sm_margin:  # FlashAttention-3's split heuristic on the SMs left: the pieces priced on fewer of them
            hw = dataclasses.replace(hw, sms=max(1, hw.sms - sm_margin))
        best = None
        # a persistent binary has no merge CTAs: one piece per tile
        for s in [1] if c.persistent else split_counts(q, t["BM"], t["BN"]):
            us = decode_retime(c, q, s, hw)
            if best is None or us < best[0] - 1e-9:
                best = (us, s)
        assert best is not None
        if len(_SPLITS) >= 4096:
            _SPLITS.clear()
        got = _SPLITS[key] = best
    return got


def decode_splits(c: ShapeClass, p: dict[str, Any], sm_margin: int = 0) -> int:
    """Pieces of the longest query tile for decode shape ``p`` (``ptsolve.ops.decode`` parameters) on class ``c``'s
    binary: the piece count (``ptsolve.ops.decode.split_counts``) at which the class's program, re-timed on the
    shape's graph (``decode_retime``), predicts the shortest kernel; the fewer pieces on a tie. Evaluated at the
    shape's key blocks rounded up to ``_kv_bucket`` (``decode_bucketed``) and kept per (class, shape without
    seq_kv, bucket). ``sm_margin``: SMs left free for other work, taken off the hardware table's for the call (as
    FlashAttention-3's split heuristic takes them off the device's)."""
    return _decode_best(c, p, sm_margin)[1]


def decode_pick(c: ShapeClass, p: dict[str, Any], sm_margin: int = 0) -> tuple[ShapeClass, int]:
    """The binary (one of ``decode_variants(c)``) and pieces a decode shape runs with: the shortest kernel the
    re-timed programs predict (``decode_splits``, with ``sm_margin`` SMs left free), the class's own binary on a
    tie."""
    best = None
    for v in decode_variants(c):
        us, s = _decode_best(v, p, sm_margin)
        if best is None or us < best[0] - 1e-9:
            best = (us, v, s)
    assert best is not None
    return best[1], best[2]


def decode(q: Any, k: Any, v: Any, out: Any, c: ShapeClass, scale: float, seqlens: Any = None,
           softcap: float = 0.0, sm_margin: int = 0) -> None:
    """Launch decode class ``c``'s split-KV kernel: q [B, Sq, H, D] (Sq <= DECODE_MAX_SEQ_Q), k/v [B, Skv, Hkv, D],
    ``out`` contiguous like q (the tensors as ``attention`` takes them; the caller checks). ``seqlens`` (int32 [B] on
    the device, or None): sequence b attends to the first seqlens[b] keys of the cache (clamped to 0 .. Skv; read by
    the kernel, so one launch or CUDA graph serves a growing cache; its pieces are chosen for the whole cache,
    ``ptsolve.ops.decode.length_pieces``). The launch's scratch (partial results and counters) is shared by every
    decode launch of the class on the device: launches on one stream at a time. ``softcap`` (> 0, a softcap
    variant's): scores become softcap · tanh(q·k · scale / softcap). ``sm_margin``: ``decode_launch``'s."""
    decode_launch(q, k, v, c, scale, seqlens, softcap=softcap, sm_margin=sm_margin)(
        prepared.current_stream(q.get_device()), out.data_ptr())


def decode_launch(q: Any, k: Any, v: Any, c: ShapeClass, scale: float, seqlens: Any = None,
                  page_table: Any = None, softcap: float = 0.0, sm_margin: int = 0) -> Any:
    """The prepared launch of ``decode`` for these inputs, kept per (addresses, shapes, strides, scale, softcap, SM
    margin); call it with the stream and the output's address. ``page_table`` (int32 [B, MAXP], with ``seqlens``): k
    and v are a paged cache [pages, PAGE, Hkv, D], sequence b's key j in page page_table[b, j // PAGE] at row
    j % PAGE. ``softcap``: ``decode``'s (> 0 exactly where ``c`` is a softcap variant). ``sm_margin``: SMs left free
    for other work (FlashAttention-3's): the pieces and the binary are chosen for the SMs left, the merge grid keeps
    its CTAs fewer than them, and a persistent binary's grid fills them only (``runtime.Launch.leave_free``); the
    binaries are the same."""
    key = ("fd", c, q.data_ptr(), k.data_ptr(), v.data_ptr(), q.shape, q.stride(), k.shape, k.stride(), v.stride(),
           scale, 0 if seqlens is None else seqlens.data_ptr(),
           None if page_table is None else (page_table.data_ptr(), page_table.shape), softcap, sm_margin)
    ln = prepared.LAUNCHES.get(key)
    return ln if ln is not None else prepared.keep(key, _decode_prepare(
        q, k, v, c, scale, seqlens, page_table=page_table, softcap=softcap, sm_margin=sm_margin)[0])


def _decode_prepare(q: Any, k: Any, v: Any, c: ShapeClass, scale: float, seqlens: Any, bound: int = 0,
                    page_table: Any = None, softcap: float = 0.0, sm_margin: int = 0
                    ) -> tuple[Any, dict[str, Any], dict[str, int], int]:
    """(the prepared launch, the shape's parameters, the tiling with its pieces, the SMs it may fill: the loaded
    module's less ``sm_margin``) of decode class ``c`` on these inputs; ``bound``: the longest cache the launch may
    later be re-targeted to (its indices checked there too); ``page_table``: a paged cache's (``decode_launch``),
    whose capacity MAXP·PAGE keys is the shape's seq_kv (the pieces are chosen for it); ``softcap``: ``decode``'s;
    ``sm_margin``: ``decode_launch``'s."""
    from codegen.cuda import decode as cd
    from codegen.runtime import usable_sms

    if bool(softcap) != c.softcap:
        raise ShapeError(f"decode class {c.key} runs softcap={softcap!r}: the class and the call must agree on the "
                         "softcap (ptsolve.torch chooses the class: decode_class(..., softcap=softcap > 0))")

    paging = (0, 0) if page_table is None else (k.shape[1], page_table.shape[1])
    (B, sq, H, D), Hkv = q.shape, k.shape[2]
    skv = k.shape[1] if page_table is None else paging[0] * paging[1]
    p = {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": sq, "seq_kv": skv, "head_dim": D, "causal": c.causal,
         "dtype": c.dtype} | ({"softcap": float(softcap)} if softcap else {})  # the pieces priced with the tanh
    v_, splits = decode_pick(c, p, sm_margin)
    if v_.persistent and splits != 1:  # decode_pick offers a persistent binary one piece only
        raise PtsolveError(f"{v_.key}: a persistent binary launched with {splits} pieces; it has no merge CTAs")
    ck = kernel(v_)
    mod = ck.module()
    sms = usable_sms(mod.sms, sm_margin)  # ShapeError for a margin the device cannot leave, before any work
    t = dict(ck.ir.tiling, splits=splits)
    err = cd.index_error(dict(p, seq_kv=max(skv, bound)), t)
    if err:
        raise ShapeError(err + ": split the batch")
    if page_table is not None and (paging[0] < 8 or max(paging[0], t["BN"]) % min(paging[0], t["BN"])):
        raise ShapeError(f"a paged cache of {paging[0]}-key pages: ptsolve's decode kernel ({t['BN']}-key blocks) "
                         "takes pages of 8 keys or more that divide its blocks or that its blocks divide (16 ... 256)")
    sz = cd.sizes(p, t, sms, paging)
    maps = cd.maps(p, t, {n: tuple(x.stride()[:3]) for n, x in (("q", q), ("k", k), ("v", v))},
                   None if page_table is None else (k.shape[0], paging[0]))
    ws = {n: prepared.scratch(q.device, ck.ks.name, n, b) for n, b in cd.generic_workspace(p, sz).items()}
    vals = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": 0, **ws,
            "scale_log2": (softcap or scale) * math.log2(math.e), "seqlens": 0 if seqlens is None else
            seqlens.data_ptr(), "page_table": 0 if page_table is None else page_table.data_ptr(), **sz}
    if softcap:  # tanh(s · scale / softcap), then the exp2 domain's scale is softcap · log2 e
        vals["softcap_pre"] = scale / softcap
    ln = mod.prepare(vals, maps, cd.grid(sz), out="o")
    if sm_margin:
        ln.leave_free(sm_margin)  # a persistent binary's grid on the SMs left
    return ln, p, t, sms


def _bucket_blocks(blocks: int) -> tuple[int, int]:
    """The key-block counts (first, last) that share ``blocks``' ``_kv_bucket``."""
    hi = _kv_bucket(blocks)
    lo = blocks
    while lo > 1 and _kv_bucket(lo - 1) == hi:
        lo -= 1
    return lo, hi


class DecodeFamily:
    """One decode launch that follows a growing cache: dense decode calls whose inputs differ from the family's
    first call only in the keys' count, the tensors' addresses and the keys' strides (transformers' dynamic cache
    makes new K/V tensors, one key longer, at every step), while the count stays in the first call's
    ``_kv_bucket`` (so the binary and pieces ``decode_pick`` chose stay the ones it would choose). A call re-targets
    the one prepared launch: the sizes and tensor maps of a new key count (computed once per count: a model's layers
    share them), the maps of the new addresses, then launches. The caller keys families by everything else (shapes
    but the keys', dtypes, strides of q, scale, softcap: ``softcap`` as ``decode``'s); a call checks the tensors are
    TMA-ready. ``sm_margin``: ``decode_launch``'s, kept by the family (the caller's key holds it)."""

    __slots__ = ("ln", "p", "t", "sms", "bn", "lo", "hi", "skv", "strides", "specs", "sz")

    def __init__(self, q: Any, k: Any, v: Any, c: ShapeClass, scale: float, softcap: float = 0.0,
                 sm_margin: int = 0):
        self.bn = class_program(c).graph.tiling["BN"]  # decode_bucketed's blocks: the class's, not its variants'
        self.lo, self.hi = _bucket_blocks(-(-k.shape[1] // self.bn))
        self.ln, self.p, self.t, self.sms = _decode_prepare(q, k, v, c, scale, None, bound=self.hi * self.bn,
                                                            softcap=softcap, sm_margin=sm_margin)
        self.skv, self.strides, self.specs, self.sz = k.shape[1], (k.stride(), v.stride()), None, {}

    def __call__(self, q: Any, k: Any, v: Any, stream: int, out: int) -> bool:
        """Launch on these inputs (``stream`` a raw handle, ``out`` the output's address); False, launching nothing,
        where their key count is outside the family's bucket or shorter than the queries, or where a tensor map cannot
        describe them as they are (misaligned, or strides TMA cannot take: ``prepared.tma_strides``; q's strides are
        the family's key)."""
        from codegen.cuda import decode as cd

        skv = k.shape[1]
        if not self.lo <= -(-skv // self.bn) <= self.hi or skv < q.shape[1]:
            return False
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
        if (qp | kp | vp) % 16:
            return False
        ln, strides = self.ln, (k.stride(), v.stride())
        if skv != self.skv or strides != self.strides or self.specs is None:
            if not (prepared.tma_strides(strides[0]) and prepared.tma_strides(strides[1])):
                return False
            p, t = dict(self.p, seq_kv=skv), self.t
            if self.sz and -(-skv // t["BN"]) == -(-self.skv // t["BN"]):
                ln.set({"SKV": skv})  # the same key blocks: the other sizes stay (cd.sizes_at)
                self.sz = cd.sizes_at(self.sz, skv)
            else:
                sz = cd.sizes(p, t, self.sms)
                ln.set({n: x for n, x in sz.items() if self.sz.get(n) != x and n in ln.slots})
                ln.regrid(cd.grid(sz))
                self.sz = sz
            self.specs = (cd.kv_map(p, t, "k", strides[0][:3]), cd.kv_map(p, t, "v", strides[1][:3]))
            self.skv, self.strides = skv, strides
        ln.repoint("q", qp)
        ln.repoint("k", kp, self.specs[0])
        ln.repoint("v", vp, self.specs[1])
        ln(stream, out)
        return True
