/* Data sources: synthetic, text (bytes as tokens), tokens (llm.c .bin files) and
 * idx (MNIST-style images + labels). Every sample is addressed by a global
 * sample index and the plan's seed, so a serial run and any parallel run see the
 * same samples in the same step, whichever rank reads them. */
#ifndef CDP_MODEL_DATA_H
#define CDP_MODEL_DATA_H

#include <stdint.h>

#include "cdp/plan_types.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum cdp_split { CDP_SPLIT_TRAIN = 0, CDP_SPLIT_VAL, CDP_SPLIT_COUNT };

/* What one sample looks like, fixed when the source is opened.
 * Token models (GPT, or explicit lists that start with an embedding):
 *   input: int32[T] token ids, target: int32[T] (the next tokens).
 *   T = context (GPT) or input[0] (layer list); vocab = the model's or the embedding's.
 * Classification (loss cross_entropy): input float[input_numel], target int32[1] (class).
 * Regression (loss mse): input float[input_numel], target float[target_numel].
 * classes / target_numel = the out of the last linear layer of layer_list (else
 * model->classes). idx data with loss mse gives one-hot targets of the label. */
struct cdp_sample_shape {
    int tokens;            /* 1 for token models */
    int64_t input_numel;   /* T for token models */
    int64_t target_numel;  /* T, 1 (class) or D (regression) */
    int target_is_float;   /* 1 for regression */
    int64_t classes;       /* classification: number of classes (targets in [0, classes)) */
    int64_t vocab;         /* token models: targets and inputs in [0, vocab) */
};

struct cdp_data;

/* Opens the plan's data source for its model. The model fixes the sample shape
 * (GPT: T = context tokens; mlp/cnn/explicit: the input shape and the loss).
 * synthetic: token models get sequences from a seeded sparse Markov chain (each
 * token has 4 likely successors; about 1.4 nats per token, far below log(vocab));
 * other models get inputs N(0,1) and targets from a fixed random teacher network
 * built from the seed (argmax for classes, its outputs for regression).
 * text: bytes are tokens (needs vocab >= 256). tokens: llm.c files (header of 256
 * int32: 20240520, 1, count, then uint16 tokens; or 20240801, 7, count, then
 * uint32 tokens) or .npy arrays of uint16 / uint32, told apart by content.
 * Text and tokens take several files (desc->paths), read end to end as one
 * token stream (docs/data.md). idx: images 0x00000803 (n, rows,
 * cols) or 0x00000804 (n, channels, rows, cols), unsigned bytes scaled to [0, 1],
 * and labels 0x00000801. Files are mapped read-only and stay mapped until close;
 * nothing is read whole, except that the first 64 MiB of token data are checked
 * against the vocabulary here (the rest as each window is read).
 * Headers are checked here: a bad magic number, a truncated file, a
 * token id >= vocab, images of another size than the model's input, a label
 * outside [0, classes), or a file too short for one sample of each split gives
 * CDP_ERR_INVALID (or CDP_ERR_IO) naming the file and what was wrong.
 * Validation: desc->val_paths' tokens when given; else the last 10% of the
 * samples (text/tokens: of the tokens; idx: of the images); synthetic data
 * draws both splits from disjoint index streams. */
cdp_status cdp_data_open(const struct cdp_data_desc *desc, const struct cdp_model_desc *model,
                         struct cdp_data **out);
void cdp_data_close(struct cdp_data *d);

const struct cdp_sample_shape *cdp_data_shape(const struct cdp_data *d);

/* Number of distinct samples in a split (text/tokens shuffled: windows start
 * anywhere, so this is the number of start positions, L - T for a split of L
 * tokens; text/tokens sequential: the (L - 1) / T windows at 0, T, 2T, ...;
 * idx: the images; synthetic: INT64_MAX). */
int64_t cdp_data_split_size(const struct cdp_data *d, enum cdp_split split);

/* Writes samples first_index .. first_index+count-1 of a split into inputs
 * (int32 or float, count * input_numel) and targets (int32 or float,
 * count * target_numel). Sample i depends only on (seed, split, i): for
 * file sources, with n = split_size, i is sample i % n of the split, in the
 * data order: shuffled, through a seeded permutation of each pass over it
 * (epoch = i / n); sequential, in file order (token windows at stride T). So
 * every sample is seen once per epoch (docs/training.md#data-order). */
/* Nothing changes in the source after open, so several threads may fetch at once.
 * Returns CDP_ERR_INVALID for a negative index or count, an unknown split, or a
 * token >= vocab in a window read; CDP_ERR_IO naming the file when a mapped
 * file shrank or vanished under the read (caught as SIGBUS: the first open
 * installs a process-wide SIGBUS handler that passes every other SIGBUS on to
 * the disposition it replaced; docs/data.md). */
cdp_status cdp_data_fetch(struct cdp_data *d, enum cdp_split split, int64_t first_index,
                          int count, void *inputs, void *targets);

#ifdef __cplusplus
}
#endif

#endif
