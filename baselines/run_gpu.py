"""Run the whole baseline suite on the GPU machine: ``python3 baselines/run_gpu.py --out $OUT``.

Writes ``$OUT/baselines_h200.json`` (every number, the device, library versions, date) and prints a
markdown table last. Each family (copy+GEMM, attention, Mamba2) runs in a child process that appends one
JSON line per (config, implementation) as it finishes; a failure inside a config (OOM, a kernel that
refuses a shape) is caught there and recorded. A CUDA error that poisons the context (illegal address
from index overflow, say) makes the child exit; the parent records the config it was on as failed and
starts a new child for the rest. Correctness is checked on small shapes against float32 references
before timing; a config whose check failed is timed but marked ``check_failed``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `import baselines.*` work from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baselines import configs  # noqa: E402

FAMILIES: dict[str, list[str]] = {
    "gemm": ["COPY"] + [c["name"] for c in configs.GEMM_CONFIGS],
    "attention": [c["name"] for c in configs.FA_CONFIGS + configs.FA_CAUSAL_CONFIGS],
    # interleaved (CS0, ST0, CS1, ...): if the time budget runs out, both kernels lose the same (largest) shapes
    "mamba": [c["name"] for pair in zip(configs.CHUNK_SCAN_CONFIGS, configs.CHUNK_STATE_CONFIGS) for c in pair],
}
TOL = {"fp16": 1e-2, "bf16": 2e-2}  # rel. Frobenius error vs float32 for half-precision inputs
STICKY_EXIT = 3  # child exit code: the CUDA context is unusable, start a new process
# children log on the parent's clock, so the progress lines of one run read as one timeline
T0 = float(os.environ.get("BASELINES_T0", time.time()))
os.environ["BASELINES_T0"] = str(T0)


def log(msg: str) -> None:
    """A progress line with seconds since start."""
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------- child side


class Child:
    """Runs a list of config names of one family in this process, appending JSON lines to ``path``."""

    def __init__(self, path: str, quick: bool) -> None:
        import torch

        self.torch = torch
        self.path = path
        self.quick = quick
        self.rep = 10 if quick else 50
        self.budget_ms = 100.0 if quick else 300.0  # timed ms per measurement, caps rep for huge configs
        self.checks: dict[str, Any] = {}
        self.gqa: dict[str, str] = {}

    def emit(self, rec: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def alive(self) -> bool:
        """Whether the CUDA context still works after an error."""
        try:
            self.torch.cuda.synchronize()
            return self.torch.ones(1, device="cuda").add_(1).item() == 2.0
        except Exception:  # noqa: BLE001 - any error here means the context is gone
            return False

    def bench(self, fn: Any, warmup: int = 3) -> dict[str, Any]:
        from baselines.timing import bench

        return bench(fn, warmup=warmup, rep=self.rep, flush_l2=True, max_total_ms=self.budget_ms)

    def meta(self) -> None:
        import importlib.metadata as md

        import triton

        torch = self.torch
        props = torch.cuda.get_device_properties(0)
        try:
            mamba_version = md.version("mamba_ssm")
        except md.PackageNotFoundError:
            mamba_version = None
        self.emit(
            {
                "meta": {
                    "device": torch.cuda.get_device_name(0),
                    "sm_count": props.multi_processor_count,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                    "torch": torch.__version__,
                    "cuda": torch.version.cuda,
                    "cudnn": torch.backends.cudnn.version(),
                    "triton": triton.__version__,
                    "mamba_ssm": mamba_version,
                    "python": sys.version.split()[0],
                    "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                }
            }
        )

    def run(self, family: str, names: list[str]) -> int:
        self.meta()
        setup = {"gemm": self.setup_gemm, "attention": self.setup_attention, "mamba": self.setup_mamba}[family]
        try:
            setup()
        except Exception as exc:  # noqa: BLE001 - checks are recorded as failed; the configs still run
            log(f"setup of {family} failed: {type(exc).__name__}: {exc}")
            self.emit({"check": f"{family}-setup", "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
            if not self.alive():
                return STICKY_EXIT
        for name in names:
            try:
                self.run_one(family, name)
            except Exception as exc:  # noqa: BLE001 - record any per-config failure, go on
                err = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                log(f"{name} FAILED {err}")
                self.emit({"name": name, "impl": "*", "status": "failed", "error": err})
                if not self.alive():
                    log("CUDA context lost: restarting in a new process")
                    return STICKY_EXIT
            self.free()
        return 0

    def free(self) -> None:
        """Return cached blocks between configs, so a huge config does not fail on fragmentation."""
        try:
            self.torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - a dead context is detected by alive(), not here
            pass

    def record(self, cfg: dict[str, Any], impl: str, t: dict[str, Any], check_key: str, **extra: Any) -> None:
        from baselines.timing import tflops

        chk = self.checks.get(check_key, {})
        ok = chk.get("ok", True)
        rec = {
            "name": cfg["name"],
            "impl": impl,
            "status": "ok" if ok else "check_failed",
            **t,
            "tflops": tflops(cfg["flops"], t["median_ms"]),
            "check_rel_err": chk.get("rel_err"),
            **extra,
        }
        self.emit(rec)
        log(
            f"{cfg['name']:6s} {impl:8s} {t['median_ms']:9.4f} ms  {rec['tflops']:7.1f} TFLOP/s  n={t['n']}"
            + ("" if ok else "  CHECK FAILED")
        )

    def set_check(self, key: str, fn: Any, tol: float) -> None:
        try:
            err = fn()
            self.checks[key] = {"rel_err": err, "ok": bool(err < tol)}
        except Exception as exc:  # noqa: BLE001
            self.checks[key] = {"rel_err": None, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        log(f"check {key}: {self.checks[key]}")
        self.emit({"check": key, **self.checks[key], "tol": tol})

    # --- GEMM and copy
    def setup_gemm(self) -> None:
        from baselines import gemm

        for dname, dtype in (("fp16", self.torch.float16), ("bf16", self.torch.bfloat16)):
            self.set_check(f"gemm-{dname}", lambda d=dtype: gemm.check(d), TOL[dname])

    def run_one_gemm(self, name: str) -> None:
        from baselines import gemm

        torch = self.torch
        if name == "COPY":  # device-to-device copy bandwidth, as a check of the machine's state
            n = 2**30  # 1 Gi float32 = 4 GiB read + 4 GiB written
            src = torch.rand(n, device="cuda")
            dst = torch.empty_like(src)
            t = self.bench(lambda: dst.copy_(src))
            tbs = 2 * n * 4 / (t["median_ms"] * 1e9)
            self.emit({"name": "COPY", "impl": "torch.copy_", "status": "ok", **t, "tb_per_s": tbs})
            log(f"COPY {t['median_ms']:.3f} ms  {tbs:.2f} TB/s (read+write)")
            return
        cfg = configs.by_name(name)
        for dname, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            a, b = gemm.make_inputs(cfg["m"], cfg["n"], cfg["k"], dtype)
            self.record(cfg, f"cublas-{dname}", self.bench(gemm.make_fn(a, b)), f"gemm-{dname}")
            del a, b

    # --- attention
    def setup_attention(self) -> None:
        from baselines import attention

        for be in attention.BACKENDS:
            mode, why = attention.gqa_mode(be, self.torch.float16)
            self.gqa[be] = mode
            log(f"{be}: GQA mode {mode} {why}")
            self.emit({"gqa_probe": be, "mode": mode, "why": why})
            for causal in (False, True):
                key = f"attn-{be}-{'causal' if causal else 'full'}"
                self.set_check(
                    key, lambda b=be, c=causal, m=mode: attention.check(b, m, c, self.torch.float16), TOL["fp16"]
                )
                # ragged seq (not a multiple of any tile): informative, does not gate the timings
                self.set_check(
                    key + "-ragged300",
                    lambda b=be, c=causal, m=mode: attention.check(b, m, c, self.torch.float16, seq=300),
                    TOL["fp16"],
                )

    def run_one_attention(self, name: str) -> None:
        from baselines import attention

        cfg = configs.by_name(name)
        q, k, v = attention.make_inputs(
            cfg["batch"], cfg["heads"], cfg["kv_heads"], cfg["seq"], cfg["head_dim"], self.torch.float16
        )
        for be in attention.BACKENDS:
            key = f"attn-{be}-{'causal' if cfg['causal'] else 'full'}"
            try:
                mode = self.gqa.get(be, "expand")
                fn = attention.make_fn(be, q, k, v, cfg["causal"], mode)
                self.record(cfg, be, self.bench(fn), key, gqa=mode)
            except Exception as exc:  # noqa: BLE001 - one backend failing must not hide the other
                err = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                log(f"{name} {be} FAILED {err}")
                self.emit({"name": name, "impl": be, "status": "failed", "error": err})
                if not self.alive():
                    raise
            self.free()

    # --- Mamba2
    def setup_mamba(self) -> None:
        from baselines import mamba2

        self.k = mamba2.load_kernels()
        for kind in ("chunk_scan", "chunk_state"):
            self.set_check(f"mamba-{kind}", lambda kd=kind: mamba2.check(self.k, kd, self.torch.float16), TOL["fp16"])
            # float32 vs float32, two independent references: should agree to ~1e-6
            self.set_check(f"mamba-{kind}-ref-vs-library-ref", lambda kd=kind: mamba2.check_reference(self.k, kd), 1e-4)

    def run_one_mamba(self, name: str) -> None:
        from baselines import mamba2

        cfg = configs.by_name(name)
        kind = cfg["kind"]
        kernel = self.k.chunk_scan_kernel if kind == "chunk_scan" else self.k.chunk_state_kernel
        mamba2.reset_autotune(kernel)
        inp = mamba2.make_inputs(
            self.k,
            cfg["batch"],
            cfg["seq"],
            cfg["heads"],
            cfg["head_dim"],
            cfg["d_state"],
            cfg["chunk"],
            cfg["ngroups"],
            self.torch.float16,
        )
        fn = mamba2.chunk_scan_fn(self.k, inp) if kind == "chunk_scan" else mamba2.chunk_state_fn(self.k, inp)
        t = self.bench(fn)
        tuned = mamba2.best_config(kernel)
        full_err = mamba2.last_batch_consistency(self.k, kind, inp, fn()) if cfg["batch"] > 1 else None
        self.record(cfg, "triton", t, f"mamba-{kind}", best_config=tuned, last_batch_rel_err=full_err)
        if full_err is not None and not full_err < 1e-3:
            log(f"{name} last-batch consistency FAILED: rel_err {full_err}")
            self.emit({"name": name, "impl": "triton", "status": "wrong_at_full_size", "last_batch_rel_err": full_err})

    def run_one(self, family: str, name: str) -> None:
        {"gemm": self.run_one_gemm, "attention": self.run_one_attention, "mamba": self.run_one_mamba}[family](name)


# ---------------------------------------------------------------- parent side


def run_family(family: str, names: list[str], jsonl: Path, quick: bool, deadline: float) -> None:
    """Run ``names`` in child processes until each has a record, restarting after a lost CUDA context.

    ``deadline`` (time.time() value): no child starts after it, and a running one is killed at it; the
    configs left are recorded as skipped.
    """
    remaining = list(names)
    while remaining:
        timeout_s = deadline - time.time()
        if timeout_s < 5:
            with open(jsonl, "a") as f:
                for n in remaining:
                    f.write(
                        json.dumps(
                            {"name": n, "impl": "*", "status": "failed", "error": "skipped: suite time budget spent"}
                        )
                        + "\n"
                    )
            log(f"{family}: time budget spent, skipped {remaining}")
            return
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            family,
            "--jsonl",
            str(jsonl),
            "--names",
            ",".join(remaining),
        ] + (["--quick"] if quick else [])
        try:
            proc = subprocess.run(cmd, stdout=sys.stdout, stderr=subprocess.PIPE, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:  # a hung kernel: give up on the config it was on
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            proc = subprocess.CompletedProcess(cmd, -9, stderr=f"killed at the suite deadline\n{err}")
        done = {r["name"] for r in read_jsonl(jsonl) if "name" in r}
        left = [n for n in remaining if n not in done]
        if proc.returncode != 0:
            tail = (proc.stderr or "").strip().splitlines()[-3:]
            log(f"{family} child exited {proc.returncode}: {' | '.join(tail)[:400]}")
            if left and proc.returncode != STICKY_EXIT:  # a hard crash inside `left[0]`: record it
                with open(jsonl, "a") as f:
                    f.write(
                        json.dumps(
                            {
                                "name": left[0],
                                "impl": "*",
                                "status": "failed",
                                "error": f"process died rc={proc.returncode}: {' | '.join(tail)[:400]}",
                            }
                        )
                        + "\n"
                    )
                left = left[1:]
        elif left:
            log(f"{family} child finished without recording {left}")
            break
        if left == remaining:  # no progress: do not loop forever
            break
        remaining = left


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def shape_str(cfg: dict[str, Any]) -> str:
    if cfg["kind"] == "attention":
        return f"{cfg['model']} B={cfg['batch']} H={cfg['heads']}/{cfg['kv_heads']} S={cfg['seq']}" + (
            " causal" if cfg["causal"] else ""
        )
    if cfg["kind"] == "gemm":
        return f"{cfg['m']}x{cfg['n']}x{cfg['k']}"
    return f"B={cfg['batch']} S={cfg['seq']}"


def markdown(results: list[dict[str, Any]]) -> str:
    """One row per config: each implementation's median ms and TFLOP/s (or its failure)."""
    rows: dict[str, dict[str, str]] = {}
    impls: dict[str, list[str]] = {}
    for r in results:
        if "name" not in r or r["name"] == "COPY" or r.get("status") == "wrong_at_full_size":
            continue
        fam = configs.by_name(r["name"])["kind"]
        if r["impl"] != "*" and r["impl"] not in impls.setdefault(fam, []):
            impls[fam].append(r["impl"])
        cell = f"{r['median_ms']:.3f} ms / {r['tflops']:.1f}" if "median_ms" in r else f"FAILED: {r['error'][:80]}"
        if r.get("status") == "check_failed":
            cell += " (check failed)"
        if r.get("last_batch_rel_err") is not None and not r["last_batch_rel_err"] < 1e-3:
            cell += " (WRONG at full size)"
        rows.setdefault(r["name"], {})[r["impl"]] = cell
    lines: list[str] = []
    for fam in dict.fromkeys(configs.by_name(n)["kind"] for n in rows):
        imps = impls.get(fam) or ["*"]
        lines += [
            "",
            "| config | shape | " + " | ".join(f"{i} (ms / TFLOP/s)" if i != "*" else "result" for i in imps) + " |",
            "|---|---|" + "---|" * len(imps),
        ]
        for cfg in configs.all_configs():
            if cfg["kind"] != fam or cfg["name"] not in rows:
                continue
            row = rows[cfg["name"]]
            cells = [row.get(i, row.get("*", "-")) for i in imps]
            lines.append(f"| {cfg['name']} | {shape_str(cfg)} | " + " | ".join(cells) + " |")
    for r in results:
        if r.get("name") == "COPY" and "tb_per_s" in r:
            lines += [
                "",
                f"Device copy: {r['tb_per_s']:.2f} TB/s (read + write, 4 GiB each way, median {r['median_ms']:.3f} ms)",
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for baselines_h200.json")
    p.add_argument("--families", default="gemm,attention,mamba", help="comma list of gemm, attention, mamba")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke test, not for reporting)")
    p.add_argument("--budget-s", type=float, default=450.0, help="wall-clock budget of the whole suite (s)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--names", help=argparse.SUPPRESS)
    p.add_argument("--jsonl", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.child:
        return Child(a.jsonl, a.quick).run(a.child, a.names.split(","))

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "baselines_h200.jsonl"
    jsonl.unlink(missing_ok=True)
    for fam in a.families.split(","):
        log(f"== {fam}: {len(FAMILIES[fam])} configs")
        run_family(fam, FAMILIES[fam], jsonl, a.quick, deadline=T0 + a.budget_s)
    recs = read_jsonl(jsonl)
    meta = next((r["meta"] for r in recs if "meta" in r), {})
    meta["wall_s"] = round(time.time() - T0, 1)
    meta["quick"] = a.quick
    doc = {
        "meta": meta,
        "configs": {c["name"]: c for c in configs.all_configs()},
        "checks": [r for r in recs if "check" in r],
        "gqa": [r for r in recs if "gqa_probe" in r],
        "results": [r for r in recs if "name" in r],
    }
    (out / "baselines_h200.json").write_text(json.dumps(doc, indent=1))
    print(
        f"\n## Baselines on {meta.get('device')} ({meta.get('date_utc')}), torch {meta.get('torch')}, "
        f"triton {meta.get('triton')}, cuDNN {meta.get('cudnn')}, fp16 unless named"
    )
    print(markdown(doc["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
