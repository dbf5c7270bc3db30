/* Data sources: synthetic (a seeded Markov chain of tokens, or a fixed random
 * teacher network), text (bytes as tokens), tokens (llm.c .bin) and idx (MNIST
 * images + labels). A sample depends only on (seed, split, global index): there
 * is no mutable state after open, so any rank or thread can fetch any sample.
 * Shape legend: T tokens per sample, D input values, C classes, H teacher width. */
#include "model/data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/hash.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the tokens reader maps little-endian uint16 files directly"
#endif

/* ---- counter-based random numbers -------------------------------------------
 * Every stream is keyed by a hash of (seed, domain, a, b); no global state. */

enum { DOM_SAMPLE = 1, DOM_TEACHER, DOM_PERM, DOM_MARKOV, DOM_CALIB };

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    uint64_t h = mix64(a ^ 0x6364706879627264ull);
    h = mix64(h ^ b);
    h = mix64(h ^ c);
    return mix64(h ^ d);
}

/* xoshiro256** seeded through splitmix64, with one cached Box-Muller normal. */
struct rng {
    uint64_t s[4];
    int have_spare;
    double spare;
};

static void rng_seed(struct rng *r, uint64_t key)
{
    uint64_t x = key;
    for (int i = 0; i < 4; i++) r->s[i] = cdp_splitmix64(&x);
    r->have_spare = 0;
    r->spare = 0.0;
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1). */
static double rng_uniform(struct rng *r) { return (double)(rng_next(r) >> 11) * 0x1p-53; }

/* Uniform in [0, n), n > 0, without modulo bias. */
static uint64_t rng_below(struct rng *r, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = rng_next(r);
    while (x >= limit);
    return x % n;
}

static double rng_normal(struct rng *r)
{
    if (r->have_spare) {
        r->have_spare = 0;
        return r->spare;
    }
    double u1 = 1.0 - rng_uniform(r); /* (0, 1]: log stays finite */
    double u2 = rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
    r->spare = rad * sin(th);
    r->have_spare = 1;
    return rad * cos(th);
}

/* ---- a seeded permutation of [0, count): Feistel network + cycle walking ----- */

struct perm {
    uint64_t count;
    int half;
    uint64_t mask;
    uint64_t keys[4];
};

static void perm_init(struct perm *p, uint64_t count, uint64_t key)
{
    int bits = 2;
    while (bits < 64 && (1ull << bits) < count) bits++;
    if (bits & 1) bits++;
    p->count = count;
    p->half = bits / 2;
    p->mask = (1ull << p->half) - 1;
    for (int i = 0; i < 4; i++) p->keys[i] = mix64(key + (uint64_t)i * 0x632be59bd9b4e019ull);
}

static uint64_t perm_apply(const struct perm *p, uint64_t x)
{
    do {
        uint64_t L = x >> p->half, R = x & p->mask;
        for (int i = 0; i < 4; i++) {
            uint64_t f = mix64(R ^ p->keys[i]) & p->mask;
            uint64_t nl = R;
            R = L ^ f;
            L = nl;
        }
        x = (L << p->half) | R;
    } while (x >= p->count); /* the walk ends: the cycle through x holds a value < count */
    return x;
}

/* ---- the source --------------------------------------------------------------- */

#define TEACHER_HIDDEN 32
#define MARKOV_SUCCESSORS 4
#define MARKOV_NOISE 0.02

struct cdp_data {
    enum cdp_data_source source;
    enum cdp_data_order order;
    uint64_t seed;
    struct cdp_sample_shape shape;
    char *path, *labels_path; /* for messages (owned) */

    /* mapped files (text, tokens, idx) */
    void *map, *lmap;
    size_t map_size, lmap_size;
    const uint8_t *bytes;    /* text: the tokens; idx: the pixels */
    const uint16_t *tokens;  /* tokens */
    const uint8_t *labels;   /* idx */
    int64_t item_numel;      /* idx: values per image */
    int64_t begin[CDP_SPLIT_COUNT]; /* first token / image of each split */
    int64_t count[CDP_SPLIT_COUNT]; /* samples in each split */
    int64_t stride;                 /* sequential token windows: T; else 1 */

