/* The plan loader: one JSON file describing the model, its data, the training
 * run, the parallel layout and the machine (docs/plan.md), loaded into the
 * plain structs of cdp/plan_types.h with every default filled in, checked,
 * resolved against the machine, and written back as JSON or a table. */
#ifndef CDP_PLAN_H
#define CDP_PLAN_H

#include "cdp/api.h"

#include <stdint.h>
#include <stdio.h>

#include "cdp/plan_types.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads and validates a plan file. Every bad value fails with CDP_ERR_INVALID and a
 * message "FILE: /json/path: expected ..., got ..." (syntax errors: "FILE:LINE:COL:
 * ..."); unknown keys suggest the closest known one; values that disagree are named
 * together. Relative paths inside the plan are relative to the plan file's folder.
 * On success *out owns a new plan (free with cdp_plan_free). */
CDP_API cdp_status cdp_plan_load(const char *path, struct cdp_plan **out);

/* As cdp_plan_load, from JSON text; `name` stands for the file in messages and
 * relative paths are taken relative to `base_dir` (NULL = the current folder). */
CDP_API cdp_status cdp_plan_load_string(const char *json, const char *name, const char *base_dir,
                                struct cdp_plan **out);

/* What the machine offers, for cdp_plan_resolve. */
struct cdp_machine_info {
    int gpus;              /* usable GPUs found live (0 when none) */
    const char *no_gpu_why; /* why none were found (a CUDA error string), or NULL */
};

/* Settles what depends on the machine: "auto" backend (cuda when GPUs are usable,
 * else cpu), "auto" devices per node, and checks that stages x replicas fit in the
 * devices available. */
CDP_API cdp_status cdp_plan_resolve(struct cdp_plan *plan, const struct cdp_machine_info *machine);

/* Number of partition units of the model (GPT: embedding + blocks + head). */
CDP_API int64_t cdp_plan_model_units(const struct cdp_plan *plan);

/* Number of trainable parameters of the model, counted exactly from its
 * architecture (GPT: token and position embeddings, 12E^2 + 13E per block, the
 * final layernorm, and the head unless tied); -1 if it overflows 64 bits. */
CDP_API int64_t cdp_plan_param_count(const struct cdp_plan *plan);

/* The resolved plan as JSON text (a plan file that loads back to the same plan).
 * *out is malloc'd; the caller frees it. */
CDP_API cdp_status cdp_plan_to_json(const struct cdp_plan *plan, char **out);

/* Writes the resolved plan as a readable table. */
CDP_API cdp_status cdp_plan_print(const struct cdp_plan *plan, FILE *f);

/* Names used in plan files ("1f1b", "adamw", ...), for printing. */
CDP_API const char *cdp_schedule_name(enum cdp_schedule_kind s);
CDP_API const char *cdp_recompute_name(enum cdp_recompute r);
/* ZeRO-2 reduces each layer's gradient after every backward, a collective of
 * the stage's replicas, so they must all run the same micro-batches: 1 when
 * the plan's /parallel/balance and /parallel/rebalance_every allow that; else
 * 0 and, where why is given, the reason naming the key. */
CDP_API int cdp_plan_zero2_allowed(const struct cdp_plan *plan, char *why, size_t cap);
/* Whether the runtime runs model m sequence parallel (/parallel/sequence_parallel):
 * 1 for GPT presets (transformer_block); else 0 and, where why is given, what
 * it is instead ("a Llama model"). The one home of the rule: the plan loader
 * refuses true for the others, and the planner's "auto" never tries them. */
CDP_API int cdp_plan_sequence_parallel_runs(const struct cdp_model_desc *m, char *why, size_t cap);
/* Gradient buckets' size in bytes for `replicas` replicas under ZeRO stage
 * `zero`: /parallel/bucket_mb, or 0 (one reduction after the last backward)
 * with bucket_mb 0, one replica, or ZeRO-2 (which reduces after every
 * backward already). The one home of the rule for the executor
 * (pipeline/run/exec_buckets.c), the planner and so the simulator; it holds on
 * every backend (cpu: mpi; cuda: nccl, or the host-staging adapter where
 * ranks share a GPU), since every communicator with several ranks overlaps
 * its collectives (the executor still checks cdp_comm_collectives_async). */
CDP_API double cdp_plan_bucket_bytes(const struct cdp_plan *plan, int replicas, int zero);
/* Whether a schedule runs several model chunks per rank (interleaved): the one
 * home of that rule. A loaded plan's /parallel/chunks is 1 for the others. */
CDP_API int cdp_schedule_has_chunks(enum cdp_schedule_kind s);
CDP_API const char *cdp_layer_type_name(enum cdp_layer_type t);

CDP_API void cdp_plan_free(struct cdp_plan *plan);

#ifdef __cplusplus
}
#endif

#endif
