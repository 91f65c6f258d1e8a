#!/usr/bin/env python3
"""PyTorch GPU reference for chorus-bench-engine --device cuda: GPT-2 124M (the model of
torch_engine.py: pre-LN, learned positions, tied head, GELU tanh, no dropout, attention
written out as Chorus computes it) with the head over the padded vocab (50304, as Chorus),
trained with torch.optim.AdamW (fused) on random tokens, fp32 weights and activations, on
GPU 0, at the same batch and sequence length as the Chorus run.

Precision: fp32 (torch.backends.cuda.matmul.allow_tf32 = False), tf32 (True; cuDNN too) or
bf16 (torch.autocast("cuda", dtype=torch.bfloat16) around the forward and loss: fp32 master
weights and AdamW state, bf16 matmuls and activations, as Chorus's train.precision = bf16).
Modes: eager, and compile (torch.compile of the model, default options). Each mode runs
--warmup steps (compile's first step compiles), then --steps timed steps, synchronised
before each clock read; the figure is the mean timed step. Prints, per mode,
  mode=<eager|compile> precision=<p> step_ms=<mean> tokens_per_s=<v>
or `mode=<m> precision=<p> failed=<reason>`; exits 2 when torch has no CUDA device."""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_engine import GPT  # noqa: E402  (the same model as the CPU reference)


def step(model, opt, x, y, bf16=False):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def run(mode, a):
    torch.manual_seed(1337)
    model = GPT(12, 12, 768, 50304, a.seq).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    x = torch.randint(0, 50257, (a.batch, a.seq), device="cuda")
    y = torch.randint(0, 50257, (a.batch, a.seq), device="cuda")
    t0 = time.perf_counter()
    bf16 = a.precision == "bf16"
    for _ in range(a.warmup):
        step(fwd, opt, x, y, bf16)
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step(fwd, opt, x, y, bf16)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / a.steps
    print(f"mode={mode} precision={a.precision} step_ms={dt * 1e3:.1f} "
          f"tokens_per_s={a.batch * a.seq / dt:.1f} warmup_s={warm:.1f}", flush=True)
    del model, opt, fwd
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default="tf32")
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        sys.exit(2)
    tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
    for mode in a.modes.split(","):
        try:
            run(mode, a)
        except Exception as e:  # one mode failing leaves the other's figure
            print(f"mode={mode} precision={a.precision} failed={type(e).__name__}: "
                  f"{str(e).splitlines()[0] if str(e) else ''}", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
