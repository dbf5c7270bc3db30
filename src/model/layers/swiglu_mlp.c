/* swiglu_mlp: Llama's MLP over [.., C]: down(silu(gate(x)) * up(x)), three
 * projections without biases. Keys: hidden (the width; default Llama's rule
 * on C with multiple_of 256). Kept: the output, the gate and up projections;
 * the tail (selective recomputation drops it): the SwiGLU product. Split
 * over a tensor group of t (docs/parallelism.md): gate and up column-parallel
 * (rank k holds rows [k H/t, (k+1) H/t)), down row-parallel; one all-reduce
 * of the output forward, one of the input gradient backward (B's under split
 * backward: the rank's part made in scratch, summed there, added into din). */
#include "model/layers/common.h"

static const char *const keys[] = {"hidden", NULL};

static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    (void)who;
    L->hidden = 0; /* 0: Llama's rule on the input width */
    return cdp_json_get_int(in, v, ptr, "hidden", 1, CDP_PLAN_MAX_COUNT, 0, &L->hidden);
}

static int64_t hidden_of(const struct cdp_layer_desc *L, int64_t C)
{
    return L->hidden > 0 ? L->hidden : cdp_llama_hidden(C, 256, 0);
}

/* the width splits */
static int tensor_check(const struct cdp_layer_desc *L, const struct cdp_shape *in, int t, const char **key,
                        int64_t *value)
{
    *value = hidden_of(L, cdp_shape_last(in));
    *key = "hidden";
    return *value % t ? -1 : 0;
}

static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    if (hidden_of(L, cdp_shape_last(in)) < 0) {
        snprintf(why, cap, "swiglu_mlp's width overflows");
        return -1;
    }
    *out = *in;
    return 0;
}

static int64_t params(const struct cdp_layer_desc *L, const struct cdp_shape *in)
{
    const int64_t C = cdp_shape_last(in);
    return cdp_mul_add(cdp_mul_add(C, hidden_of(L, C), 0), 3, 0);
}

static int emit(const struct cdp_layer_desc *L, json_t *o)
{
    return L->hidden > 0 ? json_object_set_new(o, "hidden", CDP_JINT(L->hidden)) : 0;
}

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap)
{
    if (L->hidden > 0) snprintf(buf, cap, " hidden %lld", (long long)L->hidden);
    else snprintf(buf, cap, " hidden by Llama's rule");
}

static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    (void)m;
    const int64_t C = cdp_shape_last(&u->in), H = hidden_of(&u->desc, C);
    u->desc.hidden = H;
    cdp_unit_add_linear_params(u, "gate_proj", H, C, 0, 0, 0.0f);
    cdp_unit_add_linear_params(u, "up_proj", H, C, 0, 0, 0.0f);
    cdp_unit_add_linear_params(u, "down_proj", C, H, 0, 0, 0.0f);
    if (!cdp_unit_tensor_split(u)) return;
    cdp_param_shard(u, 0, 0, u->tp_size, u->tp_index);
    cdp_param_shard(u, 1, 0, u->tp_size, u->tp_index);
    cdp_param_shard(u, 2, 1, u->tp_size, u->tp_index);
}

/* The rank's slice of the width */
static int64_t width_of(const struct cdp_unit *u)
{
    return u->desc.hidden / (cdp_unit_tensor_split(u) ? u->tp_size : 1);
}

static void cost(struct cdp_unit *u)
{
    const int64_t R = cdp_shape_rows(&u->in), C = cdp_shape_last(&u->in), H = width_of(u);
    u->fwd_flops = 6.0 * R * C * H;
    u->bwd_flops = 12.0 * R * C * H;
    u->act_floats = R * (C + 3 * H);
    /* W: the three projections' dw from their output gradients (dout, dgate, dup) */
    u->bwd_weight_flops = 6.0 * R * C * H;
    u->wstate_floats = R * (C + 2 * H);
    u->tail_floats = R * H;
    u->tail_flops = 0;
}

/* the gradients of the product, the gate and the up projection, and split
 * over a group the rank's part of the input gradient [N, C] (input_grad's) */
static int64_t scratch(const struct cdp_unit *u, int B)
{
    const int64_t N = (int64_t)B * cdp_shape_rows(&u->in);
    return N * 3 * width_of(u) + (cdp_unit_tensor_split(u) ? N * cdp_shape_last(&u->in) : 0);
}

struct dims {
    int N, C, H;
};

static struct dims dims_of(const struct cdp_unit *u, int B)
{
    return (struct dims){(int)(B * cdp_shape_rows(&u->in)), (int)cdp_shape_last(&u->in), (int)width_of(u)};
}

/* kept: out, gate, up; tail: the product */
static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch_, int B)
{
    (void)scratch_;
    const struct dims d = dims_of(u, B);
    float *gate = act + (size_t)d.N * d.C, *up = gate + (size_t)d.N * d.H;
    K(linear_fwd, gate, (const float *)in, p[0], NULL, d.N, d.C, d.H);
    K(linear_fwd, up, (const float *)in, p[1], NULL, d.N, d.C, d.H);
    K(swiglu_fwd, tail, gate, up, (size_t)d.N * d.H);
    K(linear_fwd, act, tail, p[2], NULL, d.N, d.H, d.C);
    return cdp_unit_tensor_sum(u, act, (int64_t)d.N * d.C);
}

