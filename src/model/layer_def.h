/* A layer type's description: everything cdphybrid knows about one type, in
 * that type's own file under src/model/layers/ (cdp/layer_types.h lists them).
 * The plan loader reads a layer's keys and checks its shapes through it, the
 * plan writer emits it, the model builds, sizes and runs its units through it,
 * and the cost model counts its work through it; nothing else switches over
 * layer types. */
#ifndef CDP_MODEL_LAYER_DEF_H
#define CDP_MODEL_LAYER_DEF_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "cdp/plan_types.h"
#include "cdp/status.h"
#include "core/json_check.h"
#include "model/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a unit's decode hook works on (model/infer.c, the KV-cache decoder):
 * n new positions pos .. pos + n - 1 of one sequence, on the CPU, C the
 * width; the scratch holds as many rows as the decoder's context. */
struct cdp_decode {
    int64_t pos, n, C;
    int64_t context;       /* positions the caches hold (decode_size's) */
    const int32_t *tokens; /* the new tokens [n], for a unit that reads tokens */
    float *x;              /* the residual stream [n, C], read and written in place */
    float *logits;         /* for a unit that gives logits: those of the last new position [V] */
    /* scratch: [rows, C] ln and att, [rows, 3C] qkv, [rows, row] fc (row: decode_size's),
     * [rows] scores, mean and rstd */
    float *ln, *qkv, *att, *fc, *scores, *mean, *rstd;
};

struct cdp_layer_def {
    enum cdp_layer_type type;
    const char *name;        /* the plan's "type", and the unit's name in cost tables and messages */
    int listable;            /* may be written in an explicit "layers" list (lm_head: GPT presets only) */
    const char *const *keys; /* its plan keys besides "type", NULL-terminated */
    int keeps_attention;     /* keeps attention state, which a kernel table may size (cdp_unit_fit_kernels) */
    /* may be in a plan with /parallel/tensor above 1 (docs/parallelism.md): a
     * type that splits over the tensor group, or an elementwise one that
     * passes a split layer's slice through; 0: refused at plan load */
    int tensor_ok;
    /* its output is split by vocabulary over the tensor group, each rank
     * the logits of its slice (lm_head): a model ending with it takes the
     * vocab-parallel cross-entropy (cdp_unit_vocab_split) */
    int vocab_parallel;
    /* passes the slice of a column split linear on to a row split one
     * (elementwise: relu, gelu, silu); the other tensor_ok types without
     * tensor_splits run whole on every rank of the group (replicated) */
    int tensor_passes;
    /* splits itself over the tensor group when t is above 1 (a block: its
     * attention by heads, its MLP column then row): build() makes the rank's
     * slice, cost() counts the rank's work and memory, and its passes run
     * the group's all-reduces (cdp_unit_tensor_sum) */
    int tensor_splits;
    /* With tensor_splits: 0 when the type on input in splits over t ranks,
     * else -1 with *key its layer key whose *value is not a multiple of t
     * ("heads", "kv_heads", "hidden"). NULL: any t does. */
    int (*tensor_check)(const struct cdp_layer_desc *L, const struct cdp_shape *in, int t, const char **key,
                        int64_t *value);

    /* ---- the plan ---- */
    /* Reads its keys (already checked against keys) from the layer object v at
     * ptr into L, whose generic defaults are set (bias 1, causal 1); who names
     * the layer in messages ("a linear layer"). NULL: no keys. */
    cdp_status (*parse)(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L);
    /* The output shape of one sample for input shape in; 0, or -1 with why
     * ("kernel 5 is larger than the conv2d input [3, 4, 4] (with padding 0)").
     * NULL: the shape passes through. */
    int (*shape)(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap);
    /* Its trainable parameters for input shape in; -1 when they overflow 64
     * bits. NULL: none. */
    int64_t (*params)(const struct cdp_layer_desc *L, const struct cdp_shape *in);
    /* Writes its keys into a resolved plan's layer object o; nonzero when
     * jansson runs out of memory. NULL: no keys. */
    int (*emit)(const struct cdp_layer_desc *L, json_t *o);
    /* Its settings as the plan table shows them (" out 10, no bias"). NULL: none. */
    void (*describe)(const struct cdp_layer_desc *L, char *buf, size_t cap);

