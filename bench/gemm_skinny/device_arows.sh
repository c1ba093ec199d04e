# One device call: small_m.py (A's box of M rows, before/after) and the 45 GEMM first choices of cands_arows.json
# against cands_deepen.json (cubins compiled on the CPU machine: .cubin_sm, .cubin_dp; carry small_m_sources.json).
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p $OUT/sm $OUT/space
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv,noheader > $OUT/space/gpu.txt; date -u >> $OUT/space/gpu.txt
PTSOLVE_CACHE_DIR=$PWD/.cubin_sm timeout 200 python3 -m bench gemm_skinny small_m run --out $OUT/sm/small_m.json > $OUT/sm/run.log 2>&1; echo "small_m exit $?"
python3 -m bench gemm_skinny small_m report $OUT/sm/small_m.json
PTSOLVE_CACHE_DIR=$PWD/.cubin_dp timeout 400 python3 -m bench gemm_space run results/gemm_skinny/cands_deepen.json results/gemm_skinny/cands_arows.json --out $OUT/space > $OUT/space/run.log 2>&1; echo "space exit $?"
python3 - <<'PY'
import json, math, os
r = json.load(open(os.environ["OUT"] + "/space/gemm_space.json"))
a, b = [], []
for n, x in r["shapes"].items():
    us = x["us"]; cb = us["cublas"]
    a.append(cb / us["deepen"]); b.append(cb / us.get("arows", us["deepen"]))
    if "arows" in us and abs(us["arows"] / us["deepen"] - 1) > 0.01:
        print(f"{n:20s} deepen {us['deepen']:9.2f} arows {us['arows']:9.2f} ratio {us['arows']/us['deepen']:.3f} cublas/arows {cb/us['arows']:.3f}")
g = lambda v: math.exp(sum(map(math.log, v)) / len(v))
print("geomean cuBLAS/ours: deepen %.4f arows %.4f (n=%d)" % (g(a), g(b), len(a)))
PY