    /* synthetic teacher: y = W2 tanh(W1 x + b1) + b2 */
    int64_t out; /* C (classes) or regression outputs */
    float *w1, *b1, *w2, *b2;
};

static const char *const source_names[] = {"synthetic", "text", "tokens", "idx"};
CDP_TABLE_CHECK(source_names, CDP_DATA_SOURCE_COUNT);

/* The sample shape a model takes (see data.h). */
static cdp_status shape_from_model(const struct cdp_model_desc *m, struct cdp_sample_shape *s)
{
    memset(s, 0, sizeof *s);
    if (m->kind == CDP_MODEL_GPT) {
        if (m->context < 1 || m->vocab < 1)
            return cdp_fail(CDP_ERR_INVALID, "model: a gpt needs context and vocab >= 1 (got %lld, %lld)",
                            (long long)m->context, (long long)m->vocab);
        s->tokens = 1;
        s->input_numel = s->target_numel = m->context;
        s->vocab = m->vocab;
        return CDP_OK;
    }
    if (m->n_layers > 0 && m->layer_list && m->layer_list[0].type == CDP_LAYER_EMBEDDING) {
        if (m->input_ndim != 1 || m->input[0] < 1)
            return cdp_fail(CDP_ERR_INVALID, "model: a layer list that starts with an embedding needs an "
                                             "input [T] of token ids");
        if (m->layer_list[0].vocab < 1)
            return cdp_fail(CDP_ERR_INVALID, "model: the embedding's vocab must be >= 1");
        s->tokens = 1;
        s->input_numel = s->target_numel = m->input[0];
        s->vocab = m->layer_list[0].vocab;
        return CDP_OK;
    }
    if (m->input_ndim < 1 || m->input_ndim > CDP_MAX_INPUT_DIMS)
        return cdp_fail(CDP_ERR_INVALID, "model: no input shape");
    int64_t numel = 1;
    for (int i = 0; i < m->input_ndim; i++) {
        if (m->input[i] < 1 || __builtin_mul_overflow(numel, m->input[i], &numel))
            return cdp_fail(CDP_ERR_INVALID, "model: bad input shape");
    }
    int64_t out = 0;
    for (int i = m->n_layers - 1; i >= 0 && m->layer_list; i--) {
        if (m->layer_list[i].type == CDP_LAYER_LINEAR) {
            out = m->layer_list[i].out;
            break;
        }
    }
    if (out < 1 && m->classes > 0) out = m->classes;
    if (out < 1)
        return cdp_fail(CDP_ERR_INVALID, "model: no linear layer gives the number of %s",
                        m->loss == CDP_LOSS_MSE ? "outputs" : "classes");
    s->input_numel = numel;
    if (m->loss == CDP_LOSS_MSE) {
        s->target_numel = out;
        s->target_is_float = 1;
    } else {
        s->target_numel = 1;
        s->classes = out;
    }
    return CDP_OK;
}

