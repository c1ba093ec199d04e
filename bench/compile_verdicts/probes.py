"""The experiments behind the source check's ptxas rules (results/compile_verdicts/README.md): ptxas's verdict on
kernels changed in one respect. CPU with nvcc; every kernel compiled afresh (nothing cached).

- ``trip ROWS I...``: schedule ``I`` of a recorded ``verdicts.jsonl`` as emitted, with its trip count ``T`` made a
  runtime value (``+ (threadIdx.x >> 12)``, zero at run time, unknown to nvcc) and made the constants 32 and 33.
- ``synthetic ROWS``: small kernels (the generator's device helpers, taken from schedule 0 of ``ROWS``) with one
  join or loop entry each: which shapes ptxas serialises.
- ``ptx-wait ROWS I [--after-commit K...] [--at LINE...] [--drop-commit K...]``: schedule ``I``'s PTX (nvcc
  ``-ptx``) with a ``wgmma.wait_group 0`` after its K-th commits (1-based) or after PTX lines ``LINE``, or without
  its K-th commits, assembled by ptxas alone; ``--list`` prints its commits' PTX lines. Which group's in-flight
  span, and which path, ptxas objects to.
- ``levels ROWS I...``: schedule ``I`` with its consumers' ``setmaxnreg.inc`` level set to each of ``--levels``
  (default 256 down to 96 in 8s, bisected): the least level ptxas compiles clean at, against the source's register
  pressure (codegen.cuda.wgmma_check.pressure): how many registers ptxas needs beyond the arrays it counts.
- ``edit ROWS I --sub OLD NEW [--nth K...]``: schedule ``I`` with its K-th occurrences (1-based; all without
  ``--nth``) of the text OLD replaced by NEW: ptxas's verdict on one change of the source.
- ``ptx-scan ROWS``: every attention schedule's PTX scanned path by path (every branch both ways, the committed and
  open groups of each path, ``wait_group N`` retiring all but the newest N) for a non-wgmma instruction that reads
  or writes a register of an in-flight wgmma: does the PTX itself hold what ptxas objects to?
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

from codegen.cuda import emit
from codegen.runtime import nvcc_path
from ptsolve.hw import load
from ptsolve.program import SProgram

_T_CLAMP = re.compile(r"if \(CAUSAL\) \{ const int lim = [^}]*\}")
_T_DECL = "int T = (SKVB + BN - 1) / BN;"
_WAIT = "\twgmma.wait_group.sync.aligned 0;\n"


def _source(rows: Path, i: int) -> tuple[str, tuple[str, ...]]:
    """Schedule ``i``'s kernel source and nvcc flags (h100 tables)."""
    row = json.loads(rows.read_text().splitlines()[i])
    ks = emit(SProgram.from_json(row["program"]), load("h100"))
    return ks.source, ks.flags


def verdict(source: str, flags: tuple[str, ...], ptx: bool = False) -> str:
    """ptxas's serialisation reason and spills for a CUDA source (or, ``ptx``, a PTX text), or "clean"."""
    with tempfile.TemporaryDirectory(prefix="probe_") as td:
        src = Path(td) / ("k.ptx" if ptx else "k.cu")
        src.write_text(source)
        cmd = (["ptxas", "-arch=sm_90a", "-v", "-O3", str(src), "-o", str(Path(td) / "k.cubin")] if ptx else
               [nvcc_path(), *flags, "-cubin", "-o", str(Path(td) / "k.cubin"), str(src)])
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        return "error: " + (r.stderr.strip().splitlines() or ["?"])[-1][:200]
    out = r.stdout + r.stderr
    m = re.search(r"serialized due to (.*?) (?:of\s+a wgmma|for the|in the)", out)
    spill = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", out))
    why = "; ".join(x for x in (m.group(1) if m else "", f"{spill} bytes spilled" if spill else "") if x)
    return why or "clean"


def trip(rows: Path, idx: list[int]) -> None:
    """Each schedule as emitted, with a runtime trip count and with the constants 32 and 33."""
    for i in idx:
        src, flags = _source(rows, i)
        if _T_DECL not in src:
            print(f"{i}: no attention trip count to change")
            continue
        runtime = src.replace(_T_DECL, _T_DECL[:-1] + " + (int)(threadIdx.x >> 12);")
        variants = {"as emitted": src, "T runtime": runtime}
        variants |= {f"T = {t}": _T_CLAMP.sub(f"T = {t};", src) for t in (32, 33)}
        print(f"{i}: " + "; ".join(f"{k}: {verdict(v, flags)}" for k, v in variants.items()), flush=True)


