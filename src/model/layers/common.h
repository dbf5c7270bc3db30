/* What the layer types' files share (src/model/layers/): shape arithmetic,
 * parameter descriptors with PyTorch's and GPT-2's initialisations, the plan
 * helpers every type's keys use, and K(), a kernel-table call. Shapes: B
 * batch, T tokens, C channels. */
#ifndef CDP_MODEL_LAYERS_COMMON_H
#define CDP_MODEL_LAYERS_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "model/layer_def.h"

/* Elements of a shape; rows of a last-dimension op (all but the last
 * dimension); its last dimension. */
int64_t cdp_shape_numel(const struct cdp_shape *s);
int64_t cdp_shape_rows(const struct cdp_shape *s);
int64_t cdp_shape_last(const struct cdp_shape *s);
/* "[3, 32, 32]" */
void cdp_shape_format(const struct cdp_shape *s, char *buf, size_t cap);

/* Adds a parameter descriptor to u (its numel counted in u->param_count). */
struct cdp_param_desc *cdp_unit_add_param(struct cdp_unit *u, const char *name, int ndim, int64_t d0, int64_t d1,
                                          int64_t d2, int64_t d3, enum cdp_init init, float scale,
                                          enum cdp_param_group group);
/* A linear map's weight [out, in] and bias: PyTorch's U(-1/sqrt(in), 1/sqrt(in)),
 * or GPT-2's N(0, gpt_std) and zero bias where gpt. Names "prefix.weight". */
void cdp_unit_add_linear_params(struct cdp_unit *u, const char *prefix, int64_t out, int64_t in, int bias, int gpt,
                                float gpt_std);
/* A layernorm's weight (ones) and bias (zeros) of width C. */
void cdp_unit_add_norm_params(struct cdp_unit *u, const char *prefix, int64_t C);

/* An RMS norm's weight (ones) of width C, "prefix.weight". */
void cdp_unit_add_rmsnorm_param(struct cdp_unit *u, const char *prefix, int64_t C);

/* The shape check of the rotary types: a [T, C] input passes through when C
 * is a multiple of heads, heads a multiple of kv_heads and the head width
 * C / heads even; else -1 with why naming the type. */
int cdp_rotary_shape(const char *type_name, const struct cdp_layer_desc *L, const struct cdp_shape *in,
                     struct cdp_shape *out, char *why, size_t cap);

/* A rotary (grouped-query) attention's sizes on unit u's rank, for
 * rotary_attention and llama_block: T the whole sequence (the input's rows,
 * t times the shard's when sequence parallel), C the residual stream's width
 * (whole), HD a head's width; NH and NKV the rank's heads and kv heads
 * (heads / t and kv_heads / t when u is split over a tensor group of t), A =
 * HD NH and KVD = HD NKV their widths; N = B T rows. */
struct cdp_rotary_dims {
    int T, C, HD, NH, NKV, A, KVD, N;
};
struct cdp_rotary_dims cdp_rotary_dims(const struct cdp_unit *u, int B);

/* " rope_theta 10000" and its scaling, for describe(). */
void cdp_rope_describe(const struct cdp_rope *r, char *buf, size_t cap);

/* Work of attention over [T, C]: the kernel's own count of its GEMMs, which
 * skip the masked blocks of causal attention. */
double cdp_attention_flops(int64_t T, int64_t C, int causal, int backward);

/* The shape check of the attention types: a [T, C] input passes through
 * when C is a multiple of heads; else -1 with why naming the type. */
int cdp_heads_shape(const char *type_name, const struct cdp_layer_desc *L, const struct cdp_shape *in,
                    struct cdp_shape *out, char *why, size_t cap);

/* The shape of a K x K window sliding by S over a [C, H, W] input padded by
 * P: [channels, (H + 2P - K) / S + 1, (W + 2P - K) / S + 1]; else -1 with why
 * naming the type. */
int cdp_window_shape(const char *type_name, const struct cdp_shape *in, int64_t K, int64_t S, int64_t P,
                     int64_t channels, struct cdp_shape *out, char *why, size_t cap);

/* Reads the required integer key of a layer object: "missing; WHO needs
 * "KEY", a positive integer" when absent. */
cdp_status cdp_layer_get_required_int(const struct cdp_json_in *in, const json_t *obj, const char *ptr,
                                      const char *key, int64_t min, const char *who, int64_t *out);

/* x = a * b + c without overflow (and a, b, c >= 0); -1 when it overflows. */
int64_t cdp_mul_add(int64_t a, int64_t b, int64_t c);

/* The input gradient of a unit split over a tensor group, a sum of the
 * ranks' parts: part (n floats of scratch, apart from din) holds this rank's,
 * made from zero; it is summed over the group in place there and then added
 * into din, so that din keeps what it held (backward adds, model.h). din NULL:
 * nothing. */
cdp_status cdp_unit_tensor_add_sum(const struct cdp_kernels *k, const struct cdp_unit *u, float *part, float *din,
                                   int64_t n);

/* K(op, args...): op of the unit's kernel table k; returns its failure. */
#define K(op, ...) CDP_KERNEL(k, op, __VA_ARGS__)

/* A JSON integer, for the emit functions. */
#define CDP_JINT(v) json_integer((json_int_t)(v))

#endif