/* Maps a whole regular file read-only. An empty file gives base NULL, size 0. */
static cdp_status map_file(const char *path, void **base, size_t *size)
{
    *base = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cdp_fail(CDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return cdp_fail(CDP_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return cdp_fail(CDP_ERR_INVALID, "%s: not a regular file", path);
    }
    if (sb.st_size > 0) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return cdp_fail(CDP_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
        *base = p;
        *size = (size_t)sb.st_size;
    }
    close(fd);
    return CDP_OK;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static int32_t le32(const uint8_t *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* Token streams (text, tokens): the last n/10 tokens are validation; a sample is
 * a window of T+1 tokens starting inside its split. Shuffled, a window starts
 * at any of the split's L - T positions; sequential, at the (L - 1) / T
 * positions 0, T, 2T, ... (consecutive windows share one token: the last
 * target of one is the first input of the next, as in llm.c). */
static cdp_status split_tokens(struct cdp_data *d, int64_t n, const char *unit)
{
    int64_t T = d->shape.input_numel;
    int64_t n_val = n / 10, n_train = n - n_val;
    if (n_val < T + 1) {
        long long need = (T + 1) > INT64_MAX / 10 ? (long long)INT64_MAX : (long long)(10 * (T + 1));
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: too short for one sample of %lld tokens in the validation split (the last "
                        "10%% of the file; needs at least %lld %s, the file has %lld)",
                        d->path, (long long)(T + 1), need, unit, (long long)n);
    }
    d->begin[CDP_SPLIT_TRAIN] = 0;
    d->begin[CDP_SPLIT_VAL] = n_train;
    if (d->order == CDP_DATA_ORDER_SEQUENTIAL) {
        d->stride = T;
        d->count[CDP_SPLIT_TRAIN] = (n_train - 1) / T;
        d->count[CDP_SPLIT_VAL] = (n_val - 1) / T;
    } else {
        d->count[CDP_SPLIT_TRAIN] = n_train - T;
        d->count[CDP_SPLIT_VAL] = n_val - T;
    }
    return CDP_OK;
}

static cdp_status open_text(struct cdp_data *d)
{
    cdp_status st;
    if (!d->shape.tokens)
        return cdp_fail(CDP_ERR_INVALID, "%s: text data gives byte tokens, but the model takes %s", d->path,
                        d->shape.target_is_float ? "float inputs (regression)" : "float inputs (classification)");
    if (d->shape.vocab < 256)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: text data gives byte tokens 0..255, but the model's vocabulary has only %lld "
                        "tokens (needs >= 256)",
                        d->path, (long long)d->shape.vocab);
    if ((st = map_file(d->path, &d->map, &d->map_size))) return st;
    d->bytes = d->map;
    return split_tokens(d, (int64_t)d->map_size, "bytes");
}

#define LLMC_MAGIC 20240520
#define LLMC_HEADER_BYTES 1024

static cdp_status open_tokens(struct cdp_data *d)
{
    cdp_status st;
    if (!d->shape.tokens)
        return cdp_fail(CDP_ERR_INVALID, "%s: token data needs a token model (gpt, or a layer list that "
                                         "starts with an embedding)", d->path);
    if ((st = map_file(d->path, &d->map, &d->map_size))) return st;
    const uint8_t *p = d->map;
    if (d->map_size < LLMC_HEADER_BYTES)
        return cdp_fail(CDP_ERR_INVALID, "%s: too short for an llm.c token file header (%zu bytes, needs %d)",
                        d->path, d->map_size, LLMC_HEADER_BYTES);
    int32_t magic = le32(p), version = le32(p + 4), count = le32(p + 8);
    if (magic != LLMC_MAGIC)
        return cdp_fail(CDP_ERR_INVALID, "%s: not an llm.c token file (magic %ld, expected %d)", d->path,
                        (long)magic, LLMC_MAGIC);
    if (version != 1)
        return cdp_fail(CDP_ERR_INVALID, "%s: unsupported token file version %ld (expected 1: uint16 tokens)",
                        d->path, (long)version);
    if (count < 0)
        return cdp_fail(CDP_ERR_INVALID, "%s: bad header: negative token count %ld", d->path, (long)count);
    uint64_t want = 2 * (uint64_t)count, have = d->map_size - LLMC_HEADER_BYTES;
    if (have < want)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: truncated: header says %ld tokens (%llu bytes), the file has %llu bytes after "
                        "the header",
                        d->path, (long)count, (unsigned long long)want, (unsigned long long)have);
    if (have > want)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: header says %ld tokens (%llu bytes), but the file has %llu bytes after the "
                        "header (trailing data)",
                        d->path, (long)count, (unsigned long long)want, (unsigned long long)have);
    d->tokens = (const uint16_t *)(p + LLMC_HEADER_BYTES);
    for (int64_t i = 0; i < count; i++) {
        if (d->tokens[i] >= d->shape.vocab)
            return cdp_fail(CDP_ERR_INVALID,
                            "%s: token %u at position %lld is outside the model's vocabulary (vocab %lld)",
                            d->path, (unsigned)d->tokens[i], (long long)i, (long long)d->shape.vocab);
    }
    return split_tokens(d, count, "tokens");
}

