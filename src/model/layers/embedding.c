/* embedding: token ids [T] -> [T, dim] rows of a table, plus learned
 * positions when context > 0. Keys: vocab, dim (required), context.
 * Vocab-parallel over a tensor group of t (docs/parallelism.md, Megatron-LM's
 * VocabParallelEmbedding): rank k holds rows [k Vp/t, (k+1) Vp/t) of the
 * token table, Vp the vocabulary padded up to a multiple of t (the padding
 * rows only in memory); a token outside the slice gives 0, and one
 * all-reduce over the group sums the rows (the positions, replicated, added
 * by index 0). Backward: each rank scatters into its own rows, no
 * collective. Sequence parallel (cdp_unit_set_sequence_parallel): the
 * output is the rank's sequence shard, [T/t, dim], and the all-reduce a
 * reduce-scatter of the whole partial sum; backward gathers the output
 * gradient whole first (in B under split backward, so W has no collective). */
#include "cdp/core.h"
#include "model/layers/common.h"

static const char *const keys[] = {"vocab", "dim", "context", NULL};

static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    cdp_status st;
    if ((st = cdp_layer_get_required_int(in, v, ptr, "vocab", 1, who, &L->vocab))) return st;
    if ((st = cdp_layer_get_required_int(in, v, ptr, "dim", 1, who, &L->dim))) return st;
    return cdp_json_get_int(in, v, ptr, "context", 0, CDP_PLAN_MAX_CONTEXT, 0, &L->context);
}

static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    char sh[96];
    cdp_shape_format(in, sh, sizeof sh);
    if (in->ndim != 1) {
        snprintf(why, cap, "an embedding takes token ids, a [T] input, but gets %s", sh);
        return -1;
    }
    if (L->context > 0 && in->d[0] > L->context) {
        snprintf(why, cap, "the input has %lld tokens, more than this embedding's context %lld",
                 (long long)in->d[0], (long long)L->context);
        return -1;
    }
    *out = (struct cdp_shape){2, {in->d[0], L->dim}};
    return 0;
}

static int64_t params(const struct cdp_layer_desc *L, const struct cdp_shape *in)
{
    (void)in;
    return cdp_mul_add(L->vocab + L->context, L->dim, 0);
}

static int emit(const struct cdp_layer_desc *L, json_t *o)
{
    return json_object_set_new(o, "vocab", CDP_JINT(L->vocab)) | json_object_set_new(o, "dim", CDP_JINT(L->dim)) |
           json_object_set_new(o, "context", CDP_JINT(L->context));
}

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap)
{
    snprintf(buf, cap, " vocab %lld, dim %lld, context %lld", (long long)L->vocab, (long long)L->dim,
             (long long)L->context);
}

/* GPT-2 starts the token table at N(0, 0.02) and the positions at N(0, 0.01);
 * an explicit embedding starts both at N(0, 1), as torch.nn.Embedding. */
static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    const int gpt = m->kind == CDP_MODEL_GPT;
    const struct cdp_layer_desc *d = &u->desc;
    u->in_tokens = 1;
    cdp_unit_add_param(u, "wte", 2, d->vocab, d->dim, 0, 0, CDP_INIT_NORMAL, gpt ? 0.02f : 1.0f,
                       CDP_PARAM_EMBEDDING);
    if (u->tp_size > 1) cdp_param_shard(u, 0, 0, u->tp_size, u->tp_index);
    if (d->context > 0)
        cdp_unit_add_param(u, "wpe", 2, d->context, d->dim, 0, 0, CDP_INIT_NORMAL, gpt ? 0.01f : 1.0f,
                           CDP_PARAM_EMBEDDING);
}

static void cost(struct cdp_unit *u)
{
    u->act_floats = u->out_floats;
    /* no input gradient (tokens): its whole backward, a scatter-add (no products), is W's, from a copy of
     * the output gradient that B keeps */
    u->bwd_weight_flops = 0;
    u->wstate_floats = u->out_floats;
}

