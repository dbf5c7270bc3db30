#!/usr/bin/env python3
"""Generation speed on the CPU: cdphybrid generate (KV cache) beside Hugging
Face transformers on the same machine, the same random 124M-size model (GPT-2
small's shape; --arch llama: a Llama of about that size with grouped-query
heads), the same prompt, greedy, every new token a forward of one position.

    python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers safetensors
    /tmp/venv-hf/bin/python bench/generate_vs_transformers.py --cdphybrid build/cdphybrid \\
        [--arch gpt2|llama] [--prompt 16] [--tokens 64] [--threads N] [--work DIR]

Prints, for each, the prompt's step (its positions and the first token), the
tokens per second after it (decoding), and the whole run's time of generate
(load excluded for transformers, included for cdphybrid's process), and
whether the greedy tokens are the same. Both use the same number of threads
(OpenBLAS's and torch's; default: the CPUs). A benchmark, not a test: CI
never runs it.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def make_model(arch):
    torch.manual_seed(5)
    if arch == "gpt2":
        cfg = GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024,
                         activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return GPT2LMHeadModel(cfg).eval()
    cfg = LlamaConfig(num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4, hidden_size=768,
                      intermediate_size=2048, vocab_size=50257, max_position_embeddings=1024, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def transformers_run(model, prompt, n):
    """Greedy with transformers' cache, timed as cdphybrid times itself."""
    ids, past, out = torch.tensor([prompt]), None, []
    with torch.no_grad():
        t0 = time.perf_counter()
        x = ids
        for k in range(n):
            if k == 1:
                t1 = time.perf_counter()
            r = model(input_ids=x, past_key_values=past, use_cache=True)
            past = r.past_key_values
            nxt = int(r.logits[0, -1].argmax())
            out.append(nxt)
            x = torch.tensor([[nxt]])
        t2 = time.perf_counter()
    return out, t1 - t0, (n - 1) / (t2 - t1), t2 - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cdphybrid", required=True)
    ap.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    ap.add_argument("--tokens", type=int, default=64, help="tokens to generate")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--work", default=f"/tmp/cdp-bench-generate")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    os.makedirs(a.work, exist_ok=True)
    model = make_model(a.arch)
    hf = os.path.join(a.work, a.arch)
    model.save_pretrained(hf, safe_serialization=True)
    plan = os.path.join(a.work, a.arch + ".json")
    with open(plan, "w") as f:
        json.dump({"model": {"from": a.arch}}, f)
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(0, model.config.vocab_size, (a.prompt,), generator=g).tolist()

    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads))
    t = time.perf_counter()
    p = subprocess.run([a.cdphybrid, "generate", "--plan", plan, "--prompt-ids", ",".join(map(str, prompt)),
                        "--tokens", str(a.tokens), "--temperature", "0", "--stop-token", "none", "-v"],
                       capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if p.returncode:
        sys.exit(p.stderr)
    m = re.search(r"positions and the first token in ([0-9.]+) s; (\d+) more tokens in ([0-9.]+) s: ([0-9.]+) "
                  r"tokens/s", p.stderr)
    if not m:
        sys.exit(f"no timing line in cdphybrid's output:\n{p.stderr}")
    ours = [int(x) for x in p.stdout.split()][a.prompt:]

    transformers_run(model, prompt, 4)  # warm-up
    theirs, first, rate, total = transformers_run(model, prompt, a.tokens)
    params = sum(x.numel() for x in model.parameters())
    print(f"{a.arch}, {params / 1e6:.1f}M parameters, float32, {a.threads} threads, prompt {a.prompt} tokens, "
          f"{a.tokens} new tokens, greedy")
    print(f"{'':14s} {'prompt step s':>14s} {'decode tokens/s':>16s} {'generate s':>11s}")
    print(f"{'cdphybrid':14s} {float(m.group(1)):14.3f} {float(m.group(4)):16.2f} "
          f"{float(m.group(1)) + float(m.group(3)):11.3f}   (process with loading: {wall:.2f} s)")
    print(f"{'transformers':14s} {first:14.3f} {rate:16.2f} {total:11.3f}   (torch {torch.__version__})")
    print(f"decode speed ratio cdphybrid / transformers: {float(m.group(4)) / rate:.2f}")
    print(f"greedy tokens {'identical' if ours == theirs else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