#define IDX_IMAGES_MAGIC 0x00000803u
#define IDX_IMAGES_C_MAGIC 0x00000804u /* n, channels, rows, cols */
#define IDX_LABELS_MAGIC 0x00000801u

static cdp_status open_idx(struct cdp_data *d, const struct cdp_model_desc *m)
{
    cdp_status st;
    if (d->shape.tokens)
        return cdp_fail(CDP_ERR_INVALID, "%s: idx images need a model with float inputs, not a token model",
                        d->path);
    if (!d->labels_path) return cdp_fail(CDP_ERR_INVALID, "%s: idx data needs a labels file", d->path);
    if ((st = map_file(d->path, &d->map, &d->map_size))) return st;
    const uint8_t *p = d->map;
    if (d->map_size < 4)
        return cdp_fail(CDP_ERR_INVALID, "%s: too short for an IDX header (%zu bytes)", d->path, d->map_size);
    uint32_t magic = be32(p);
    if (magic != IDX_IMAGES_MAGIC && magic != IDX_IMAGES_C_MAGIC)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: not an IDX images file (magic 0x%08x, expected 0x%08x, or 0x%08x with channels)",
                        d->path, magic, IDX_IMAGES_MAGIC, IDX_IMAGES_C_MAGIC);
    int ndim = p[3];
    size_t hdr = 4 + 4 * (size_t)ndim;
    if (d->map_size < hdr)
        return cdp_fail(CDP_ERR_INVALID, "%s: truncated IDX header (%zu bytes, needs %zu)", d->path, d->map_size,
                        hdr);
    int64_t n = be32(p + 4), dims[3] = {1, 1, 1}; /* channels, rows, cols */
    for (int i = 1; i < ndim; i++) dims[3 - ndim + i] = be32(p + 4 + 4 * i);
    int64_t per;
    if (__builtin_mul_overflow(dims[0], dims[1], &per) || __builtin_mul_overflow(per, dims[2], &per))
        return cdp_fail(CDP_ERR_INVALID, "%s: absurd image size in the header", d->path);
    unsigned long long want, have = d->map_size - hdr;
    if (__builtin_mul_overflow((unsigned long long)n, (unsigned long long)per, &want))
        return cdp_fail(CDP_ERR_INVALID, "%s: absurd header: %lld images of %lld values", d->path, (long long)n,
                        (long long)per);
    char dims_txt[96];
    if (ndim == 4)
        snprintf(dims_txt, sizeof dims_txt, "%lldx%lldx%lld", (long long)dims[0], (long long)dims[1],
                 (long long)dims[2]);
    else
        snprintf(dims_txt, sizeof dims_txt, "%lldx%lld", (long long)dims[1], (long long)dims[2]);
    if (have < want)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: truncated: header says %lld images of %s (%llu bytes), the file has %llu bytes "
                        "after the header",
                        d->path, (long long)n, dims_txt, want, have);
    if (have > want)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: header says %lld images of %s (%llu bytes), but the file has %llu bytes after "
                        "the header (trailing data)",
                        d->path, (long long)n, dims_txt, want, have);

    /* the images against the model's input */
    char in_txt[96];
    int k = snprintf(in_txt, sizeof in_txt, "[");
    for (int i = 0; i < m->input_ndim && k < (int)sizeof in_txt; i++)
        k += snprintf(in_txt + k, sizeof in_txt - (size_t)k, "%s%lld", i ? ", " : "", (long long)m->input[i]);
    if (k < (int)sizeof in_txt) snprintf(in_txt + k, sizeof in_txt - (size_t)k, "]");
    int shape_ok = per == d->shape.input_numel;
    if (shape_ok && m->input_ndim == 3)
        shape_ok = m->input[0] == dims[0] && m->input[1] == dims[1] && m->input[2] == dims[2];
    else if (shape_ok && m->input_ndim == 2)
        shape_ok = m->input[0] == dims[1] && m->input[1] == dims[2];
    if (!shape_ok)
        return cdp_fail(CDP_ERR_INVALID, "%s: images are %s (%lld values), but the model's input %s takes %lld",
                        d->path, dims_txt, (long long)per, in_txt, (long long)d->shape.input_numel);

    if ((st = map_file(d->labels_path, &d->lmap, &d->lmap_size))) return st;
    const uint8_t *q = d->lmap;
    if (d->lmap_size < 8)
        return cdp_fail(CDP_ERR_INVALID, "%s: too short for an IDX labels header (%zu bytes, needs 8)",
                        d->labels_path, d->lmap_size);
    if (be32(q) != IDX_LABELS_MAGIC)
        return cdp_fail(CDP_ERR_INVALID, "%s: not an IDX labels file (magic 0x%08x, expected 0x%08x)",
                        d->labels_path, be32(q), IDX_LABELS_MAGIC);
    int64_t nl = be32(q + 4);
    unsigned long long lhave = d->lmap_size - 8;
    if (lhave < (unsigned long long)nl)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: truncated: header says %lld labels, the file has %llu bytes after the header",
                        d->labels_path, (long long)nl, lhave);
    if (lhave > (unsigned long long)nl)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: header says %lld labels, but the file has %llu bytes after the header "
                        "(trailing data)",
                        d->labels_path, (long long)nl, lhave);
    if (nl != n)
        return cdp_fail(CDP_ERR_INVALID, "%s has %lld images but %s has %lld labels", d->path, (long long)n,
                        d->labels_path, (long long)nl);
    int64_t classes = d->shape.target_is_float ? d->shape.target_numel : d->shape.classes;
    for (int64_t i = 0; i < nl; i++) {
        if (q[8 + i] >= classes)
            return cdp_fail(CDP_ERR_INVALID, "%s: label %u of image %lld is outside the model's %lld %s",
                            d->labels_path, (unsigned)q[8 + i], (long long)i, (long long)classes,
                            d->shape.target_is_float ? "outputs (one-hot targets)" : "classes");
    }
    int64_t n_val = n / 10;
    if (n_val < 1)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: too short for one sample in the validation split (the last 10%% of the images; "
                        "needs at least 10 images, the file has %lld)",
                        d->path, (long long)n);
    d->bytes = p + hdr;
    d->labels = q + 8;
    d->item_numel = per;
    d->begin[CDP_SPLIT_TRAIN] = 0;
    d->count[CDP_SPLIT_TRAIN] = n - n_val;
    d->begin[CDP_SPLIT_VAL] = n - n_val;
    d->count[CDP_SPLIT_VAL] = n_val;
    return CDP_OK;
}