def _mma(acc: str, k: int) -> str:
    return (f"wg_fence(); wgmma_ss_n64_f16({acc}, make_desc(sq + {k}, 16, 1024), make_desc(sk + {k}, 16, 1024), 1); "
            "wg_commit();")


_SCALE = "fence_regs(a);\n#pragma unroll\n  for (int i = 0; i < 32; ++i) a[i] *= 0.5f;"
_BZ0 = "wgmma_ss_n64_f16_z(b, make_desc(sq, 16, 1024), make_desc(sk, 16, 1024)); wg_commit();"
_READB = "wg_fence(); wgmma_ss_n64_f16(a, make_desc(sq, 16, 1024), make_desc(sk, 16, 1024), 1); wg_commit(); " \
         "wg_wait<1>(); out[threadIdx.x] += b[1]; "
_MMAZ = "wg_fence(); wgmma_ss_n64_f16_z(b, make_desc(sq + 32, 16, 1024), make_desc(sk + 32, 16, 1024)); wg_commit();"
_HALF = "fence_regs(a);\n#pragma unroll\n  for (int i = 0; i < 16; ++i) a[i] *= 0.5f;"
_LOOP = "\n#pragma unroll 1\n  for (int j = 0; j < {n}; ++j) {{ {body} }}\n  wg_wait<0>(); fence_regs(a);"
SYNTHETIC = {  # name -> kernel body; a, b: accumulators zeroed before it; n: a runtime count
    "if: wgmma on each way": f"if (n > 0) {{ {_mma('a', 0)} }} else {{ {_mma('a', 32)} }}\n"
                             "wg_wait<0>(); fence_regs(a);",
    "if: wgmma | ordinary write": f"if (n > 0) {{ {_mma('a', 0)} }} else {{ {_SCALE} wg_commit(); }}\n"
                                  "wg_wait<0>(); fence_regs(a);",
    "if without else after a write": f"{_SCALE}\nif (n > 0) {{ {_mma('a', 0)} }}\nwg_wait<0>(); fence_regs(a);",
    "if: wgmma | wait, write, wgmma": f"{_mma('a', 0)}\nif (n > 3) {{ wg_wait<0>(); {_SCALE} {_mma('a', 64)} }}\n"
                                      "wg_wait<0>(); fence_regs(a);",
    "loop, a in flight at the back edge": _LOOP.format(n="n", body=f"{_mma('b', 0)} wg_wait<0>(); {_mma('a', 32)}"),
    "the same after 1 empty commit": "wg_commit();" + _LOOP.format(
        n="n", body=f"{_mma('b', 0)} wg_wait<0>(); {_mma('a', 32)}"),
    "GEMM-like chain (wait<1>), n runtime": _LOOP.format(n="n", body=f"{_mma('a', 0)} wg_wait<1>();"),
    "the same after 1 empty commit ": "wg_commit();" + _LOOP.format(n="n", body=f"{_mma('a', 0)} wg_wait<1>();"),
    "the same, 63 trips": "wg_commit();" + _LOOP.format(n="63", body=f"{_mma('a', 0)} wg_wait<1>();"),
    "not a chain (b then a) after 1 empty commit, 63 trips": "wg_commit();" + _LOOP.format(
        n="63", body=f"{_mma('b', 0)} wg_wait<0>(); {_mma('a', 32)}"),
    "not a chain after 1 empty commit, a wait before the back edge": "wg_commit();" + _LOOP.format(
        n="n", body=f"{_mma('b', 0)} wg_wait<0>(); {_mma('a', 32)} wg_wait<0>();"),
    "not a chain after a real group, a in flight at the back edge": f"{_mma('b', 64)}" + _LOOP.format(
        n="n", body=f"{_mma('b', 0)} wg_wait<0>(); {_mma('a', 32)}"),
    # scores (b, written from scratch by a zero-scale wgmma) or an accumulating array (a) in flight at the back edge
    "b from scratch in flight at the back edge": _BZ0 + _LOOP.format(n="n", body=_READB + _MMAZ),
    "the same, a wait before the back edge": _BZ0 + _LOOP.format(n="n", body=_READB + _MMAZ + " wg_wait<0>();"),
    "the same, b accumulating (scale 1) in flight at the back edge": f"{_mma('b', 0)}" + _LOOP.format(
        n="n", body=_READB + _mma("b", 32)),
    "b from scratch in flight at the back edge, retired by wait<0> before it is read": _BZ0 + _LOOP.format(
        n="n", body=_READB.replace("wg_wait<1>()", "wg_wait<0>()") + _MMAZ),
    # an accumulator rewritten in part (half its elements) by ordinary code, then accumulated by a wgmma
    "after the loop, part of a rewritten, then a wgmma": _LOOP.format(n="n", body=f"{_mma('a', 0)} wg_wait<0>();")
    + f"\n{_HALF}\n{_mma('a', 32)}\nwg_wait<0>(); fence_regs(a);",
    "after the loop, all of a rewritten, then a wgmma": _LOOP.format(n="n", body=f"{_mma('a', 0)} wg_wait<0>();")
    + f"\n{_SCALE}\n{_mma('a', 32)}\nwg_wait<0>(); fence_regs(a);",
    "in the loop, part of a rewritten, then a wgmma": _LOOP.format(
        n="n", body=f"{_HALF} {_mma('a', 0)} wg_wait<0>();"),
    "in the loop, part of a rewritten at the end of its body, a wgmma after the loop": _LOOP.format(
        n="n", body=f"{_mma('a', 0)} wg_wait<0>(); {_HALF}").replace(
        "wg_wait<0>(); fence_regs(a);", f"{_mma('a', 32)} wg_wait<0>(); fence_regs(a);"),
    "a loop that zeroes a each trip, part of a rewritten, then a wgmma": _LOOP.format(
        n="n", body="for (int i = 0; i < 32; ++i) a[i] = 0.f; "
                    f"{_mma('a', 0)} wg_wait<0>(); {_HALF} {_mma('a', 32)} wg_wait<0>(); b[0] += a[0];"),
    "no loop, part of a rewritten, then a wgmma": f"{_mma('a', 0)} wg_wait<0>();\n{_HALF}\n{_mma('a', 32)}\n"
                                                  "wg_wait<0>(); fence_regs(a);",
}


