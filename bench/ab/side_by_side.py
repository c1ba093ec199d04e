"""Side-by-side of `codegen.round` result files (same committed schedules, two code versions); the last file is
"now", the ones before it are "before" (a config found in several takes the first):
python -m bench ab side_by_side results/round_h200.json results/mamba_h200.json results/round_skeleton_h200.json"""
import json
import sys


def lib(row: dict) -> tuple[str, float | None]:
    for k in ("sdpa_cudnn_us", "cublas_us", "triton_us"):
        if row.get(k):
            return k[:-3], row[k]
    return "", None


def f(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def main(*files: str) -> None:
    *before, now = files
    a: dict = {}
    for p in before:
        for r in json.load(open(p))["rows"]:
            a.setdefault(r["config"], r)
    b = {r["config"]: r for r in json.load(open(now))["rows"]}
    print("| config | exact µs before | exact µs now | now / before | hand plan before → now | library before → now |"
          " exact / library before → now |")
    print("|---|---|---|---|---|---|---|")
    for c in sorted(set(a) & set(b), key=list(b).index):
        x, y = a[c], b[c]
        hx = x.get("hand_us") or x.get("fa3_hand_us")
        ln, lx = lib(x)
        _, ly = lib(y)
        rx = f"{lx / x['cpsat_us']:.3f}" if lx else "—"
        ry = f"{ly / y['cpsat_us']:.3f}" if ly else "—"
        print(f"| {c} | {f(x['cpsat_us'])} | {f(y['cpsat_us'])} | {y['cpsat_us'] / x['cpsat_us']:.3f} | {f(hx)} → "
              f"{f(y.get('hand_us'))} | {ln} {f(lx)} → {f(ly)} | {rx} → {ry} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