/* One hidden layer of width H with tanh, weights N(0, 1/fan_in), output rows of
 * unit norm, and output biases that centre the outputs over a calibration
 * sample so that argmax classes come out roughly balanced. */
static void teacher_forward(const struct cdp_data *d, const float *x, float *h, float *y)
{
    int64_t D = d->shape.input_numel, C = d->out;
    for (int j = 0; j < TEACHER_HIDDEN; j++) {
        const float *w = d->w1 + (int64_t)j * D;
        double a = d->b1[j];
        for (int64_t i = 0; i < D; i++) a += (double)w[i] * x[i];
        h[j] = (float)tanh(a);
    }
    for (int64_t c = 0; c < C; c++) {
        const float *w = d->w2 + c * TEACHER_HIDDEN;
        double a = d->b2[c];
        for (int j = 0; j < TEACHER_HIDDEN; j++) a += (double)w[j] * h[j];
        y[c] = (float)a;
    }
}

static void normal_input(struct rng *r, float *x, int64_t D)
{
    for (int64_t i = 0; i < D; i++) x[i] = (float)rng_normal(r);
}

static cdp_status open_synthetic(struct cdp_data *d)
{
    for (int s = 0; s < CDP_SPLIT_COUNT; s++) d->count[s] = INT64_MAX;
    if (d->shape.tokens) return CDP_OK; /* the Markov chain is a pure function of the seed */
    int64_t D = d->shape.input_numel, C = d->out = d->shape.target_is_float ? d->shape.target_numel
                                                                             : d->shape.classes;
    if (D > INT64_MAX / TEACHER_HIDDEN / (int64_t)sizeof(float) || C > INT64_MAX / TEACHER_HIDDEN / 8)
        return cdp_fail(CDP_ERR_NOMEM, "synthetic data: teacher for %lld inputs and %lld outputs is too large",
                        (long long)D, (long long)C);
    d->w1 = malloc((size_t)(D * TEACHER_HIDDEN) * sizeof(float));
    d->b1 = malloc(TEACHER_HIDDEN * sizeof(float));
    d->w2 = malloc((size_t)(C * TEACHER_HIDDEN) * sizeof(float));
    d->b2 = calloc((size_t)C, sizeof(float));
    float *x = malloc((size_t)D * sizeof(float)), *h = malloc(TEACHER_HIDDEN * sizeof(float));
    double *mean = calloc((size_t)C, sizeof(double));
    float *y = malloc((size_t)C * sizeof(float));
    if (!d->w1 || !d->b1 || !d->w2 || !d->b2 || !x || !h || !mean || !y) {
        free(x), free(h), free(mean), free(y);
        return cdp_fail(CDP_ERR_NOMEM, "synthetic data: out of memory for the teacher network");
    }
    struct rng r;
    rng_seed(&r, hash4(d->seed, DOM_TEACHER, 0, 0));
    double s1 = 1.0 / sqrt((double)D);
    for (int64_t i = 0; i < D * TEACHER_HIDDEN; i++) d->w1[i] = (float)(rng_normal(&r) * s1);
    for (int j = 0; j < TEACHER_HIDDEN; j++) d->b1[j] = (float)(rng_normal(&r) * 0.1);
    for (int64_t c = 0; c < C; c++) {
        float *w = d->w2 + c * TEACHER_HIDDEN;
        double nrm = 0;
        for (int j = 0; j < TEACHER_HIDDEN; j++) {
            w[j] = (float)rng_normal(&r);
            nrm += (double)w[j] * w[j];
        }
        nrm = sqrt(nrm);
        for (int j = 0; j < TEACHER_HIDDEN; j++) w[j] = (float)(w[j] / (nrm > 0 ? nrm : 1.0));
    }
    /* calibration: a few hundred inputs, fewer when one teacher pass is large */
    double work = (double)D * TEACHER_HIDDEN + (double)C * TEACHER_HIDDEN;
    int64_t n_cal = (int64_t)(33554432.0 / work);
    if (n_cal > 1024) n_cal = 1024;
    if (n_cal < 64) n_cal = 64;
    for (int64_t k = 0; k < n_cal; k++) {
        rng_seed(&r, hash4(d->seed, DOM_CALIB, 0, (uint64_t)k));
        normal_input(&r, x, D);
        teacher_forward(d, x, h, y);
        for (int64_t c = 0; c < C; c++) mean[c] += y[c];
    }
    for (int64_t c = 0; c < C; c++) d->b2[c] = (float)(-mean[c] / (double)n_cal);
    free(x), free(h), free(mean), free(y);
    return CDP_OK;
}

