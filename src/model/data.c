/* Data sources: synthetic (a seeded Markov chain of tokens, or a fixed random
 * teacher network), text (bytes as tokens), tokens (llm.c .bin v1 / uint32,
 * .npy) and idx (MNIST images + labels). Text and token files, one or many
 * (shards), form one token stream read in place through read-only maps. A
 * sample depends only on (seed, split, global index): there is no mutable
 * state after open, so any rank or thread can fetch any sample.
 * Opening a source and its sample shape here; the readers are data_tokens.c,
 * data_idx.c and data_synthetic.c, the fetch data_fetch.c.
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
#include "model/data_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the tokens reader maps little-endian uint16 / uint32 files directly"
#endif

/* ---- the source --------------------------------------------------------------- */

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
cdp_status data_map_file(const char *path, void **base, size_t *size)
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

uint32_t data_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

int32_t data_le32(const uint8_t *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

void cdp_data_close(struct cdp_data *d)
{
    if (!d) return;
    if (d->map) munmap(d->map, d->map_size);
    if (d->lmap) munmap(d->lmap, d->lmap_size);
    data_close_stream(&d->streams[0]);
    data_close_stream(&d->streams[1]);
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
    case CDP_DATA_SYNTHETIC: st = data_open_synthetic(d); break;
    case CDP_DATA_TEXT: st = data_open_token_source(d, desc); break;
    case CDP_DATA_TOKENS: st = data_open_token_source(d, desc); break;
    case CDP_DATA_IDX: st = data_open_idx(d, model); break;
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
    if (desc->source != CDP_DATA_SYNTHETIC) pthread_once(&data_guard_once, data_guard_install);
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
