/* linear: y = x W^T + b over the last dimension. Keys: out (required), bias,
 * split. Split over a tensor group of t (docs/parallelism.md, Megatron-LM's
 * column- and row-parallel linear layers): "column": rank k holds rows
 * [k out/t, (k+1) out/t) of W and of b and computes that slice of y; its
 * input gradient is a partial sum, made in scratch, all-reduced over the
 * group there and added into din. "row": rank k
 * holds the matching columns of W (its input is the slice a column split
 * made) and the whole b; y is the group's sum of the partial products, with b
 * added once; its backward needs no collective. */
#include "model/layers/common.h"

static const char *const keys[] = {"out", "bias", "split", NULL};
static const char *const split_names[] = {"none", "column", "row", NULL};
CDP_TABLE_CHECK(split_names, CDP_TSPLIT_COUNT + 1);

static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    cdp_status st = cdp_layer_get_required_int(in, v, ptr, "out", 1, who, &L->out);
    if (!st) st = cdp_json_get_bool(in, v, ptr, "bias", &L->bias);
    int split = CDP_TSPLIT_NONE;
    if (!st) st = cdp_json_get_enum(in, v, ptr, "split", split_names, &split);
    L->split = (enum cdp_tensor_split)split;
    return st;
}

/* The unit's output width (a column split's slice) and input width (a row split's). */
static int64_t out_of(const struct cdp_unit *u) { return cdp_shape_last(&u->out); }
static int64_t in_of(const struct cdp_unit *u) { return cdp_shape_last(&u->in); }


static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    (void)why, (void)cap;
    *out = *in;
    out->d[out->ndim - 1] = L->out;
    return 0;
}

static int64_t params(const struct cdp_layer_desc *L, const struct cdp_shape *in)
{
    return cdp_mul_add(cdp_shape_last(in), L->out, L->bias ? L->out : 0);
}

static int emit(const struct cdp_layer_desc *L, json_t *o)
{
    return json_object_set_new(o, "out", CDP_JINT(L->out)) | json_object_set_new(o, "bias", json_boolean(L->bias)) |
           (L->split ? json_object_set_new(o, "split", json_string(split_names[L->split])) : 0);
}

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap)
{
    snprintf(buf, cap, " out %lld%s%s%s", (long long)L->out, L->bias ? "" : ", no bias", L->split ? ", split " : "",
             L->split ? split_names[L->split] : "");
}

/* The whole W and b as one rank has them (so each slice is initialised as
 * that rank's part of the same values), then this rank's slice. */
static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    (void)m;
    const int t = u->tp_size > 1 ? u->tp_size : 1, split = t > 1 ? u->desc.split : CDP_TSPLIT_NONE;
    const int64_t in = cdp_shape_last(&u->in) * (split == CDP_TSPLIT_ROW ? t : 1);
    cdp_unit_add_linear_params(u, "", u->desc.out, in, u->desc.bias, 0, 0.0f);
    if (split == CDP_TSPLIT_COLUMN) {
        cdp_param_shard(u, 0, 0, t, u->tp_index);
        if (u->desc.bias) cdp_param_shard(u, 1, 0, t, u->tp_index);
    } else if (split == CDP_TSPLIT_ROW) {
        cdp_param_shard(u, 0, 1, t, u->tp_index);
    }
}

static void cost(struct cdp_unit *u)
{
    const double rows = (double)cdp_shape_rows(&u->in), last = (double)in_of(u), out = (double)out_of(u);
    u->fwd_flops = 2.0 * rows * last * out;
    u->bwd_flops = 4.0 * rows * last * out;
    u->act_floats = u->out_floats;
    /* W: dw += dout^T . in (and db) from a copy of the output gradient */
    u->bwd_weight_flops = 2.0 * rows * last * out;
    u->wstate_floats = u->out_floats;
}

static int row_split(const struct cdp_unit *u) { return u->tp_size > 1 && u->desc.split == CDP_TSPLIT_ROW; }
static int column_split(const struct cdp_unit *u) { return u->tp_size > 1 && u->desc.split == CDP_TSPLIT_COLUMN; }

/* a column split's part of the input gradient [N, in] (input_grad); else none */
static int64_t scratch(const struct cdp_unit *u, int B)
{
    return column_split(u) ? (int64_t)B * cdp_shape_rows(&u->in) * in_of(u) : 0;
}

/* din += dout's product with W (linear_bwd's input gradient), and the weight
 * gradients where gw is not NULL. Column split: the product is the rank's
 * slice's part of the sum, made in part (scratch, zeroed), summed over the
 * group there, then added, so that din keeps what it held (model.h). */
static cdp_status input_grad(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, float *gw,
                             float *gb, const float *dout, const void *in, float *din, float *part, int N)
{
    if (!din || !column_split(u)) {
        K(linear_bwd, din, gw, gb, dout, (const float *)in, p[0], N, (int)in_of(u), (int)out_of(u));
        return CDP_OK;
    }
    K(zero, part, (size_t)N * in_of(u) * sizeof *part);
    K(linear_bwd, part, gw, gb, dout, (const float *)in, p[0], N, (int)in_of(u), (int)out_of(u));
    return cdp_unit_tensor_add_sum(k, u, part, din, (int64_t)N * in_of(u));
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch_, int B)
{
    (void)tail;
    (void)scratch_;
    const int64_t N = B * cdp_shape_rows(&u->in);
    /* row split: the group's sum of partial products, the bias added once (by index 0) */
    const float *bias = u->desc.bias && (!row_split(u) || u->tp_index == 0) ? p[1] : NULL;
    K(linear_fwd, act, (const float *)in, p[0], bias, (int)N, (int)in_of(u), (int)out_of(u));
    return row_split(u) ? cdp_unit_tensor_sum(u, act, N * out_of(u)) : CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch_, int B)
{
    (void)tail, (void)act;
    return input_grad(k, u, p, g[0], u->desc.bias ? g[1] : NULL, dout, in, din, scratch_,
                      (int)(B * cdp_shape_rows(&u->in)));
}

/* B: din with the weight outputs NULL; the output gradient kept for W */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch_, int B)
{
    (void)act, (void)tail;
    const int N = (int)(B * cdp_shape_rows(&u->in));
    K(copy, ws, dout, (size_t)N * out_of(u) * sizeof *ws);
    if (!din) return CDP_OK;
    /* the group's collective is B's, W has none */
    return input_grad(k, u, p, NULL, NULL, dout, in, din, scratch_, N);
}

/* W: dw and db with din NULL, from that copy */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch_, int B)
{
    (void)act, (void)tail, (void)dout, (void)scratch_;
    K(linear_bwd, NULL, g[0], u->desc.bias ? g[1] : NULL, ws, (const float *)in, p[0],
      (int)(B * cdp_shape_rows(&u->in)), (int)in_of(u), (int)out_of(u));
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_linear = {
    .type = CDP_LAYER_LINEAR,
    .name = "linear",
    .listable = 1,
    .tensor_ok = 1,
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
};
