"""Issue 8 A/B on the GPU: the old per-op emitters' kernels (commit ae3a8a0, emitted from the schedules committed
then), the one-lowering skeleton's on main ("base") and with the issue-8 fixes ("fix", plus variants that switch
single fixes off), base and fix emitted, as ``codegen.round`` does, from the committed schedules' orders and tilings
(``plan_from_program``: the committed programs predate the current release-point model, so their barriers are
not reused), interleaved in one process (codegen.harness.time_many, CUDA graphs captured on the launch stream, 30
rounds).

    python -m bench ab regress_ab emit base --root /work/main   # CPU: main's sources  -> ab_sources.json
    python -m bench ab regress_ab emit fix                       # CPU: this tree's sources (fix + variants)
    PTSOLVE_CACHE_DIR=$PWD/.cubin3 python -m bench ab regress_ab compile   # CPU: nvcc every cubin
    PTSOLVE_CACHE_DIR=$PWD/.cubin3 python -m bench ab regress_ab check     # every cubin is a cache hit
    PTSOLVE_CACHE_DIR=... timeout 300 python -m bench ab regress_ab        # GPU: smoke, compare, time
    (AB_ONLY=A,B times only those schedules)

Every kernel takes exactly the arguments its own ``args`` / ``tensor_maps`` list (old and new kernels name the
same tensors of the same shapes; the script checks). Before timing, each kernel runs once in a child process
that the parent kills when one kernel takes longer than SMOKE_S: a kernel that hangs or faults is reported and
skipped, and so is a variant whose output differs from the base kernel's. One line per schedule as it is
timed, a markdown table last. Candidates run in a rotated order each round (codegen.harness.time_many).

Columns besides old / base / fix: old_again (the old kernel a second time: the noise of the comparison), old_1d
(the old kernel on the new one's 1-D tile grid), fix_no_early_p (P packed in rowsum, OpKernel.early off),
fix_xs2 (ChunkState with two xs copies named), and three probes of FlashAttention's remaining gap: fix_nosync (no
__syncwarp before a warp's lane-0 release), fix_grid3 (the 3-D grid the old emitter launched), fix_wait1 (the old
emitter's redundant wg_wait<1> in the steady rescale).
"""
from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if "--root" in sys.argv:  # emit base with another checkout's code
    sys.path.insert(0, sys.argv[sys.argv.index("--root") + 1])
sys.path.insert(0 if "--root" not in sys.argv else 1, str(ROOT))

from codegen.cuda.common import KernelSource, TensorMapSpec  # noqa: E402

NAMES = ["CS3_cpsat", "CS8_cpsat", "CS9_cpsat", "ST3_cpsat", "ST5_cpsat", "FA17c_cpsat", "FA8c_cpsat", "FA3_cpsat",
         "FA3c_cpsat", "FA13c_cpsat", "GEMM1_cpsat", "GEMM3_cpsat"]
SRC = ROOT / "results/ab/regress_sources.json"  # the old emitters' sources
SCHED = ROOT / "results/schedules_h200"
AB = ROOT / "results/ab/ab_sources.json"  # {schedule: {variant: KernelSource}}
SMOKE_S = 30.0  # one kernel's first launch + synchronize (random inputs made on the GPU)
COLS = ["old", "old_again", "old_1d", "base", "fix", "fix_no_early_p", "fix_xs2", "fix_nosync", "fix_grid3",
        "fix_wait1"]
RATIOS = [("fix", "old"), ("fix", "base")]  # (a, b): the a / b columns of the table
ROUNDS = 30  # timing rounds (codegen.harness.time_many)


def ks_of(d: dict) -> KernelSource:
    d = dict(d)
    d["tensor_maps"] = tuple(TensorMapSpec(**{**m, "dims": tuple(m["dims"]), "strides_bytes": tuple(m["strides_bytes"]),
                                              "box": tuple(m["box"])}) for m in d["tensor_maps"])
    for k in ("grid", "block", "args", "flags"):
        d[k] = tuple(d[k])
    return KernelSource(**d)


def _plan(name: str):
    from codegen.plan import plan_from_program
    from ptsolve.result import Result
    return plan_from_program(Result.from_json((SCHED / f"{name}.json").read_text()).program, "h200")


