/* A model, or the contiguous range of its units that one pipeline stage holds:
 * parameters, gradients and kept activations in device buffers (so the device's
 * memory cap applies), forward and backward over micro-batches, the loss when
 * the range ends the model, and weights in and out of safetensors files.
 * Parameters are named by global unit index ("layers.12.attn.c_attn.weight"),
 * so weights written under one partition load under any other. */
#ifndef CDP_MODEL_MODEL_H
#define CDP_MODEL_MODEL_H

#include <stdint.h>

#include "cdp/device.h"
#include "cdp/plan_types.h"
#include "cdp/status.h"
#include "model/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One stored tensor of the model: parameters shared by two units (a tied LM
 * head) are one tensor. */
struct cdp_model_tensor {
    char name[64];  /* "layers.<unit>.<param>" */
    int unit, param; /* the owning unit (global) and its parameter index */
    int unit_local;  /* the model's unit (0 .. units - 1) it was made for */
    int param_local; /* its parameter index in that unit (a tied copy's differs from param: the head's
                      * weight tied to the embedding's table) */
    float *data, *grad; /* not owned: inside the model's buffers (device memory); under sharded
                         * gradients (cdp_model_create_sharded) a windowed tensor's grad is its place in
                         * the one-unit window, which holds a gradient only during its unit's backward */
    int windowed;        /* sharded gradients: reduced after each of its unit's backwards (not tied) */
    int64_t numel;
    int ndim;
    int64_t shape[CDP_SHAPE_MAX];
    enum cdp_param_group group; /* for weight decay: the owner's (a tied copy is its embedding) */
};

/* Device bytes of a model range, buffer by buffer, exactly as cdp_model_create
 * allocates them: the one home of those sizes, which the planner's memory
 * prediction (pipeline/layout.h) reads too. */
struct cdp_model_bytes {
    uint64_t params, grads;   /* fp32 parameters held (tied ones once), and their gradients (sharded:
                               * the shard, the tied tensors whole and the one-unit window) */
    uint64_t activations;     /* slots x the units' kept activations (in the model's recompute mode) */
    uint64_t inputs;          /* slots x the first unit's input */
    uint64_t targets, losses; /* slots x targets, and one micro-batch's per-row losses (ranges ending the model) */
    uint64_t scratch;         /* the largest unit scratch */
    uint64_t grad_buffers;    /* the backward's two gradients in flight: 2 x the widest input or output */
    uint64_t recompute;       /* the work buffer activations are computed again into: the largest unit's */
    uint64_t wstate;          /* split backward (cdp_model_set_split_backward): wslots x the units'
                               * wstate_bytes; cdp_model_bytes_of leaves it 0 (no W-state slots), a
                               * range with wslots adds it with cdp_model_bytes_add_wstate */
    uint64_t total;
};

/* What one unit adds to a range of B-sample micro-batches. The "sum" fields
 * add up over the range, the "max" fields take the largest; input_bytes counts
 * when the unit starts the range, target and loss bytes when it ends the model. */
struct cdp_unit_bytes {
    uint64_t held_floats;   /* sum: parameters it keeps, a tied one included (a range without its owner
                             * keeps its own copy) */
    uint64_t tied_floats;   /* of held_floats, those of a parameter tied to unit tied_owner */
    uint64_t window_floats; /* of held_floats, those in no tie (neither tied nor tied to): what sharded
                             * gradients reduce after the unit's backward */
    int tied_owner;         /* -1: none */
    uint64_t act_bytes;     /* sum: kept activations per slot (output included), in the unit's recompute mode */
    uint64_t work_bytes;    /* max: what its backward computes again into the work buffer */
    uint64_t wstate_bytes;  /* sum: its W-state per micro-batch (wstate_floats x B x 4), held from its
                             * backward's input half (B) to its weight half (W) under split backward */
    uint64_t scratch_bytes; /* max */
    uint64_t io_bytes;      /* max: its input or output, whichever is wider (floats x 4) */
    uint64_t input_bytes;   /* its input per slot (int32 tokens or floats, 4 bytes each) */
    int in_tokens;          /* its input is token ids (no input gradient) */
    uint64_t output_bytes;  /* its output per micro-batch (what a stage ending with it sends) */
    uint64_t target_bytes;  /* targets per slot were it the model's last unit */
    uint64_t loss_bytes;    /* per-row losses of one micro-batch were it the model's last unit */
};

void cdp_unit_bytes(const struct cdp_unit *u, int B, enum cdp_loss loss, struct cdp_unit_bytes *out);

