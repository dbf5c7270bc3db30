/* Data sources: synthetic (a seeded Markov chain of tokens, or a fixed random
 * teacher network), text (bytes as tokens), tokens (llm.c .bin v1 / uint32,
 * .npy) and idx (MNIST images + labels). Text and token files, one or many
 * (shards), form one token stream read in place through read-only maps. A
 * sample depends only on (seed, split, global index): there is no mutable
 * state after open, so any rank or thread can fetch any sample.
 * Shape legend: T tokens per sample, D input values, C classes, H teacher width. */
#include "model/data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/hash.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the tokens reader maps little-endian uint16 / uint32 files directly"
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

/* ---- guarded reads of mapped files ---------------------------------------------
 * A mapped file that shrinks (truncated, or rewritten in place) under a running
 * job turns the next read of a lost page into SIGBUS. Every read of mapped data
 * in cdp_data_fetch runs armed: a SIGBUS handler, installed once per process,
 * jumps back to the fetch of the thread that faulted, which reports the file
 * that holds the address. A SIGBUS nobody armed for (another mapping, kill -BUS)
 * gets the disposition that was there before ours. Checking the size with fstat
 * before each read would cost a system call per sample and still race with a
 * truncation between the check and the read; the handler costs nothing until
 * the fault and catches every one. SA_NODEFER keeps SIGBUS unblocked in the
 * handler, so the jump needs no signal mask saved (sigsetjmp(.., 0): no system
 * call per fetch). */

static _Thread_local sigjmp_buf *volatile guard_jmp;
static _Thread_local void *volatile guard_addr;
static struct sigaction guard_prev;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;

static void guard_handler(int sig, siginfo_t *si, void *uc)
{
    sigjmp_buf *j = guard_jmp;
    if (j) {
        guard_addr = si->si_addr;
        guard_jmp = NULL;
        siglongjmp(*j, 1);
    }
    /* not ours: the previous disposition, then the fault again (a memory fault
     * re-runs its instruction; a sent signal is raised again) */
    sigaction(SIGBUS, &guard_prev, NULL);
    if (si->si_code <= 0) raise(sig);
    (void)uc;
}

static void guard_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = guard_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &guard_prev);
}

/* The message for a fault at addr: the file whose map holds it, its size now
 * and when it was opened. */
static cdp_status fault_error(const struct cdp_data *d, const void *addr)
{
    const uint8_t *a = addr;
    const char *path = NULL;
    size_t was = 0;
    for (int s = 0; s < 2 && !path; s++)
        for (int i = 0; i < d->streams[s].n; i++) {
            const struct shard *h = &d->streams[s].sh[i];
            if (h->map && a >= (const uint8_t *)h->map && a < (const uint8_t *)h->map + h->map_size) {
                path = h->path;
                was = h->map_size;
                break;
            }
        }
    if (!path && d->map && a >= (const uint8_t *)d->map && a < (const uint8_t *)d->map + d->map_size)
        path = d->path, was = d->map_size;
    if (!path && d->lmap && a >= (const uint8_t *)d->lmap && a < (const uint8_t *)d->lmap + d->lmap_size)
        path = d->labels_path, was = d->lmap_size;
    if (!path)
        return cdp_fail(CDP_ERR_IO, "data: a data file changed while it was read (bus error at %p)", addr);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return cdp_fail(CDP_ERR_IO, "%s: the file changed while training read it: it is gone now (%s); it had %zu "
                        "bytes when opened", path, strerror(errno), was);
    return cdp_fail(CDP_ERR_IO, "%s: the file changed while training read it: it has %lld bytes now, %zu when "
                    "opened (data files are read in place: do not truncate or rewrite them during a run)",
                    path, (long long)sb.st_size, was);
}

/* ---- token streams (text, tokens) ----------------------------------------------- */

#define LLMC_MAGIC 20240520        /* llm.c, GPT-2: version 1, uint16 tokens */
#define LLMC_MAGIC_U32 20240801    /* llm.c, Llama 3: version 7, uint32 tokens */
#define LLMC_VERSION_U32 7
#define LLMC_HEADER_BYTES 1024
#define SCAN_AT_OPEN_BYTES (64ll << 20) /* tokens checked against the vocabulary at open */

