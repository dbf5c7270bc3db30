#!/usr/bin/env python3
"""Writes the golden Llama fixture for tests/test_model.c: transformers'
LlamaForCausalLM, float64, with 2 decoder layers, grouped-query attention
(4 query heads, 2 key/value heads), Llama 3 rope scaling and an untied head;
fixed weights drawn away from their initial values; the loss and every
gradient of one batch (cross-entropy of the logits against explicit targets,
no shift, as cdphybrid's loss).

    python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers safetensors
    /tmp/venv-hf/bin/python tools/gen_golden_llama.py tests/fixtures/golden

Outputs (safetensors, written by the Python safetensors library):
  llama-tiny.safetensors     weights named as cdphybrid names them (layers.N.*),
                             tokens/targets, the loss, every gradient (grad.*)
  llama-tiny-hf/             the same weights as a Hugging Face folder
                             (config.json, model.safetensors), as
                             LlamaForCausalLM.save_pretrained writes it
CI does not run this; the fixture is committed. The plan that matches it:
  {"preset": "llama", "vocab": 48, "context": 12, "layers": 2, "dim": 32,
   "heads": 4, "kv_heads": 2, "hidden": 48, "rope_theta": 10000, "norm_eps": 1e-5,
   "rope_scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1,
                    "high_freq_factor": 4, "original_context": 64}}
"""
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

V, T, L, NH, NKV, C, H, B = 48, 12, 2, 4, 2, 32, 48, 2
THETA, EPS = 10000.0, 1e-5
SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def ours(name):
    """cdphybrid's name of a Hugging Face tensor name."""
    if name == "model.embed_tokens.weight":
        return "layers.0.wte"
    if name == "model.norm.weight":
        return f"layers.{L + 1}.norm.weight"
    if name == "lm_head.weight":
        return f"layers.{L + 1}.lm_head.weight"
    assert name.startswith("model.layers.")
    rest = name[len("model.layers."):]
    i, param = rest.split(".", 1)
    return f"layers.{int(i) + 1}.{param}"


def main(out_dir):
    torch.manual_seed(4321)
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=H, num_hidden_layers=L,
                      num_attention_heads=NH, num_key_value_heads=NKV, max_position_embeddings=128,
                      rms_norm_eps=EPS, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                      rope_parameters={"rope_type": "llama3", "rope_theta": THETA, **SCALING},
                      attn_implementation="eager", bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).to(torch.float64)
    model.eval()  # no dropout (there is none at attention_dropout 0 either)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms, away from one so that they matter
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}

    tokens = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    logits = model(input_ids=tokens).logits
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()

    f32 = lambda t: t.detach().to(torch.float32).contiguous()
    out = {ours(n): f32(v) for n, v in init.items()}
    out.update({"grad." + ours(n): f32(p.grad) for n, p in model.named_parameters()})
    out["tokens"] = tokens.to(torch.int32)
    out["targets"] = targets.to(torch.int32)
    out["loss"] = torch.tensor([loss.item()], dtype=torch.float32)
    meta = {"generator": "tools/gen_golden_llama.py", "torch": torch.__version__,
            "transformers": transformers.__version__,
            "config": f"vocab={V} context={T} layers={L} heads={NH} kv_heads={NKV} dim={C} hidden={H} batch={B} "
                      f"rope_theta={THETA} norm_eps={EPS} llama3={SCALING}",
            "loss_f64": repr(loss.item())}
    os.makedirs(out_dir, exist_ok=True)
    save_file(out, os.path.join(out_dir, "llama-tiny.safetensors"), metadata=meta)

    hf_dir = os.path.join(out_dir, "llama-tiny-hf")
    model.to(torch.float32).save_pretrained(hf_dir, safe_serialization=True)
    for extra in ("generation_config.json",):
        path = os.path.join(hf_dir, extra)
        if os.path.exists(path):
            os.remove(path)
    print(f"loss {loss.item():.10f}; wrote {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/golden")