void cdp_data_close(struct cdp_data *d)
{
    if (!d) return;
    if (d->map) munmap(d->map, d->map_size);
    if (d->lmap) munmap(d->lmap, d->lmap_size);
    free(d->path);
    free(d->labels_path);
    free(d->w1);
    free(d->b1);
    free(d->w2);
    free(d->b2);
    free(d);
}

cdp_status cdp_data_open(const struct cdp_data_desc *desc, const struct cdp_model_desc *model,
                         struct cdp_data **out)
{
    cdp_status st;
    CDP_ASSERT(desc && model && out);
    if ((unsigned)desc->source >= CDP_DATA_SOURCE_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "data: unknown source %d", (int)desc->source);
    if ((unsigned)desc->order >= CDP_DATA_ORDER_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "data: unknown order %d", (int)desc->order);
    struct cdp_data *d = calloc(1, sizeof *d);
    if (!d) return cdp_fail(CDP_ERR_NOMEM, "data: out of memory");
    d->source = desc->source;
    d->order = desc->order;
    d->seed = desc->seed;
    d->stride = 1;
    if ((st = shape_from_model(model, &d->shape))) goto fail;
    if (desc->source != CDP_DATA_SYNTHETIC) {
        if (!desc->path) {
            st = cdp_fail(CDP_ERR_INVALID, "data: source \"%s\" needs a file", source_names[desc->source]);
            goto fail;
        }
        if (!(d->path = strdup(desc->path)) || (desc->labels && !(d->labels_path = strdup(desc->labels)))) {
            st = cdp_fail(CDP_ERR_NOMEM, "data: out of memory");
            goto fail;
        }
    }
    switch (desc->source) {
    case CDP_DATA_SYNTHETIC: st = open_synthetic(d); break;
    case CDP_DATA_TEXT: st = open_text(d); break;
    case CDP_DATA_TOKENS: st = open_tokens(d); break;
    case CDP_DATA_IDX: st = open_idx(d, model); break;
    case CDP_DATA_SOURCE_COUNT: st = cdp_fail(CDP_ERR_INVALID, "data: unknown source %d", (int)desc->source); break;
    }
    if (st) goto fail;
    if (desc->source == CDP_DATA_SYNTHETIC)
        CDP_INFO(DATA, "synthetic %s data, seed %llu",
                 d->shape.tokens ? "token" : d->shape.target_is_float ? "regression" : "classification",
                 (unsigned long long)d->seed);
    else
        CDP_INFO(DATA, "%s data from %s: %lld training and %lld validation samples, %s", source_names[d->source],
                 d->path, (long long)d->count[CDP_SPLIT_TRAIN], (long long)d->count[CDP_SPLIT_VAL],
                 d->order == CDP_DATA_ORDER_SEQUENTIAL ? "in file order" : "shuffled every epoch");
    *out = d;
    return CDP_OK;
fail:
    cdp_data_close(d);
    return st;
}