/* "a.bin" or "a.bin and 3 more files": how messages name a stream. */
static const char *stream_name(const struct stream *s, char *buf, size_t cap)
{
    if (s->n <= 1) return s->n ? s->sh[0].path : "";
    snprintf(buf, cap, "%s and %d more file%s", s->sh[0].path, s->n - 1, s->n > 2 ? "s" : "");
    return buf;
}

/* A tiny reader of the Python literal numpy writes as a .npy header:
 * {'descr': '<u2', 'fortran_order': False, 'shape': (N,), } */
struct pylit {
    const char *p, *end;
};

static void py_space(struct pylit *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\n' || *r->p == '\t')) r->p++;
}

static int py_char(struct pylit *r, char c)
{
    py_space(r);
    if (r->p < r->end && *r->p == c) {
        r->p++;
        return 1;
    }
    return 0;
}

/* A quoted string into buf (at most cap-1 characters); 0 when there is none. */
static int py_string(struct pylit *r, char *buf, size_t cap)
{
    py_space(r);
    if (r->p >= r->end || (*r->p != '\'' && *r->p != '"')) return 0;
    const char q = *r->p++;
    size_t k = 0;
    while (r->p < r->end && *r->p != q) {
        if (k + 1 >= cap) return 0;
        buf[k++] = *r->p++;
    }
    if (r->p >= r->end) return 0;
    r->p++;
    buf[k] = '\0';
    return 1;
}

static cdp_status npy_header(const char *path, const uint8_t *p, size_t size, int *width, int64_t *count,
                             size_t *data_off)
{
    if (size < 10)
        return cdp_fail(CDP_ERR_INVALID, "%s: too short for a .npy header (%zu bytes)", path, size);
    const int major = p[6];
    size_t hlen, off;
    if (major == 1) {
        hlen = (size_t)p[8] | (size_t)p[9] << 8;
        off = 10;
    } else if (major == 2 || major == 3) {
        if (size < 12) return cdp_fail(CDP_ERR_INVALID, "%s: too short for a .npy header (%zu bytes)", path, size);
        hlen = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
        off = 12;
    } else {
        return cdp_fail(CDP_ERR_INVALID, "%s: .npy format version %d.%d (expected 1, 2 or 3)", path, major, p[7]);
    }
    if (hlen > size - off)
        return cdp_fail(CDP_ERR_INVALID, "%s: truncated .npy header (%zu bytes announced, %zu in the file)", path,
                        hlen, size - off);
    struct pylit r = {(const char *)p + off, (const char *)p + off + hlen};
    char key[32], descr[16] = "";
    int fortran = -1, have_shape = 0, ndim = 0;
    int64_t n = 0;
    if (!py_char(&r, '{')) return cdp_fail(CDP_ERR_INVALID, "%s: .npy header is not a dictionary", path);
    while (!py_char(&r, '}')) {
        if (!py_string(&r, key, sizeof key) || !py_char(&r, ':'))
            return cdp_fail(CDP_ERR_INVALID, "%s: .npy header: expected 'key': value", path);
        if (!strcmp(key, "descr")) {
            if (!py_string(&r, descr, sizeof descr))
                return cdp_fail(CDP_ERR_INVALID, "%s: .npy header: 'descr' is not a simple type string", path);
        } else if (!strcmp(key, "fortran_order")) {
            py_space(&r);
            if (r.end - r.p >= 5 && !memcmp(r.p, "False", 5)) fortran = 0, r.p += 5;
            else if (r.end - r.p >= 4 && !memcmp(r.p, "True", 4)) fortran = 1, r.p += 4;
            else return cdp_fail(CDP_ERR_INVALID, "%s: .npy header: 'fortran_order' is not True or False", path);
        } else if (!strcmp(key, "shape")) {
            if (!py_char(&r, '(')) return cdp_fail(CDP_ERR_INVALID, "%s: .npy header: 'shape' is not a tuple", path);
            have_shape = 1;
            n = 1;
            while (!py_char(&r, ')')) {
                py_space(&r);
                int64_t v = 0;
                int digits = 0;
                while (r.p < r.end && *r.p >= '0' && *r.p <= '9') {
                    if (v > (INT64_MAX - 9) / 10)
                        return cdp_fail(CDP_ERR_INVALID, "%s: .npy header: absurd shape", path);
                    v = v * 10 + (*r.p++ - '0');
                    digits++;
                }
                if (!digits) return cdp_fail(CDP_ERR_INVALID, "%s: .npy header: bad 'shape'", path);
                ndim++;
                n = v;
                py_char(&r, ',');
            }
        } else {
            return cdp_fail(CDP_ERR_INVALID, "%s: .npy header: unknown key '%s'", path, key);
        }
        py_char(&r, ',');
    }
    if (!descr[0] || fortran < 0 || !have_shape)
        return cdp_fail(CDP_ERR_INVALID, "%s: .npy header lacks %s", path,
                        !descr[0] ? "'descr'" : fortran < 0 ? "'fortran_order'" : "'shape'");
    if (!strcmp(descr, "<u2")) *width = 2;
    else if (!strcmp(descr, "<u4")) *width = 4;
    else
        return cdp_fail(CDP_ERR_INVALID, "%s: a .npy array of '%s'; token arrays must be uint16 ('<u2') or uint32 "
                        "('<u4')", path, descr);
    if (ndim != 1)
        return cdp_fail(CDP_ERR_INVALID, "%s: a .npy array of %d dimensions; token arrays must have one", path, ndim);
    *count = n;
    *data_off = off + hlen;
    return CDP_OK;
}

