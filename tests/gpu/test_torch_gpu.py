"""GPU tests of ``ptsolve.torch`` (shape-generic kernels through torch.library custom ops) on an H100/H200.

Attention follows FlashAttention's rule: max|out − ref| ≤ 2·max|out_lowprec − ref| + 1e-3, ref in float32 and
out_lowprec the same PyTorch formula in the input dtype; the output's memory is NaN-filled before each call, so a
row the kernel does not write fails. The matrix: tiny, ragged, seq_q < seq_kv and seq_q > seq_kv (causal rows that
see no key are zeros), long, GQA, MQA, a softmax scale, varlen, both dtypes and head_dims; then torch.compile
(fullgraph), CUDA-graph capture, the fake implementations (torch.library.opcheck) and the errors."""
from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu  # the fixtures torch and pt: tests/conftest.py


def ref_attention(q, k, v, causal, scale, dtype):
    """softmax(q kᵀ scale, bottom-right causal) v in ``dtype``; rows that see no key are 0. q [B,Sq,H,D]."""
    import torch
    q, k, v = (x.to(dtype).transpose(1, 2) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    sq, skv = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(skv, device=q.device)[None, :]
        s = s.masked_fill(j > i + (skv - sq), float("-inf"))
    p = torch.softmax(s.float(), -1).nan_to_num(0.0).to(dtype)  # an all -inf row: NaN -> 0 (FlashAttention's zeros)
    return (p @ v).transpose(1, 2)


def poison(torch, shape, dtype):
    """Fill and free a block of the size the op will allocate, so the caching allocator hands it out NaN-filled."""
    x = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    del x


def check(torch, out, q, k, v, causal, scale):
    ref = ref_attention(q, k, v, causal, scale, torch.float32)
    low = ref_attention(q, k, v, causal, scale, q.dtype).float()
    err, lerr = (out.float() - ref).abs().max().item(), (low - ref).abs().max().item()
    assert not math.isnan(err), "NaN in the output (a row not written?)"
    assert err <= 2 * lerr + 1e-3, f"max err {err:.3g} > 2 * {lerr:.3g} + 1e-3"
    return err, lerr


SHAPES = [  # B, Sq, Skv, H, Hkv, D, causal, dtype
    (1, 1, 1, 1, 1, 64, False, "fp16"),
    (1, 1, 1, 2, 1, 128, True, "bf16"),
    (2, 77, 77, 4, 4, 128, True, "bf16"),
    (3, 130, 257, 8, 2, 64, False, "fp16"),
    (2, 100, 300, 4, 2, 128, True, "fp16"),      # seq_q < seq_kv
    (2, 300, 100, 4, 4, 64, True, "bf16"),       # seq_q > seq_kv: the first 200 rows see no key
    (1, 513, 64, 8, 8, 128, True, "fp16"),       # whole query blocks see no key
    (1, 1, 1000, 8, 2, 128, True, "bf16"),       # decode step
    (1, 4096, 4096, 8, 2, 128, True, "bf16"),    # long
    (1, 2000, 6000, 4, 4, 64, False, "fp16"),
    (2, 200, 200, 16, 1, 64, True, "fp16"),      # MQA
    (1, 333, 333, 32, 4, 128, False, "bf16"),    # GQA 8
    (2, 300, 300, 8, 8, 96, True, "fp16"),       # Phi-3's head_dim: padded tiles
    (1, 4, 700, 8, 8, 96, True, "fp16"),         # a short query of head_dim 96: the prefill kernel, not decode's
    (1, 513, 513, 4, 2, 192, False, "fp16"),
    (2, 333, 1000, 8, 4, 256, True, "fp16"),     # Gemma-2's
]


@pytest.mark.parametrize("B,Sq,Skv,H,Hkv,D,causal,dt", SHAPES)
def test_flash_attention_matrix(torch, pt, B, Sq, Skv, H, Hkv, D, causal, dt):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    g = torch.Generator(device="cuda").manual_seed(B * 1000 + Sq + Skv)
    q = torch.randn(B, Sq, H, D, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(B, Skv, Hkv, D, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(B, Skv, Hkv, D, device="cuda", dtype=dtype, generator=g)
    poison(torch, q.shape, dtype)
    out = pt.flash_attention(q, k, v, causal=causal)
    check(torch, out, q, k, v, causal, 1 / math.sqrt(D))
    if causal and Sq > Skv:  # FlashAttention's convention for rows that see no key
        assert out[:, : Sq - Skv].abs().max().item() == 0


def test_softmax_scale_and_strided_inputs(torch, pt):
    q, k, v = (torch.randn(2, 8, 300, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [B, S, H, D] views, as transformers passes them
    out = pt.flash_attention(qt, kt, vt, causal=True, softmax_scale=0.3)
    check(torch, out, qt, kt, vt, True, 0.3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dt,D,H,Hkv", [("bf16", 128, 8, 2), ("fp16", 64, 4, 4), ("fp16", 96, 8, 8),
                                        ("fp16", 256, 8, 4)])
def test_varlen(torch, pt, causal, dt, D, H, Hkv):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    lq, lk = [1, 77, 300, 5, 129], [1, 77, 500, 3, 129]  # one sequence with seq_q > seq_kv
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lq), H, D, device="cuda", dtype=dtype)
    k = torch.randn(sum(lk), Hkv, D, device="cuda", dtype=dtype)
    v = torch.randn(sum(lk), Hkv, D, device="cuda", dtype=dtype)
    poison(torch, q.shape, dtype)
    out = pt.flash_attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=causal)
    for b in range(len(lq)):
        sq, sk = slice(cq[b].item(), cq[b + 1].item()), slice(ck[b].item(), ck[b + 1].item())
        check(torch, out[sq][None], q[sq][None], k[sk][None], v[sk][None], causal, 1 / math.sqrt(D))


@pytest.mark.parametrize("M,N,K,dt", [(1000, 1024, 520, "fp16"), (1, 4096, 4096, "bf16"), (4097, 72, 8, "bf16"),
                                      (3000, 6144, 4096, "fp16"),
                                      # N off the 16-byte pitch: the register-store classes (gemm/<dtype>/regs)
                                      (4095, 4097, 1024, "fp16"), (33, 77, 64, "bf16"), (1, 4100, 4096, "fp16")])
def test_gemm(torch, pt, M, N, K, dt):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(N, K, device="cuda", dtype=dtype) / math.sqrt(K)
    poison(torch, (M, N), dtype)
    out = pt.gemm(a, b)
    ref = a.float() @ b.float().T
    low = (a @ b.T).float()
    err, lerr = (out.float() - ref).abs().max().item(), (low - ref).abs().max().item()
    assert err <= 2 * lerr + 1e-3, (err, lerr)
    x = torch.randn(2, 5, K, device="cuda", dtype=dtype)  # a [..., K], as F.linear takes it
    assert pt.gemm(x, b).shape == (2, 5, N)


def test_torch_compile_fullgraph(torch, pt):
    q, k, v = (torch.randn(2, 256, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    w = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16) / 23

    def f(q, k, v):
        o = pt.flash_attention(q * 1.0, k, v, causal=True)
        return pt.gemm(o.reshape(2, 256, 512), w).relu()

    eager = f(q, k, v)
    comp = torch.compile(f, fullgraph=True)(q, k, v)
    torch.testing.assert_close(comp, eager, atol=2e-2, rtol=2e-2)


def test_cuda_graph_capture(torch, pt):
    q, k, v = (torch.randn(1, 384, 4, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    w = torch.randn(256, 512, device="cuda", dtype=torch.float16) / 23
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up (module load, tensor maps) off the capture
        pt.gemm(pt.flash_attention(q, k, v, causal=True).reshape(384, 512), w)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pt.gemm(pt.flash_attention(q, k, v, causal=True).reshape(384, 512), w)
    for _ in range(2):
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        want = pt.gemm(pt.flash_attention(q, k, v, causal=True).reshape(384, 512), w)
        torch.testing.assert_close(out, want, atol=0, rtol=0)


def test_fake_impls_opcheck(torch, pt):
    q = torch.randn(1, 100, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 80, 2, 64, device="cuda", dtype=torch.float16)
    torch.library.opcheck(torch.ops.ptsolve.flash_attention.default, (q, k, k.clone(), True, 0.125))
    cu = torch.tensor([0, 40, 100], dtype=torch.int32, device="cuda")
    cuk = torch.tensor([0, 30, 80], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.ptsolve.flash_attention_varlen.default,
                          (q[0], k[0], k[0].clone(), cu, cuk, 60, 50, True, 0.125))
    torch.library.opcheck(torch.ops.ptsolve.flash_attention_lse.default, (q, k, k.clone(), True, 0.125))
    torch.library.opcheck(torch.ops.ptsolve.flash_attention_varlen_lse.default,
                          (q[0], k[0], k[0].clone(), cu, cuk, 60, 50, True, 0.125))
    f = torch.compile(lambda q, k: pt.flash_attention(q, k, k, causal=True, return_lse=True), fullgraph=True)
    o, lse = f(q, k)
    o2, lse2 = pt.flash_attention(q, k, k, causal=True, return_lse=True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    a, b = (torch.randn(n, 16, device="cuda", dtype=torch.bfloat16) for n in (40, 24))
    torch.library.opcheck(torch.ops.ptsolve.gemm.default, (a, b))


def test_errors_name_the_fix(torch, pt):
    from ptsolve.errors import ShapeError
    q = torch.randn(1, 16, 2, 80, device="cuda", dtype=torch.float16)
    with pytest.raises(ShapeError, match="head_dim=80"):
        pt.flash_attention(q, q, q)
    with pytest.raises(ShapeError, match="float16"):
        pt.flash_attention(q.float(), q.float(), q.float())
    with pytest.raises(ShapeError, match="K=12 must be a multiple of 8"):
        pt.gemm(torch.randn(4, 12, device="cuda", dtype=torch.float16),
                torch.randn(8, 12, device="cuda", dtype=torch.float16))


def test_one_binary_serves_every_shape_of_a_class(torch, pt):
    from codegen import runtime
    from ptsolve import serve
    q = torch.randn(2, 100, 8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 100, 2, 64, device="cuda", dtype=torch.bfloat16)
    pt.flash_attention(q, k, k, causal=True)
    runs, kernels = runtime.NVCC_RUNS[0], len(serve.kernels._KERNELS)
    for sq, skv, b in ((17, 1, 1), (1000, 77, 3), (4097, 5000, 1)):  # seq_q <= 16: the decode kernel's
        q = torch.randn(b, sq, 8, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, skv, 2, 64, device="cuda", dtype=torch.bfloat16)
        pt.flash_attention(q, k, k, causal=True)
    torch.cuda.synchronize()
    assert runtime.NVCC_RUNS[0] == runs and len(serve.kernels._KERNELS) == kernels


def test_warm_calls_reuse_the_launch_and_see_new_data(torch, pt):
    q, k, v = (torch.randn(2, 200, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    a = pt.flash_attention(q, k, v, causal=True)
    b = pt.flash_attention(q, k, v, causal=True)  # the eager fast path: the prepared launch, a new output
    assert a.data_ptr() != b.data_ptr()
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    q.copy_(torch.randn_like(q))  # same addresses, new values
    check(torch, pt.flash_attention(q, k, v, causal=True), q, k, v, True, 1 / math.sqrt(64))
    w = torch.randn(64, 96, device="cuda", dtype=torch.float16) / 10
    x = torch.randn(96, 3, 5, device="cuda", dtype=torch.float16).permute(1, 2, 0)  # [3, 5, 96], reshape copies
    for _ in range(2):
        torch.testing.assert_close(pt.gemm(x, w).float(), (x.float() @ w.float().T), atol=2e-2, rtol=2e-2)


def test_new_tensors_of_one_layout_run_through_its_family(torch, pt):
    """A prefill's pattern: new q / k / v of one layout every call (strided as transformers hands them over). From
    the third call on they run the layout's family (its launch re-pointed in place), each output right for its own
    inputs; the first tensors still run their own kept launch."""
    def fresh():
        q, k, v = (torch.randn(2, n, 333, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                   for n in (8, 2, 2))
        return q, k, v
    ins = [fresh() for _ in range(5)]
    for q, k, v in ins + ins[:1]:
        poison(torch, q.shape, q.dtype)
        check(torch, pt.flash_attention(q, k, v, causal=True), q, k, v, True, 1 / math.sqrt(128))
    assert any(key[0] == ins[0][0].shape for key in pt._MOVE)


@pytest.mark.parametrize("b,L,h,g,n,q,dt", [(1, 300, 4, 1, 128, 256, "fp16"), (2, 1000, 8, 2, 64, 128, "bf16"),
                                            (1, 64, 2, 1, 128, 64, "fp16")])
def test_mamba_chunk_ops(torch, pt, b, L, h, g, n, q, dt):
    """mamba_ssm's layouts in and out, against codegen.harness's float64 references; ragged last chunks; bf16;
    grouped B/C; and under torch.compile (the fake implementations give the shapes)."""
    from codegen.harness import TOL, chunk_scan_reference, chunk_state_reference, rel_err, scan_inputs, state_inputs
    p = {"batch": b, "seq": L, "heads": h, "head_dim": 64, "d_state": n, "chunk": q, "groups": g, "dtype": dt}
    s = scan_inputs(p, seed=1)
    out = pt.mamba_chunk_scan(s["cb"], s["x"], s["dt"], s["dA_cumsum"], s["C"], s["states"])
    assert out.shape == s["x"].shape and out.dtype == s["x"].dtype
    assert rel_err(out, chunk_scan_reference(**s)) <= TOL
    st = state_inputs(p, seed=2)
    states = pt.mamba_chunk_state(st["B"], st["x"], st["dt"], st["dA_cumsum"])
    assert states.dtype == torch.float32 and states.shape == (b, -(-L // q), h, 64, n)
    assert rel_err(states, chunk_state_reference(st["x"], st["B"], st["dt"], st["dA_cumsum"])) <= TOL
    compiled = torch.compile(lambda *a: pt.mamba_chunk_state(*a), fullgraph=True)
    torch.testing.assert_close(compiled(st["B"], st["x"], st["dt"], st["dA_cumsum"]), states, atol=0, rtol=0)
    with pytest.raises(Exception, match="d_state"):
        pt.mamba_chunk_state(st["B"][..., :48].contiguous(), st["x"], st["dt"], st["dA_cumsum"])


MAMBA_SHAPES = [(1, 1, 2, 1), (2, 300, 8, 2), (3, 1000, 24, 8), (1, 2048, 64, 1)]  # b, L, h, g of one class


def test_mamba_one_kernel_serves_every_shape_of_a_class(torch, pt):
    """Class (fp16, head_dim 64, d_state 128, chunk 256): batch, seq (ragged, one position to 8 chunks), heads and
    ngroups change, the kernel does not (no nvcc, no new class kernel after the first call); every shape matches the
    float64 references; float32 states (mamba_ssm's) are converted; a warm call sees new data at old addresses."""
    from codegen import runtime
    from codegen.harness import TOL, chunk_scan_reference, chunk_state_reference, rel_err, scan_inputs, state_inputs
    from ptsolve import serve
    runs = kernels = None
    for b, L, h, g in MAMBA_SHAPES:
        p = {"batch": b, "seq": L, "heads": h, "head_dim": 64, "d_state": 128, "chunk": 256, "groups": g,
             "dtype": "fp16"}
        s = scan_inputs(p, seed=L)
        args = (s["cb"], s["x"], s["dt"], s["dA_cumsum"], s["C"], s["states"])
        poison(torch, s["x"].shape, torch.float16)
        assert rel_err(pt.mamba_chunk_scan(*args), chunk_scan_reference(**s)) <= TOL, (b, L, h, g)
        assert rel_err(pt.mamba_chunk_scan(*args[:5], s["states"].float()), chunk_scan_reference(**s)) <= TOL
        st = state_inputs(p, seed=L + 1)
        r = L % 256
        if r:  # mamba_ssm's dt past seq is 0, so dA_cumsum is flat there (else a 1-position chunk's states underflow)
            st["dt"][:, :, -1, r:] = 0
            st["dA_cumsum"][:, :, -1, r:] = st["dA_cumsum"][:, :, -1, r - 1:r]
        sargs = (st["B"], st["x"], st["dt"], st["dA_cumsum"])
        ref = chunk_state_reference(st["x"], st["B"], st["dt"], st["dA_cumsum"])
        assert rel_err(pt.mamba_chunk_state(*sargs), ref) <= TOL, (b, L, h, g)
        st["x"].copy_(torch.randn_like(st["x"]))  # same addresses, new values: the kept launch reads them
        ref = chunk_state_reference(st["x"], st["B"], st["dt"], st["dA_cumsum"])
        assert rel_err(pt.mamba_chunk_state(*sargs), ref) <= TOL, (b, L, h, g)
        if runs is None:
            runs, kernels = runtime.NVCC_RUNS[0], len(serve.kernels._KERNELS)
    torch.cuda.synchronize()
    assert runtime.NVCC_RUNS[0] == runs and len(serve.kernels._KERNELS) == kernels


PROBE = """
import json, torch
import ptsolve.torch as pt
from codegen import runtime
from codegen.harness import scan_inputs, state_inputs
p = {"batch": 2, "seq": 777, "heads": 12, "head_dim": 64, "d_state": 128, "chunk": 256, "groups": 3, "dtype": "fp16"}
s, st = scan_inputs(p, seed=3), state_inputs(p, seed=4)
o = pt.mamba_chunk_scan(s["cb"], s["x"], s["dt"], s["dA_cumsum"], s["C"], s["states"])
t = pt.mamba_chunk_state(st["B"], st["x"], st["dt"], st["dA_cumsum"])
torch.cuda.synchronize()
print(json.dumps({"nvcc": runtime.NVCC_RUNS[0], "finite": bool(o.isfinite().all() and t.isfinite().all())}))
"""


def test_mamba_second_process_compiles_nothing(torch, pt):
    """A new process calling the class (at a shape no process has called) runs no nvcc: the cubin is on disk."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).parents[2]
    from ptsolve import serve
    for op in serve.MAMBA_OPS:  # this process fills the disk cache where it is cold (no nvcc where it is warm)
        serve.compile_class(serve.mamba_class(op, "fp16", 64, 128, 256))
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"nvcc": 0, "finite": True}


@pytest.mark.parametrize("M,tiling,dt", [
    (16, {"BM": 64, "BN": 128, "BK": 64, "depth": 6, "groups": 1, "splits": 4}, "fp16"),  # split-K: beats the class
    (200, {"BM": 128, "BN": 128, "BK": 64, "depth": 4, "groups": 2}, "bf16"),
    (4096, {"BM": 64, "BN": 64, "BK": 64, "depth": 2, "groups": 1}, "fp16")])  # a poor plan: the class must win
def test_a_kept_exact_answer_runs_where_it_is_faster(torch, pt, M, tiling, dt, tmp_path, monkeypatch):
    """ptsolve.serve.exact: a shape whose answer is on disk races it against the class's kernel on its first call
    (the verdict kept in the entry, per GPU) and runs the faster through ptsolve.torch, with the right result (split-K
    included: its own grid, boxes and scratch)."""
    import json

    from codegen.plan import default_plan
    from ptsolve import serve
    from ptsolve.serve import exact, prepared

    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PTSOLVE_EXACT", "off")  # the GPU machine solves nothing: only the kept answer
    monkeypatch.setattr(exact, "_READY", {})
    monkeypatch.setattr(exact, "_RACED", {})
    N, K = 4096, 2048
    c = serve.gemm_class(dt)
    params = {"M": M, "N": N, "K": K, "dtype": dt}
    key = exact.shape_key(c, params)
    plan = default_plan("gemm", params, tiling)
    exact.write_entry(exact.store() / f"{key}.json", {"params": params, "plan": json.loads(plan.to_json())})
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    a = torch.randn(M, K, device="cuda", dtype=tdt)
    b = torch.randn(N, K, device="cuda", dtype=tdt) / math.sqrt(K)
    for _ in range(2):  # the cold call and the warm one
        out = pt.gemm(a, b)
        torch.cuda.synchronize()
        ref = a.float() @ b.float().T
        assert (out.float() - ref).abs().max().item() <= 2 * (((a @ b.T).float() - ref).abs().max().item()) + 1e-3
    (verdict,) = json.loads((exact.store() / f"{key}.json").read_text())["measured"].values()
    launched = [ln for k, ln in prepared.LAUNCHES.items() if k[0] == "gemm" and k[2] == a.data_ptr()]
    ck = exact._settle(key, c, json.loads((exact.store() / f"{key}.json").read_text()))
    faster = ck.ks.name if verdict["exact_us"] < verdict["class_us"] else serve.kernel(c).ks.name
    assert launched and launched[-1].name == faster, verdict
    if M == 16:
        assert faster == ck.ks.name, verdict  # 64 tiles x 4 splits against the class's 32 tiles
    if M == 4096:
        assert faster != ck.ks.name, verdict


def test_fa3s_interface_runs_ptsolves_kernels(torch, pt):
    """ptsolve.flash_attn_interface: FlashAttention-3's three calls give ptsolve.torch's results, bit for bit."""
    from ptsolve import flash_attn_interface as fai

    q = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 700, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    assert torch.equal(fai.flash_attn_func(q, k, v, causal=True), pt.flash_attention(q, k, v, causal=True))
    cu = torch.tensor([0, 300, 600], dtype=torch.int32, device="cuda")
    cuk = torch.tensor([0, 700, 1400], dtype=torch.int32, device="cuda")
    qp, kp, vp = q.reshape(600, 8, 128), k.reshape(1400, 2, 128), v.reshape(1400, 2, 128)
    assert torch.equal(fai.flash_attn_varlen_func(qp, kp, vp, cu, cuk, 300, 700, causal=True),
                       pt.flash_attention_varlen(qp, kp, vp, cu, cuk, 300, 700, causal=True))
    lens = torch.tensor([650, 700], dtype=torch.int32, device="cuda")
    qd = q[:, :4].contiguous()
    assert torch.equal(fai.flash_attn_with_kvcache(qd, k, v, cache_seqlens=lens, causal=True),
                       pt.flash_attention_kvcache(qd, k, v, lens, causal=True))
    assert torch.equal(fai.flash_attn_with_kvcache(qd, k, v), pt.flash_attention_kvcache(qd, k, v, 700))


def _lse_ref(torch, q, k, causal, scale):
    """float32 log-sum-exp of each row's scaled scores, [B, H, Sq]; +inf where a row sees no key."""
    B, Sq, H, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    kk = k.float().repeat_interleave(H // Hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk) * scale
    if causal:  # bottom-right aligned
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Skv, device=q.device)[None, :]
        s = s.masked_fill(j > i + Skv - Sq, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)


@pytest.mark.parametrize("Sq,Skv,H,Hkv,D,causal", [(300, 700, 8, 2, 128, True), (333, 333, 8, 2, 128, False),
                                                    (300, 100, 4, 4, 96, True), (4, 700, 8, 2, 128, True)])
def test_the_softmax_log_sum_exp(torch, pt, Sq, Skv, H, Hkv, D, causal):
    """return_lse: FlashAttention-3's softmax_lse, float32 [B, H, Sq] (+inf for rows that see no key), next to the
    same output as without it; a short query (decode-sized) runs the prefill kernel for it."""
    from ptsolve import flash_attn_interface as fai

    q = torch.randn(2, Sq, H, D, device="cuda", dtype=torch.float16)
    k = torch.randn(2, Skv, Hkv, D, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    out, lse = pt.flash_attention(q, k, v, causal=causal, return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (2, H, Sq)
    ref = _lse_ref(torch, q, k, causal, D ** -0.5)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref))
    fin = torch.isfinite(ref)
    assert (lse[fin] - ref[fin]).abs().max().item() < 2e-3
    check(torch, out, q, k, v, causal, D ** -0.5)
    o2, l2 = fai.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert torch.equal(o2, out) and torch.equal(l2, lse)


def test_the_varlen_log_sum_exp(torch, pt):
    """Varlen: softmax_lse [H, total_q], each sequence's rows its own log-sum-exp."""
    lq, lk = [1, 77, 300, 5], [1, 77, 500, 3]
    cq = torch.tensor([0, 1, 78, 378, 383], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, 1, 78, 578, 581], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lq), 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lk), 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out, lse = pt.flash_attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=True, return_lse=True)
    assert lse.shape == (8, sum(lq))
    for b in range(len(lq)):
        sq, sk = slice(cq[b].item(), cq[b + 1].item()), slice(ck[b].item(), ck[b + 1].item())
        ref = _lse_ref(torch, q[sq][None], k[sk][None], True, 128 ** -0.5)[0]
        got = lse[:, sq]
        assert torch.equal(torch.isinf(got), torch.isinf(ref))
        fin = torch.isfinite(ref)
        assert (got[fin] - ref[fin]).abs().max().item() < 2e-3