const struct cdp_sample_shape *cdp_data_shape(const struct cdp_data *d) { return &d->shape; }

int64_t cdp_data_split_size(const struct cdp_data *d, enum cdp_split split)
{
    if ((unsigned)split >= CDP_SPLIT_COUNT) return 0;
    return d->count[split];
}

/* Synthetic tokens: token t+1 is one of MARKOV_SUCCESSORS successors of token t
 * (fixed by the seed, with probabilities 1/2, 1/4, 3/20, 1/10), or with
 * probability MARKOV_NOISE any token. */
static void synth_tokens(const struct cdp_data *d, struct rng *r, int32_t *in, int32_t *tgt)
{
    static const double cum[MARKOV_SUCCESSORS] = {0.5, 0.75, 0.9, 1.0};
    int64_t T = d->shape.input_numel;
    uint64_t V = (uint64_t)d->shape.vocab;
    uint64_t tok = rng_below(r, V);
    for (int64_t t = 0; t <= T; t++) {
        if (t < T) in[t] = (int32_t)tok;
        if (t > 0) tgt[t - 1] = (int32_t)tok;
        double u = rng_uniform(r);
        if (u < MARKOV_NOISE) {
            tok = rng_below(r, V);
        } else {
            u = (u - MARKOV_NOISE) / (1.0 - MARKOV_NOISE);
            int k = 0;
            while (k < MARKOV_SUCCESSORS - 1 && u >= cum[k]) k++;
            tok = hash4(d->seed, DOM_MARKOV, tok, (uint64_t)k) % V;
        }
    }
}

