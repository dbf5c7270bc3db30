/* AdamW and SGD over the tensors of a model, through the kernel table of the
 * model's device. */
#include "model/optim.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/ops.h"

struct cdp_optimizer {
    struct cdp_optimizer_desc d;
    cdp_buffer_t state; /* AdamW: m then v; SGD: velocity; laid out like the parameters */
    float *s1, *s2;
    float *params_base;
    uint64_t off, len; /* the parameters it steps: [off, off + len) of the model's buffer */
    int t;
};

/* The state lives on the model's device (dev), so the model's kernels clear it. */
static cdp_status zero_state(const struct cdp_kernels *k, float *p, size_t bytes)
{
    CDP_KERNEL(k, zero, p, bytes);
    return CDP_OK;
}

uint64_t cdp_optimizer_state_bytes(const struct cdp_optimizer_desc *desc, int64_t param_floats)
{
    return (uint64_t)(desc->type == CDP_OPT_ADAMW ? 2 : 1) * (uint64_t)param_floats * 4;
}

cdp_status cdp_optimizer_create(const struct cdp_optimizer_desc *desc, struct cdp_model *m,
                                cdp_device_t dev, struct cdp_optimizer **out)
{
    return cdp_optimizer_create_shard(desc, m, dev, 0, (uint64_t)cdp_model_param_floats(m), out);
}

void cdp_optimizer_shard(const struct cdp_optimizer *o, uint64_t *off, uint64_t *len)
{
    *off = o->off;
    *len = o->len;
}

cdp_status cdp_optimizer_create_shard(const struct cdp_optimizer_desc *desc, struct cdp_model *m, cdp_device_t dev,
                                      uint64_t off, uint64_t len, struct cdp_optimizer **out)
{
    CDP_ASSERT(off + len <= (uint64_t)cdp_model_param_floats(m));
    struct cdp_optimizer *o = calloc(1, sizeof *o);
    if (!o) return cdp_fail(CDP_ERR_NOMEM, "out of memory for the optimizer");
    o->d = *desc;
    o->off = off;
    o->len = len;
    int64_t n = (int64_t)len;
    const int copies = desc->type == CDP_OPT_ADAMW ? 2 : 1;
    cdp_status st = cdp_buffer_create(dev, cdp_optimizer_state_bytes(desc, n), &o->state);
    if (st) {
        free(o);
        return cdp_error_context(st, "optimizer state (%s)", desc->type == CDP_OPT_ADAMW ? "adamw" : "sgd");
    }
    o->s1 = cdp_buffer_data(o->state);
    o->s2 = copies == 2 ? o->s1 + n : NULL;
    if (n && (st = zero_state(cdp_model_kernels(m), o->s1, (size_t)(copies * n) * 4))) {
        cdp_optimizer_destroy(o);
        return cdp_error_context(st, "optimizer state (%s)", desc->type == CDP_OPT_ADAMW ? "adamw" : "sgd");
    }
    o->params_base = cdp_model_tensor_count(m) ? cdp_model_tensor(m, 0)->data : NULL;
    *out = o;
    return CDP_OK;
}

void cdp_optimizer_destroy(struct cdp_optimizer *o)
{
    if (!o) return;
    cdp_buffer_destroy(o->state);
    free(o);
}

int cdp_optimizer_steps(const struct cdp_optimizer *o) { return o->t; }
void cdp_optimizer_set_steps(struct cdp_optimizer *o, int steps) { o->t = steps; }
enum cdp_optimizer_type cdp_optimizer_type_of(const struct cdp_optimizer *o) { return o->d.type; }
cdp_device_t cdp_optimizer_device(const struct cdp_optimizer *o) { return cdp_buffer_device(o->state); }

void cdp_optimizer_state(struct cdp_optimizer *o, struct cdp_model *m, int i, float **a, float **b)
{
    struct cdp_model_tensor *t = cdp_model_tensor(m, i);
    CDP_ASSERT(o->off == 0 && o->len == (uint64_t)cdp_model_param_floats(m)); /* a whole-model optimizer */
    size_t off = (size_t)(t->data - o->params_base);
    *a = o->s1 + off;
    *b = o->s2 ? o->s2 + off : NULL;
}

void cdp_optimizer_state_range(struct cdp_optimizer *o, struct cdp_model *m, int i, float **a, float **b,
                               uint64_t *from, uint64_t *count)
{
    struct cdp_model_tensor *t = cdp_model_tensor(m, i);
    const uint64_t lo = o->off, hi = o->off + o->len, s = (uint64_t)(t->data - o->params_base),
                   e = s + (uint64_t)t->numel;
    const uint64_t x = s > lo ? s : lo, y = e < hi ? e : hi;
    *a = *b = NULL;
    *from = 0;
    *count = 0;
    if (x >= y) return;
    *from = x - s;
    *count = y - x;
    *a = o->s1 + (x - lo);
    *b = o->s2 ? o->s2 + (x - lo) : NULL;
}

