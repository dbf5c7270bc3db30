/* Using a trained model: the next token's logits of a GPT over a sliding
 * window of its context, the choice of the next token (greedy, or sampled
 * from softmax(logits / T) over the top k with a seeded stream), and the
 * validation loss as training computes it (docs/generate.md). */
#ifndef CDP_MODEL_INFER_H
#define CDP_MODEL_INFER_H

#include <stdint.h>

#include "cdp/status.h"
#include "model/data.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The window the model sees after tokens[0 .. n) (n >= 1): the last
 * `context` tokens when n is more, at win[0 ..], the rest of win's `context`
 * entries token 0. Returns how many are tokens (the logits to read are those
 * of position that - 1). */
int64_t cdp_infer_window(const int32_t *tokens, int64_t n, int64_t context, int32_t *win);

/* The logits of the token after tokens[0 .. n) (n >= 1) of a whole GPT made
 * for micro-batches of one sample of `context` tokens: the last `context`
 * tokens when n is more, placed at positions 0 .. and the rest of the window
 * filled with token 0 (a causal model's logits at a position do not depend on
 * later ones). m is on device dev. vocab floats are copied into logits (host memory). */
cdp_status cdp_infer_next_logits(struct cdp_model *m, cdp_device_t dev, const int32_t *tokens, int64_t n,
                                 int64_t context, int64_t vocab, float *logits);

/* The next token among ids 0 .. n-1 of logits: temperature 0 the largest
 * logit (the lowest id among equals); otherwise one id drawn with probability
 * softmax(logits / temperature) over the top_k largest (0: all n; ties by
 * lower id), from the uniform (cdp_splitmix64(state) >> 11) * 2^-53, one draw
 * per call, so a seed gives the same tokens. NaN logits are CDP_ERR_INVALID. */
cdp_status cdp_infer_pick(const float *logits, int64_t n, double temperature, int64_t top_k, uint64_t *state,
                          int32_t *out);

/* Validation loss as training's validation computes it (pipeline/interpret.c
 * cdp_exec_validate): `batches` micro-batches of B samples of the validation
 * split, micro-batch k starting at sample (k B) mod (split - B + 1), the loss
 * summed over every row and divided by batches x B x rows per sample. m is a
 * whole model made for B samples, one slot, on device dev. *rows: the rows
 * (tokens, or samples for other models) it averaged over. */
cdp_status cdp_infer_val_loss(struct cdp_model *m, cdp_device_t dev, struct cdp_data *d, int B, int64_t batches,
                              double *loss, int64_t *rows);

#ifdef __cplusplus
}
#endif

#endif
