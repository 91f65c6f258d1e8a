#!/usr/bin/python3
"""Independent PyTorch reference for Chorus's training engine (DESIGN section 7).

Written from the GPT-2 definition, not from Chorus's C code: pre-LayerNorm blocks
(eps 1e-5), learned positions, causal multi-head attention, 4C MLP with tanh-GELU, final
LayerNorm, LM head tied to wte, no dropout; Hugging Face names and Conv1D layouts
(x @ W + b). Training: mean cross-entropy over the global batch,
torch.nn.utils.clip_grad_norm_(1.0), torch.optim.AdamW(betas=(0.9, 0.95), eps=1e-8,
weight_decay=0.1 on 2-D weights only, foreach=False), Chorus's LR schedule, and
Chorus's data sampling (sample j of step s at offset hash(seed, s, j) mod (n - T)).

Subcommands:
  make    OUT_DIR [--layers L --heads H --embd C --vocab V --seq-len T --tokens N --seed S]
          random GPT-2 weights (init.safetensors) and an llm.c token file (tokens.bin)
  train   INIT TOKENS STEPS OUT [--heads H --batch B --microbatches K --lr X --lr-min X
          --warmup N --seed S --val VAL --eval-tokens N]   prints "step S loss L lr X
          grad_norm G" per step and, with --val, "val_loss V" after the last (TOKENS and VAL
          may be text:FILE, each byte a token)
  hfeval  DIR TOKENS [--batch G --eval-tokens N]   the validation loss (Chorus's rule) of a
          folder written by `chorusctl export --out DIR`, built from its config.json
  compare A.safetensors B.safetensors A.log B.log
          relative differences of weights and per-step losses

Only the standard library, numpy and torch are used (safetensors is read and written
here, so no extra package is needed).
"""
import argparse
import json
import math
import struct
import sys

import numpy as np
import torch

MASK = (1 << 64) - 1


# ---------------------------------------------------------------------------
# files

def st_read(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    data = buf[8 + n:]
    meta = header.pop("__metadata__", {})
    dtypes = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
    out = {}
    for name, e in header.items():
        b, en = e["data_offsets"]
        if e["dtype"] == "BF16":  # the top half of a float32
            arr = (np.frombuffer(data[b:en], dtype=np.uint16).astype(np.uint32) << 16)
            arr = arr.view(np.float32).reshape(e["shape"])
        else:
            arr = np.frombuffer(data[b:en], dtype=dtypes[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.astype(np.float32).copy())
    return out, meta


def st_write(path, tensors, meta=None):
    header, pos, blobs = {}, 0, []
    if meta:
        header["__metadata__"] = meta
    for name, t in tensors.items():
        b = t.detach().cpu().contiguous().numpy().astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [pos, pos + len(b)]}
        pos += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def tokens_read(path):
    if path.startswith("text:"):  # Chorus's text:FILE: each byte a token
        return np.fromfile(path[5:], dtype=np.uint8).astype(np.uint16)
    raw = np.fromfile(path, dtype=np.uint8)
    hdr = raw[:1024].view(np.int32)
    if len(raw) >= 1024 and hdr[0] == 20240520:
        assert hdr[1] == 1, "token file version"
        n = int(hdr[2])
        return raw[1024:1024 + 2 * n].view(np.uint16)
    return raw.view(np.uint16)


def tokens_write(path, toks):
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(np.asarray(toks, dtype=np.uint16).tobytes())


# ---------------------------------------------------------------------------
# sampling, as specified in workerd/data.h

def mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def data_hash(seed, step, j):
    return mix64(mix64(mix64(seed ^ 0x64617461) ^ step) ^ j)


def global_batch(toks, seed, step, nseq, T):
    n = len(toks)
    rows = []
    for j in range(nseq):
        o = data_hash(seed, step, j) % (n - T)
        rows.append(toks[o:o + T + 1].astype(np.int64))
    w = torch.from_numpy(np.stack(rows))
    return w[:, :-1], w[:, 1:]


def val_loss(P, L, H, toks, T, nseq, eval_tokens):
    """Chorus's validation loss (workerd/engine/data.h, trainer.h): windows of T + 1 tokens
    every T tokens, read in order, whole global batches of nseq windows, eval_tokens //
    (nseq * T) of them (at least one, at most enough to cover the windows once)."""
    W = (len(toks) - 1) // T
    n = min(eval_tokens // (nseq * T), (W + nseq - 1) // nseq)
    n = max(n, 1)
    total, count = 0.0, 0
    with torch.no_grad():
        for e in range(n):
            rows = [toks[((e * nseq + j) % W) * T:((e * nseq + j) % W) * T + T + 1]
                    for j in range(nseq)]
            w = torch.from_numpy(np.stack(rows).astype(np.int64))
            logits = forward(P, w[:, :-1], L, H)
            V = logits.shape[-1]
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, V),
                                                       w[:, 1:].reshape(-1)).item()
            count += 1
    return total / count