/* The header of a tokens file: llm.c's (either magic) or .npy. */
static cdp_status token_header(const char *path, const uint8_t *p, size_t size, int *width, int64_t *count,
                               size_t *data_off)
{
    if (size >= 6 && !memcmp(p, "\x93NUMPY", 6)) return npy_header(path, p, size, width, count, data_off);
    if (size < LLMC_HEADER_BYTES)
        return cdp_fail(CDP_ERR_INVALID, "%s: too short for an llm.c token file header (%zu bytes, needs %d)", path,
                        size, LLMC_HEADER_BYTES);
    int32_t magic = le32(p), version = le32(p + 4), n = le32(p + 8);
    if (magic == LLMC_MAGIC) {
        if (version != 1)
            return cdp_fail(CDP_ERR_INVALID, "%s: unsupported token file version %ld (expected 1: uint16 tokens)",
                            path, (long)version);
        *width = 2;
    } else if (magic == LLMC_MAGIC_U32) {
        if (version != LLMC_VERSION_U32)
            return cdp_fail(CDP_ERR_INVALID,
                            "%s: unsupported token file version %ld for magic %d (expected %d: uint32 tokens)", path,
                            (long)version, LLMC_MAGIC_U32, LLMC_VERSION_U32);
        *width = 4;
    } else {
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: not an llm.c token file (magic %ld, expected %d) nor its uint32 form (magic %d), "
                        "nor a .npy array", path, (long)magic, LLMC_MAGIC, LLMC_MAGIC_U32);
    }
    if (n < 0) return cdp_fail(CDP_ERR_INVALID, "%s: bad header: negative token count %ld", path, (long)n);
    *count = n;
    *data_off = LLMC_HEADER_BYTES;
    return CDP_OK;
}

static uint32_t shard_token(const struct shard *h, int64_t i)
{
    const uint8_t *q = h->tok + i * h->width;
    if (h->width == 1) return q[0];
    if (h->width == 2) return (uint32_t)q[0] | (uint32_t)q[1] << 8;
    return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}

static cdp_status vocab_error(const struct cdp_data *d, const struct shard *h, int64_t i, uint32_t v)
{
    return cdp_fail(CDP_ERR_INVALID, "%s: token %lu at position %lld is outside the model's vocabulary (vocab %lld)",
                    h->path, (unsigned long)v, (long long)i, (long long)d->shape.vocab);
}

