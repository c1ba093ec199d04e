"""The profiler on the CPU: the instrumented build is one switch in the skeleton (same kernel otherwise), its
buffer layout is what ``codegen.profile.parse`` reads (a buffer written the way the kernel writes it, with a known
initiation interval, comes back as the same events, II and span), and recorded device buffers parse."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from codegen.cuda import emit_ir
from codegen.cuda.skeleton import PHASE_CODE, PROF_CTAS, PROF_HDR, PROF_REC, prof_cap, prof_words
from codegen.lower import lower
from codegen.plan import default_plan, fa3_order_plan
from codegen.profile import MEvent, Profile, measured_ii, parse, span, task_means, timeline
from ptsolve.errors import CodegenError

FA = {"batch": 1, "heads": 4, "kv_heads": 2, "seq_q": 512, "seq_kv": 512, "head_dim": 64, "causal": False,
      "dtype": "fp16"}
T = {"BM": 128, "BN": 64, "depth": 2, "groups": 2}
DATA = Path(__file__).parents[1] / "data"


def _ir(**kw):
    return lower(fa3_order_plan(FA, T), "h200", **kw)


def test_switch_only_adds_probes():
    ir = _ir()
    plain, inst = emit_ir(ir), emit_ir(dataclasses.replace(ir, profile=True))
    assert "pts_clock" not in plain.source and "ptr:prof" not in plain.args
    assert inst.args == (*plain.args, "ptr:prof") and inst.info["profile_words"] == prof_words(ir)
    strip = [ln for ln in inst.source.splitlines() if ln and "pts_" not in ln and "pr_" not in ln and "PROF" not in ln
             and "prof" not in ln]
    base = [ln for ln in plain.source.splitlines() if ln and "plan " not in ln and "pts_" not in ln]
    # every line of the plain kernel is in the instrumented one, in the same order
    it = iter(strip)
    assert all(any(ln == x for x in it) for ln in base)
    # one record at every place a task is emitted: each loop instance (prologue, steady loop, epilogue), pre, post
    sites = sum(plain.source.count(x) for x in ("const int it_ = ", "// pre: ", "// post: "))
    assert inst.source.count("pts_rec(pr_") == sites


def _write(ir, ii: int, lat: int, ctas: int = 2):
    """A buffer as the kernel writes it: every role of ``ctas`` CTAs runs its pre tasks, ``ir.trips`` iterations
    one ``ii`` apart (each task ``lat`` cycles after the previous one of its role, waiting 5 cycles first), and
    its post tasks. Returns (buffer, expected events)."""
    cap = prof_cap(ir)
    region = PROF_HDR + PROF_REC * cap
    w = np.zeros(PROF_CTAS * len(ir.roles) * region, dtype=np.uint64)
    tid = {t.name: k for k, t in enumerate(ir.tasks)}
    want = []
    for c in range(ctas):
        for k, role in enumerate(ir.roles):
            base = (c * len(ir.roles) + k) * region
            clock0 = 10_000 * (c + 1) + 7 * k  # roles start a few cycles apart on the same SM clock
            w[base:base + 4] = [3 + c, 1_000_000 + c, clock0, c]
            n = 0
            seq = [("pre", t, 0, 0) for t, _ in role.pre]
            seq += [("loop", t, it, 100 + it * ii + j * lat) for it in range(ir.trips) for j, (t, _) in
                    enumerate(role.loop)]
            seq += [("post", t, ir.trips - 1, 100 + ir.trips * ii + j * lat) for j, (t, _) in enumerate(role.post)]
            for ph, t, it, at in seq:
                r = base + PROF_HDR + PROF_REC * n
                t0 = clock0 + at
                w[r:r + 4] = [(1 << 63) | (PHASE_CODE[ph] << 56) | (tid[t] << 32) | it, t0, t0 + 5, t0 + 5 + lat // 2]
                want.append(MEvent(c, role.name, t, ph, it, t0 - 10_000 * (c + 1), t0 + 5 - 10_000 * (c + 1),
                                   t0 + 5 + lat // 2 - 10_000 * (c + 1)))
                n += 1
    return w, want


def test_parse_recovers_the_written_timeline():
    ir = _ir()
    w, want = _write(ir, ii=400, lat=30)
    ev, sm = parse(w, ir)
    assert sorted(ev, key=repr) == sorted(want, key=repr)
    assert sm == [3, 4]
    assert measured_ii(ev) == 400
    # the earliest probe is the producer's (clock0); role k starts 7k cycles later
    last = max(7 * k + (100 + ir.trips * 400 + 30 * (len(r.post) - 1) if r.post else 100 + (ir.trips - 1) * 400 +
                        30 * (len(r.loop) - 1)) + 5 + 15 for k, r in enumerate(ir.roles))
    assert span(ev) == last
    assert all(e.wait == 5 for e in ev)
    tl = timeline(Profile("k", ir.op, tuple(ev), 400.0, span(ev)))
    assert {e.stream for e in tl.events} == {r.name for r in ir.roles}


def test_parse_refuses_a_foreign_buffer():
    ir = _ir()
    with pytest.raises(CodegenError, match="shorter"):
        parse(np.zeros(10, dtype=np.uint64), ir)
    w, _ = _write(ir, 400, 30)
    other = lower(default_plan("gemm", {"M": 256, "N": 256, "K": 256, "dtype": "fp16"},
                               {"BM": 128, "BN": 128, "BK": 64, "depth": 2, "groups": 1}), "h200")
    bad = w.copy()
    bad[PROF_HDR] = (1 << 63) | (999 << 32)
    with pytest.raises(CodegenError, match="task 999"):
        parse(bad, ir)
    assert other.tasks != ir.tasks


def test_profile_json_round_trip():
    ir = _ir()
    ev, sm = parse(_write(ir, 400, 30)[0], ir)
    p = Profile("k", ir.op, tuple(ev), measured_ii(ev), span(ev), 10.0, 10.5, tuple(sm))
    q = Profile.from_json(p.to_json())
    assert q == p and abs(json.loads(p.to_json())["overhead"] - 0.05) < 1e-12


def test_task_means_average_the_loop_instances():
    """Waits and bodies averaged per role and task over the steady loop only (the prologue's instance is left out);
    ``base`` merges the warpgroups' copies of a task."""
    ev = (MEvent(0, "wg0", "exp2@0", "pre", 0, 0, 100, 900),
          MEvent(0, "wg0", "exp2@0", "loop", 0, 0, 10, 30), MEvent(1, "wg0", "exp2@0", "loop", 1, 0, 30, 40),
          MEvent(0, "wg1", "exp2@1", "loop", 0, 0, 0, 60), MEvent(0, "producer", "load_k", "loop", 0, 5, 6, 9))
    p = Profile("k", "flash_attention", ev, 0.0, 0.0, 1.0, 1.0, (0, 1))
    assert task_means(p) == {"producer:load_k": (1.0, 3.0), "wg0:exp2@0": (20.0, 15.0), "wg1:exp2@1": (0.0, 60.0)}
    assert task_means(p, base=True) == {"producer:load_k": (1.0, 3.0), "wg0:exp2": (20.0, 15.0),
                                        "wg1:exp2": (0.0, 60.0)}


@pytest.mark.skipif(not (DATA / "profile_fa_h200.npz").exists(), reason="no recorded device buffer yet")
def test_recorded_device_buffer():
    """A buffer recorded on the H200 (tests/data, written by `bench study`) parses into a sane timeline: every role
    of every sampled CTA recorded, iterations in order, waits non-negative, the II positive."""
    d = np.load(DATA / "profile_fa_h200.npz", allow_pickle=False)
    from codegen.kernel_ir import KernelIR
    ir = KernelIR.from_json(str(d["ir"]))
    ev, sm = parse(d["words"], ir)
    assert len(sm) >= 1 and all(e.t0 <= e.t1 <= e.t2 for e in ev)
    for c in {e.cta for e in ev}:
        assert {e.role for e in ev if e.cta == c} == {r.name for r in ir.roles}
    assert measured_ii(ev) > 0


def test_profile_refuses_a_stale_schedule(tmp_path):
    """A schedule the current table does not validate (solved with an older model) is refused before any GPU work,
    naming the fix, instead of a deadlock message from the predicted replay."""
    from codegen.profile import main
    from ptsolve.errors import PtsolveError

    with pytest.raises(PtsolveError, match="not valid for the current h200 table.*solve it again"):
        main(["--schedules", str(Path(__file__).parents[1] / "data" / "schedules_h200"), "--only", "FA3_cpsat",
              "--hw", "h200", "--out", str(tmp_path)])
