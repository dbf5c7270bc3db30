/* Optimizers over a model's tensors: AdamW (decoupled weight decay) and SGD with
 * momentum, with the same semantics as torch.optim; weight decay applies to
 * the parameter groups the plan decays (cdp_optimizer_desc.no_decay: by
 * default matrices only, not embeddings, biases or norms). The learning-rate
 * schedule (cdp_lr_at). State lives in buffers of the model's device. */
#ifndef CDP_MODEL_OPTIM_H
#define CDP_MODEL_OPTIM_H

#include "cdp/device.h"
#include "cdp/plan_types.h"
#include "cdp/status.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_optimizer;

/* Device bytes of the state cdp_optimizer_create allocates for param_floats
 * parameters: AdamW two fp32 moments, SGD one velocity (kept even without
 * momentum). The planner's memory prediction reads this. */
uint64_t cdp_optimizer_state_bytes(const struct cdp_optimizer_desc *desc, int64_t param_floats);

cdp_status cdp_optimizer_create(const struct cdp_optimizer_desc *desc, struct cdp_model *m,
                                cdp_device_t dev, struct cdp_optimizer **out);
/* An optimizer of the floats [off, off + len) of the model's parameter buffer
 * only (ZeRO-1: one replica's shard, cdp_shard): it keeps their state and
 * steps them, each element exactly as the whole model's optimizer would. */
cdp_status cdp_optimizer_create_shard(const struct cdp_optimizer_desc *desc, struct cdp_model *m, cdp_device_t dev,
                                      uint64_t off, uint64_t len, struct cdp_optimizer **out);
/* Its shard: [*off, *off + *len) of the parameters (the whole for cdp_optimizer_create). */
void cdp_optimizer_shard(const struct cdp_optimizer *o, uint64_t *off, uint64_t *len);
void cdp_optimizer_destroy(struct cdp_optimizer *o);

/* Sum of squares of the model's gradients (each stored tensor once), for a
 * model with whole gradients (not cdp_model_create_sharded's). NAN when a
 * kernel fails or failed before (see cdp_model_record_error). */
double cdp_model_grad_sumsq(struct cdp_model *m);

/* The factor global-norm clipping multiplies the gradients by, as
 * torch.nn.utils.clip_grad_norm_ computes it: min(1, max_norm / (norm + 1e-6)).
 * 1 when clipping is off (max_norm <= 0) or the norm is not a number. */
#define CDP_GRAD_CLIP_EPS 1e-6
float cdp_grad_clip_scale(double norm, double max_norm);

/* One update of every tensor of m (of its shard): gradients are first
 * multiplied by grad_scale (1, or the clipping factor), then the optimizer
 * steps with learning rate lr. A kernel failure is recorded in the model
 * (cdp_model_record_error) and returned by its next pass. */
void cdp_optimizer_step(struct cdp_optimizer *o, struct cdp_model *m, float lr, float grad_scale);

/* Whether tensors of group g are decayed under d: weight_decay > 0 and g not
 * in d->no_decay. */
int cdp_optimizer_decays(const struct cdp_optimizer_desc *d, enum cdp_param_group g);

/* The learning rate of step `step` (1-based, 1 .. t->steps) under
 * t->lr_schedule and t->optimizer.lr (the peak): a function of the step alone,
 * so a resumed run continues the schedule exactly. The plan loader has
 * checked the schedule against t->steps. */
double cdp_lr_at(const struct cdp_train_desc *t, int64_t step);

/* Steps taken so far; set when resuming from a checkpoint. */
int cdp_optimizer_steps(const struct cdp_optimizer *o);
void cdp_optimizer_set_steps(struct cdp_optimizer *o, int steps);

/* The optimizer's type, and its state for tensor i of the model it was made for
 * (laid out like the tensor, in device memory; a whole-model optimizer only): AdamW: first and second
 * moments; SGD: the velocity in *a and NULL in *b. Not owned. These are device
 * pointers (only computed here, never dereferenced): where the device is not
 * host visible, copy through cdp_device_read / cdp_device_write on
 * cdp_optimizer_device. */
enum cdp_optimizer_type cdp_optimizer_type_of(const struct cdp_optimizer *o);
void cdp_optimizer_state(struct cdp_optimizer *o, struct cdp_model *m, int i, float **a, float **b);
/* The part of tensor i's state this optimizer holds (all of it, or under
 * ZeRO-1 what its shard covers): elements [*from, *from + *count) of the
 * tensor, whose state starts at *a and *b (device pointers, as above; NULL
 * when count is 0, and *b NULL for SGD). */
void cdp_optimizer_state_range(struct cdp_optimizer *o, struct cdp_model *m, int i, float **a, float **b,
                               uint64_t *from, uint64_t *count);
/* The device the state lives on: the one given to cdp_optimizer_create, which
 * is the model's (its kernels update the state and the parameters together). */
cdp_device_t cdp_optimizer_device(const struct cdp_optimizer *o);

#ifdef __cplusplus
}
#endif

#endif
