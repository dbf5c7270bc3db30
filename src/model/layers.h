/* The units of a model: every partition unit (a layer of an explicit list,
 * or a GPT embedding / transformer block / head) with its shapes, parameters,
 * work and memory, and its forward and backward passes through a device's
 * kernel table (kernels/ops.h), so the same code runs on every backend. What
 * each layer type does is in its own file (model/layer_def.h).
 * The partitioner and the simulator read the same numbers the executor uses.
 *
 * Per-sample figures: multiply by the micro-batch size B.
 * FLOPs count matrix-multiply work, 2*M*N*K per GEMM, exactly as the kernels
 * issue it (tests count the cblas_sgemm calls). Elementwise work is not
 * counted: it is memory-bound and under 2% of the GEMM work in these models. */
#ifndef CDP_MODEL_LAYERS_H
#define CDP_MODEL_LAYERS_H

#include <stdint.h>

#include "cdp/plan_types.h"
#include "cdp/status.h"
#include "model/tensor_group.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDP_UNIT_MAX_PARAMS 12
#define CDP_SHAPE_MAX 4

struct cdp_shape {
    int ndim;
    int64_t d[CDP_SHAPE_MAX];
};

/* How a parameter is initialised (GPT-2 and PyTorch defaults). */
enum cdp_init {
    CDP_INIT_ZERO = 0,
    CDP_INIT_ONE,
    CDP_INIT_NORMAL,  /* N(0, std) */
    CDP_INIT_UNIFORM, /* U(-bound, bound) */
};

struct cdp_param_desc {
    char name[32];        /* within the unit: "weight", "qkv.weight", "wte" ... */
    int ndim;
    int64_t shape[CDP_SHAPE_MAX];
    int64_t numel;
    enum cdp_init init;
    float init_scale;     /* std or bound */
    enum cdp_param_group group; /* for weight decay: a matrix, an embedding, a bias or a norm's */
    int tied_unit;        /* -1, or the global unit whose parameter this one is */
    int tied_param;       /* index of that parameter in its unit */
    int tie_target;       /* a later unit's parameter is tied to this one (cdp_units_build sets it) */
    /* a slice of a tensor split over a tensor group (cdp_param_shard): shape
     * is the slice's; dimension shard_dim of the whole tensor has shard_full
     * entries, of which this holds [shard_off, shard_off + shape[shard_dim])
     * (shard_off = index x shape[shard_dim]). Where shard_full is not a
     * multiple of t (a vocabulary), the slices are padded: entries past
     * shard_full are padding (zeros, in no checkpoint, export or loss;
     * cdp_param_slice_len). With shard_parts P above 1 that dimension is P
     * equal parts split alike (a fused q, k, v projection: rank k holds its
     * heads of each; never padded): the slice holds [shard_off, shard_off +
     * shape[shard_dim] / P) of every part, in part order. shard_dim -1: the
     * whole tensor */
    int shard_dim, shard_parts;
    int64_t shard_full, shard_off;
};

struct cdp_unit {
    struct cdp_layer_desc desc;   /* its type (model/layer_def.h describes it) and sizes (out, kernel, heads, ...) */
    int index;                    /* global unit index in the model */
    int64_t T;                    /* tokens per sample for token models, else 0 */
    struct cdp_shape in, out;     /* per sample */
    int in_tokens;                /* the input is int32 token ids */
    int n_params;
    struct cdp_param_desc params[CDP_UNIT_MAX_PARAMS];
    int64_t param_count;          /* parameters this unit owns (tied ones not counted) */
    double fwd_flops, bwd_flops;  /* per sample */
    /* Split backward (cdp_unit_backward_input / cdp_unit_backward_weight; docs/training.md):
     * B computes the input gradient, W the parameter gradients, later. */
    double bwd_weight_flops;      /* per sample: the part of bwd_flops that W does (the parameter gradients'
                                   * products); B does bwd_flops - bwd_weight_flops */
    int64_t wstate_floats;        /* per sample: the W-state, what W needs that B leaves and nothing else keeps
                                   * (copies of output gradients of the unit's products and norms), held by
                                   * a micro-batch from its B to its W besides its activations (0: no
                                   * parameters). Under recomputation W computes again what B did (the same
                                   * work, recompute_flops, once more), so this does not depend on the mode */
    int64_t act_floats;           /* kept from forward to backward, output included */
    int64_t att_floats;           /* attention's saved state per sample, part of act_floats (heads*T*T
                                   * unless the kernel table keeps less: cdp_unit_fit_kernels) */
    int64_t out_floats;           /* output per sample (what is sent onward) */
    /* Activation recomputation (cdp_unit_set_recompute; docs/training.md). */
    int64_t tail_floats;          /* of act_floats, besides attention state: what selective recomputation
                                   * drops and the type's recompute hook computes again (0: none) */
    double tail_flops;            /* per sample: the matrix work of computing the tail again */
    enum cdp_recompute recompute; /* the mode its kept and work floats are for */
    int64_t keep_floats;          /* per sample, kept per micro-batch from forward to backward */
    int64_t work_floats;          /* per sample, computed again into the model's one work buffer */
    double recompute_flops;       /* per sample: the matrix work its backward adds to compute them again
                                   * (split backward: B adds it, and W adds it again) */
    /* Tensor parallelism (docs/parallelism.md): the unit as rank tp_index of
     * a tensor group of tp_size holds it (cdp_units_build_tensor; 1 and 0
     * elsewhere), its shapes, parameters and costs that rank's slice; tp the
     * group's collectives, set by the executor (NULL elsewhere: a split unit
     * of tp_size 1 needs none; not owned). */
    int tp_size, tp_index;
    const struct cdp_tensor_group *tp;
    /* Sequence parallelism (cdp_unit_set_sequence_parallel): 1 when the
     * unit's input and output are its tensor rank's sequence shard, rows
     * [k T/t, (k + 1) T/t) of every sample (/parallel/sequence_parallel);
     * 0 otherwise. */
    int seq_parallel;
};