static int32_t token_at(const struct cdp_data *d, int64_t pos)
{
    return d->source == CDP_DATA_TEXT ? (int32_t)d->bytes[pos] : (int32_t)d->tokens[pos];
}

cdp_status cdp_data_fetch(struct cdp_data *d, enum cdp_split split, int64_t first_index, int count,
                          void *inputs, void *targets)
{
    CDP_ASSERT(d);
    if ((unsigned)split >= CDP_SPLIT_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "data: unknown split %d", (int)split);
    if (first_index < 0 || count < 0 || first_index > INT64_MAX - count)
        return cdp_fail(CDP_ERR_INVALID, "data: bad sample range %lld + %d", (long long)first_index, count);
    if (count == 0) return CDP_OK;
    CDP_ASSERT(inputs && targets);
    const struct cdp_sample_shape *s = &d->shape;
    int64_t D = s->input_numel, TN = s->target_numel;
    float *h = NULL, *y = NULL;
    if (d->source == CDP_DATA_SYNTHETIC && !s->tokens) {
        h = malloc(TEACHER_HIDDEN * sizeof *h);
        y = malloc((size_t)d->out * sizeof *y);
        if (!h || !y) {
            free(h), free(y);
            return cdp_fail(CDP_ERR_NOMEM, "data: out of memory");
        }
    }
    struct perm p = {0};
    int64_t epoch = -1, n = d->count[split];
    for (int b = 0; b < count; b++) {
        int64_t i = first_index + b;
        int32_t *iin = (int32_t *)inputs + b * D, *itg = (int32_t *)targets + b * TN;
        float *fin = (float *)inputs + b * D, *ftg = (float *)targets + b * TN;
        if (d->source == CDP_DATA_SYNTHETIC) {
            struct rng r;
            rng_seed(&r, hash4(d->seed, DOM_SAMPLE, (uint64_t)split, (uint64_t)i));
            if (s->tokens) {
                synth_tokens(d, &r, iin, itg);
                continue;
            }
            normal_input(&r, fin, D);
            teacher_forward(d, fin, h, y);
            if (s->target_is_float) {
                memcpy(ftg, y, (size_t)TN * sizeof *y);
            } else {
                int64_t best = 0;
                for (int64_t c = 1; c < d->out; c++)
                    if (y[c] > y[best]) best = c;
                itg[0] = (int32_t)best;
            }
            continue;
        }
        int64_t k = i % n;
        if (d->order == CDP_DATA_ORDER_SHUFFLE) {
            if (i / n != epoch) {
                epoch = i / n;
                perm_init(&p, (uint64_t)n, hash4(d->seed, DOM_PERM, (uint64_t)split, (uint64_t)epoch));
            }
            k = (int64_t)perm_apply(&p, (uint64_t)k);
        }
        int64_t item = d->begin[split] + k * d->stride;
        if (s->tokens) {
            for (int64_t t = 0; t < D; t++) {
                iin[t] = token_at(d, item + t);
                itg[t] = token_at(d, item + t + 1);
            }
        } else {
            const uint8_t *px = d->bytes + item * d->item_numel;
            for (int64_t k = 0; k < D; k++) fin[k] = (float)px[k] * (1.0f / 255.0f);
            int label = d->labels[item];
            if (s->target_is_float) {
                memset(ftg, 0, (size_t)TN * sizeof *ftg);
                ftg[label] = 1.0f;
            } else {
                itg[0] = label;
            }
        }
    }
    free(h);
    free(y);
    return CDP_OK;
}
