/* Checkpoints that survive crashes and re-plans. A checkpoint is a folder
 * DIR/step-NNNNNNNN holding one safetensors part per stage chunk (weights and
 * optimizer state of the tensors that chunk owns, named by global unit, so any
 * other partition loads them) and manifest.json, written last: a checkpoint is
 * complete, and can become the latest, only when its manifest exists and every
 * part's checksum in it is right. Parts and manifest are written to temporary
 * names, fsynced and renamed, so a crash at any moment leaves the previous
 * checkpoint intact and loadable.
 *
 * Tensor names in a part: "layers.N.param" (weights), and the optimizer state
 * "optim.m.layers.N.param", "optim.v.layers.N.param" (AdamW) or
 * "optim.velocity.layers.N.param" (SGD).
 *
 * Device memory: weights and state are reached through each range's optimizer
 * (cdp_optimizer_device, the model's device). Host-visible memory (cpu) is
 * written from and read into in place; a device the host cannot address (cuda)
 * is staged through host memory in pieces of at most 8 MiB, one host buffer at
 * a time, never a copy of the whole range. The files are the same either way.
 * A range given without its optimizer (opts NULL, or a NULL entry) must be in
 * host-visible memory. */
#ifndef CDP_MODEL_CHECKPOINT_H
#define CDP_MODEL_CHECKPOINT_H

#include <stdint.h>

#include "cdp/status.h"
#include "model/model.h"
#include "model/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_ckpt_info {
    int64_t step;         /* optimizer steps done */
    int64_t samples_seen; /* training samples consumed (the data position) */
    uint64_t seed;        /* the data and init seed of the run */
    char optimizer[16];   /* "adamw" / "sgd" */
    char *plan_json;      /* the resolved plan that wrote it (owned; may be NULL when writing) */
    char data_file[160];  /* what the data file was ("bytes N sha256 H" of its size and its first and last MiB;
                             cdp_ckpt_data_signature), or "" */
};

/* The signature of a data file kept in the manifest: its size and the
 * SHA-256 of its first and last MiB, so that a resume notices a file replaced
 * or cut without reading it whole. "" for a path that is not a regular file. */
void cdp_ckpt_data_signature(const char *path, char out[160]);

/* The run this process's saves belong to (an id every rank of a job shares,
 * e.g. 32 hex digits; at most 39 characters; NULL or "": none). Parts carry it
 * in their metadata ("run"), the manifest too, and a commit refuses a part of
 * another run (two jobs saving into one folder), naming it. */
void cdp_ckpt_set_run(const char *id);

/* Writes one part of checkpoint `step`: the tensors the n models own (a tied
 * copy of another range's tensor is skipped) with their optimizer state, into
 * DIR/step-NNNNNNNN/PART.safetensors, atomically; the step folder is made
 * when missing. Every rank holding a part calls this, in parallel. */
cdp_status cdp_ckpt_write_part(const char *dir, int64_t step, const char *part, struct cdp_model *const *models,
                               struct cdp_optimizer *const *opts, int n);

/* ZeRO-1 (optimizers that hold a shard, cdp_optimizer_create_shard): a part
 * written as above, except that the state of each tensor a sharded optimizer
 * holds is put together by gather->state (into *out, malloc'd, the whole
 * tensor's nbytes) while the part is written, one tensor at a time in host
 * memory. The file is the one an unsharded run writes: any layout, sharded or
 * not, loads it. The executor gathers over the stage's replicas
 * (pipeline/run/exec_ckpt_gather.c); this layer has no communicator. */
struct cdp_ckpt_gather {
    /* state s (0: m or velocity, 1: v) of tensor i of m, whole */
    cdp_status (*state)(void *ctx, struct cdp_optimizer *o, struct cdp_model *m, int i, int s, uint64_t nbytes,
                        uint8_t **out);
    void *ctx;
};
cdp_status cdp_ckpt_write_part_sharded(const char *dir, int64_t step, const char *part,
                                       struct cdp_model *const *models, struct cdp_optimizer *const *opts, int n,
                                       const struct cdp_ckpt_gather *gather);

/* Whether o (NULL: no) holds only a shard of its model's state (ZeRO-1). */
int cdp_ckpt_sharded(struct cdp_optimizer *o, struct cdp_model *m);

