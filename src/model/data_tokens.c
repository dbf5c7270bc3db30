/* Data sources (data.h): token streams of text (bytes as tokens) and token
 * files (llm.c .bin v1 / uint32, .npy), one or many shards end to end, read
 * in place through read-only maps and checked against the vocabulary. */
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
#include "model/data_internal.h"

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
    int32_t magic = data_le32(p), version = data_le32(p + 4), n = data_le32(p + 8);
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
    if ((st = data_map_file(h->path, &h->map, &h->map_size))) return st;
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

void data_close_stream(struct stream *s)
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
cdp_status data_read_tokens(const struct cdp_data *d, const struct stream *s, int64_t pos, int64_t n, int32_t *out)
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

cdp_status data_open_token_source(struct cdp_data *d, const struct cdp_data_desc *desc)
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

