#!/usr/bin/env python3
"""PyTorch CPU reference for chorus-bench-engine: the same GPT-2 (pre-LN, learned positions,
tied head, GELU tanh, no dropout) trained with torch.optim.AdamW on random tokens, timed
in full steps (zero_grad, forward, backward, AdamW) as chorus-bench-engine times Chorus.

PyTorch is measured at its best: each variant below is one combination of the CPU options
PyTorch 1.13 offers for this model, and the reference is the fastest. A variant's figure
is its fastest timed step after warm-up steps (1 eager, 3 traced: the JIT profiles, then
optimizes). Variants, as labels a/b/c/d:
  a  threads: intraN_blasM = torch.set_num_threads(N), OpenBLAS on M threads (Debian's
     torch does its matmuls in OpenBLAS, whose pthreads pool is apart from torch's OpenMP
     one). Chorus runs OpenBLAS on 2 threads and its other kernels on 1; tried: 1/2, 2/1, 2/2.
  b  mkldnn_on / mkldnn_off: torch.backends.mkldnn.enabled.
  c  adamw_loop / adamw_foreach: AdamW's per-tensor loop (its CPU default) or foreach.
  d  eager / jit_trace: eager, or torch.jit.trace of the model with the CPU fuser (NNC) on.
torch.compile is PyTorch 2 and not in 1.13; inference_mode does not apply to training.
The default is what PyTorch does untold: its own thread choice (intra-op threads = physical
cores, OpenBLAS = all CPUs), mkldnn on, AdamW's default, eager.

--sweep: from the default, one option at a time (a, b, c, d in turn) the faster value is
kept; a variant whose (last) warm-up step takes over 3x the fastest warm-up step so far is
not timed further (it cannot win; its warm-up time is printed). Warm-up is compared with
warm-up: a first step is slower than the ones after it. --variants L1,L2,...: only those. Prints, per variant,
  variant=<label> step_s=<fastest> tokens_per_s=<v>
then `default=<label> tokens_per_s=<v>` and `best=<label> tokens_per_s=<v>`."""
import argparse
import ctypes
import math
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        k = k.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        v = v.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L, NH, C, V, T):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        self.register_buffer("pos", torch.arange(T))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(self.pos[:T])
        for b in self.h:
            x = b(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def openblas():
    """The OpenBLAS that torch's matmuls run in (Debian: libblas.so.3 -> libopenblas.so.0)."""
    for name in ("libopenblas.so.0", "libopenblas.so"):
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_num_threads.restype = ctypes.c_int
            return lib
        except (OSError, AttributeError):
            pass
    return None


def parse(label):
    thr, mkl, adam, mode = label.split("/")
    n, m = thr[len("intra"):].split("_blas")
    return {"intra": int(n), "blas": int(m), "mkldnn": mkl == "mkldnn_on",
            "foreach": adam == "adamw_foreach", "jit": mode == "jit_trace"}


def label(v):
    return "intra%d_blas%d/%s/%s/%s" % (
        v["intra"], v["blas"], "mkldnn_on" if v["mkldnn"] else "mkldnn_off",
        "adamw_foreach" if v["foreach"] else "adamw_loop", "jit_trace" if v["jit"] else "eager")


untimed = set()  # labels of the variants cut off after their warm-up
warmups = []  # each variant's last warm-up step, seconds


def run(model, x, y, v, steps, blas, cutoff):
    """Fastest timed step of variant v, in seconds (inf if the variant fails). A variant
    whose last warm-up step took over `cutoff` seconds is not timed: it cannot be the best,
    and its warm-up time stands for it."""
    torch.set_num_threads(v["intra"])
    if blas is not None:
        blas.openblas_set_num_threads(v["blas"])
    torch.backends.mkldnn.enabled = v["mkldnn"]
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, foreach=v["foreach"])
    fwd = model
    if v["jit"]:
        torch._C._jit_override_can_fuse_on_cpu(True)
        torch._C._jit_set_texpr_fuser_enabled(True)
        try:
            fwd = torch.jit.trace(model, (x, y), check_trace=False)
        except Exception as e:  # a variant PyTorch cannot run is not the best one
            print(f"  {label(v)}: torch.jit.trace failed: {e}", flush=True)
            return float("inf")
    warm = 3 if v["jit"] else 1
    best = float("inf")
    for s in range(warm + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = fwd(x, y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        print(f"  {label(v)} step {s}: loss {loss.item():.4f}, {dt:.3f} s"
              f"{' (warm-up)' if s < warm else ''}", flush=True)
        if s >= warm:
            best = min(best, dt)
        elif s == warm - 1:
            warmups.append(dt)
        if s == warm - 1 and dt > cutoff:
            print(f"  {label(v)}: warm-up step over {cutoff:.3f} s (3x the fastest warm-up), "
                  "not timed", flush=True)
            untimed.add(label(v))
            best = dt
            break
    del opt
    return best


def main():
    ap = argparse.ArgumentParser()
    for a in ("layers", "heads", "embd", "vocab", "seq", "batch", "steps"):
        ap.add_argument("--" + a, type=int, required=True)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--variants", default="")
    a = ap.parse_args()
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    blas = openblas()
    default = {"intra": torch.get_num_threads(),
               "blas": blas.openblas_get_num_threads() if blas else 0,
               "mkldnn": torch.backends.mkldnn.enabled, "foreach": False, "jit": False}
    if blas is None:
        print("(OpenBLAS not found: its thread count is left as it is)")
    print(f"torch {torch.__version__}, defaults: {label(default)}", flush=True)
    torch.manual_seed(0)
    model = GPT(a.layers, a.heads, a.embd, a.vocab, a.seq)
    tok = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
    x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
    seen = {}

    def measure(v):
        key = label(v)
        if key not in seen:
            cutoff = 3 * min(warmups, default=float("inf"))
            seen[key] = run(model, x, y, v, a.steps, blas, cutoff)
            tps = a.batch * a.seq / seen[key]
            note = " (warm-up step, not timed)" if key in untimed else ""
            print(f"variant={key} step_s={seen[key]:.4f} tokens_per_s={tps:.1f}{note}",
                  flush=True)
        return seen[key]

    measure(default)
    if a.sweep:
        cur = dict(default)
        axes = [("threads", [(1, 2), (2, 1), (2, 2)]), ("mkldnn", [True, False]),
                ("foreach", [False, True]), ("jit", [False, True])]
        for axis, values in axes:
            best_v, best_t = cur, measure(cur)
            for val in values:
                cand = dict(cur)
                if axis == "threads":
                    cand["intra"], cand["blas"] = val
                else:
                    cand[axis] = val
                t = measure(cand)
                if t < best_t:
                    best_v, best_t = cand, t
            cur = best_v
    for lab in filter(None, a.variants.split(",")):
        measure(parse(lab))
    best = min(seen, key=seen.get)
    if math.isinf(seen[best]):
        sys.exit(1)
    print(f"default={label(default)} tokens_per_s={a.batch * a.seq / seen[label(default)]:.1f}")
    print(f"best={best} tokens_per_s={a.batch * a.seq / seen[best]:.1f}")


if __name__ == "__main__":
    main()