def synthetic(rows: Path, only: str = "") -> None:
    """ptxas's verdict on each SYNTHETIC kernel (the device helpers of the first schedule of ``rows`` that has the
    n64 wgmma helper)."""
    n = len(rows.read_text().splitlines())
    src, flags = next(sf for sf in (_source(rows, i) for i in range(n)) if "void wgmma_ss_n64_f16(" in sf[0])
    prelude = src.split('extern "C" __global__')[0]
    for name, body in SYNTHETIC.items():
        if only not in name:
            continue
        k = (prelude + 'extern "C" __global__ void __launch_bounds__(128, 1) k(float* out, int n) {\n'
             "  using namespace pts;\n  __shared__ __align__(1024) uint8_t sm[32768];\n"
             "  const uint32_t sq = smem_u32(sm), sk = sq + 16384;\n  float a[32]; float b[32];\n"
             "#pragma unroll\n  for (int i = 0; i < 32; ++i) { a[i] = 0.f; b[i] = 0.f; }\n" + body +
             "\n#pragma unroll\n  for (int i = 0; i < 32; ++i) out[threadIdx.x * 32 + i] = a[i] + b[i];\n}\n")
        print(f"{name.strip()}: {verdict(k, flags)}", flush=True)


def ptx_wait(rows: Path, i: int, commits: list[int], lines: list[int], drop: list[int], show: bool) -> None:
    """Schedule ``i``'s PTX with waits after the given commits / lines and without the ``drop`` commits, assembled
    by ptxas."""
    src, flags = _source(rows, i)
    with tempfile.TemporaryDirectory(prefix="probe_") as td:
        (Path(td) / "k.cu").write_text(src)
        subprocess.run([nvcc_path(), *[f for f in flags if f not in ("-Xptxas", "-v")], "-ptx", "-o",
                        str(Path(td) / "k.ptx"), str(Path(td) / "k.cu")], check=True, capture_output=True)
        ptx = (Path(td) / "k.ptx").read_text().splitlines(keepends=True)
    at = [n for n, ln in enumerate(ptx, 1) if "wgmma.commit_group" in ln]
    if show:
        print(f"{i}: commits at PTX lines {at}")
    after = sorted({at[k - 1] for k in commits} | set(lines), reverse=True)
    gone = {at[k - 1] for k in drop}
    for n in gone:
        ptx[n - 1] = "\n"  # the line count stays, so later line numbers still name the same lines
    for n in after:
        ptx.insert(n, _WAIT)
    print(f"{i}: waits after PTX lines {sorted(after)}, commits dropped at {sorted(gone)}: "
          f"{verdict(''.join(ptx), flags, ptx=True)}")


