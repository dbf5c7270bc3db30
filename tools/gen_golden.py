#!/usr/bin/env python3
"""Writes the golden fixture for tests/test_model.c: a tiny GPT-2 (vocab 32,
context 8, 2 blocks, 2 heads, width 16, tied head) with fixed weights, one
forward + backward + AdamW step computed by PyTorch in float64.

    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch safetensors numpy
    /tmp/tv/bin/python tools/gen_golden.py tests/fixtures/golden

Outputs (safetensors, written by the Python safetensors library):
  gpt-tiny.safetensors     weights named as cdphybrid names them (layers.N.*),
                           tokens/targets, the loss, every gradient (grad.*) and
                           every weight after the AdamW step (after.*)
  gpt-tiny-hf.safetensors  the same initial weights in the Hugging Face GPT-2
                           layout (transformer.h.N.*, Conv1D weights in x out)
CI does not run this; the fixture is committed.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

V, T, L, NH, C, B = 32, 8, 2, 2, 16, 2
LR, WD, BETAS, EPS = 1e-3, 0.1, (0.9, 0.95), 1e-8


def main(out_dir):
    torch.manual_seed(1234)
    dt = torch.float64
    p = {}
    # Weights drawn away from their initial values so that norms and biases matter.
    p["layers.0.wte"] = torch.randn(V, C, dtype=dt) * 0.3
    p["layers.0.wpe"] = torch.randn(T, C, dtype=dt) * 0.1
    for l in range(L):
        u = f"layers.{l + 1}."
        p[u + "ln_1.weight"] = 1 + 0.1 * torch.randn(C, dtype=dt)
        p[u + "ln_1.bias"] = 0.1 * torch.randn(C, dtype=dt)
        p[u + "attn.c_attn.weight"] = torch.randn(3 * C, C, dtype=dt) * 0.2
        p[u + "attn.c_attn.bias"] = torch.randn(3 * C, dtype=dt) * 0.05
        p[u + "attn.c_proj.weight"] = torch.randn(C, C, dtype=dt) * 0.2
        p[u + "attn.c_proj.bias"] = torch.randn(C, dtype=dt) * 0.05
        p[u + "ln_2.weight"] = 1 + 0.1 * torch.randn(C, dtype=dt)
        p[u + "ln_2.bias"] = 0.1 * torch.randn(C, dtype=dt)
        p[u + "mlp.c_fc.weight"] = torch.randn(4 * C, C, dtype=dt) * 0.2
        p[u + "mlp.c_fc.bias"] = torch.randn(4 * C, dtype=dt) * 0.05
        p[u + "mlp.c_proj.weight"] = torch.randn(C, 4 * C, dtype=dt) * 0.1
        p[u + "mlp.c_proj.bias"] = torch.randn(C, dtype=dt) * 0.05
    h = f"layers.{L + 1}."
    p[h + "ln_f.weight"] = 1 + 0.1 * torch.randn(C, dtype=dt)
    p[h + "ln_f.bias"] = 0.1 * torch.randn(C, dtype=dt)
    init = {k: v.clone() for k, v in p.items()}
    for v in p.values():
        v.requires_grad_(True)

    tokens = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))

    def gpt(p):
        x = p["layers.0.wte"][tokens] + p["layers.0.wpe"][:T]
        hs = C // NH
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        for l in range(L):
            u = f"layers.{l + 1}."
            a = F.layer_norm(x, (C,), p[u + "ln_1.weight"], p[u + "ln_1.bias"], 1e-5)
            qkv = a @ p[u + "attn.c_attn.weight"].T + p[u + "attn.c_attn.bias"]
            q, k, v = qkv.split(C, dim=2)
            q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
            s = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
            s = s.masked_fill(~mask, float("-inf"))
            y = (F.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
            x = x + y @ p[u + "attn.c_proj.weight"].T + p[u + "attn.c_proj.bias"]
            a = F.layer_norm(x, (C,), p[u + "ln_2.weight"], p[u + "ln_2.bias"], 1e-5)
            a = F.gelu(a @ p[u + "mlp.c_fc.weight"].T + p[u + "mlp.c_fc.bias"], approximate="tanh")
            x = x + a @ p[u + "mlp.c_proj.weight"].T + p[u + "mlp.c_proj.bias"]
        x = F.layer_norm(x, (C,), p[h + "ln_f.weight"], p[h + "ln_f.bias"], 1e-5)
        logits = x @ p["layers.0.wte"].T
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))

    loss = gpt(p)
    loss.backward()
    grads = {k: v.grad.clone() for k, v in p.items()}
    # Weight decay on matrices only (embeddings and linear weights): the test states this
    # recipe in its optimizer (no_decay bias and norm; a plan's default also skips embeddings).
    decay = [v for k, v in p.items() if v.dim() >= 2]
    no_decay = [v for k, v in p.items() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    opt.step()

    f32 = lambda t: t.detach().to(torch.float32).contiguous()
    out = {k: f32(v) for k, v in init.items()}
    out.update({"grad." + k: f32(v) for k, v in grads.items()})
    out.update({"after." + k: f32(v) for k, v in p.items()})
    out["tokens"] = tokens.to(torch.int32)
    out["targets"] = targets.to(torch.int32)
    out["loss"] = torch.tensor([loss.item()], dtype=torch.float32)
    meta = {"generator": "tools/gen_golden.py", "torch": torch.__version__,
            "config": f"vocab={V} context={T} layers={L} heads={NH} embed={C} batch={B}",
            "adamw": f"lr={LR} weight_decay={WD} betas={BETAS} eps={EPS}",
            "loss_f64": repr(loss.item())}
    os.makedirs(out_dir, exist_ok=True)
    save_file(out, os.path.join(out_dir, "gpt-tiny.safetensors"), metadata=meta)

    hf = {"transformer.wte.weight": f32(init["layers.0.wte"]),
          "transformer.wpe.weight": f32(init["layers.0.wpe"])}
    for l in range(L):
        u = f"layers.{l + 1}."
        for name in ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_attn.bias",
                     "attn.c_proj.bias", "mlp.c_fc.bias", "mlp.c_proj.bias"):
            hf[f"transformer.h.{l}.{name}"] = f32(init[u + name])
        for name in ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"):
            hf[f"transformer.h.{l}.{name}"] = f32(init[u + name].T)  # Conv1D: in x out
    hf["transformer.ln_f.weight"] = f32(init[h + "ln_f.weight"])
    hf["transformer.ln_f.bias"] = f32(init[h + "ln_f.bias"])
    save_file(hf, os.path.join(out_dir, "gpt-tiny-hf.safetensors"), metadata={"format": "pt"})
    print(f"loss {loss.item():.10f}; wrote {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/golden")
