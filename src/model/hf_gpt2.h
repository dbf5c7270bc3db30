/* The Hugging Face names of a GPT-2's and a Llama's parameters: one table a
 * family, read in both directions, by the import (cdp_model_load of a Hugging
 * Face file, the check of what a weights file holds) and by `cdphybrid
 * export --format hf`. The family is told by the prefix: GPT-2's
 * "transformer." (or none), Llama's "model." (LlamaForCausalLM: embed_tokens,
 * layers.<block>.<our name>, norm; lm_head.weight without the prefix;
 * nothing transposed). docs/models.md has both tables.
 *
 * Ours: "layers.<unit>.<param>", unit 0 the embedding (wte, wpe), units
 * 1..layers the blocks, unit layers + 1 the head (ln_f, lm_head.weight).
 * Hugging Face: "transformer." (GPT2LMHeadModel; absent in a bare GPT2Model's
 * files) + "wte.weight", "wpe.weight", "h.<block>.<param>", "ln_f.<param>",
 * and "lm_head.weight" without the prefix. The four Conv1D weights (c_attn,
 * attn.c_proj, c_fc, mlp.c_proj) are stored in x out there, out x in here. */
#ifndef CDP_MODEL_HF_GPT2_H
#define CDP_MODEL_HF_GPT2_H

#include <stddef.h>

#include "cdp/plan_types.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_safetensors_file;

enum cdp_hf_part { CDP_HF_EMBED = 0, CDP_HF_BLOCK, CDP_HF_HEAD };

/* The prefix of a family's *ForCausalLM files: "transformer." (GPT-2),
 * "model." (Llama); it chooses the table of the functions below. */
const char *cdp_hf_prefix(enum cdp_model_arch arch);

/* The Hugging Face name of our parameter `param` (its name inside the unit:
 * "wte", "attn.c_attn.weight", "lm_head.weight") of a unit of that part
 * (block: its block index, 0-based) with prefix "", "transformer." or "model." (the family), into
 * out; *conv1d 1 when it is stored transposed there. 0 when the parameter has
 * no Hugging Face name. */
int cdp_hf_gpt2_name(enum cdp_hf_part part, int block, const char *param, const char *prefix, char *out, size_t cap,
                     int *conv1d);

/* The other way: a Hugging Face GPT-2 tensor name (with or without
 * "transformer.") or Llama one (with "model.") -> its part, block index
 * (CDP_HF_BLOCK), our parameter name (static) and whether it is a Conv1D
 * weight. 0 when it is not the name of a parameter of either. */
int cdp_hf_gpt2_parse(const char *name, enum cdp_hf_part *part, int *block, const char **param, int *conv1d);

/* A causal-mask buffer some GPT-2 files carry ("h.N.attn.bias",
 * "h.N.attn.masked_bias"): not a weight (the kernels mask by themselves);
 * *block is its block. */
int cdp_hf_gpt2_is_buffer(const char *name, int *block);

/* Whether f is in the Hugging Face layout: it has no tensor named `ours`
 * (our first tensor's name) and holds a GPT-2 or Llama parameter by its
 * Hugging Face name. *prefix is "transformer." or "model." when its names
 * carry it (which says the family), else "". */
int cdp_hf_gpt2_layout(const struct cdp_safetensors_file *f, const char *ours, const char **prefix);

#ifdef __cplusplus
}
#endif

#endif