    /* ---- the unit ---- */
    /* Fills the parameters of u, whose desc, in and out are set; m is the
     * model (GPT presets initialise as GPT-2 does). NULL: no parameters. */
    void (*build)(struct cdp_unit *u, const struct cdp_model_desc *m);
    /* Work and memory per sample: fwd_flops, bwd_flops and its part
     * bwd_weight_flops, act_floats (output included), att_floats,
     * wstate_floats, and for a type with a recompute hook tail_floats and
     * tail_flops; out_floats is set. */
    void (*cost)(struct cdp_unit *u);
    /* Scratch floats for a micro-batch of B (forward and backward share
     * them). NULL: none. */
    int64_t (*scratch)(const struct cdp_unit *u, int B);
    /* As cdp_unit_forward and cdp_unit_backward (layers.h), with the unit's
     * kept activations at act and its tail at tail: the activations selective
     * recomputation drops (cost() sets tail_floats; attention state, where the
     * type keeps it, is at the tail's end). Without recomputation the tail
     * follows the kept ones in the same buffer. */
    cdp_status (*forward)(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch, int B);
    cdp_status (*backward)(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail, const float *dout,
                           float *din, float *scratch, int B);
    /* Split backward (cdp_unit_backward_input, cdp_unit_backward_weight):
     * backward as two calls whose gradients are its bits, the same kernels
     * on the same values (each parameter gradient one call of the combined
     * backward, with din NULL; each input-gradient call one of it with the
     * weight outputs NULL). backward_input: din as backward computes it, no
     * parameter gradient touched; it writes into ws (B x wstate_floats)
     * what backward_weight needs that nothing else keeps: copies of the
     * output gradients of the unit's products and norms (dout itself, and
     * the scratch and the caller's gradient buffers, are reused before W).
     * backward_weight: g += from ws, the kept activations, the tail and the
     * input, which must be as backward_input saw them; dout is the unit's
     * output gradient again for a type with weight_takes_dout, else NULL.
     * Both NULL: the type has no parameters, backward is its input gradient
     * and W has nothing to do. */
    cdp_status (*backward_input)(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch, int B);
    cdp_status (*backward_weight)(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch, int B);
    /* Its backward_weight takes the output gradient again rather than a copy
     * in the W-state: lm_head, whose logits' gradient (T x V a sample) the
     * model computes again from the kept logits and targets. */
    int weight_takes_dout;
    /* Selective recomputation: the tail again, from the input and the kept
     * activations (which it may write again with the values they have), as the
     * forward computed it. NULL: the type has no tail, and selective keeps all. */
    cdp_status (*recompute)(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                            float *act, float *tail, float *scratch, int B);

    /* ---- decoding with a KV cache (model/infer.c; `cdphybrid generate`) ---- */
    /* For a cache of `context` positions: the floats of the unit's cache (its
     * keys and values; 0: none) into *cache, the width of its widest scratch
     * row (an MLP's; 0: none) into *row, and the logits it gives (the
     * vocabulary; 0: it gives none) into *logits. CDP_ERR_INVALID naming the
     * unit when it cannot decode that context. */
    cdp_status (*decode_size)(const struct cdp_unit *u, int64_t context, int64_t *cache, int64_t *row,
                              int64_t *logits);
    /* The new positions of d through the unit, with its parameters p, on the
     * CPU: a unit that reads tokens writes d->x from d->tokens, one that gives
     * logits writes d->logits from d->x, the others change d->x in place; the
     * cache holds the unit's keys and values of positions [0, pos) and gets
     * those of the new ones. The same kernels and order on one position or
     * several, so that a step of n positions gives the bits of n steps of one.
     * Both NULL: the decoder does not run the type. */
    cdp_status (*decode)(const struct cdp_unit *u, float *const *p, const struct cdp_decode *d, float *cache);
};

/* Shared by the decode hooks (model/layers/common.c). out[n, OC] (+)= in[n,
 * IC] w[OC, IC]^T + b: accumulate adds to what out holds (the residual
 * stream); one row is a matrix-vector product, several a matrix product. */
void cdp_decode_linear(float *out, const float *in, const float *w, const float *b, int64_t n, int64_t IC, int64_t OC,
                       int accumulate);
/* Causal attention of d's n new rows over the cache [0, pos + n) of keys kc
 * and values vc ([context, kv_heads x C / heads] each, the new rows already
 * in): queries from q (row stride q_stride), heads heads sharing kv_heads key
 * and value heads; out [n, C]. */
void cdp_decode_attend(const struct cdp_decode *d, const float *kc, const float *vc, int64_t heads, int64_t kv_heads,
                       const float *q, int64_t q_stride, float *out);

/* Shared by the Llama layer types and the llama preset (model/layers/common.c). */
/* Llama's MLP width for model width dim: 4 dim, two thirds of it, times
 * ffn_dim_multiplier when positive, rounded up to a multiple of multiple_of
 * (Meta's llama/model.py); -1 when it overflows. */
int64_t cdp_llama_hidden(int64_t dim, int64_t multiple_of, double ffn_dim_multiplier);

/* Reads "rope_theta" (default 10000) and "rope_scaling" (absent or null: none;
 * else {"type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
 * "original_context"}) of the object obj at ptr into *r. */
cdp_status cdp_rope_parse(const struct cdp_json_in *in, const json_t *obj, const char *ptr, struct cdp_rope *r);
/* Writes them into o; nonzero when jansson runs out of memory. */
int cdp_rope_emit(const struct cdp_rope *r, json_t *o);

/* The description of type t (every type has one). */
const struct cdp_layer_def *cdp_layer_def(enum cdp_layer_type t);
/* The type named name among the listable ones (a plan's "type"); -1 when none. */
int cdp_layer_find(const char *name);
/* The listable names in enum order, NULL-terminated (for messages). */
const char *const *cdp_layer_listable_names(void);

#ifdef __cplusplus
}
#endif

#endif
