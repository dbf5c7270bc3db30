#!/usr/bin/env python3
"""PyTorch eager reference for cdphybrid's GPU step benchmark.

A GPT-2 (pre-LayerNorm, tanh GELU, tied embeddings, as cdphybrid's "gpt" preset)
trained with AdamW for a few steps on random tokens; prints one JSON line with
the median step time. Same configuration as bench-gpu-step: B=8, T=1024, GPT-2
124M, bf16 autocast (bf16 matrix products, fp32 weights and optimizer state),
eager mode (no torch.compile), PyTorch's fused attention
(scaled_dot_product_attention) and fused AdamW.

    python3 bench/torch_gpt2_step.py [--batch 8] [--seq 1024] [--layers 12]
        [--embed 768] [--heads 12] [--vocab 50257] [--steps 10] [--warmup 3]
        [--precision bf16|fp32] [--device cuda|cpu]

Used by tools/gpu-check.sh; a reference, not part of the product.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.fc2 = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.nh, c // self.nh).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, layers, heads, embed):
        super().__init__()
        self.wte = nn.Embedding(vocab, embed)
        self.wpe = nn.Embedding(ctx, embed)
        self.blocks = nn.ModuleList(Block(embed, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(embed)
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc2.weight"))
                                else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.lnf(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--embed", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = GPT(a.vocab, a.seq, a.layers, a.heads, a.embed).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=dev.type == "cuda")
    idx = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    times, last = [], float("nan")
    for i in range(a.warmup + a.steps):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        last = loss.item()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    ms = 1e3 * statistics.median(times)
    # the model FLOPs of a step, counted as cdphybrid's layer table does:
    # 6 x parameters of the matrices x tokens, plus attention's 12 x L x T x C per token
    tokens = a.batch * a.seq
    matrix_params = a.layers * 12 * a.embed * a.embed + a.vocab * a.embed
    flops = 6 * matrix_params * tokens + 12 * a.layers * a.seq * a.embed * tokens
    print(json.dumps({"impl": "pytorch-eager", "torch": torch.__version__, "device": str(dev),
                      "precision": a.precision, "params": params, "batch": a.batch, "seq": a.seq,
                      "ms_per_step": round(ms, 3), "tokens_per_s": round(tokens / (ms / 1e3), 1),
                      "model_flops_per_step": flops, "loss": round(last, 4),
                      "finite": math.isfinite(last)}))


if __name__ == "__main__":
    main()