/* The sums and maxima of cdp_unit_bytes over a range; zero-initialise, then add each unit. */
struct cdp_range_terms {
    uint64_t held_floats, act_bytes, scratch_bytes, io_bytes, work_bytes;
    uint64_t window_sum, window_max; /* of the units' window_floats */
};
void cdp_range_terms_add(struct cdp_range_terms *t, const struct cdp_unit_bytes *u);

/* The buffers of a range with terms t, whose first and last units are first and
 * last, holding shared_floats parameters once that two of its units use (a
 * tied head beside its embedding), with `slots` activation slots; ends_model:
 * the range holds the model's last unit (targets and losses). grad_shards > 1:
 * sharded gradients (ZeRO-2, cdp_model_create_sharded) over that many
 * replicas, grad_shard this one's index. */
void cdp_model_bytes_of(const struct cdp_range_terms *t, uint64_t shared_floats, const struct cdp_unit_bytes *first,
                        const struct cdp_unit_bytes *last, int ends_model, int slots, int grad_shards, int grad_shard,
                        struct cdp_model_bytes *out);

/* Split backward: sets mb->wstate to wslots x wstate_sum (the range's units'
 * wstate_bytes added up) and adds it to mb->total, saturating. */
void cdp_model_bytes_add_wstate(struct cdp_model_bytes *mb, uint64_t wstate_sum, int wslots);

/* The loss a model trains with: cross-entropy for a GPT, else the plan's. */
enum cdp_loss cdp_model_loss_of(const struct cdp_model_desc *desc);

struct cdp_model;

/* Builds units [first, end) of the described model for micro-batches of B
 * samples, with `slots` micro-batches' activations kept at once (1 for
 * one-rank training; a pipeline stage keeps as many as its schedule has in
 * flight). Parameters are initialised from `seed` identically whatever the
 * range. Memory comes from `dev` (not owned; it must outlive the model).
 * cdp_model_create keeps every activation; cdp_model_create_ex keeps what
 * recompute mode r keeps (cdp_unit_set_recompute), computing the rest again in
 * the backward: the same kernels on the same inputs, so the same results. */
cdp_status cdp_model_create(const struct cdp_model_desc *desc, int first, int end, int B, int slots,
                            uint64_t seed, cdp_device_t dev, struct cdp_model **out);
cdp_status cdp_model_create_ex(const struct cdp_model_desc *desc, int first, int end, int B, int slots,
                               uint64_t seed, enum cdp_recompute r, cdp_device_t dev, struct cdp_model **out);
/* ZeRO-2: gradients sharded over `shards` data-parallel replicas, this one
 * `shard` (the shards of cdp_shard over the parameter buffer, as ZeRO-1's
 * optimizer). The model keeps this shard's reduced gradient, the tensors in a
 * tie whole (they are reduced at the step's end, after the tied reduction),
 * and one window as large as its largest unit's other parameters: a unit's
 * backward writes its gradient there, the reduce hook (cdp_model_set_grad_reduce)
 * reduce-scatters it over the replicas and the model adds this shard's part
 * to what it keeps. shards 1 is cdp_model_create_ex. */
cdp_status cdp_model_create_sharded(const struct cdp_model_desc *desc, int first, int end, int B, int slots,
                                    uint64_t seed, enum cdp_recompute r, int shards, int shard, cdp_device_t dev,
                                    struct cdp_model **out);
/* Tensor parallelism (docs/parallelism.md): the range as rank tg->index of
 * the tensor group tg holds it (cdp_units_build_tensor: split layers' slices,
 * each initialised as its part of the whole tensor one rank would make), its
 * split units calling tg's collective (tg not owned; it must outlive the
 * model). tg NULL is cdp_model_create_sharded. */
cdp_status cdp_model_create_tensor(const struct cdp_model_desc *desc, int first, int end, int B, int slots,
                                   uint64_t seed, enum cdp_recompute r, int shards, int shard,
                                   const struct cdp_tensor_group *tg, cdp_device_t dev, struct cdp_model **out);
void cdp_model_destroy(struct cdp_model *m);

/* Sharded gradients' reduction: fn reduce-scatters, over the replicas, the
 * count floats at buf (device memory), which are floats [from, from + count)
 * of the model's parameter buffer of n floats; on return this replica's part
 * of them must hold the sum (cdp_comm_reduce_scatter_window_f32). Called once
 * per run of a unit's untied tensors after each of its backwards, and once per
 * tied tensor by cdp_model_reduce_tied_grads. Without one (a single replica),
 * the gradient is its own sum. */
