/* Hugging Face model folders, both ways: config.json <-> the model's
 * description, one table per architecture (its config keys and our plan
 * keys), and where a folder's weights are (model.safetensors, or shards
 * listed by model.safetensors.index.json). The tensor names are
 * model/hf_gpt2.h's table. docs/models.md says what imports and exports. */
#ifndef CDP_MODEL_HF_H
#define CDP_MODEL_HF_H

#include <jansson.h>

#include "cdp/plan_types.h"
#include "cdp/status.h"
#include "core/json_check.h"
#include "model/safetensors.h"

struct cdp_model;

#ifdef __cplusplus
extern "C" {
#endif

/* Reads DIR/config.json: the architecture (its "architectures"[0], else its
 * "model_type") chooses the table; the sizes, the tie and what our model
 * fixes (GPT-2: layer_norm_epsilon 1e-5, a tanh GELU, 4 x n_embd inner) are
 * checked. Fills md (kind, preset "gpt", sizes) and *weights (owned): the
 * absolute path of DIR/model.safetensors.index.json when there is one, else
 * of DIR/model.safetensors. Errors (CDP_ERR_INVALID; CDP_ERR_IO when the
 * folder or file cannot be read) name the file and the key: an unknown
 * architecture, a value we do not implement, no weights. */
cdp_status cdp_hf_read_config(const char *dir, struct cdp_model_desc *md, char **weights);

/* The plan's own keys beside "from" (the object m at /model of in's file):
 * each key a field of config.json fills must say the same (an error naming
 * the key, the plan's value and config.json's otherwise), except "context",
 * which may be smaller (a model that sees fewer positions; the first rows
 * of learned positions load). config is config.json's path, for messages. */
cdp_status cdp_hf_plan_keys(const struct cdp_json_in *in, const json_t *m, const char *config,
                            struct cdp_model_desc *md);

/* config.json and generation_config.json of md for transformers'
 * from_pretrained; NULL when out of memory or md's family has no Hugging
 * Face form (cdp_hf_family says which). */
json_t *cdp_hf_config_json(const struct cdp_model_desc *md);
json_t *cdp_hf_generation_config_json(const struct cdp_model_desc *md);

/* The name of md's Hugging Face architecture ("GPT2LMHeadModel"), or NULL
 * when it has none. */
const char *cdp_hf_family(const struct cdp_model_desc *md);

/* transformers' save_pretrained default: shards of at most 5 GB. */
#define CDP_HF_SHARD_BYTES ((uint64_t)5000000000)

/* Writes a Hugging Face folder dir (made when missing): the tensors ts[0 ..
 * n) (their Hugging Face names and shapes; bytes through fetch, as
 * cdp_safetensors_write_staged takes them) as model.safetensors, or, when
 * they pass shard_bytes, as shards model-0000k-of-0000N.safetensors of at
 * most shard_bytes each (a tensor larger alone is a shard of its own) listed
 * by model.safetensors.index.json; then config.json and
 * generation_config.json of md. Every file is written atomically; the other
 * form's file left by an earlier export (model.safetensors or the index) is
 * removed, so transformers reads what was written. */
cdp_status cdp_hf_write_folder(const char *dir, const struct cdp_model_desc *md,
                               const struct cdp_safetensors_tensor *ts, int n, const char *const *meta, int n_meta,
                               cdp_safetensors_fetch_fn fetch, void *ctx, uint64_t shard_bytes);

/* The weights of m (the whole model md describes, on the CPU device) as a
 * Hugging Face folder (cdp_hf_write_folder): names by md's architecture
 * (model/hf_gpt2.h), Conv1D weights transposed. CDP_ERR_INVALID when md's
 * family has no Hugging Face form. */
cdp_status cdp_hf_export_model(struct cdp_model *m, const struct cdp_model_desc *md, const char *dir,
                               uint64_t shard_bytes, const char *const *meta, int n_meta);

#ifdef __cplusplus
}
#endif

#endif
