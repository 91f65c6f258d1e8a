#!/usr/bin/env python3
"""PyTorch eager CPU reference for chorus-bench-engine: the same GPT-2 (pre-LN, learned
positions, tied head, GELU tanh, no dropout) trained with torch.optim.AdamW (foreach=False)
on random tokens. Prints per-step times and one line `tokens_per_s=<v>` from the fastest
timed step (after one warm-up step), as chorus-bench-engine does for Chorus.

Threads: run with OPENBLAS_NUM_THREADS=2 and --threads 1 on a 2-core machine. Debian's
torch does its matmuls in OpenBLAS (pthreads) beside its own OpenMP pool; letting both use
2 threads oversubscribes the cores, and of the settings tried (OpenMP/OpenBLAS 2/2, 2/1,
1/2) 1/2 was the fastest by 2-3x."""
import argparse
import math
import time

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
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    for a in ("layers", "heads", "embd", "vocab", "seq", "batch", "steps", "threads"):
        ap.add_argument("--" + a, type=int, required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.layers, a.heads, a.embd, a.vocab, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, foreach=False)
    tok = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
    x, y = tok[:, :-1], tok[:, 1:]
    best = float("inf")
    for s in range(a.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        print(f"step {s}: loss {loss.item():.4f}, {dt:.3f} s{' (warm-up)' if s == 0 else ''}")
        if s > 0:
            best = min(best, dt)
    print(f"tokens_per_s={a.batch * a.seq / best:.1f}")


if __name__ == "__main__":
    main()
