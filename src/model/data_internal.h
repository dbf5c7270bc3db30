/* Internal to the data files of src/model/ (data*.c): the data source
 * object, the counter-based random numbers and the readers they share. Not
 * for other layers: the interface is model/data.h. */
#ifndef CDP_MODEL_DATA_INTERNAL_H
#define CDP_MODEL_DATA_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cdp/status.h"
#include "model/data.h"

/* The domains of the counter-based random streams (data_hash4's second key). */
enum { DOM_SAMPLE = 1, DOM_TEACHER, DOM_PERM, DOM_MARKOV, DOM_CALIB };

/* xoshiro256** seeded through splitmix64, with one cached Box-Muller normal. */
struct rng {
    uint64_t s[4];
    int have_spare;
    double spare;
};

/* A seeded permutation of [0, count): Feistel network + cycle walking. */
struct perm {
    uint64_t count;
    int half;
    uint64_t mask;
    uint64_t keys[4];
};

#define TEACHER_HIDDEN 32
#define MARKOV_SUCCESSORS 4
#define MARKOV_NOISE 0.02

/* One mapped file of a token stream (a shard). */
struct shard {
    char *path;          /* owned */
    void *map;
    size_t map_size;
    const uint8_t *tok;  /* its first token */
    int width;           /* bytes per token: 1 (text), 2 or 4 */
    int checked;         /* every token was checked against the vocabulary at open */
    int64_t count;       /* tokens */
    int64_t start;       /* stream position of its first token */
};

/* data.path's files (stream 0) or data.val_path's (stream 1), end to end. */
struct stream {
    struct shard *sh;
    int n;
    int64_t total;
};

struct cdp_data {
    enum cdp_data_source source;
    enum cdp_data_order order;
    uint64_t seed;
    struct cdp_sample_shape shape;
    char *path, *labels_path; /* for messages (owned) */

    /* text, tokens */
    struct stream streams[2];
    int split_stream[CDP_SPLIT_COUNT]; /* the stream each split reads */
    int64_t scan_budget;               /* bytes left to check against the vocabulary at open */
    int64_t windows;                   /* windows read since the maps' pages were last let go (atomic) */

    /* idx: mapped files */
    void *map, *lmap;
    size_t map_size, lmap_size;
    const uint8_t *bytes;    /* idx: the pixels */
    const uint8_t *labels;   /* idx */
    int64_t item_numel;      /* idx: values per image */
    int64_t begin[CDP_SPLIT_COUNT]; /* first token / image of each split */
    int64_t count[CDP_SPLIT_COUNT]; /* samples in each split */
    int64_t stride;                 /* sequential token windows: T; else 1 */

    /* synthetic teacher: y = W2 tanh(W1 x + b1) + b2 */
    int64_t out; /* C (classes) or regression outputs */
    float *w1, *b1, *w2, *b2;
};

/* ---- data_random.c: every stream is keyed by a hash of (seed, domain, a, b) ---- */

uint64_t data_hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d);
void data_rng_seed(struct rng *r, uint64_t key);
double data_rng_uniform(struct rng *r);       /* [0, 1) */
uint64_t data_rng_below(struct rng *r, uint64_t n); /* [0, n) */
double data_rng_normal(struct rng *r);
void data_perm_init(struct perm *p, uint64_t count, uint64_t key);
uint64_t data_perm_apply(const struct perm *p, uint64_t x);

/* ---- data.c: opening ---- */

/* Maps a whole regular file read-only. An empty file gives base NULL, size 0. */
cdp_status data_map_file(const char *path, void **base, size_t *size);
uint32_t data_be32(const uint8_t *p);
int32_t data_le32(const uint8_t *p);

/* ---- data_tokens.c: token streams (text, tokens) ---- */

cdp_status data_open_token_source(struct cdp_data *d, const struct cdp_data_desc *desc);
void data_close_stream(struct stream *s);
/* n tokens of stream s from position pos into out (checked against the vocabulary). */
cdp_status data_read_tokens(const struct cdp_data *d, const struct stream *s, int64_t pos, int64_t n, int32_t *out);

/* ---- data_idx.c: MNIST idx images and labels ---- */

cdp_status data_open_idx(struct cdp_data *d, const struct cdp_model_desc *m);

/* ---- data_synthetic.c: the teacher network and the Markov chain of tokens ---- */

cdp_status data_open_synthetic(struct cdp_data *d);
void data_teacher_forward(const struct cdp_data *d, const float *x, float *h, float *y);
void data_normal_input(struct rng *r, float *x, int64_t D);
void data_synth_tokens(const struct cdp_data *d, struct rng *r, int32_t *in, int32_t *tgt);

/* ---- data_fetch.c: the SIGBUS guard of mapped reads, installed once at open ---- */

extern pthread_once_t data_guard_once;
void data_guard_install(void);

#endif