/* sequence parallel: the whole partial output and the moves' staging, B T dim each */
static int64_t scratch_floats(const struct cdp_unit *u, int B)
{
    return u->seq_parallel ? 2 * (int64_t)B * u->in.d[0] * u->out.d[1] : 0;
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch, int B)
{
    (void)tail;
    const float *wpe = u->n_params > 1 ? p[1] : NULL;
    if (u->tp_size > 1) { /* this rank's rows, the positions once (index 0), summed over the group */
        const struct cdp_param_desc *pd = &u->params[0];
        const int T = (int)u->in.d[0], C = (int)u->out.d[1];
        float *whole = u->seq_parallel ? scratch : act;
        K(embedding_vp_fwd, whole, (const int32_t *)in, p[0], u->tp_index == 0 ? wpe : NULL, B, T, C,
          (int)pd->shard_off, (int)cdp_param_slice_len(pd));
        if (u->seq_parallel) /* the sum's rows of this rank's shard */
            return cdp_unit_seq_scatter(k, u, whole, act, scratch + (int64_t)B * T * C, B, T, C);
        return cdp_unit_tensor_sum(u, act, (int64_t)B * u->out_floats);
    }
    K(embedding_fwd, act, (const int32_t *)in, p[0], wpe, B, (int)u->in.d[0], (int)u->out.d[1]);
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch, int B)
{
    (void)tail;
    (void)p, (void)act, (void)din;
    if (u->seq_parallel) { /* the output gradient whole first */
        const int T = (int)u->in.d[0], C = (int)u->out.d[1];
        cdp_status st = cdp_unit_seq_gather(k, u, dout, scratch, scratch + (int64_t)B * T * C, B, T, C);
        if (st) return st;
        dout = scratch;
    }
    if (u->tp_size > 1) { /* into this rank's rows only */
        const struct cdp_param_desc *pd = &u->params[0];
        K(embedding_vp_bwd, g[0], u->n_params > 1 ? g[1] : NULL, dout, (const int32_t *)in, B, (int)u->in.d[0],
          (int)u->out.d[1], (int)pd->shard_off, (int)cdp_param_slice_len(pd));
        return CDP_OK;
    }
    K(embedding_bwd, g[0], u->n_params > 1 ? g[1] : NULL, dout, (const int32_t *)in, B, (int)u->in.d[0],
      (int)u->out.d[1]);
    return CDP_OK;
}

/* B: no input gradient (tokens); the output gradient kept for W */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch, int B)
{
    (void)p, (void)in, (void)act, (void)tail, (void)din;
    if (u->seq_parallel) /* whole in the W-state (T dim a sample), so that W has no collective */
        return cdp_unit_seq_gather(k, u, dout, ws, scratch, B, u->in.d[0], u->out.d[1]);
    K(copy, ws, dout, (size_t)B * u->out_floats * sizeof *ws);
    return CDP_OK;
}

/* W: the whole backward, from that copy */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch, int B)
{
    (void)dout;
    if (u->seq_parallel) { /* ws holds the whole output gradient already */
        struct cdp_unit whole = *u;
        whole.seq_parallel = 0;
        return backward(k, &whole, p, g, in, act, tail, ws, NULL, scratch, B);
    }
    return backward(k, u, p, g, in, act, tail, ws, NULL, scratch, B);
}

/* Decoding: the token's row plus its position's (when learned), which the
 * context must not pass. */
static cdp_status decode_size(const struct cdp_unit *u, int64_t context, int64_t *cache, int64_t *row,
                              int64_t *logits)
{
    if (u->n_params > 1 && u->params[1].shape[0] < context)
        return cdp_fail(CDP_ERR_INVALID, "unit %d: %lld learned positions, fewer than the context %lld", u->index,
                        (long long)u->params[1].shape[0], (long long)context);
    *cache = *row = *logits = 0;
    return CDP_OK;
}

static cdp_status decode(const struct cdp_unit *u, float *const *p, const struct cdp_decode *d, float *cache)
{
    (void)cache;
    const int64_t C = d->C, V = u->params[0].shape[0];
    for (int64_t r = 0; r < d->n; r++) {
        const int32_t tok = d->tokens[r];
        if (tok < 0 || tok >= V)
            return cdp_fail(CDP_ERR_INVALID, "token %d is outside the vocabulary of %lld", tok, (long long)V);
        const float *e = p[0] + tok * C, *pe = u->n_params > 1 ? p[1] + (d->pos + r) * C : NULL;
        for (int64_t j = 0; j < C; j++) d->x[r * C + j] = e[j] + (pe ? pe[j] : 0.0f);
    }
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_embedding = {
    .type = CDP_LAYER_EMBEDDING,
    .name = "embedding",
    .listable = 1,
    .tensor_ok = 1,
    .tensor_splits = 1, /* vocab-parallel */
    .keys = keys,
    .parse = parse,
    .shape = shape,
    .params = params,
    .emit = emit,
    .describe = describe,
    .build = build,
    .cost = cost,
    .scratch = scratch_floats,
    .forward = forward,
    .backward = backward,
    .backward_input = backward_input,
    .backward_weight = backward_weight,
    .decode_size = decode_size,
    .decode = decode,
};
