/* Text to token shards (`cdphybrid tokenize`, docs/data.md#tokenize): text
 * files, folders of them, or JSONL files with a text field, encoded by a
 * byte-level BPE (bpe.h) over several threads, each document preceded by an
 * end-of-text token as llm.c's data scripts write them, cut into llm.c .bin
 * (or .npy) shards of a training and a validation split that data.path and
 * data.val_path read. */
#ifndef CDP_MODEL_TOKENIZE_H
#define CDP_MODEL_TOKENIZE_H

#include <stdint.h>

#include "cdp/status.h"
#include "model/bpe.h"

#ifdef __cplusplus
extern "C" {
#endif

enum cdp_shard_format { CDP_SHARD_BIN = 0, CDP_SHARD_NPY, CDP_SHARD_FORMAT_COUNT };

struct cdp_tokenize_opts {
    const char *const *inputs; /* files and folders (read recursively, in name order) */
    int n_inputs;
    const char *out_dir;       /* made when missing; must hold no shard of this prefix */
    const char *prefix;        /* shard names: PREFIX_train_000000.bin, PREFIX_val_000000.bin */
    const char *text_field;    /* JSONL (.jsonl files): the key of each line's text */
    const struct cdp_bpe *bpe; /* not owned */
    int32_t eot;               /* the id written before every document; -1: none */
    double val_fraction;       /* share of documents in the validation split, in [0, 1) */
    int val_required;          /* 1: a validation split that gets no document is an error */
    int64_t shard_tokens;      /* tokens per shard (the last one of a split holds the rest) */
    enum cdp_shard_format format;
    int threads;               /* >= 1 */
    /* called now and then from the calling thread (NULL: never) */
    void (*progress)(void *ctx, int64_t bytes_done, int64_t bytes_total, int64_t tokens);
    void *ctx;
};

struct cdp_tokenize_stats {
    int64_t docs[2], tokens[2]; /* [0] training, [1] validation */
    int shards[2];
    int token_bytes;            /* 2 (uint16) or 4 (uint32) */
    int64_t bytes;              /* text read */
};

/* Runs the whole job. Shards are written atomically one by one; on failure
 * the ones this call wrote are removed. CDP_ERR_INVALID names the input (file
 * and line for JSONL) or the option at fault; CDP_ERR_IO a file that could not
 * be read or written. */
cdp_status cdp_tokenize_run(const struct cdp_tokenize_opts *o, struct cdp_tokenize_stats *stats);

/* Whether document i (0-based, in input order) belongs to the validation
 * split: an even spread, floor((i + 1) f) > floor(i f). */
int cdp_tokenize_is_val(int64_t i, double f);

#ifdef __cplusplus
}
#endif

#endif