_REG = re.compile(r"%[a-z]+\d+")


def _blocks(ptx: str) -> tuple[dict[str, list[str]], dict[str, list[str]], str]:
    """The entry's basic blocks (label -> statements), their successors, and the first block's label."""
    body = ptx[ptx.index("{", ptx.index(".entry")) + 1:ptx.rindex("}")]
    stmts: list[str] = []
    for ln in body.splitlines():
        ln = re.sub(r"//.*", "", ln).strip()
        if not ln or ln.startswith("."):
            continue
        stmts += [ln] if re.match(r"^\$?\w+:$", ln) else [x.strip() for x in ln.split(";") if x.strip()]
    blocks: list[tuple[str, list[str]]] = [("entry", [])]
    for st in stmts:
        if st.endswith(":"):
            blocks.append((st[:-1], []))
            continue
        blocks[-1][1].append(st)
        if re.search(r"\bbra\b|\bret\b|\bexit\b", st):
            blocks.append((f"_after{len(blocks)}", []))
    succ: dict[str, list[str]] = {}
    for k, (lab, ss) in enumerate(blocks):
        last, nxt = (ss[-1] if ss else ""), ([blocks[k + 1][0]] if k + 1 < len(blocks) else [])
        m = re.search(r"\bbra(?:\.uni)?\s+(\$?\w+)", last)
        succ[lab] = ([m.group(1)] + (nxt if last.startswith("@") else [])) if m else \
            ([] if re.search(r"\bret\b|\bexit\b", last) else nxt)
    return dict(blocks), succ, "entry"


def _step(st: tuple, s: str, hits: set[str]) -> tuple:
    """One PTX statement on a path's (committed groups, open group); an access of an in-flight register is a hit."""
    groups, open_ = st
    if "wgmma.mma_async" in s:
        braces = re.findall(r"\{([^}]*)\}", s)
        a = _REG.findall(braces[1]) if len(braces) > 1 and "%r" in braces[1] else []
        return groups, open_ | {(r, "acc") for r in _REG.findall(braces[0])} | {(r, "in") for r in a}
    if "wgmma.commit_group" in s:
        groups = (*groups, open_)
        return ((groups[0] | groups[1], *groups[2:]) if len(groups) > 8 else groups), frozenset()  # wait_group: 0-7
    m = re.search(r"wgmma.wait_group.sync.aligned\s+(\d+)", s)
    if m:
        return (groups[len(groups) - int(m.group(1)):] if int(m.group(1)) else ()), open_
    live = frozenset().union(open_, *groups)
    op = re.sub(r"^@!?%p\d+\s+", "", s)
    ops = op.split(None, 1)[1].split(",") if len(op.split(None, 1)) > 1 else []
    stores = op.startswith(("st.", "bar", "red.", "mbarrier", "cp.", "fence"))
    defs = [] if stores or not ops else _REG.findall(ops[0])
    uses = _REG.findall(",".join(ops if stores else ops[1:]))
    hits.update(f"{r} written: {s[:60]}" for r in defs if (r, "acc") in live or (r, "in") in live)
    hits.update(f"{r} read: {s[:60]}" for r in uses if (r, "acc") in live)
    return st


def ptx_scan(rows: Path) -> None:
    """Per attention schedule: ptxas's verdict (recorded) and whether the PTX has an in-flight access on a path."""
    found = {True: 0, False: 0}
    for i, line in enumerate(rows.read_text().splitlines()):
        row = json.loads(line)
        if row["op"] != "flash_attention":
            continue
        src, flags = _source(rows, i)
        with tempfile.TemporaryDirectory(prefix="probe_") as td:
            (Path(td) / "k.cu").write_text(src)
            subprocess.run([nvcc_path(), *[f for f in flags if f not in ("-Xptxas", "-v")], "-ptx", "-o",
                            str(Path(td) / "k.ptx"), str(Path(td) / "k.cu")], check=True, capture_output=True)
            blocks, succ, first = _blocks((Path(td) / "k.ptx").read_text())
        seen: dict[str, set] = {first: {((), frozenset())}}
        work, hits = [first], set()
        while work:
            lab = work.pop()
            out = set()
            for st in seen[lab]:
                for s in blocks[lab]:
                    st = _step(st, s, hits)
                out.add(st)
            for nxt in (n for n in succ[lab] if n in blocks):
                if not out <= seen.setdefault(nxt, set()):
                    seen[nxt] |= out
                    work.append(nxt)
        if row["serialized"]:
            found[bool(hits)] += 1
        print(f"{i}: ptxas {'serialised' if row['serialized'] else 'clean'}; PTX: "
              + (sorted(hits)[0] if hits else "no in-flight access"), flush=True)
    print(f"serialised kernels whose PTX holds an in-flight access: {found[True]} of {sum(found.values())}")