static cdp_status grad_sumsq(struct cdp_model *m, double *out)
{
    const struct cdp_kernels *k = cdp_model_kernels(m);
    double s = 0;
    for (int i = 0; i < cdp_model_tensor_count(m); i++) {
        const struct cdp_model_tensor *t = cdp_model_tensor(m, i);
        double x;
        CDP_KERNEL(k, sum_squares, t->grad, (size_t)t->numel, &x);
        s += x;
    }
    *out = s;
    return CDP_OK;
}

float cdp_grad_clip_scale(double norm, double max_norm)
{
    if (!(max_norm > 0)) return 1.0f;
    double coef = max_norm / (norm + CDP_GRAD_CLIP_EPS);
    return coef < 1.0 ? (float)coef : 1.0f; /* NaN: 1; the caller refuses the norm */
}

double cdp_model_grad_sumsq(struct cdp_model *m)
{
    double s = 0;
    if (cdp_model_error(m)) return NAN;
    cdp_status st = grad_sumsq(m, &s);
    if (!st) return s;
    cdp_model_record_error(m, cdp_error_context(st, "the gradient norm"));
    return NAN;
}

/* Each tensor's part within the shard, elementwise: the same updates as the
 * whole tensor's, element by element. */
static cdp_status step(struct cdp_optimizer *o, struct cdp_model *m, float lr, float grad_scale)
{
    const struct cdp_kernels *k = cdp_model_kernels(m);
    for (int i = 0; i < cdp_model_tensor_count(m); i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(m, i);
        float *s1, *s2;
        uint64_t from, count;
        cdp_optimizer_state_range(o, m, i, &s1, &s2, &from, &count);
        if (!count) continue;
        const size_t n = (size_t)count;
        float wd = cdp_optimizer_decays(&o->d, t->group) ? (float)o->d.weight_decay : 0.0f;
        float *g = cdp_model_reduced_grad(m, i, from);
        if (grad_scale != 1.0f) CDP_KERNEL(k, scale, g, n, grad_scale);
        if (o->d.type == CDP_OPT_ADAMW)
            CDP_KERNEL(k, adamw_step, t->data + from, g, s1, s2, n, lr, (float)o->d.beta1, (float)o->d.beta2,
                       (float)o->d.eps, wd, o->t);
        else
            CDP_KERNEL(k, sgd_step, t->data + from, g, s1, n, lr, (float)o->d.momentum, wd, o->t);
    }
    return CDP_OK;
}

int cdp_optimizer_decays(const struct cdp_optimizer_desc *d, enum cdp_param_group g)
{
    return d->weight_decay > 0 && !(d->no_decay & CDP_PARAM_GROUP_BIT(g));
}

/* Steps are 1-based: step s runs with cdp_lr_at(t, s); the warmup's last step
 * and every decay's last step (train.steps) land exactly on lr and min_lr. */
double cdp_lr_at(const struct cdp_train_desc *t, int64_t step)
{
    const struct cdp_lr_schedule_desc *s = &t->lr_schedule;
    const double lr = t->optimizer.lr, lo = s->min_lr;
    const int64_t n = t->steps, w = s->warmup_steps;
    if (step <= w) return lr * (double)step / (double)w;
    switch (s->type) {
    case CDP_LR_CONSTANT:
        return lr;
    case CDP_LR_COSINE: {
        const double x = (double)(step - w) / (double)(n - w);
        return x >= 1 ? lo : lo + 0.5 * (lr - lo) * (1.0 + cos(M_PI * x));
    }
    case CDP_LR_LINEAR: {
        const double x = (double)(step - w) / (double)(n - w);
        return x >= 1 ? lo : lr + (lo - lr) * x;
    }
    case CDP_LR_WSD: {
        const int64_t d0 = n - s->decay_steps; /* the last stable step */
        if (step <= d0) return lr;
        const double x = (double)(step - d0) / (double)s->decay_steps;
        return x >= 1 ? lo : lr + (lo - lr) * x;
    }
    case CDP_LR_SCHEDULE_COUNT:
        break;
    }
    CDP_ASSERT(!"an lr schedule type");
    return lr;
}

void cdp_optimizer_step(struct cdp_optimizer *o, struct cdp_model *m, float lr, float grad_scale)
{
    o->t++;
    if (cdp_model_error(m)) return; /* the weights are already undefined */
    cdp_status st = step(o, m, lr, grad_scale);
    if (st) cdp_model_record_error(m, cdp_error_context(st, "optimizer step %d", o->t));
}