/* Whether u's work is its tensor rank's slice (a split linear, or a type
 * that splits itself over the group, layer_def.h's tensor_splits) rather than
 * the whole layer every rank of the group repeats. 0 at tp_size 1. */
int cdp_unit_tensor_split(const struct cdp_unit *u);
/* Sums n floats of buf (memory of the unit's device) over u's tensor group in
 * place; nothing at tp_size 1. CDP_ERR_INTERNAL when u is split but has no
 * group's collective (layers.h, tp). */
cdp_status cdp_unit_tensor_sum(const struct cdp_unit *u, float *buf, int64_t n);

/* How many partition units m has, and the description of unit i: a layer
 * list's, or a GPT preset's (embedding, blocks of its family, head). */
int cdp_model_desc_units(const struct cdp_model_desc *m);
struct cdp_layer_desc cdp_model_desc_unit(const struct cdp_model_desc *m, int i);

/* The first unit of m that does not split over a tensor group of t: its
 * index, with *key its layer key ("heads", "kv_heads", "hidden") and *value
 * that key's value, which t does not divide (layer_def.h, tensor_check); -1
 * when every unit does. A list whose shapes do not follow ends the walk
 * there (the plan's shape check names it). */
int cdp_model_desc_tensor_misfit(const struct cdp_model_desc *m, int t, const char **key, int64_t *value);

/* The partition units of a model description; *out is malloc'd (n entries). */
cdp_status cdp_units_build(const struct cdp_model_desc *m, struct cdp_unit **out, int *n);
/* The same as rank k of a tensor group of t holds them: split layers'
 * shapes, parameters and costs are k's slice (docs/parallelism.md). t = 1 is
 * cdp_units_build. CDP_ERR_INVALID when a split width is not a multiple of t. */
cdp_status cdp_units_build_tensor(const struct cdp_model_desc *m, int t, int k, struct cdp_unit **out, int *n);

/* Makes parameter p of u the slice k of t along dimension dim, as
 * cdp_param_desc's shard fields describe: ceil(size / t) entries each, the
 * last slices padded where the size is not a multiple of t;
 * u->param_count follows (the entries of the whole tensor it holds). */
void cdp_param_shard(struct cdp_unit *u, int p, int dim, int t, int k);
/* The same with dimension dim made of parts equal parts, each split alike
 * (shard_parts); parts 1 is cdp_param_shard. */
void cdp_param_shard_parts(struct cdp_unit *u, int p, int dim, int parts, int t, int k);
/* shard_off of index j's slice of the tensor pd slices (its group's ranks
 * hold slices of one size). */
int64_t cdp_param_shard_off_of(const struct cdp_param_desc *pd, int j);
/* How many entries along shard_dim of the slice pd are the whole tensor's
 * (the rest are padding); shape[0] for a whole tensor. */
int64_t cdp_param_slice_len(const struct cdp_param_desc *pd);
/* Copies the slice pd describes between the whole tensor and the slice's
 * own storage (float data, any alignment): into whole when to_whole (its
 * padding left out), else out of it (its padding zeroed). pd->shard_dim must
 * be 0 or more. */
void cdp_param_slice_copy(const struct cdp_param_desc *pd, void *whole, void *slice, int to_whole);

/* The one description of a tie: whether the model's head reuses its token
 * embedding (a GPT with /model/tie_embeddings; its units then carry the tie as
 * tied_unit / tie_target, cdp_units_build). Split over several virtual
 * stages, the two copies' gradients are summed (REDUCE_TIED_GRADS). */
int cdp_model_ties_embeddings(const struct cdp_model_desc *m);

