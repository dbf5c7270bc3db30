#!/usr/bin/env python3
"""Checks that Hugging Face transformers loads `cdphybrid export --format hf`
output as the model cdphybrid trained: GPT2LMHeadModel.from_pretrained(DIR)
gives the same loss.

    python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers safetensors
    cdphybrid export --checkpoint CKPT --format hf --out DIR
    /tmp/venv-hf/bin/python tools/check_hf_export.py DIR --golden tests/fixtures/golden/gpt-tiny.safetensors
    cdphybrid export --checkpoint CKPT --out ours.safetensors
    /tmp/venv-hf/bin/python tools/check_hf_export.py DIR --ours ours.safetensors

--golden FILE: the loss on FILE's tokens and targets against FILE's "loss"
  (tools/gen_golden.py: PyTorch in float64 on the same weights; the model suite
  checks cdphybrid's loss against it to 1e-5), for a DIR exported from a
  checkpoint of those weights.
--ours FILE: the loss on seeded random tokens (or --text: windows of a text
  file) against a plain PyTorch GPT-2
  (the one of tools/gen_golden.py) reading cdphybrid's own names from FILE, the
  default export of the same checkpoint.
Exit 0 when they agree to 1e-4 relative, 1 otherwise. CI does not run this:
the product and its tests need no Python.
"""
import argparse
import math
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel


def hf_loss(model, tokens, targets):
    with torch.no_grad():
        logits = model(input_ids=tokens.long()).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), targets.long().reshape(-1)).item()


def ours_loss(p, cfg, tokens, targets):
    """GPT-2 over cdphybrid's names (layers.N.*), in float64."""
    p = {k: v.double() for k, v in p.items()}
    L, NH, C = cfg.n_layer, cfg.n_head, cfg.n_embd
    B, T = tokens.shape
    tokens, targets = tokens.long(), targets.long()
    x = p["layers.0.wte"][tokens] + p["layers.0.wpe"][:T]
    hs = C // NH
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        u = f"layers.{l + 1}."
        a = F.layer_norm(x, (C,), p[u + "ln_1.weight"], p[u + "ln_1.bias"], cfg.layer_norm_epsilon)
        q, k, v = (a @ p[u + "attn.c_attn.weight"].T + p[u + "attn.c_attn.bias"]).split(C, dim=2)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        s = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(~mask, float("-inf"))
        y = (F.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[u + "attn.c_proj.weight"].T + p[u + "attn.c_proj.bias"]
        a = F.layer_norm(x, (C,), p[u + "ln_2.weight"], p[u + "ln_2.bias"], cfg.layer_norm_epsilon)
        a = F.gelu(a @ p[u + "mlp.c_fc.weight"].T + p[u + "mlp.c_fc.bias"], approximate="tanh")
        x = x + a @ p[u + "mlp.c_proj.weight"].T + p[u + "mlp.c_proj.bias"]
    h = f"layers.{L + 1}."
    x = F.layer_norm(x, (C,), p[h + "ln_f.weight"], p[h + "ln_f.bias"], cfg.layer_norm_epsilon)
    head = p.get(h + "lm_head.weight", p["layers.0.wte"])
    return F.cross_entropy((x @ head.T).reshape(-1, head.shape[0]), targets.reshape(-1)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the folder `cdphybrid export --format hf` wrote")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--golden", help="tools/gen_golden.py's gpt-tiny.safetensors (tokens, targets, loss)")
    g.add_argument("--ours", help="the default export of the same checkpoint (cdphybrid's names)")
    ap.add_argument("--batch", type=int, default=4, help="--ours: samples (default 4)")
    ap.add_argument("--text", help="--ours: take the samples from the last 10%% of this text file (its bytes are "
                    "the tokens, as data.source \"text\"; cdphybrid validates on that part) instead of random tokens")
    args = ap.parse_args()

    model = GPT2LMHeadModel.from_pretrained(args.dir, torch_dtype=torch.float32)
    model.eval()
    cfg = model.config
    if args.golden:
        gf = load_file(args.golden)
        tokens, targets = gf["tokens"], gf["targets"]
        ref, what = gf["loss"].item(), "PyTorch float64 reference (the golden file)"
    else:
        T = cfg.n_positions
        if args.text:
            data = open(args.text, "rb").read()
            val = torch.tensor(list(data[len(data) * 9 // 10:]), dtype=torch.long)
            if len(val) < args.batch * (T + 1):
                sys.exit(f"{args.text}: its last 10% holds fewer than {args.batch} samples of {T + 1} bytes")
            w = val[: args.batch * (T + 1)].view(args.batch, T + 1)
            tokens, targets = w[:, :-1], w[:, 1:]
        else:
            torch.manual_seed(1)
            tokens = torch.randint(0, cfg.vocab_size, (args.batch, T))
            targets = torch.roll(tokens, -1, dims=1)
        ref, what = ours_loss(load_file(args.ours), cfg, tokens, targets), "cdphybrid's names, plain PyTorch"
    got = hf_loss(model, tokens, targets)
    rel = abs(got - ref) / abs(ref)
    print(f"transformers GPT2LMHeadModel.from_pretrained({args.dir}): loss {got:.8f}")
    print(f"{what}: loss {ref:.8f}")
    print(f"relative difference {rel:.3g} ({'ok' if rel <= 1e-4 else 'MISMATCH'}, tolerance 1e-4)")
    return 0 if rel <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