/* Maps one file of a stream and reads its header (text: none). */
static cdp_status open_shard(struct cdp_data *d, struct shard *h)
{
    cdp_status st;
    if ((st = map_file(h->path, &h->map, &h->map_size))) return st;
    if (h->map && d->order == CDP_DATA_ORDER_SHUFFLE) madvise(h->map, h->map_size, MADV_RANDOM);
    const uint8_t *p = h->map;
    if (d->source == CDP_DATA_TEXT) {
        h->tok = p;
        h->width = 1;
        h->count = (int64_t)h->map_size;
        h->checked = 1; /* bytes are below 256 <= vocab */
        return CDP_OK;
    }
    size_t off = 0;
    if ((st = token_header(h->path, p, h->map_size, &h->width, &h->count, &off))) return st;
    uint64_t want, have = h->map_size - off;
    if (__builtin_mul_overflow((uint64_t)h->count, (uint64_t)h->width, &want))
        return cdp_fail(CDP_ERR_INVALID, "%s: absurd token count %lld", h->path, (long long)h->count);
    if (have < want)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: truncated: header says %lld tokens (%llu bytes), the file has %llu bytes after the "
                        "header",
                        h->path, (long long)h->count, (unsigned long long)want, (unsigned long long)have);
    if (have > want)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: header says %lld tokens (%llu bytes), but the file has %llu bytes after the header "
                        "(trailing data)",
                        h->path, (long long)h->count, (unsigned long long)want, (unsigned long long)have);
    h->tok = p + off;
    /* small data is checked whole now; the rest window by window as it is read,
     * so that a 20 GB data set is not read at open */
    if ((int64_t)want <= d->scan_budget) {
        d->scan_budget -= (int64_t)want;
        for (int64_t i = 0; i < h->count; i++) {
            const uint32_t v = shard_token(h, i);
            if (v >= (uint64_t)d->shape.vocab) return vocab_error(d, h, i, v);
        }
        h->checked = 1;
    }
    return CDP_OK;
}

static cdp_status open_stream(struct cdp_data *d, struct stream *s, char *const *paths, int n)
{
    cdp_status st;
    if (!(s->sh = calloc((size_t)n, sizeof *s->sh))) return cdp_fail(CDP_ERR_NOMEM, "data: out of memory");
    for (int i = 0; i < n; i++) {
        struct shard *h = &s->sh[s->n++];
        if (!(h->path = strdup(paths[i]))) return cdp_fail(CDP_ERR_NOMEM, "data: out of memory");
        if ((st = open_shard(d, h))) return st;
        h->start = s->total;
        if (__builtin_add_overflow(s->total, h->count, &s->total))
            return cdp_fail(CDP_ERR_INVALID, "%s: more than 2^63 tokens in all", h->path);
    }
    return CDP_OK;
}

static void close_stream(struct stream *s)
{
    for (int i = 0; i < s->n; i++) {
        if (s->sh[i].map) munmap(s->sh[i].map, s->sh[i].map_size);
        free(s->sh[i].path);
    }
    free(s->sh);
    memset(s, 0, sizeof *s);
}

/* Tokens [pos, pos + n) of a stream as int32, each checked against the
 * vocabulary unless its file was checked whole at open. */
static cdp_status read_tokens(const struct cdp_data *d, const struct stream *s, int64_t pos, int64_t n, int32_t *out)
{
    int lo = 0, hi = s->n - 1; /* the last file that starts at or before pos */
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (s->sh[mid].start <= pos) lo = mid;
        else hi = mid - 1;
    }
    for (int k = lo; n > 0; k++) {
        CDP_ASSERT(k < s->n);
        const struct shard *h = &s->sh[k];
        const int64_t off = pos - h->start, m = n < h->count - off ? n : h->count - off;
        for (int64_t j = 0; j < m; j++) {
            const uint32_t v = shard_token(h, off + j);
            if (!h->checked && v >= (uint64_t)d->shape.vocab) return vocab_error(d, h, off + j, v);
            out[j] = (int32_t)v;
        }
        out += m;
        pos += m;
        n -= m;
    }
    return CDP_OK;
}

/* The splits of a token source (docs/data.md): without val_path, the last
 * n/10 tokens of the stream are validation; with it, data.path's stream is
 * training and val_path's validation. A sample is a window of T+1 tokens
 * starting inside its split: shuffled, at any of the split's L - T positions;
 * sequential, at the (L - 1) / T positions 0, T, 2T, ... (consecutive windows
 * share one token: the last target of one is the first input of the next, as
 * in llm.c). */