/* Checks, before any unit of m is built, that its sizes stay in bounds at
 * micro-batches of B: every parameter tensor and every micro-batch's input,
 * output within CDP_PLAN_MAX_TENSOR elements (its scratch within 2^60), the parameters in
 * all within CDP_PLAN_MAX_PARAMS, an attention's tokens within
 * CDP_PLAN_MAX_CONTEXT, and a micro-batch's rows (B x all but the last
 * dimension) within INT32_MAX, which the kernels index with int. Its arithmetic is checked, so that cdp_units_build's need not be.
 * 0, or -1 with *at the unit and why what is too large. */
int cdp_units_check_sizes(const struct cdp_model_desc *m, int64_t B, int *at, char *why, size_t cap);

/* Scratch floats a unit needs for a micro-batch of B samples (forward and
 * backward use the same scratch). */
int64_t cdp_unit_scratch_floats(const struct cdp_unit *u, int B);

/* The name of a layer type ("linear", "lm_head"): the plan's "type", the
 * unit's name in cost tables and messages; "?" out of range. */
const char *cdp_layer_name(enum cdp_layer_type t);

/* Sets what u keeps for its backward in mode r: NONE keeps act_floats;
 * SELECTIVE keeps all but its tail (tail_floats and, for an attention type,
 * the attention state), which its backward computes again into the work
 * buffer; FULL keeps only its output, and its backward runs its whole forward
 * again into the work buffer. A unit with nothing to drop in that mode (no
 * tail; an output that is all it keeps) keeps what NONE keeps. Called again
 * whenever act_floats changes (cdp_unit_fit_kernels, cdp_cost_fit_units). */
void cdp_unit_set_recompute(struct cdp_unit *u, enum cdp_recompute r);
/* Floats per sample of u's selective tail, attention state included. */
int64_t cdp_unit_tail_floats(const struct cdp_unit *u);

struct cdp_kernels;
/* Sizes an attention or transformer-block unit's saved attention state for
 * kernel table k and micro-batches of B: what the table's
 * attention_state_floats says its attention keeps (kernels/ops.h), per sample,
 * where that is less than heads*T*T; act_floats shrinks with it. Other units,
 * and tables without that entry, are left alone. */
void cdp_unit_fit_kernels(struct cdp_unit *u, const struct cdp_kernels *k, int B);

/* The kernels a unit runs on: a device's table and the state its ops take
 * first (cdp_device_ops, cdp_device_kernel_state). Neither is owned. */
struct cdp_ops;
struct cdp_kernels {
    const struct cdp_ops *ops;
    void *ks;
};

/* Calls op of k's table with k's state and the remaining arguments, and returns
 * the first failure from the calling function (which returns cdp_status). A
 * NULL entry is an op the backend does not have: CDP_ERR_UNSUPPORTED. Needs
 * kernels/ops.h. */
#define CDP_KERNEL(k, op, ...)                                                                 \
    do {                                                                                       \
        const struct cdp_kernels *k_ = (k);                                                    \
        if (!k_->ops->op)                                                                      \
            return cdp_fail(CDP_ERR_UNSUPPORTED, "the %s kernels have no " #op, k_->ops->name); \
        cdp_status kst_ = k_->ops->op(k_->ks, __VA_ARGS__);                                    \
        if (kst_) return kst_;                                                                 \
    } while (0)

/* Sequence parallelism's moves between a sequence shard and the whole
 * sequence (for a unit whose norms and residual run on its rank's rows
 * only: cdp_unit_set_sequence_parallel's). B samples of T rows of C floats; rank k of
 * u's tensor group of t holds rows [k T/t, (k + 1) T/t) of every sample,
 * [B, T/t, C] (T a multiple of t). stage is B T C floats of the device's
 * memory, apart from the other buffers, clobbered. At tp_size 1 each is a
 * copy. CDP_ERR_INTERNAL as cdp_unit_tensor_sum; CDP_ERR_INVALID when t does
 * not divide T.
 * gather: full [B, T, C] = every rank's shard in place, the same on every
 * rank (the forward of entering a column-parallel region, the backward of
 * leaving a row-parallel one). */
cdp_status cdp_unit_seq_gather(const struct cdp_kernels *k, const struct cdp_unit *u, const float *shard,
                               float *full, float *stage, int B, int64_t T, int64_t C);
/* scatter: shard = this rank's rows of the sum over the group of full [B, T,
 * C] (the forward of leaving a row-parallel region, the backward of entering
 * a column-parallel one). */
cdp_status cdp_unit_seq_scatter(const struct cdp_kernels *k, const struct cdp_unit *u, const float *full,
                                float *shard, float *stage, int B, int64_t T, int64_t C);

/* Makes split unit u run sequence parallel (docs/parallelism.md): the
 * residual stream becomes its rank's sequence shard, [T/t, C] per sample --
 * a transformer_block's or llama_block's input and output, an embedding's
 * output, an lm_head's input (those shapes and out_floats divided by t) --
 * its norms
 * and residual run on the shard, with an all-gather entering each split
 * product and a reduce-scatter leaving it instead of the all-reduce, and
 * its norms' parameter gradients summed over the group inside its backward.
 * Set by cdp_units_build_tensor under /parallel/sequence_parallel: forward,
 * both backwards (split: B does every collective, the norms' gradient sum
 * included, and leaves the results in the W-state, so W has none) and the
 * blocks' recompute hooks (which gathers the norms' outputs again) honour
 * it. act_floats (and keep_floats) shrink to what the rank keeps:
 * the residual stream's and the norms' statistics' rows of its shard, the
 * norms' outputs and the split products' whole; scratch grows by the moves'
 * staging; FLOPs and wstate_floats stay as they were (the planner costs its
 * collectives apart, partitioner/planner_tensor.c). CDP_ERR_UNSUPPORTED for another type or
 * an unsplit unit, CDP_ERR_INVALID when t does not divide the sequence. */
cdp_status cdp_unit_set_sequence_parallel(struct cdp_unit *u);

/* Forward for B samples on kernels k: in (float, or int32 tokens) -> act (the
 * unit's B x act_floats activations; its output is at the start). params
 * points at this unit's parameter pointers, in the order of u->params. Every
 * pointer is memory of k's device. Returns the first failing kernel's status
 * (CDP_ERR_DEVICE on a GPU, CDP_ERR_UNSUPPORTED for an op the backend lacks);
 * the CPU kernels do not fail. */
cdp_status cdp_unit_forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *params,
                            const void *in, float *act, float *scratch, int B);

