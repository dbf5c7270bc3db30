/* Using a trained model: the sliding window of a GPT's context and the choice
 * of the next token (greedy, or sampled from softmax(logits / T) over the top
 * k with a seeded stream); src/cli/cmd_generate.c runs the forward passes on
 * one rank or a pipeline (docs/generate.md). */
#ifndef CDP_MODEL_INFER_H
#define CDP_MODEL_INFER_H

#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The window the model sees after tokens[0 .. n) (n >= 1): the last
 * `context` tokens when n is more, at win[0 ..], the rest of win's `context`
 * entries token 0. Returns how many are tokens (the logits to read are those
 * of position that - 1). */
int64_t cdp_infer_window(const int32_t *tokens, int64_t n, int64_t context, int32_t *win);

/* The next token among ids 0 .. n-1 of logits: temperature 0 the largest
 * logit (the lowest id among equals); otherwise one id drawn with probability
 * softmax(logits / temperature) over the top_k largest (0: all n; ties by
 * lower id), from the uniform (cdp_splitmix64(state) >> 11) * 2^-53, one draw
 * per call, so a seed gives the same tokens. NaN logits are CDP_ERR_INVALID. */
cdp_status cdp_infer_pick(const float *logits, int64_t n, double temperature, int64_t top_k, uint64_t *state,
                          int32_t *out);

#ifdef __cplusplus
}
#endif

#endif
