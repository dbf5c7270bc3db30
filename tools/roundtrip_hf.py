#!/usr/bin/env python3
"""The round trip Hugging Face -> cdphybrid -> training -> Hugging Face, for a
Llama: transformers writes a random LlamaForCausalLM folder (grouped-query
attention, llama3 rope scaling, untied head); cdphybrid imports it
("model": {"from": DIR}), trains 20 steps of AdamW on a tokens file, evaluates
the validation loss and exports the trained weights with --format hf;
transformers loads that folder and computes the loss of the same validation
batch. Exit 0 when the two losses agree to 1e-6 relative. Not run by CI (it
needs torch and transformers).

    /tmp/venv-hf/bin/python tools/roundtrip_hf.py build/cdphybrid /tmp/roundtrip
"""
import json
import os
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

V, C, L, NH, NKV, H, T, B, N_TOK = 256, 64, 2, 4, 2, 96, 32, 4, 8192


def run(binary, out, *args):
    r = subprocess.run([binary, *args], cwd=out, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{' '.join(args)}: exit {r.returncode}\n{r.stderr}")
    return r.stdout


def main(binary, out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(5)
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=H, num_hidden_layers=L, num_attention_heads=NH,
                      num_key_value_heads=NKV, max_position_embeddings=128, rms_norm_eps=1e-5,
                      tie_word_embeddings=False,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64},
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    LlamaForCausalLM(cfg).save_pretrained(os.path.join(out, "hf-in"))

    g = torch.Generator().manual_seed(9)
    # a learnable stream: each token mostly the previous one plus one
    tok = torch.zeros(N_TOK, dtype=torch.int64)
    for i in range(1, N_TOK):
        tok[i] = (tok[i - 1] + 1) % V if torch.rand(1, generator=g) < 0.8 else torch.randint(0, V, (1,), generator=g)
    with open(os.path.join(out, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, N_TOK, *([0] * 253)))
        f.write(tok.to(torch.int32).numpy().astype("<u2").tobytes())

    plan = {"model": {"from": "hf-in", "context": T},
            "data": {"source": "tokens", "path": "tokens.bin", "order": "sequential"},
            "train": {"steps": 20, "global_batch": B, "micro_batch": B, "eval_batches": 1,
                      "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.1}},
            "cluster": {"backend": "cpu"}, "output": {"weights": "trained.safetensors", "metrics": "metrics.jsonl"}}
    with open(os.path.join(out, "plan.json"), "w") as f:
        json.dump(plan, f, indent=1)
    run(binary, out, "-q", "--plan", "plan.json")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        losses = [r["loss"] for r in map(json.loads, f) if "loss" in r]  # the first line is the layout
    ev = run(binary, out, "eval", "-q", "--plan", "plan.json", "--weights", "trained.safetensors", "--batches", "1")
    ours = float(ev.split("val_loss")[1].split()[0])
    run(binary, out, "export", "-q", "--plan", "plan.json", "--weights", "trained.safetensors", "--format", "hf",
        "--out", "hf-out")

    m = LlamaForCausalLM.from_pretrained(os.path.join(out, "hf-out"), torch_dtype=torch.float32).eval()
    n_tr = N_TOK - N_TOK // 10  # the validation split, read in order (docs/training.md, Data order)
    x = torch.stack([tok[n_tr + k * T:n_tr + k * T + T] for k in range(B)])
    y = torch.stack([tok[n_tr + k * T + 1:n_tr + k * T + T + 1] for k in range(B)])
    with torch.no_grad():
        theirs = F.cross_entropy(m(input_ids=x).logits.reshape(-1, V), y.reshape(-1), reduction="sum").item() / (B * T)
    rel = abs(ours - theirs) / theirs
    print(f"training loss {losses[0]:.6f} -> {losses[-1]:.6f} in {len(losses)} steps")
    print(f"validation loss after training: cdphybrid {ours:.10f}, transformers on the exported folder "
          f"{theirs:.10f}, relative difference {rel:.2e}")
    return 0 if rel <= 1e-6 and len(losses) == 20 else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(os.path.abspath(sys.argv[1]), sys.argv[2]))