typedef cdp_status (*cdp_grad_reduce_fn)(void *ctx, float *buf, uint64_t n, uint64_t from, uint64_t count);
void cdp_model_set_grad_reduce(struct cdp_model *m, cdp_grad_reduce_fn fn, void *ctx);
/* Called after each unit's backward (unit: 0 .. cdp_model_unit_count - 1,
 * the last first; with split backward after its W, cdp_model_backward_weight,
 * and only for units with parameters), once its kernels are queued: that micro-batch's gradient
 * of the unit's tensors is then in place (on a GPU, in stream order). The
 * executor starts reducing the gradient buckets of the step's last backward
 * here, while earlier units' backward still runs. NULL: none. */
typedef cdp_status (*cdp_unit_done_fn)(void *ctx, int unit);
void cdp_model_set_backward_hook(struct cdp_model *m, cdp_unit_done_fn fn, void *ctx);
/* Sharded gradients: reduces the tied tensors (whole until now) and keeps
 * this shard's part; after the step's last backward and the tied reduction.
 * A no-op with whole gradients. */
cdp_status cdp_model_reduce_tied_grads(struct cdp_model *m);
/* The reduced gradient of elements [from, ...) of tensor i: with whole
 * gradients t->grad + from; sharded, inside this shard (the elements the
 * shard's optimizer steps, cdp_optimizer_state_range). Device memory. */
float *cdp_model_reduced_grad(struct cdp_model *m, int i, uint64_t from);
/* 1 when the model's gradients are sharded (cdp_model_create_sharded, shards > 1). */
int cdp_model_grads_sharded(const struct cdp_model *m);

int cdp_model_unit_count(const struct cdp_model *m);
const struct cdp_unit *cdp_model_unit(const struct cdp_model *m, int i);
/* The parameters of the model's unit i (0 .. units - 1): CDP_UNIT_MAX_PARAMS
 * pointers in the order of its params (device memory; a tied one is its
 * owner's tensor, or the range's own copy). Not owned. */
float *const *cdp_model_unit_params(const struct cdp_model *m, int i);
int cdp_model_tensor_count(const struct cdp_model *m);
struct cdp_model_tensor *cdp_model_tensor(struct cdp_model *m, int i);

/* The model's copy of the tied parameter (the embedding the head reuses:
 * the parameter its units mark tied_unit / tie_target), or NULL when this
 * range holds none. The one lookup of it: nothing finds it by name. */
struct cdp_model_tensor *cdp_model_tied_tensor(struct cdp_model *m);

/* Device work on the model's buffers (model_ops.c), on its device's stream
 * (as the layers' kernels): bytes copied or zeroed, dst += src over n floats,
 * the sum of squares of n floats (which waits for the stream). */
cdp_status cdp_model_copy(struct cdp_model *m, void *dst, const void *src, size_t bytes);
cdp_status cdp_model_zero(struct cdp_model *m, void *dst, size_t bytes);
cdp_status cdp_model_add(struct cdp_model *m, float *dst, const float *src, size_t n);
cdp_status cdp_model_sum_squares(struct cdp_model *m, const float *x, size_t n, double *out);
int64_t cdp_model_param_floats(const struct cdp_model *m);
/* Matrix-multiply FLOPs of one forward + backward of one micro-batch: the
 * model's work, so with tensor groups a split unit's slice, and a replicated
 * unit only at index 0 (summed over a group, each unit counts once). */
double cdp_model_step_flops(const struct cdp_model *m);
/* The kernels of the model's device, which every pass runs on. Not owned. */
const struct cdp_kernels *cdp_model_kernels(const struct cdp_model *m);

/* Kernel failures where no status can be returned (cdp_model_zero_grad,
 * cdp_model_grad_sumsq, cdp_optimizer_step): record_error keeps the first one
 * (st with this thread's message; CDP_OK is ignored) and logs it; from then on
 * cdp_model_error, and every cdp_model_forward, cdp_model_loss and
 * cdp_model_backward, return it with its message, since the weights or
 * gradients are no longer what they should be. */
void cdp_model_record_error(struct cdp_model *m, cdp_status st);
cdp_status cdp_model_error(const struct cdp_model *m);

/* Where the input of a slot's micro-batch goes: int32 tokens [B, T] or float
 * [B, input numel], in device memory. Not owned. */
void *cdp_model_input(struct cdp_model *m, int slot);
/* The output of the last unit for a slot (logits for a GPT head). Not owned. */
float *cdp_model_output(struct cdp_model *m, int slot);

/* Forward of a slot's micro-batch through every unit. */
cdp_status cdp_model_forward(struct cdp_model *m, int slot);