_INC = re.compile(r"setmaxnreg\.inc\.sync\.aligned\.u32 (\d+);")


def levels(rows: Path, idx: list[int], lv: list[int], sub: tuple[str, str] | None = None) -> None:
    """Per schedule: its pressure peak, ptxas's verdict at the consumer register levels a bisection of ``lv`` asks
    about, and the least clean one."""
    from codegen.cuda.wgmma_check import pressure

    for i in idx:
        src, flags = _source(rows, i)
        src = src.replace(*sub) if sub else src  # the source changed in one respect (``--sub``), then levelled
        p = pressure(src)
        if not _INC.search(src):
            print(f"{i}: no setmaxnreg.inc level to change (pressure {p.peak}, budget {p.budget})")
            continue
        got: dict[int, str] = {}
        lo, hi = 0, len(lv) - 1  # levels ascending; ptxas taken as monotone in them: bisect for the least clean
        lv = sorted(lv)
        while lo <= hi:
            mid = (lo + hi) // 2
            got[lv[mid]] = verdict(_INC.sub(f"setmaxnreg.inc.sync.aligned.u32 {lv[mid]};", src), flags)
            lo, hi = (lo, mid - 1) if got[lv[mid]] == "clean" else (mid + 1, hi)
        got = dict(sorted(got.items()))
        clean = [n for n, v in got.items() if v == "clean"]
        least = min(clean) if clean else None
        print(f"{i}: pressure {p.peak} (pinned {','.join(p.pinned)}; live {','.join(p.live)}), budget {p.budget}; "
              + "; ".join(f"{n}: {v}" for n, v in got.items())
              + f"; least clean {least}" + (f", {least - p.peak} above the pressure" if least else ""), flush=True)


def edit(rows: Path, idx: list[int], old: str, new: str, nth: list[int]) -> None:
    """ptxas's verdict on schedule ``i`` as emitted and with ``old`` replaced by ``new`` (its ``nth`` occurrences)."""
    for i in idx:
        src, flags = _source(rows, i)
        parts = src.split(old)
        if len(parts) == 1:
            print(f"{i}: {old!r} not in the source")
            continue
        out = parts[0] + "".join((new if not nth or k in nth else old) + p for k, p in enumerate(parts[1:], 1))
        print(f"{i}: as emitted {verdict(src, flags)}; {old!r} -> {new!r} (occurrences {nth or 'all'} of "
              f"{len(parts) - 1}): {verdict(out, flags)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", choices=("trip", "synthetic", "ptx-wait", "ptx-scan", "levels", "edit"))
    ap.add_argument("rows", type=Path, help="a verdicts.jsonl of python -m bench compile_verdicts")
    ap.add_argument("index", type=int, nargs="*", help="schedules (0-based lines of ROWS)")
    ap.add_argument("--after-commit", type=int, nargs="*", default=[])
    ap.add_argument("--at", type=int, nargs="*", default=[])
    ap.add_argument("--drop-commit", type=int, nargs="*", default=[])
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--only", default="", help="synthetic: the kernels whose name holds this text")
    ap.add_argument("--levels", type=int, nargs="*", default=list(range(256, 95, -8)))
    ap.add_argument("--sub", nargs=2, metavar=("OLD", "NEW"))
    ap.add_argument("--nth", type=int, nargs="*", default=[])
    a = ap.parse_args()
    if a.probe == "trip":
        trip(a.rows, a.index)
    elif a.probe == "synthetic":
        synthetic(a.rows, a.only)
    elif a.probe == "ptx-scan":
        ptx_scan(a.rows)
    elif a.probe == "levels":
        levels(a.rows, a.index, a.levels, a.sub)
    elif a.probe == "edit":
        edit(a.rows, a.index, *a.sub, a.nth)
    else:
        for i in a.index:
            ptx_wait(a.rows, i, a.after_commit, a.at, a.drop_commit, a.list)


if __name__ == "__main__":
    main()