static cdp_status recompute(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                            float *act, float *tail, float *scratch_, int B)
{
    (void)p, (void)in, (void)scratch_;
    const struct dims d = dims_of(u, B);
    const float *gate = act + (size_t)d.N * d.C, *up = gate + (size_t)d.N * d.H;
    K(swiglu_fwd, tail, gate, up, (size_t)d.N * d.H);
    return CDP_OK;
}

/* din += the gate and up projections' input gradients, their dw into gw[0]
 * and gw[1] (gw NULL: not). Split over a group, the sum is the rank's slice
 * of the width's part: made in part (scratch, zeroed), summed over the group
 * there, then added, so that din keeps what it held (it receives +=, model.h). */
static cdp_status input_grad(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                             float *const *gw, const void *in, const float *dgate, const float *dup, float *din,
                             float *part, const struct dims *d)
{
    const int split = din && cdp_unit_tensor_split(u);
    float *to = split ? part : din;
    if (split) K(zero, part, (size_t)d->N * d->C * sizeof *part);
    K(linear_bwd, to, gw ? gw[0] : NULL, NULL, dgate, (const float *)in, p[0], d->N, d->C, d->H);
    K(linear_bwd, to, gw ? gw[1] : NULL, NULL, dup, (const float *)in, p[1], d->N, d->C, d->H);
    return split ? cdp_unit_tensor_add_sum(k, u, part, din, (int64_t)d->N * d->C) : CDP_OK;
}

/* The W-state: the output gradients of down, gate and up. */
static void mlp_wstate(float *ws, const struct dims *d, float **dout, float **dgate, float **dup)
{
    *dout = ws;
    *dgate = ws + (size_t)d->N * d->C;
    *dup = *dgate + (size_t)d->N * d->H;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch_, int B)
{
    const struct dims d = dims_of(u, B);
    const size_t NH_ = (size_t)d.N * d.H;
    const float *gate = act + (size_t)d.N * d.C, *up = gate + NH_;
    float *dh = scratch_, *dgate = dh + NH_, *dup = dgate + NH_;
    K(zero, dh, 3 * NH_ * sizeof *dh);
    K(linear_bwd, dh, g[2], NULL, dout, tail, p[2], d.N, d.H, d.C);
    K(swiglu_bwd, dgate, dup, dh, gate, up, NH_);
    return input_grad(k, u, p, g, in, dgate, dup, din, dup + NH_, &d);
}

/* B: backward's input-gradient calls, the weight outputs NULL, with the
 * projections' output gradients in the W-state */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch_, int B)
{
    const struct dims d = dims_of(u, B);
    const size_t NH_ = (size_t)d.N * d.H;
    const float *gate = act + (size_t)d.N * d.C, *up = gate + NH_;
    float *dh = scratch_, *wdout, *dgate, *dup;
    mlp_wstate(ws, &d, &wdout, &dgate, &dup);
    K(copy, wdout, dout, (size_t)d.N * d.C * sizeof *wdout);
    K(zero, dh, NH_ * sizeof *dh);
    K(linear_bwd, dh, NULL, NULL, dout, tail, p[2], d.N, d.H, d.C);
    K(zero, dgate, 2 * NH_ * sizeof *dgate); /* dgate and dup */
    K(swiglu_bwd, dgate, dup, dh, gate, up, NH_);
    /* dgate and dup in the W-state; the part where backward has it, after three [N, H] */
    return din ? input_grad(k, u, p, NULL, in, dgate, dup, din, scratch_ + 3 * NH_, &d) : CDP_OK;
}

/* W: the three projections' dw, din NULL */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch_, int B)
{
    (void)act, (void)dout, (void)scratch_;
    const struct dims d = dims_of(u, B);
    float *wdout, *dgate, *dup;
    mlp_wstate((float *)ws, &d, &wdout, &dgate, &dup);
    K(linear_bwd, NULL, g[2], NULL, wdout, tail, p[2], d.N, d.H, d.C);
    K(linear_bwd, NULL, g[0], NULL, dgate, (const float *)in, p[0], d.N, d.C, d.H);
    K(linear_bwd, NULL, g[1], NULL, dup, (const float *)in, p[1], d.N, d.C, d.H);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_swiglu_mlp = {
    .type = CDP_LAYER_SWIGLU_MLP,
    .name = "swiglu_mlp",
    .listable = 1,
    .tensor_ok = 1,
    .tensor_splits = 1,
    .tensor_check = tensor_check,
    .keys = keys,
    .parse = parse,
    .shape = shape,
    .params = params,
    .emit = emit,
    .describe = describe,
    .build = build,
    .cost = cost,
    .scratch = scratch,
    .forward = forward,
    .backward = backward,
    .backward_input = backward_input,
    .backward_weight = backward_weight,
    .recompute = recompute,
};