static cdp_status split_tokens(struct cdp_data *d, const char *unit)
{
    const int64_t T = d->shape.input_numel;
    char nb[2][4200];
    int64_t len[CDP_SPLIT_COUNT];
    if (d->streams[1].n == 0) {
        const int64_t n = d->streams[0].total, n_val = n / 10, n_train = n - n_val;
        if (n_val < T + 1) {
            long long need = (T + 1) > INT64_MAX / 10 ? (long long)INT64_MAX : (long long)(10 * (T + 1));
            return cdp_fail(CDP_ERR_INVALID,
                            "%s: too short for one sample of %lld tokens in the validation split (the last "
                            "10%% of the %s; needs at least %lld %s, the %s %lld)",
                            stream_name(&d->streams[0], nb[0], sizeof nb[0]), (long long)(T + 1),
                            d->streams[0].n > 1 ? "files" : "file", need, unit,
                            d->streams[0].n > 1 ? "files have" : "file has", (long long)n);
        }
        d->split_stream[CDP_SPLIT_TRAIN] = d->split_stream[CDP_SPLIT_VAL] = 0;
        d->begin[CDP_SPLIT_TRAIN] = 0;
        d->begin[CDP_SPLIT_VAL] = n_train;
        len[CDP_SPLIT_TRAIN] = n_train;
        len[CDP_SPLIT_VAL] = n_val;
    } else {
        for (int s = 0; s < 2; s++) {
            if (d->streams[s].total < T + 1)
                return cdp_fail(CDP_ERR_INVALID,
                                "%s: too short for one sample of %lld tokens in the %s split (%s %lld %s)",
                                stream_name(&d->streams[s], nb[s], sizeof nb[s]), (long long)(T + 1),
                                s ? "validation" : "training", d->streams[s].n > 1 ? "the files have" : "the file has",
                                (long long)d->streams[s].total, unit);
            d->split_stream[s] = s;
            d->begin[s] = 0;
            len[s] = d->streams[s].total;
        }
    }
    for (int s = 0; s < CDP_SPLIT_COUNT; s++) {
        if (d->order == CDP_DATA_ORDER_SEQUENTIAL) {
            d->stride = T;
            d->count[s] = (len[s] - 1) / T;
        } else {
            d->count[s] = len[s] - T;
        }
    }
    return CDP_OK;
}

static cdp_status open_token_source(struct cdp_data *d, const struct cdp_data_desc *desc)
{
    cdp_status st;
    const int text = d->source == CDP_DATA_TEXT;
    if (!d->shape.tokens) {
        if (text)
            return cdp_fail(CDP_ERR_INVALID, "%s: text data gives byte tokens, but the model takes %s", d->path,
                            d->shape.target_is_float ? "float inputs (regression)" : "float inputs (classification)");
        return cdp_fail(CDP_ERR_INVALID, "%s: token data needs a token model (gpt, or a layer list that "
                                         "starts with an embedding)", d->path);
    }
    if (text && d->shape.vocab < 256)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: text data gives byte tokens 0..255, but the model's vocabulary has only %lld "
                        "tokens (needs >= 256)",
                        d->path, (long long)d->shape.vocab);
    d->scan_budget = SCAN_AT_OPEN_BYTES;
    char *const one[1] = {d->path};
    if ((st = desc->n_paths > 0 ? open_stream(d, &d->streams[0], desc->paths, desc->n_paths)
                                : open_stream(d, &d->streams[0], one, 1)))
        return st;
    if (desc->n_val_paths > 0 && (st = open_stream(d, &d->streams[1], desc->val_paths, desc->n_val_paths)))
        return st;
    return split_tokens(d, text ? "bytes" : "tokens");
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
    close_stream(&d->streams[0]);
    close_stream(&d->streams[1]);
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
    case CDP_DATA_TEXT: st = open_token_source(d, desc); break;
    case CDP_DATA_TOKENS: st = open_token_source(d, desc); break;
    case CDP_DATA_IDX: st = open_idx(d, model); break;
    case CDP_DATA_SOURCE_COUNT: st = cdp_fail(CDP_ERR_INVALID, "data: unknown source %d", (int)desc->source); break;
    }
    if (st) goto fail;
    if (desc->source == CDP_DATA_SYNTHETIC)
        CDP_INFO(DATA, "synthetic %s data, seed %llu",
                 d->shape.tokens ? "token" : d->shape.target_is_float ? "regression" : "classification",
                 (unsigned long long)d->seed);
    else
        CDP_INFO(DATA, "%s data from %s%s: %lld training and %lld validation samples, %s", source_names[d->source],
                 d->path, d->streams[0].n > 1 ? " and more" : "", (long long)d->count[CDP_SPLIT_TRAIN],
                 (long long)d->count[CDP_SPLIT_VAL],
                 d->order == CDP_DATA_ORDER_SEQUENTIAL ? "in file order" : "shuffled every epoch");
    if (desc->source != CDP_DATA_SYNTHETIC) pthread_once(&guard_once, guard_install);
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

