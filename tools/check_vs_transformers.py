#!/usr/bin/env python3
"""Checks a random model of GPT-2 124M's size against transformers, end to end
through the cdphybrid binary: the loss of the first training batch (step 1, whose
loss is that of the weights before the update) and 50 greedy tokens from a prompt. Not run by CI (it needs
torch and transformers, and minutes of CPU).

    python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers safetensors
    /tmp/venv-hf/bin/python tools/check_vs_transformers.py build/cdphybrid llama /tmp/check-llama
    /tmp/venv-hf/bin/python tools/check_vs_transformers.py build/cdphybrid gpt2 /tmp/check-gpt2

llama: dim 768, 12 layers, 12 heads, 4 key/value heads, hidden 2048, vocab
32000, rope_theta 500000, untied head (124.7M parameters), weights written in
cdphybrid's names (docs/models.md). gpt2: GPT2LMHeadModel of gpt2's config
(124.4M), weights in the Hugging Face layout, which /model/weights reads.
Weights are drawn N(0, 1/fan_in) (not the initialiser's 0.02) so that the
next-token distribution is peaked enough for greedy choices to be stable.

The batch: 4 windows of 64 tokens of a tokens file (llm.c format) read in
order; the loss is transformers' cross-entropy of the logits of each window
against the window shifted by one, as cdphybrid's first step computes it.
Greedy: cdphybrid generate without a tokenizer takes the prompt's bytes as
tokens and chooses among ids 0..255, so the reference takes the argmax of the
logits' first 256 entries. Exit 0 when the losses agree to 1e-5 relative and
the 50 tokens are identical.
"""
import json
import os
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

T, B, PROMPT, NEW = 64, 4, "The quick brown fox", 50


def llama(out):
    from transformers import LlamaConfig, LlamaForCausalLM
    V, C, L, NH, NKV, H = 32000, 768, 12, 12, 4, 2048
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=H, num_hidden_layers=L, num_attention_heads=NH,
                      num_key_value_heads=NKV, max_position_embeddings=1024, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                      attn_implementation="eager", bos_token_id=None, eos_token_id=None, pad_token_id=None)
    m = LlamaForCausalLM(cfg).eval()
    names = {}
    for n, _ in m.named_parameters():
        if n == "model.embed_tokens.weight":
            names[n] = "layers.0.wte"
        elif n == "model.norm.weight":
            names[n] = f"layers.{L + 1}.norm.weight"
        elif n == "lm_head.weight":
            names[n] = f"layers.{L + 1}.lm_head.weight"
        else:
            i, rest = n[len("model.layers."):].split(".", 1)
            names[n] = f"layers.{int(i) + 1}.{rest}"
    model = {"preset": "llama", "vocab": V, "context": 256, "layers": L, "dim": C, "heads": NH, "kv_heads": NKV,
             "hidden": H, "rope_theta": 500000, "norm_eps": 1e-5}
    return m, V, model, names


def gpt2(out):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(activation_function="gelu_new", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    m = GPT2LMHeadModel(cfg).eval()
    model = {"preset": "gpt2", "context": 256}
    return m, cfg.vocab_size, model, None


def main(binary, family, out):
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(2)
    torch.manual_seed(7)
    m, V, model, names = (llama if family == "llama" else gpt2)(out)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p)) if "weight" in n else p.copy_(0.02 * torch.randn_like(p))
            else:
                fan_in = p.shape[0] if family == "gpt2" and "wte" not in n and "wpe" not in n else p.shape[1]
                p.copy_(torch.randn_like(p) / fan_in ** 0.5)
    sd = {n: p.detach().contiguous() for n, p in m.named_parameters()}
    if names:
        save_file({names[n]: t for n, t in sd.items()}, os.path.join(out, "weights.safetensors"))
    else:
        save_file(sd, os.path.join(out, "weights.safetensors"), metadata={"format": "pt"})

    g = torch.Generator().manual_seed(11)
    n_tok = 4096
    tokens = torch.randint(0, V, (n_tok,), generator=g)
    with open(os.path.join(out, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n_tok, *([0] * 253)))
        f.write(tokens.to(torch.int32).numpy().astype("<u2").tobytes())
    x = torch.stack([tokens[q * T:q * T + T] for q in range(B)])
    y = torch.stack([tokens[q * T + 1:q * T + T + 1] for q in range(B)])
    ref_path = os.path.join(out, "reference.json")
    if os.path.exists(ref_path):  # a rerun against another binary
        with open(ref_path) as f:
            ref = json.load(f)
    else:
        with torch.no_grad():
            ref = {"loss": F.cross_entropy(m(input_ids=x).logits.reshape(-1, V), y.reshape(-1)).item()}
            print(f"transformers: first loss {ref['loss']:.8f}", flush=True)
            ids = list(PROMPT.encode())
            r = m(input_ids=torch.tensor([ids]), use_cache=True)
            for _ in range(NEW):
                ids.append(int(r.logits[0, -1, :256].argmax()))
                r = m(input_ids=torch.tensor([[ids[-1]]]), past_key_values=r.past_key_values, use_cache=True)
            ref["tokens"] = ids[len(PROMPT):]
        with open(ref_path, "w") as f:
            json.dump(ref, f)
    ref_loss, ref_text = ref["loss"], bytes(ref["tokens"])
    print(f"transformers: first loss {ref_loss:.8f}, greedy {ref_text!r}", flush=True)

    plan = {"model": dict(model, weights="weights.safetensors"),
            "data": {"source": "tokens", "path": "tokens.bin", "order": "sequential"},
            "train": {"steps": 1, "global_batch": B, "micro_batch": B, "optimizer": {"type": "sgd", "lr": 1e-3}},
            "cluster": {"backend": "cpu"}, "output": {"metrics": "metrics.jsonl"}}
    # generation sees the prompt and all it generated (no sliding window, as transformers): a context of 128
    plan["model"]["context"] = 128
    with open(os.path.join(out, "generate.json"), "w") as f:
        json.dump(plan, f, indent=1)
    plan["model"]["context"] = T
    with open(os.path.join(out, "plan.json"), "w") as f:
        json.dump(plan, f, indent=1)
    subprocess.run([binary, "-q", "--plan", "plan.json"], cwd=out, check=True)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        loss = next(r["loss"] for r in map(json.loads, f) if "loss" in r)
    gen = subprocess.run([binary, "generate", "-q", "--plan", "generate.json", "--weights", "weights.safetensors",
                          "--prompt", PROMPT, "--tokens", str(NEW), "--temperature", "0"], cwd=out, check=True,
                         capture_output=True).stdout
    text = gen[len(PROMPT):len(PROMPT) + NEW]  # generate ends its output with a newline
    rel = abs(loss - ref_loss) / ref_loss
    print(f"{family}: {sum(p.numel() for p in m.parameters()):,} parameters")
    print(f"  first loss: cdphybrid {loss:.8f}, transformers {ref_loss:.8f}, relative {rel:.2e}")
    print(f"  {NEW} greedy tokens identical: {text == ref_text} ({sum(a == b for a, b in zip(text, ref_text))} of {NEW})")
    return 0 if rel <= 1e-5 and text == ref_text else 1


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[2] not in ("llama", "gpt2"):
        sys.exit(__doc__)
    sys.exit(main(os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3]))