/* A ZeRO-1 shard's part of state s of tensor i, copied into host memory:
 * *host (malloc'd, *count floats), read from the optimizer's device where the
 * host cannot address it. */
cdp_status cdp_ckpt_shard_piece(struct cdp_optimizer *o, struct cdp_model *m, int i, int s, float **host,
                                uint64_t *count);

/* Called once, after every part of the step is written (into the hidden
 * .step-N.partial folder): checksums (SHA-256) every part, writes
 * manifest.json (with its own checksum) there, and renames the folder to
 * step-N, the commit point; a committed step-N already there is never
 * written over (CDP_ERR_INVALID). Then removes older checkpoints beyond the
 * newest `keep` complete ones, and unfinished saves older than this step. */
cdp_status cdp_ckpt_commit(const char *dir, int64_t step, const struct cdp_ckpt_info *info, int keep);

/* The newest complete checkpoint under dir (a checkpoint folder itself is
 * accepted too): *path (malloc'd) is its folder and *info is read from its
 * manifest after every part's size and checksum are verified. A corrupt or
 * truncated newest checkpoint is an error naming the file (it is not skipped
 * silently); no checkpoint at all is CDP_ERR_INVALID "no complete checkpoint". */
cdp_status cdp_ckpt_find_latest(const char *dir, char **path, struct cdp_ckpt_info *info);
void cdp_ckpt_info_free(struct cdp_ckpt_info *info);

/* Loads every tensor of the n models (tied copies too, from their owner's
 * name) and, when opts is not NULL, their optimizer state (of a sharded
 * optimizer its shard's part only), from the parts of a verified checkpoint
 * folder; sets the optimizers' step count. A missing
 * tensor, another shape, or state of another optimizer type is an error naming
 * the file and the tensor; nothing is changed on disk. These checks come before
 * any value is read, so such a load changes nothing; a device copy that fails
 * during the load (after them), or a value that is not a finite number (a NaN
 * or an infinity: an error naming the file, the tensor and the element), can
 * leave the ranges partly loaded. */
cdp_status cdp_ckpt_load(const char *path, const struct cdp_ckpt_info *info, struct cdp_model *const *models,
                         struct cdp_optimizer *const *opts, int n);

/* Before training resumes from `step`: removes incomplete saves above it
 * (.step-N.partial folders), the leftovers of a crash while saving, so that
 * the run's next saves start clean. Committed checkpoints are never touched. */
void cdp_ckpt_discard_incomplete_after(const char *dir, int64_t step);
/* Before a run that resumed from `step` saves into dir: CDP_ERR_INVALID
 * naming the newest when dir holds committed checkpoints of later steps
 * (resuming from an earlier step of a folder would write another history
 * under their names). */
cdp_status cdp_ckpt_check_no_later(const char *dir, int64_t step);

/* Before a fresh run (no resume) saves into dir: CDP_ERR_INVALID naming the
 * newest when dir holds committed checkpoints (of an earlier run, whose
 * history this run's saves would mix with); unfinished saves are no matter. */
cdp_status cdp_ckpt_check_fresh(const char *dir);

/* The whole model's weights (no optimizer state) from a checkpoint folder, as
 * one safetensors file readable by other tools, written atomically. */
cdp_status cdp_ckpt_export(const char *path, const char *out);

/* The same weights as Hugging Face's GPT2LMHeadModel.from_pretrained(dir)
 * reads them (model/hf.h cdp_hf_write_folder): model.safetensors, or shards
 * of at most shard_bytes with model.safetensors.index.json, named and laid
 * out as save_pretrained writes GPT-2 (transformer.wte.weight, transformer.h.N.*,
 * Conv1D weights in x out, lm_head.weight only when the head is untied; the
 * one name table of model/hf_gpt2.h), with metadata {"format": "pt"};
 * config.json (GPT2Config: the sizes from the manifest's plan, gelu_new,
 * layer_norm_epsilon 1e-5, no dropout, tie_word_embeddings) and
 * generation_config.json. Each file atomically.
 * A checkpoint of a model that is not a GPT preset, or without its plan, is
 * CDP_ERR_INVALID naming the manifest and the key. */
cdp_status cdp_ckpt_export_hf(const char *path, const char *dir, uint64_t shard_bytes);

#ifdef __cplusplus
}
#endif

#endif