/* Backward for B samples on kernels k: dout -> din (+=; NULL when the input
 * needs no gradient: tokens, or the first unit), dparams (+=). Statuses as for
 * cdp_unit_forward. */
cdp_status cdp_unit_backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *params,
                             float *const *dparams, const void *in, const float *act, const float *dout,
                             float *din, float *scratch, int B);

/* Split backward (docs/training.md): cdp_unit_backward as two calls, B then
 * W, whose gradients are the combined backward's bits (the same kernels on
 * the same values, each parameter gradient accumulated once per call as the
 * combined backward does; across micro-batches, in the order the Ws run).
 * backward_input: din (+=; NULL: not wanted) as cdp_unit_backward, no
 * parameter gradient touched; fills ws, B x wstate_floats floats of k's
 * device, with what W needs. backward_weight: dparams += from ws, the kept
 * activations and the input, which must be unchanged since B; dout: the
 * output gradient again where cdp_unit_weight_takes_dout says so (lm_head),
 * else ignored (NULL). After it ws may be reused. The activations and tail
 * are as for cdp_unit_backward_split: under recomputation the caller
 * computes them again before each of the two calls. */
cdp_status cdp_unit_backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *params,
                                   const void *in, const float *act, const float *tail, const float *dout,
                                   float *din, float *ws, float *scratch, int B);
cdp_status cdp_unit_backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *params,
                                    float *const *dparams, const void *in, const float *act, const float *tail,
                                    const float *dout, const float *ws, float *scratch, int B);
/* 1 when u's output is split by vocabulary over a tensor group of more
 * than one rank (the head at t > 1): its logits are the columns
 * [*off, *off + *valid) of the whole vocabulary's, followed by padding up
 * to its output's width; 0 otherwise. */
int cdp_unit_vocab_split(const struct cdp_unit *u, int64_t *off, int64_t *valid);

/* 1 when u's backward_weight needs its output gradient again (lm_head: the
 * loss's gradient, computed again from the kept logits and targets). */
int cdp_unit_weight_takes_dout(const struct cdp_unit *u);

/* The same passes with the kept activations (B x (act_floats - tail)) at act
 * and the selective tail (B x cdp_unit_tail_floats) at tail, anywhere; and the
 * tail computed again from the input and the kept ones, as the forward wrote
 * it (a unit without a tail: nothing to do). */
cdp_status cdp_unit_forward_split(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *params,
                                  const void *in, float *act, float *tail, float *scratch, int B);
cdp_status cdp_unit_backward_split(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *params,
                                   float *const *dparams, const void *in, const float *act, const float *tail,
                                   const float *dout, float *din, float *scratch, int B);
cdp_status cdp_unit_recompute_tail(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *params,
                                   const void *in, float *act, float *tail, float *scratch, int B);

/* Deterministic initial values of parameter p of a unit: element i of
 * (seed, owning unit, parameter) whatever the partition. dst is host memory. */
void cdp_param_init(const struct cdp_unit *u, int p, uint64_t seed, float *dst);

#ifdef __cplusplus
}
#endif

#endif