/* For a model that ends with the model's last unit: the loss of the slot's
 * micro-batch against targets (host memory: int32 classes / next tokens, or
 * float values; copied to the device), summed over its rows into *loss_sum, and
 * the output gradient scaled by `scale` (1 / rows in the global batch) kept, per
 * slot, for cdp_model_backward (and split backward's B and W). */
cdp_status cdp_model_loss(struct cdp_model *m, int slot, const void *targets, float scale,
                          double *loss_sum);

/* Backward of a slot's micro-batch: dout is the gradient of this range's output
 * (NULL when the range holds the loss: the gradient from cdp_model_loss is
 * used); din receives (+=) the gradient of its input (NULL: not wanted). Both
 * are device memory. Parameter gradients accumulate until cdp_model_zero_grad.
 * Forward, loss and backward return a failing kernel's status with the unit in
 * the message. */
cdp_status cdp_model_backward(struct cdp_model *m, int slot, const float *dout, float *din);
void cdp_model_zero_grad(struct cdp_model *m);

/* Split backward (zero-bubble schedules; docs/training.md): cdp_model_backward
 * as B, the input gradient, then W, the parameter gradients, later, with the
 * combined backward's bits (the same kernels on the same values) when the
 * Ws run in the order the combined backwards would (float addition is not
 * associative: the order in which micro-batches add into a gradient shows).
 * Between its B and its W a micro-batch holds its activations (its slot:
 * schedules count it in flight from F to W), its input and targets, and a
 * W-state: copies of the output gradients of the units' products and norms
 * (the units' wstate_floats). Under recomputation W computes again what B did.
 *
 * set_split_backward allocates wslots W-states on the model's device (each
 * B x the range's wstate_floats summed; in the device's high-water mark and
 * in cdp_model_memory's wstate), freeing those there were; 0 frees them. */
cdp_status cdp_model_set_split_backward(struct cdp_model *m, int wslots);
int cdp_model_wstate_slots(const struct cdp_model *m);
/* B: as cdp_model_backward for din (dout likewise: NULL on the range holding
 * the loss), the activations of `slot`, filling W-state `wslot`; no
 * parameter gradient changes. CDP_ERR_INVALID for a slot or W-state slot out
 * of range, or none allocated, and for a dout given to a range ending with a
 * unit whose W takes the loss's gradient again (lm_head). */
cdp_status cdp_model_backward_input(struct cdp_model *m, int slot, int wslot, const float *dout, float *din);
/* W: accumulates that micro-batch's parameter gradients from W-state wslot
 * and the slot's activations, input (and, on the range holding the loss, its
 * targets and the loss's scale, whose gradient it computes again), which must
 * be unchanged since its B; calls the gradient reduce hook where
 * cdp_model_backward does (after each unit's, sharded gradients). After it
 * the slot and the W-state slot may be reused. */
cdp_status cdp_model_backward_weight(struct cdp_model *m, int slot, int wslot);

/* The device bytes the model holds, buffer by buffer (cdp_model_bytes_of's
 * figures, and the W-state that split backward adds). */
void cdp_model_memory(const struct cdp_model *m, struct cdp_model_bytes *out);

/* Weights: write every tensor (named as above) to a safetensors file,
 * atomically; read them back from one written by cdphybrid, or from a GPT-2
 * checkpoint in the Hugging Face layout (model/hf_gpt2.h: wte, wpe, h.N.*,
 * Conv1D weights stored in x out; with or without "transformer."; a tied head
 * stored once as wte.weight or as lm_head.weight), detected by its names.
 * Missing or mis-shaped tensors are errors naming the file and the tensor.
 * Learned positions (wpe) with more rows than the model's context load their
 * first rows (said at info level); fewer is an error naming the context key.
 * A range loads its own tensors and ignores the rest of the file: what the
 * whole model does not use is cdp_model_check_weights' business. */
cdp_status cdp_model_save(struct cdp_model *m, const char *path, const char *const *meta, int n_meta);
cdp_status cdp_model_load(struct cdp_model *m, const char *path);

/* Before a run loads `path` into the model desc describes: every tensor in
 * the file must be one the whole model loads (the causal-mask buffers some
 * Hugging Face files carry, h.N.attn.bias, excepted). Others are an error
 * (CDP_ERR_INVALID) naming the first few and how many, and the plan key that
 * would use them (/model/layers for blocks beyond the plan's, /model/tie_embeddings
 * for an untied lm_head.weight that a tied plan would drop); with
 * desc->unused_tensors CDP_UNUSED_WARN the same words are a warning. A head
 * stored beside the embedding with the same bytes is a tied head, used. */
cdp_status cdp_model_check_weights(const struct cdp_model_desc *desc, const char *path);

#ifdef __cplusplus
}
#endif

#endif
