#!/usr/bin/env python3
"""Hugging Face folders both ways, against transformers itself.

Run where torch and transformers are installed (CI never runs this; the
product and its tests need no Python):

    python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers safetensors

fixture DIR [--arch gpt2|llama]
    Writes a tiny sharded folder the hf suite imports (tests/fixtures/hf/gpt2-tiny,
    llama-tiny): a random GPT2LMHeadModel (2 layers, 4 heads, width 32,
    vocabulary 64, 16 positions, seed 1) or LlamaForCausalLM (the same sizes,
    2 key/value heads, MLP 48, rope_theta 10000 with llama3 scaling, untied
    head) saved by save_pretrained in shards of 40 kB, and expect.json: a batch
    of tokens, transformers' loss on it (float64 cross-entropy of its float32
    logits) and the logits of the last position of the first row.

compare --cdphybrid BIN --work DIR [--arch gpt2|llama] [--size tiny|124m]
    A random model of that size saved by transformers (sharded), then
    1. cdphybrid eval of a plan {"model": {"from": DIR/hf}} on a tokens file
       against transformers' loss on the same windows;
    2. 50 greedy tokens from cdphybrid generate (KV cache) against
       transformers' greedy decoding with its cache;
    3. cdphybrid export --format hf of those weights (sharded), loaded by
       GPT2LMHeadModel.from_pretrained: the same logits as the original.
    Prints each number; exit 0 when the losses agree to 1e-5 relative, the
    tokens are identical and the exported logits equal.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

SIZES = {
    "tiny": dict(layers=2, heads=4, dim=32, vocab=64, context=16, kv_heads=2, hidden=48),
    # GPT-2 small's shape; a Llama of about the same size (Llama's blocks, GQA, untied head)
    "124m": dict(layers=12, heads=12, dim=768, vocab=50257, context=1024, kv_heads=4, hidden=2048),
}


def make_model(arch, size, seed):
    torch.manual_seed(seed)
    z = SIZES[size]
    if arch == "gpt2":
        cfg = GPT2Config(n_layer=z["layers"], n_head=z["heads"], n_embd=z["dim"], vocab_size=z["vocab"],
                         n_positions=z["context"], activation_function="gelu_new", resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
        model = GPT2LMHeadModel(cfg).eval()
    else:
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": z["context"] // 2}
        cfg = LlamaConfig(num_hidden_layers=z["layers"], num_attention_heads=z["heads"], hidden_size=z["dim"],
                          num_key_value_heads=z["kv_heads"], intermediate_size=z["hidden"], vocab_size=z["vocab"],
                          max_position_embeddings=z["context"], rms_norm_eps=1e-5, rope_parameters=rope,
                          tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
        model = LlamaForCausalLM(cfg).eval()
    # transformers starts biases and layernorm at 0 and 1: move them so the check sees them
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name or "norm" in name:
                p.add_(torch.randn_like(p) * 0.05)
    return model


def loss_of(model, tokens, targets):
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    return F.cross_entropy(logits.double().reshape(-1, logits.shape[-1]), targets.reshape(-1)).item(), logits


def fixture(out, arch):
    model = make_model(arch, "tiny", 1)
    model.save_pretrained(out, max_shard_size="40kB", safe_serialization=True)
    g = torch.Generator().manual_seed(2)
    T, V = SIZES["tiny"]["context"], model.config.vocab_size
    seq = torch.randint(0, V, (2, T + 1), generator=g)
    loss, logits = loss_of(model, seq[:, :T], seq[:, 1:])
    expect = {"tokens": seq[:, :T].tolist(), "targets": seq[:, 1:].tolist(), "loss": loss,
              "last_logits": logits[0, -1].tolist()}
    with open(os.path.join(out, "expect.json"), "w") as f:
        json.dump(expect, f)
        f.write("\n")
    print(f"wrote {out}: loss {loss:.17g}; files {sorted(os.listdir(out))}")


def write_tokens(path, toks):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks))


def run(args):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{' '.join(args)}: exit {p.returncode}\n{p.stderr}")
    return p.stdout


def greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out, past = [], None
    with torch.no_grad():
        x = ids
        for _ in range(n):
            r = model(input_ids=x, past_key_values=past, use_cache=True)
            past = r.past_key_values
            nxt = int(r.logits[0, -1].argmax())
            out.append(nxt)
            x = torch.tensor([[nxt]])
    return out


def compare(a):
    os.makedirs(a.work, exist_ok=True)
    hf = os.path.join(a.work, "hf")
    model = make_model(a.arch, a.size, 3)
    shard = "40kB" if a.size == "tiny" else "200MB"
    model.save_pretrained(hf, max_shard_size=shard, safe_serialization=True)
    T, V, B = SIZES[a.size]["context"], model.config.vocab_size, 2
    # a tokens file whose validation split (its last 10%) starts with B windows of T + 1
    g = torch.Generator().manual_seed(4)
    n_val = B * T + 1
    n = 10 * n_val
    toks = torch.randint(0, V, (n,), generator=g).tolist()
    write_tokens(os.path.join(a.work, "tokens.bin"), toks)
    start = n - n // 10
    plan = {"model": {"from": "hf"}, "data": {"source": "tokens", "path": "tokens.bin", "order": "sequential"},
            "train": {"micro_batch": B, "steps": 1}}
    with open(os.path.join(a.work, "plan.json"), "w") as f:
        json.dump(plan, f)
    windows = torch.tensor([toks[start + k * T: start + k * T + T + 1] for k in range(B)])
    want, logits = loss_of(model, windows[:, :T], windows[:, 1:])
    out = run([a.cdphybrid, "eval", "--plan", os.path.join(a.work, "plan.json"), "--batches", "1", "-q"])
    got = float(out.split()[1])
    rel = abs(got - want) / abs(want)
    print(f"loss: transformers {want:.10f}  cdphybrid {got:.10f}  relative difference {rel:.2e}")
    ok = rel < 1e-5
    prompt = toks[:8]
    k = min(50, T - len(prompt))  # transformers' GPT-2 stops at n_positions; the same for both
    want_ids = greedy(model, prompt, k)
    out = run([a.cdphybrid, "generate", "--plan", os.path.join(a.work, "plan.json"), "--prompt-ids",
               ",".join(map(str, prompt)), "--tokens", str(k), "--temperature", "0", "--stop-token", "none", "-q"])
    got_ids = [int(x) for x in out.split()][len(prompt):]
    same = got_ids == want_ids
    print(f"{k} greedy tokens: {'identical' if same else 'DIFFERENT'}")
    if not same:
        print(f"  transformers {want_ids}\n  cdphybrid    {got_ids}")
    ok &= same
    exp = os.path.join(a.work, "exported")
    run([a.cdphybrid, "export", "--plan", os.path.join(a.work, "plan.json"), "--format", "hf", "--shard-size",
         shard, "--out", exp, "-q"])
    back = AutoModelForCausalLM.from_pretrained(exp).eval()
    print(f"  loaded as {type(back).__name__}")
    loss2, logits2 = loss_of(back, windows[:, :T], windows[:, 1:])
    diff = (logits2 - logits).abs().max().item()
    print(f"export -> from_pretrained: files {sorted(os.listdir(exp))}; loss {loss2:.10f}; "
          f"largest logit difference {diff:.3g}")
    ok &= diff == 0.0
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixture")
    f.add_argument("dir")
    f.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    c = sub.add_parser("compare")
    c.add_argument("--cdphybrid", required=True)
    c.add_argument("--work", required=True)
    c.add_argument("--size", choices=sorted(SIZES), default="tiny")
    c.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    if a.cmd == "fixture":
        fixture(a.dir, a.arch)
        return 0
    return compare(a)


if __name__ == "__main__":
    sys.exit(main())