/* Samples of a file source: the reads of mapped data that the SIGBUS guard
 * covers (it allocates nothing, so a jump out of it leaks nothing). */
static cdp_status fetch_files(const struct cdp_data *d, enum cdp_split split, int64_t first_index, int count,
                              void *inputs, void *targets)
{
    cdp_status st;
    const struct cdp_sample_shape *s = &d->shape;
    const int64_t D = s->input_numel, TN = s->target_numel;
    struct perm p = {0};
    int64_t epoch = -1, n = d->count[split];
    for (int b = 0; b < count; b++) {
        int64_t i = first_index + b;
        int32_t *iin = (int32_t *)inputs + b * D, *itg = (int32_t *)targets + b * TN;
        float *fin = (float *)inputs + b * D, *ftg = (float *)targets + b * TN;
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
            /* the window tok[item .. item + T]: inputs its first T, targets its last T */
            const struct stream *str = &d->streams[d->split_stream[split]];
            if ((st = read_tokens(d, str, item, D, iin))) return st;
            memcpy(itg, iin + 1, (size_t)(D - 1) * sizeof *itg);
            if ((st = read_tokens(d, str, item + D, 1, itg + D - 1))) return st;
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
    return CDP_OK;
}

/* Pages of the token maps a process has touched count in its RSS until it
 * unmaps them, though the kernel may drop them at will (clean file pages):
 * after a long run over a 20 GB data set the RSS would read 20 GB. Every
 * RELEASE_EVERY windows the maps' page-table entries are let go
 * (MADV_DONTNEED on a read-only file map: the pages stay in the page cache and
 * the next read maps them again), so the RSS holds the recent windows only. */
#define RELEASE_EVERY 64

static void release_pages(struct cdp_data *d, int count)
{
    if (__atomic_add_fetch(&d->windows, count, __ATOMIC_RELAXED) < RELEASE_EVERY) return;
    __atomic_store_n(&d->windows, 0, __ATOMIC_RELAXED);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < d->streams[s].n; i++)
            if (d->streams[s].sh[i].map) madvise(d->streams[s].sh[i].map, d->streams[s].sh[i].map_size, MADV_DONTNEED);
}

/* fetch_files under the SIGBUS guard (see guard_handler). */
static cdp_status fetch_guarded(const struct cdp_data *d, enum cdp_split split, int64_t first_index, int count,
                                void *inputs, void *targets)
{
    sigjmp_buf jb;
    if (sigsetjmp(jb, 0)) {
        guard_jmp = NULL;
        return fault_error(d, guard_addr);
    }
    guard_jmp = &jb;
    cdp_status st = fetch_files(d, split, first_index, count, inputs, targets);
    guard_jmp = NULL;
    return st;
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
    if (d->source != CDP_DATA_SYNTHETIC) {
        cdp_status st = fetch_guarded(d, split, first_index, count, inputs, targets);
        if (!st && d->shape.tokens) release_pages(d, count);
        return st;
    }
    const struct cdp_sample_shape *s = &d->shape;
    int64_t D = s->input_numel, TN = s->target_numel;
    float *h = NULL, *y = NULL;
    if (!s->tokens) {
        h = malloc(TEACHER_HIDDEN * sizeof *h);
        y = malloc((size_t)d->out * sizeof *y);
        if (!h || !y) {
            free(h), free(y);
            return cdp_fail(CDP_ERR_NOMEM, "data: out of memory");
        }
    }
    for (int b = 0; b < count; b++) {
        int64_t i = first_index + b;
        int32_t *iin = (int32_t *)inputs + b * D, *itg = (int32_t *)targets + b * TN;
        float *fin = (float *)inputs + b * D, *ftg = (float *)targets + b * TN;
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
    }
    free(h);
    free(y);
    return CDP_OK;
}
