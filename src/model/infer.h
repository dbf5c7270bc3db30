/* Using a trained model: decoding with a KV cache (one forward of the new
 * tokens per step, the keys and values of earlier positions kept), the
 * sliding window of a GPT's context, and the choice of the next token
 * (greedy, or sampled from softmax(logits / T) over the top k and the top p
 * with a seeded stream); src/cli/cmd_generate.c runs it on one rank or a
 * pipeline (docs/generate.md). */
#ifndef CDP_MODEL_INFER_H
#define CDP_MODEL_INFER_H

#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_model;
struct cdp_infer;

/* A decoder over the units of m (a whole model or a pipeline stage's range,
 * on the CPU device: its parameters are read in place), with a cache of
 * `context` positions (the model's /model/context). Unit types it runs:
 * those whose description has a decode hook (model/layer_def.h: embedding,
 * transformer_block, llama_block, lm_head); others are CDP_ERR_INVALID
 * naming the unit. */
cdp_status cdp_infer_create(struct cdp_model *m, int64_t context, struct cdp_infer **out);
void cdp_infer_destroy(struct cdp_infer *s);

/* Positions held in the cache (the next token's position). */
int64_t cdp_infer_position(const struct cdp_infer *s);
/* Forgets every position (the next step starts at position 0). */
void cdp_infer_reset(struct cdp_infer *s);

/* What a step of n positions takes and gives: in, int32 token ids [n] when
 * the range starts with the embedding, else floats [n, width]; out, the
 * logits [vocab] of the last of the n positions when the range ends the
 * model, else floats [n, width] for the next stage. */
int64_t cdp_infer_in_floats(const struct cdp_infer *s, int64_t n);
int64_t cdp_infer_out_floats(const struct cdp_infer *s, int64_t n);

/* n (>= 1) new positions through the range; their keys and values join the
 * cache. CDP_ERR_INVALID when position + n passes the context, or a token is
 * outside the vocabulary. */
cdp_status cdp_infer_step(struct cdp_infer *s, const void *in, int64_t n, float *out);

/* The window the model sees after tokens[0 .. n) (n >= 1): the last
 * `context` tokens when n is more, at win[0 ..], the rest of win's `context`
 * entries token 0. Returns how many are tokens (the logits to read are those
 * of position that - 1). */
int64_t cdp_infer_window(const int32_t *tokens, int64_t n, int64_t context, int32_t *win);

/* The next token among ids 0 .. n-1 of logits: temperature 0 the largest
 * logit (the lowest id among equals); otherwise one id drawn with probability
 * softmax(logits / temperature) over the top_k largest (0: all n; ties by
 * lower id), then over the fewest of those, most likely first, whose
 * probabilities (renormalised over the top k) add up to at least top_p (1:
 * all; as transformers' TopPLogitsWarper, at least one), from the uniform
 * (cdp_splitmix64(state) >> 11) * 2^-53, one draw per call, so a seed gives
 * the same tokens. NaN logits are CDP_ERR_INVALID. */
cdp_status cdp_infer_pick(const float *logits, int64_t n, double temperature, int64_t top_k, double top_p,
                          uint64_t *state, int32_t *out);

#ifdef __cplusplus
}
#endif

#endif