def lr_at(step, lr, lr_min, warmup, steps):
    if step < warmup:
        return lr * (step + 1) / warmup
    span = steps - 1 - warmup
    if span <= 0:
        return lr
    ratio = min(1.0, (step - warmup) / span)
    return lr_min + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - lr_min)


# ---------------------------------------------------------------------------
# GPT-2

def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def layernorm(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * w + b


def forward(P, idx, L, H):
    B, T = idx.shape
    C = P["wte.weight"].shape[1]
    x = P["wte.weight"][idx] + P["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        p = "h.%d." % l
        h = layernorm(x, P[p + "ln_1.weight"], P[p + "ln_1.bias"])
        qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"]
        h = layernorm(x, P[p + "ln_2.weight"], P[p + "ln_2.bias"])
        h = gelu_tanh(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"])
        x = x + h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"]
    x = layernorm(x, P["ln_f.weight"], P["ln_f.bias"])
    return x @ P["wte.weight"].t()


# ---------------------------------------------------------------------------
# commands

def cmd_make(a):
    import os
    os.makedirs(a.out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(a.seed)
    C, L, V, T = a.embd, a.layers, a.vocab, a.seq_len
    P = {"wte.weight": torch.randn(V, C, generator=g) * 0.02,
         "wpe.weight": torch.randn(T, C, generator=g) * 0.01}
    for l in range(L):
        p = "h.%d." % l
        # perturbed LayerNorm and non-zero biases so every parameter matters
        P[p + "ln_1.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        P[p + "ln_1.bias"] = 0.02 * torch.randn(C, generator=g)
        P[p + "attn.c_attn.weight"] = torch.randn(C, 3 * C, generator=g) * 0.02
        P[p + "attn.c_attn.bias"] = 0.02 * torch.randn(3 * C, generator=g)
        P[p + "attn.c_proj.weight"] = torch.randn(C, C, generator=g) * 0.02 / math.sqrt(2 * L)
        P[p + "attn.c_proj.bias"] = 0.02 * torch.randn(C, generator=g)
        P[p + "ln_2.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        P[p + "ln_2.bias"] = 0.02 * torch.randn(C, generator=g)
        P[p + "mlp.c_fc.weight"] = torch.randn(C, 4 * C, generator=g) * 0.02
        P[p + "mlp.c_fc.bias"] = 0.02 * torch.randn(4 * C, generator=g)
        P[p + "mlp.c_proj.weight"] = torch.randn(4 * C, C, generator=g) * 0.02 / math.sqrt(2 * L)
        P[p + "mlp.c_proj.bias"] = 0.02 * torch.randn(C, generator=g)
    P["ln_f.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
    P["ln_f.bias"] = 0.02 * torch.randn(C, generator=g)
    st_write(a.out_dir + "/init.safetensors", P, {"format": "pt"})
    # tokens with structure (a noisy repeating pattern) so training has something to learn
    rng = np.random.default_rng(a.seed)
    base = rng.integers(0, V, size=97)
    toks = base[np.arange(a.tokens) % 97]
    noise = rng.random(a.tokens) < 0.2
    toks[noise] = rng.integers(0, V, size=int(noise.sum()))
    tokens_write(a.out_dir + "/tokens.bin", toks)


def cmd_train(a):
    torch.manual_seed(0)
    P0, _ = st_read(a.init)
    L = sum(1 for k in P0 if k.endswith(".ln_1.weight"))
    T = P0["wpe.weight"].shape[0]
    V = P0["wte.weight"].shape[0]
    toks = tokens_read(a.tokens)
    assert int(toks.max()) < V
    names = list(P0.keys())
    P = {k: torch.nn.Parameter(P0[k].clone()) for k in names}
    decay = [P[k] for k in names if P[k].dim() >= 2]
    no_decay = [P[k] for k in names if P[k].dim() < 2]
    lr_min = a.lr / 10 if a.lr_min < 0 else a.lr_min
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    nseq = a.batch * a.microbatches
    for s in range(a.steps):
        x, y = global_batch(toks, a.seed, s, nseq, T)
        logits = forward(P, x, L, a.heads)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
        lr = lr_at(s, a.lr, lr_min, a.warmup, a.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        print("step %d loss %.9g lr %.9g grad_norm %.9g" % (s, loss.item(), lr, norm.item()),
              flush=True)
    if a.val:
        vt = tokens_read(a.val)
        print("val_loss %.9g after step %d" % (val_loss(P, L, a.heads, vt, T, nseq,
                                                        a.eval_tokens), a.steps - 1))
    st_write(a.out, {k: P[k].data for k in names}, {"format": "pt"})


def cmd_hfeval(a):
    """An exported Hugging Face folder (chorusctl export --out DIR): its config.json gives
    the model, model.safetensors the weights; prints the validation loss over TOKENS by
    Chorus's rule (val_loss above)."""
    with open(a.dir + "/config.json") as f:
        cfg = json.load(f)
    assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu_new"
    P, _ = st_read(a.dir + "/model.safetensors")
    L, H, T = cfg["n_layer"], cfg["n_head"], cfg["n_positions"]
    assert P["wte.weight"].shape[0] == cfg["vocab_size"] and P["wpe.weight"].shape[0] == T
    toks = tokens_read(a.tokens)
    print("val_loss %.9g" % val_loss(P, L, H, toks, T, a.batch, a.eval_tokens))


def read_losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if len(w) >= 4 and w[0] == "step":
                out[int(w[1])] = float(w[3])
    return out


def cmd_compare(a):
    A, _ = st_read(a.a)
    B, _ = st_read(a.b)
    assert set(A) == set(B), "tensor names differ: %s" % (set(A) ^ set(B))
    worst_l2, worst_name, worst_max = 0.0, "", 0.0
    for k in sorted(A):
        d = (A[k].double() - B[k].double())
        rel = (d.norm() / B[k].double().norm().clamp_min(1e-30)).item()
        mx = (d.abs().max() / B[k].double().abs().max().clamp_min(1e-30)).item()
        if rel > worst_l2:
            worst_l2, worst_name = rel, k
        worst_max = max(worst_max, mx)
    la, lb = read_losses(a.log_a), read_losses(a.log_b)
    assert la.keys() == lb.keys() and la, "step lists differ"
    loss_rel = max(abs(la[s] - lb[s]) / abs(lb[s]) for s in la)
    last = max(la)
    print("steps %d  loss[0] %.7f / %.7f  loss[%d] %.7f / %.7f" %
          (len(la), la[0], lb[0], last, la[last], lb[last]))
    print("max loss rel diff %.3g" % loss_rel)
    print("weights: max per-tensor rel L2 diff %.3g (%s), max elementwise diff / tensor max %.3g"
          % (worst_l2, worst_name, worst_max))
    ok = loss_rel <= a.loss_tol and worst_l2 <= a.weight_tol
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out_dir")
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--embd", type=int, default=64)
    m.add_argument("--vocab", type=int, default=50)
    m.add_argument("--seq-len", type=int, default=32)
    m.add_argument("--tokens", type=int, default=20000)
    m.add_argument("--seed", type=int, default=1)
    t = sub.add_parser("train")
    t.add_argument("init")
    t.add_argument("tokens")
    t.add_argument("steps", type=int)
    t.add_argument("out")
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--batch", type=int, default=4)
    t.add_argument("--microbatches", type=int, default=1)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--lr-min", type=float, default=-1)
    t.add_argument("--warmup", type=int, default=0)
    t.add_argument("--seed", type=int, default=1337)
    t.add_argument("--val", default="", help="validation tokens (text:FILE allowed)")
    t.add_argument("--eval-tokens", type=int, default=65536)
    c = sub.add_parser("compare")
    h = sub.add_parser("hfeval", help="validation loss of an exported Hugging Face folder")
    h.add_argument("dir")
    h.add_argument("tokens")
    h.add_argument("--batch", type=int, default=16, help="global batch, in sequences")
    h.add_argument("--eval-tokens", type=int, default=65536)
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("log_a")
    c.add_argument("log_b")
    c.add_argument("--loss-tol", type=float, default=1e-5)
    c.add_argument("--weight-tol", type=float, default=3e-4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.cmd == "make":
        return cmd_make(a)
    if a.cmd == "train":
        return cmd_train(a)
    if a.cmd == "hfeval":
        return cmd_hfeval(a)
    return cmd_compare(a)


if __name__ == "__main__":
    sys.exit(main())