def _emit_fix(name: str) -> dict[str, KernelSource]:
    """fix and the variants that switch one fix off or on (left out where they emit the same source)."""
    from codegen.cuda import emit, skeleton
    from codegen.lower import lower

    plan = _plan(name)
    out = {"fix": emit(plan, "h200")}
    if plan.op == "flash_attention":  # P packed in rowsum again (the early write of OpKernel.early off)
        keep = skeleton.early_writes
        skeleton.early_writes = lambda opk, role, loop, commits, needs, steady: (needs, steady, set())
        try:
            ks = emit(plan, "h200")
        finally:
            skeleton.early_writes = keep
        if ks.source != out["fix"].source:
            out["fix_no_early_p"] = ks
    if plan.op == "flash_attention":
        src = out["fix"].source.replace("__syncwarp();\n    if (lane == 0) mbar_arrive", "if (lane == 0) mbar_arrive")
        if src != out["fix"].source:  # no __syncwarp before a warp's lane-0 release
            out["fix_nosync"] = dataclasses.replace(out["fix"], source=src)
    ks = out["fix"]
    if "PERSISTENT = false" in ks.source and ks.grid[1:] == (1, 1) and plan.op == "flash_attention":
        # the tiles as a 3-D grid (query block, head, batch), as the old emitter launched them
        nmb = int(ks.source.split("constexpr int NMB = ")[1].split(";")[0])
        src = ks.source.replace("const int tile = blockIdx.x;",
                                "const int tile = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);")
        h = int(ks.params.get("heads", ks.params.get("H", 0)) or 0)
        if h and ks.grid[0] == nmb * h * (ks.grid[0] // (nmb * h)):
            out["fix_grid3"] = dataclasses.replace(ks, source=src, grid=(nmb, h, ks.grid[0] // (nmb * h)))
    if plan.op == "flash_attention":  # the old emitter's wg_wait<1> in the steady loop's rescale
        import re
        src = re.sub(r"(\{  // rescale@\d\n\{ const int it_ = j; const int q_ = rbase \+ it_; \(void\)q_;\n)",
                     r"\1  wg_wait<1>();\n", out["fix"].source)
        if src != out["fix"].source:
            out["fix_wait1"] = dataclasses.replace(out["fix"], source=src)
    if plan.op == "mamba2_chunk_state":  # two xs copies named (a plan keeps its own copies; the old emitter's)
        named = dataclasses.replace(plan, copies={b: 2 for b in lower(plan, "h200").copies})
        ks = emit(named, "h200")
        if ks.source != out["fix"].source:
            out["fix_xs2"] = ks
    return out


def emit_sources(which: str) -> None:
    """Add ``which`` (base: the code on sys.path's first checkout; fix: this tree's) to ab_sources.json."""
    from codegen.cuda import emit

    old = json.loads(SRC.read_text())["old"]
    ab = json.loads(AB.read_text()) if AB.exists() else {}
    for n in NAMES:
        if which == "base":
            got = {"base": emit(_plan(n), "h200")}
        else:
            got = _emit_fix(n)
        row = ab.setdefault(n, {})
        row["old"] = old[n]
        row.update({k: dataclasses.asdict(ks) for k, ks in got.items()})
        print(n, which, sorted(got), flush=True)
    AB.write_text(json.dumps(ab, indent=0, sort_keys=True))


def variants(name: str) -> dict[str, KernelSource]:
    """The kernels to compare for one schedule, in COLS order (missing ones left out)."""
    row = json.loads(AB.read_text())[name]
    out = {k: ks_of(row[k]) for k in COLS if k in row}
    o = out.get("old")
    if o is not None:  # the old kernel twice: the spread between the two is the comparison's noise
        out["old_again"] = o
    if o is not None and o.op == "flash_attention" and "const int mb_ = blockIdx.x, hq = blockIdx.y, bz = blockIdx.z;" \
            in o.source:  # the old kernel with the new one's 1-D tile grid
        src = o.source.replace("const int mb_ = blockIdx.x, hq = blockIdx.y, bz = blockIdx.z;",
                               "const int tile = blockIdx.x; const int mb_ = tile % NMB, hq = (tile / NMB) % H, "
                               "bz = tile / (NMB * H);")
        out["old_1d"] = dataclasses.replace(o, source=src, grid=(o.grid[0] * o.grid[1] * o.grid[2], 1, 1))
    return {k: out[k] for k in COLS if k in out}


def compile_all(check: bool) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import codegen.runtime as rt
    if check:  # a cache miss would have to run nvcc: make that an error
        def no_nvcc(*a, **k):
            raise RuntimeError("cache miss: nvcc would run")
        rt._nvcc = no_nvcc
    jobs = [(n, k, ks) for n in NAMES for k, ks in variants(n).items()]
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as ex:
        futs = [(n, k, ex.submit(rt.compile_kernel, ks)) for n, k, ks in jobs]
        bad = 0
        for n, k, f in futs:
            try:
                c = f.result()
                print(f"{n:12s} {k:16s} ok  regs {c.report.get('registers')} spill {c.report.get('spill_stores')}  "
                      f"{c.path.name[:16]}", flush=True)
            except Exception as e:  # noqa: BLE001
                bad += 1
                print(f"{n:12s} {k:16s} FAILED {str(e)[:300]}", flush=True)
    print(f"{len(jobs) - bad} of {len(jobs)} cubins {'found in' if check else 'in'} {rt.cache_dir()}", flush=True)
    if bad:
        sys.exit(1)


def smoke_child(keys: list[str]) -> None:
    """Run each kernel (schedule/variant) once; print 'ok KEY' or 'fail KEY why' after each."""
    import torch

    from codegen.harness import random_args
    from codegen.runtime import load
    cache: dict[str, dict] = {}
    for key in keys:
        name, var = key.split("/")
        try:
            if name not in cache:
                cache.clear()
                cache[name] = variants(name)
            ks = cache[name][var]
            args = random_args(ks, 0)
            load(ks).launch({k: t.data_ptr() for k, t in args.items()}, int(torch.cuda.current_stream().cuda_stream))
            torch.cuda.synchronize()
            print(f"ok {key}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"fail {key} {type(e).__name__}: {str(e)[:200]}".replace("\n", " "), flush=True)
            if "illegal" in str(e).lower() or "launch failure" in str(e).lower():
                return  # the context is gone; the parent restarts a child for the rest


def smoke(keys: list[str]) -> dict[str, str]:
    """key -> 'ok' or why not, each kernel run once in a child process with a per-kernel deadline."""
    res: dict[str, str] = {}
    todo = list(keys)
    while todo:
        p = subprocess.Popen([sys.executable, __file__, "smoke", *todo], stdout=subprocess.PIPE, text=True, bufsize=1)
        deadline = time.time() + SMOKE_S + 30  # the first kernel also pays for the imports and the CUDA context
        while True:
            r, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.time()))
            if not r:  # the kernel in flight hangs
                p.kill()
                p.wait()
                res[todo[0]] = f"hung (> {SMOKE_S:.0f} s), skipped"
                print(f"  smoke: {todo[0]} {res[todo[0]]}", flush=True)
                todo = todo[1:]
                break
            line = p.stdout.readline()
            if not line:  # the child ended (a fault that took the context)
                p.wait()
                if todo:
                    res[todo[0]] = res.get(todo[0]) or f"child exited {p.returncode}, skipped"
                    print(f"  smoke: {todo[0]} {res[todo[0]]}", flush=True)
                    todo = todo[1:]
                break
            word, key, *why = [*line.strip().split(" ", 2), ""][:3]
            if word in ("ok", "fail") and key in todo:
                res[key] = "ok" if word == "ok" else " ".join(why)
                if word != "ok":
                    print(f"  smoke: {key} failed: {res[key]}, skipped", flush=True)
                todo.remove(key)
                deadline = time.time() + SMOKE_S
            if not todo:
                p.wait()
                break
    return res


def _max_abs(a, b=None) -> float:
    """max |a - b| (|a| without b) over two flat tensors, in float32 slices of 2^26 elements; NaN if any is NaN."""
    step = 1 << 26
    vals = [(a[i:i + step].float() - (b[i:i + step].float() if b is not None else 0)).abs().max().item()
            for i in range(0, a.numel(), step)]
    return math.nan if any(math.isnan(v) for v in vals) else max(vals)


def main() -> None:
    import torch

    from codegen.harness import random_args, time_many
    from codegen.runtime import load

    t0 = time.time()
    only = [n for n in os.environ.get("AB_ONLY", "").split(",") if n]  # a subset, e.g. one large config alone
    allv = {n: variants(n) for n in NAMES if not only or n in only}
    keys = [f"{n}/{k}" for n, v in allv.items() for k in v]
    print(f"{len(keys)} kernels; smoke test (each run once, {SMOKE_S:.0f} s deadline)", flush=True)
    ok = smoke(keys)
    nok = sum(v == "ok" for v in ok.values())
    print(f"smoke done in {time.time() - t0:.0f} s: {nok} of {len(keys)} ok", flush=True)
    rows = []
    for n, vs in allv.items():
        good = {k: ks for k, ks in vs.items() if ok.get(f"{n}/{k}") == "ok"}
        ref = next(iter(good.values()), None)
        if ref is None:
            print(f"{n}: nothing to time", flush=True)
            continue
        try:
            sets = [random_args(ref, s) for s in range(2)]
            for k, ks in list(good.items()):
                need = {a.split(":")[1] for a in ks.args}
                if not need <= set(sets[0]) or ks.params != ref.params:
                    print(f"  {n}/{k}: arguments {sorted(need)} do not match, skipped", flush=True)
                    good.pop(k)
            ptrs = [{k: t.data_ptr() for k, t in s.items()} for s in sets]
            kern = {k: load(ks) for k, ks in good.items()}
            stream = int(torch.cuda.current_stream().cuda_stream)  # the comparison launches (no capture)
            names = [a.split(":")[1] for a in ref.args]
            outk = next(k for k in ("o", "out", "c") if k in names)  # ChunkScan's "c" is an input
            # every variant's output next to base's (old's where base failed): the reference kept in its own
            # dtype, the others compared as they come, in slices (CS9's outputs are 16 GiB in float32)
            rk = "base" if "base" in kern else next(iter(kern))
            ref = peak = None
            diffs = {}
            for k in [rk, *(k for k in kern if k != rk)]:
                sets[0][outk].fill_(float("nan"))
                kern[k].launch(ptrs[0], stream)
                torch.cuda.synchronize()
                o = sets[0][outk].reshape(-1)
                if ref is None:
                    ref = o.clone()
                    peak = _max_abs(ref)
                d = _max_abs(o, ref)
                diffs[k] = d
                if not d <= 1e-2 * max(1.0, peak):
                    print(f"  {n}/{k}: output differs from {rk} by {d:.3g}, not timed", flush=True)
                    kern.pop(k)
            del ref
            # the stream is read at each launch: under torch.cuda.graph it is the capture stream (a stream fixed
            # before the capture leaves the graph empty and times nothing)
            fns = {k: (lambda i, kk=kk, pp=ptrs: kk.launch(pp[i], int(torch.cuda.current_stream().cuda_stream)))
                   for k, kk in kern.items()}
            ms = time_many(fns, 2, graphs=True, rounds=ROUNDS)
        except Exception as e:  # noqa: BLE001
            print(f"{n}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        finally:
            sets = ptrs = None
            gc.collect()  # the captured graphs' private pools (CS9's 16 GiB inputs after CS8's)
            torch.cuda.empty_cache()
        us = {k: v * 1e3 for k, v in ms.items()}
        rows.append((n, us))
        print(f"{n:12s} " + "  ".join(f"{k} {v:.1f}" for k, v in us.items()) +
              "".join(f"  {a}/{b} {us[a] / us[b]:.3f}" for a, b in RATIOS if a in us and b in us) +
              f"  [max |diff| vs {rk}: " + ", ".join(f"{k} {v:.2g}" for k, v in diffs.items()) + "]", flush=True)
    print(f"\ndone in {time.time() - t0:.0f} s; median µs per call (CUDA graphs, interleaved, {ROUNDS} rounds)\n")
    print("| schedule | " + " | ".join(f"{c} µs" for c in COLS) + "".join(f" | {a} / {b}" for a, b in RATIOS) + " |")
    print("|---|" + "---|" * (len(COLS) + len(RATIOS)))
    for n, us in rows:
        cell = [f"{us[c]:.1f}" if c in us else "—" for c in COLS]
        cell += [f"{us[a] / us[b]:.3f}" if a in us and b in us else "—" for a, b in RATIOS]
        print(f"| {n} | " + " | ".join(cell) + " |")
    sys.stdout.flush()


def cli(emit: Callable[[], None]) -> None:
    """The command line of an A/B script built on this one (bench/orders_ab/orders_ab.py,
    bench/first_choice/first_choice_ab.py):
    ``emit`` (its own, CPU), ``compile`` / ``check`` (CPU), ``smoke`` (the child of a smoke test), else time (GPU)."""
    cmd = sys.argv[1:2]
    if cmd == ["emit"]:
        emit()
    elif cmd in (["compile"], ["check"]):
        compile_all(check=cmd == ["check"])
    elif cmd == ["smoke"]:
        smoke_child(sys.argv[2:])
    else:
        main()


if __name__ == "__main__":
    if sys.argv[1:2] == ["emit"]:
        emit_sources(sys.argv[2])
    elif sys.argv[1:2] == ["compile"]:
        compile_all(check=False)
    elif sys.argv[1:2] == ["check"]:
        compile_all(check=True)
    elif sys.argv[1:2] == ["smoke"]:
        smoke_child(sys.argv[2:])
    else:
        main()
