/* Data sources (data.h): idx files (MNIST images + labels), mapped. */
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

#define IDX_IMAGES_MAGIC 0x00000803u
#define IDX_IMAGES_C_MAGIC 0x00000804u /* n, channels, rows, cols */
#define IDX_LABELS_MAGIC 0x00000801u

cdp_status data_open_idx(struct cdp_data *d, const struct cdp_model_desc *m)
{
    cdp_status st;
    if (d->shape.tokens)
        return cdp_fail(CDP_ERR_INVALID, "%s: idx images need a model with float inputs, not a token model",
                        d->path);
    if (!d->labels_path) return cdp_fail(CDP_ERR_INVALID, "%s: idx data needs a labels file", d->path);
    if ((st = data_map_file(d->path, &d->map, &d->map_size))) return st;
    const uint8_t *p = d->map;
    if (d->map_size < 4)
        return cdp_fail(CDP_ERR_INVALID, "%s: too short for an IDX header (%zu bytes)", d->path, d->map_size);
    uint32_t magic = data_be32(p);
    if (magic != IDX_IMAGES_MAGIC && magic != IDX_IMAGES_C_MAGIC)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: not an IDX images file (magic 0x%08x, expected 0x%08x, or 0x%08x with channels)",
                        d->path, magic, IDX_IMAGES_MAGIC, IDX_IMAGES_C_MAGIC);
    int ndim = p[3];
    size_t hdr = 4 + 4 * (size_t)ndim;
    if (d->map_size < hdr)
        return cdp_fail(CDP_ERR_INVALID, "%s: truncated IDX header (%zu bytes, needs %zu)", d->path, d->map_size,
                        hdr);
    int64_t n = data_be32(p + 4), dims[3] = {1, 1, 1}; /* channels, rows, cols */
    for (int i = 1; i < ndim; i++) dims[3 - ndim + i] = data_be32(p + 4 + 4 * i);
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

    if ((st = data_map_file(d->labels_path, &d->lmap, &d->lmap_size))) return st;
    const uint8_t *q = d->lmap;
    if (d->lmap_size < 8)
        return cdp_fail(CDP_ERR_INVALID, "%s: too short for an IDX labels header (%zu bytes, needs 8)",
                        d->labels_path, d->lmap_size);
    if (data_be32(q) != IDX_LABELS_MAGIC)
        return cdp_fail(CDP_ERR_INVALID, "%s: not an IDX labels file (magic 0x%08x, expected 0x%08x)",
                        d->labels_path, data_be32(q), IDX_LABELS_MAGIC);
    int64_t nl = data_be32(q + 4);
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
