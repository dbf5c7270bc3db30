/* safetensors reader (validated, memory-mapped) and atomic writer. The format:
 * an 8-byte little-endian header length N, N bytes of JSON, then the data
 * section, which the tensors' [begin, end) byte ranges must cover exactly. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian and is read in place"
#endif

/* The reference implementation refuses headers above 100 MB. */
#define ST_MAX_HEADER 100000000ull

struct st_dtype {
    const char *name;
    unsigned size;
    enum cdp_dtype dtype; /* CDP_DTYPE_COUNT when the library has no such dtype */
};

static const struct st_dtype st_dtypes[] = {
    {"F64", 8, CDP_DTYPE_COUNT},      {"F32", 4, CDP_DTYPE_F32},       {"F16", 2, CDP_DTYPE_COUNT},
    {"BF16", 2, CDP_DTYPE_BF16},      {"I64", 8, CDP_DTYPE_COUNT},     {"I32", 4, CDP_DTYPE_I32},
    {"I16", 2, CDP_DTYPE_COUNT},      {"I8", 1, CDP_DTYPE_COUNT},      {"U64", 8, CDP_DTYPE_COUNT},
    {"U32", 4, CDP_DTYPE_COUNT},      {"U16", 2, CDP_DTYPE_COUNT},     {"U8", 1, CDP_DTYPE_COUNT},
    {"BOOL", 1, CDP_DTYPE_COUNT},     {"F8_E4M3", 1, CDP_DTYPE_COUNT}, {"F8_E5M2", 1, CDP_DTYPE_COUNT},
};
#define N_DTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

static const struct st_dtype *dtype_by_name(const char *name)
{
    for (int i = 0; i < N_DTYPES; i++)
        if (!strcmp(st_dtypes[i].name, name)) return &st_dtypes[i];
    return NULL;
}

static const struct st_dtype *dtype_by_enum(enum cdp_dtype t)
{
    for (int i = 0; i < N_DTYPES; i++)
        if (st_dtypes[i].dtype == t && t != CDP_DTYPE_COUNT) return &st_dtypes[i];
    return NULL;
}

struct cdp_safetensors_file {
    char *path;
    void *map;
    size_t map_size;
    int n;
    struct cdp_safetensors_tensor *tensors; /* names and dtype names point into names/ */
    char **names;
    int n_meta;
    char **meta; /* key, value pairs (owned) */
    struct cdp_safetensors_file **shards; /* a sharded set (an index): its files, which own the
                                             tensors' names and data; names is NULL then */
    int n_shards;
};

void cdp_safetensors_close(struct cdp_safetensors_file *f)
{
    if (!f) return;
    if (f->map) munmap(f->map, f->map_size);
    for (int i = 0; i < f->n; i++) free(f->names ? f->names[i] : NULL);
    for (int i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
    for (int i = 0; i < f->n_shards; i++) cdp_safetensors_close(f->shards[i]);
    free(f->shards);
    free(f->names);
    free(f->meta);
    free(f->tensors);
    free(f->path);
    free(f);
}

/* A non-negative JSON integer. */
static int json_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

static int cmp_range(const void *a, const void *b, void *ctx)
{
    const struct cdp_safetensors_tensor *ts = ctx;
    const struct cdp_safetensors_tensor *x = &ts[*(const int *)a], *y = &ts[*(const int *)b];
    const uint8_t *xa = x->data, *ya = y->data;
    if (xa != ya) return xa < ya ? -1 : 1;
    /* empty tensors first, so that a tensor sharing their offset follows them */
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static cdp_status parse_tensor(struct cdp_safetensors_file *f, const char *name, const json_t *v, const uint8_t *data,
                               uint64_t data_size, struct cdp_safetensors_tensor *t)
{
    const char *p = f->path;
    if (!json_is_object(v))
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": expected an object with dtype, shape and "
                                         "data_offsets", p, name);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": unknown key \"%s\"", p, name, key);
    }
    const json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
                 *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": dtype missing or not a string", p, name);
    const struct st_dtype *dt = dtype_by_name(json_string_value(jd));
    if (!dt)
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": unknown dtype \"%s\"", p, name,
                        json_string_value(jd));
    if (!json_is_array(js))
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": shape missing or not an array", p, name);
    size_t nd = json_array_size(js);
    if (nd > CDP_MAX_DIMS)
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": %zu dimensions, at most %d are supported", p, name,
                        nd, CDP_MAX_DIMS);
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t dim;
        if (!json_uint(json_array_get(js, i), &dim))
            return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": shape[%zu] is not a non-negative integer", p,
                            name, i);
        if (__builtin_mul_overflow(numel, dim, &numel))
            return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": shape overflows", p, name);
        t->shape[i] = (int64_t)dim;
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, (uint64_t)dt->size, &nbytes))
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": shape overflows", p, name);
    uint64_t b, e;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_uint(json_array_get(jo, 0), &b) ||
        !json_uint(json_array_get(jo, 1), &e))
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": data_offsets must be [begin, end], two "
                                         "non-negative integers", p, name);
    if (e < b)
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before they begin", p,
                        name, (unsigned long long)b, (unsigned long long)e);
    if (e - b != nbytes)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: tensor \"%s\": %s of %llu elements needs %llu bytes, data_offsets [%llu, %llu] "
                        "hold %llu",
                        p, name, dt->name, (unsigned long long)numel, (unsigned long long)nbytes,
                        (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b));
    if (e > data_size)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: tensor \"%s\": data_offsets [%llu, %llu] run past the data section (%llu bytes)", p,
                        name, (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_size);
    t->dtype = dt->dtype;
    t->dtype_name = dt->name;
    t->ndim = (int)nd;
    t->data = data + b;
    t->nbytes = nbytes;
    return CDP_OK;
}

static cdp_status parse_metadata(struct cdp_safetensors_file *f, const json_t *v)
{
    if (!json_is_object(v))
        return cdp_fail(CDP_ERR_INVALID, "%s: __metadata__ must be an object of strings", f->path);
    size_t n = json_object_size(v);
    f->meta = calloc(2 * n + 1, sizeof *f->meta);
    if (!f->meta) return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", f->path);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        if (!json_is_string(val))
            return cdp_fail(CDP_ERR_INVALID, "%s: __metadata__ \"%s\": expected a string value", f->path, key);
        int i = f->n_meta;
        f->meta[2 * i] = strdup(key);
        f->meta[2 * i + 1] = strdup(json_string_value(val));
        f->n_meta++;
        if (!f->meta[2 * i] || !f->meta[2 * i + 1]) return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", f->path);
    }
    return CDP_OK;
}

static cdp_status open_index(const char *path, struct cdp_safetensors_file **out);

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

cdp_status cdp_safetensors_open(const char *path, struct cdp_safetensors_file **out)
{
    cdp_status st;
    CDP_ASSERT(path && out);
    if (ends_with(path, ".json")) return open_index(path, out);
    json_t *root = NULL;
    int *order = NULL;
    CDP_ASSERT(path && out);
    struct cdp_safetensors_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = cdp_fail(CDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = cdp_fail(CDP_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: not a regular file", path);
        close(fd);
        goto fail;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        close(fd);
        st = cdp_fail(CDP_ERR_INVALID, "%s: too short for a safetensors file (%llu bytes, needs at least 8)", path,
                      (unsigned long long)size);
        goto fail;
    }
    f->map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        st = cdp_fail(CDP_ERR_IO, "%s: cannot map: %s", path, strerror(map_errno));
        goto fail;
    }
    f->map_size = (size_t)size;
    const uint8_t *base = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | base[i];
    if (hlen > ST_MAX_HEADER) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: header length %llu is absurd (at most %llu bytes; not a safetensors "
                                       "file?)", path, (unsigned long long)hlen, ST_MAX_HEADER);
        goto fail;
    }
    if (hlen > size - 8) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: header length %llu runs past the end of the file (%llu bytes)", path,
                      (unsigned long long)hlen, (unsigned long long)size);
        goto fail;
    }
    if (hlen < 2) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: header of %llu bytes cannot hold a JSON object", path,
                      (unsigned long long)hlen);
        goto fail;
    }
    json_error_t jerr;
    root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: header JSON: %s (line %d, column %d)", path, jerr.text, jerr.line,
                      jerr.column);
        goto fail;
    }
    if (!json_is_object(root)) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: header JSON is not an object", path);
        goto fail;
    }
    const uint8_t *data = base + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;
    size_t cap = json_object_size(root);
    f->tensors = calloc(cap + 1, sizeof *f->tensors);
    f->names = calloc(cap + 1, sizeof *f->names);
    order = calloc(cap + 1, sizeof *order);
    if (!f->tensors || !f->names || !order) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if ((st = parse_metadata(f, val))) goto fail;
            continue;
        }
        if (!key[0]) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: a tensor has an empty name", path);
            goto fail;
        }
        struct cdp_safetensors_tensor *t = &f->tensors[f->n];
        if (!(f->names[f->n] = strdup(key))) {
            st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        t->name = f->names[f->n];
        f->n++;
        if ((st = parse_tensor(f, key, val, data, data_size, t))) goto fail;
    }
    /* the ranges, in file order, must tile the data section */
    for (int i = 0; i < f->n; i++) order[i] = i;
    qsort_r(order, (size_t)f->n, sizeof *order, cmp_range, f->tensors);
    uint64_t at = 0;
    for (int k = 0; k < f->n; k++) {
        const struct cdp_safetensors_tensor *t = &f->tensors[order[k]];
        uint64_t b = (uint64_t)((const uint8_t *)t->data - data);
        if (b > at) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\" begins at byte %llu of the data, leaving a hole "
                                           "after byte %llu", path, t->name, (unsigned long long)b,
                          (unsigned long long)at);
            goto fail;
        }
        if (b < at) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\" (bytes %llu..%llu) overlaps \"%s\"", path, t->name,
                          (unsigned long long)b, (unsigned long long)(b + t->nbytes),
                          f->tensors[order[k - 1]].name);
            goto fail;
        }
        at = b + t->nbytes;
    }
    if (at != data_size) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: the tensors cover %llu bytes of data, but the file holds %llu after "
                                       "the header", path, (unsigned long long)at, (unsigned long long)data_size);
        goto fail;
    }
    json_decref(root);
    free(order);
    CDP_DEBUG(CKPT, "%s: %d tensors, %llu data bytes", path, f->n, (unsigned long long)data_size);
    *out = f;
    return CDP_OK;
fail:
    json_decref(root);
    free(order);
    cdp_safetensors_close(f);
    return st;
}

/* ---- sharded sets: model.safetensors.index.json --------------------------------- */

/* An index, as transformers' save_pretrained writes it beside the shards:
 * {"metadata": {...}, "weight_map": {"tensor": "model-00001-of-00002.safetensors", ...}}.
 * The set reads as one file: every shard's tensors, shard by shard in the
 * order the index first names them. Each listed tensor must be in its shard,
 * and each shard's tensor listed there, so nothing is read from the wrong file. */
static cdp_status open_index(const char *path, struct cdp_safetensors_file **out)
{
    cdp_status st = CDP_OK;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    char *dir = NULL;
    struct cdp_safetensors_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path)) || !(dir = strdup(path))) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    if (!root) {
        struct stat sb;
        st = stat(path, &sb) != 0 ? cdp_fail(CDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno))
                                  : cdp_fail(CDP_ERR_INVALID, "%s: line %d, column %d: %s", path, jerr.line,
                                             jerr.column, jerr.text);
        goto fail;
    }
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(map) || json_object_size(map) == 0) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: /weight_map: expected an object naming each tensor's shard file "
                      "(a model.safetensors.index.json)", path);
        goto fail;
    }
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = '\0';
    else dir[0] = '\0';
    const size_t cap = json_object_size(map);
    char **shard_name = calloc(cap + 1, sizeof *shard_name);
    f->shards = calloc(cap + 1, sizeof *f->shards);
    if (!shard_name || !f->shards) {
        free(shard_name);
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    const char *key;
    json_t *val;
    /* the shards, in the order first named */
    json_object_foreach(map, key, val) {
        const char *file = json_string_value(val);
        if (!file || !*file || strchr(file, '/') || !strcmp(file, "..")) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: /weight_map/%s: expected the file name of a shard beside the "
                          "index", path, key);
            break;
        }
        int k = 0;
        while (k < f->n_shards && strcmp(shard_name[k], file)) k++;
        if (k < f->n_shards) continue;
        char spath[4200];
        snprintf(spath, sizeof spath, "%s%s", dir, file);
        shard_name[f->n_shards] = (char *)file;
        if ((st = cdp_safetensors_open(spath, &f->shards[f->n_shards]))) {
            cdp_error_context(st, "%s: /weight_map/%s: shard \"%s\"", path, key, file);
            break;
        }
        f->n_shards++;
    }
    /* listed tensors in their shards, shard tensors listed there */
    json_object_foreach(map, key, val) {
        if (st) break;
        int k = 0;
        while (strcmp(shard_name[k], json_string_value(val))) k++;
        if (!cdp_safetensors_find(f->shards[k], key))
            st = cdp_fail(CDP_ERR_INVALID, "%s: /weight_map/%s: shard \"%s\" has no tensor \"%s\"", path, key,
                          shard_name[k], key);
    }
    int total = 0;
    for (int k = 0; !st && k < f->n_shards; k++) {
        for (int i = 0; !st && i < f->shards[k]->n; i++) {
            const char *name = f->shards[k]->tensors[i].name;
            const char *listed = json_string_value(json_object_get(map, name));
            if (!listed || strcmp(listed, shard_name[k]))
                st = cdp_fail(CDP_ERR_INVALID, "%s: shard \"%s\" holds tensor \"%s\", which /weight_map %s", path,
                              shard_name[k], name, listed ? "puts in another shard" : "does not list");
        }
        total += f->shards[k]->n;
    }
    free(shard_name);
    if (st) goto fail;
    if (!(f->tensors = calloc((size_t)total + 1, sizeof *f->tensors))) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (int k = 0; k < f->n_shards; k++)
        for (int i = 0; i < f->shards[k]->n; i++) f->tensors[f->n++] = f->shards[k]->tensors[i];
    CDP_DEBUG(CKPT, "%s: %d tensors in %d shards", path, f->n, f->n_shards);
    json_decref(root);
    free(dir);
    *out = f;
    return CDP_OK;
fail:
    json_decref(root);
    free(dir);
    cdp_safetensors_close(f);
    return st;
}

int cdp_safetensors_count(const struct cdp_safetensors_file *f) { return f->n; }

const struct cdp_safetensors_tensor *cdp_safetensors_at(const struct cdp_safetensors_file *f, int i)
{
    CDP_ASSERT(i >= 0 && i < f->n);
    return &f->tensors[i];
}

const struct cdp_safetensors_tensor *cdp_safetensors_find(const struct cdp_safetensors_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

const char *cdp_safetensors_metadata(const struct cdp_safetensors_file *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | man << 13; /* inf, NaN */
    } else if (exp == 0) {
        if (!man) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else {
        bits = sign | (exp + 112) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* Bytes per element of a tensor of the file (its dtype is a known one). */
static uint64_t elem_size(const struct cdp_safetensors_tensor *t)
{
    const struct st_dtype *dt = dtype_by_name(t->dtype_name);
    return dt && dt->size ? dt->size : 1;
}

/* Elements [first, first + count) of t (inside it) as float32 into dst. */
static cdp_status to_f32(const struct cdp_safetensors_file *f, const struct cdp_safetensors_tensor *t, uint64_t first,
                         uint64_t count, float *dst)
{
    const uint8_t *src = t->data;
    if (!strcmp(t->dtype_name, "F32")) {
        if (count) memcpy(dst, src + 4 * first, (size_t)(4 * count));
    } else if (!strcmp(t->dtype_name, "BF16") || !strcmp(t->dtype_name, "F16")) {
        int bf = t->dtype_name[0] == 'B';
        src += 2 * first;
        for (uint64_t i = 0; i < count; i++) {
            uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
            dst[i] = bf ? cdp_bf16_to_f32(h) : f16_to_f32(h);
        }
    } else {
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\" is %s, which cannot be read as float32 (F32, BF16 or "
                                         "F16 can)", f->path, t->name, t->dtype_name);
    }
    return CDP_OK;
}

cdp_status cdp_safetensors_read_f32(const struct cdp_safetensors_file *f, const char *name, int ndim,
                                    const int64_t *shape, float *dst)
{
    const struct cdp_safetensors_tensor *t = cdp_safetensors_find(f, name);
    if (!t) return cdp_fail(CDP_ERR_INVALID, "%s: no tensor named \"%s\"", f->path, name);
    if (shape) {
        int same = ndim == t->ndim;
        for (int i = 0; same && i < ndim; i++) same = shape[i] == t->shape[i];
        if (!same) {
            char want[160], have[160];
            format_shape(want, sizeof want, ndim, shape);
            format_shape(have, sizeof have, t->ndim, t->shape);
            return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\" has shape %s, expected %s", f->path, name, have,
                            want);
        }
    }
    return to_f32(f, t, 0, t->nbytes / elem_size(t), dst);
}

cdp_status cdp_safetensors_read_f32_range(const struct cdp_safetensors_file *f, const char *name, uint64_t first,
                                          uint64_t count, float *dst)
{
    const struct cdp_safetensors_tensor *t = cdp_safetensors_find(f, name);
    if (!t) return cdp_fail(CDP_ERR_INVALID, "%s: no tensor named \"%s\"", f->path, name);
    uint64_t numel = t->nbytes / elem_size(t);
    if (first > numel || count > numel - first)
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": elements [%llu, %llu) asked for, it has %llu", f->path,
                        name, (unsigned long long)first, (unsigned long long)first + count,
                        (unsigned long long)numel);
    return to_f32(f, t, first, count, dst);
}

/* ---- writing ------------------------------------------------------------------ */

/* The header JSON for the tensors, padded with spaces to a multiple of 8. */
static cdp_status build_header(const char *path, const struct cdp_safetensors_tensor *ts, int n,
                               const char *const *meta, int n_meta, char **out, size_t *out_len)
{
    cdp_status st = CDP_OK;
    json_t *root = json_object();
    if (!root) return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
    if (n_meta > 0) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m)) {
            st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        for (int i = 0; i < n_meta; i++) {
            const char *k = meta[2 * i], *v = meta[2 * i + 1];
            if (!k || !v) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: metadata entry %d has a NULL key or value", path, i);
                goto done;
            }
            if (json_object_get(m, k)) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: metadata key \"%s\" is given twice", path, k);
                goto done;
            }
            if (json_object_set_new(m, k, json_string(v))) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: metadata \"%s\": key or value is not valid UTF-8", path, k);
                goto done;
            }
        }
    }
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        const struct cdp_safetensors_tensor *t = &ts[i];
        if (!t->name || !t->name[0]) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: tensor %d has no name", path, i);
            goto done;
        }
        if (!strcmp(t->name, "__metadata__")) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: \"__metadata__\" is reserved and cannot name a tensor", path);
            goto done;
        }
        if (json_object_get(root, t->name)) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: tensor name \"%s\" is given twice", path, t->name);
            goto done;
        }
        const struct st_dtype *dt = t->dtype_name ? dtype_by_name(t->dtype_name) : dtype_by_enum(t->dtype);
        if (!dt) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": unknown dtype %s", path, t->name,
                          t->dtype_name ? t->dtype_name : "(enum value)");
            goto done;
        }
        if (t->ndim < 0 || t->ndim > CDP_MAX_DIMS) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": %d dimensions (0..%d allowed)", path, t->name,
                          t->ndim, CDP_MAX_DIMS);
            goto done;
        }
        uint64_t numel = 1;
        json_t *shape = json_array(), *offs = json_array(), *e = json_object();
        if (!shape || !offs || !e || json_object_set_new(root, t->name, e)) {
            json_decref(shape), json_decref(offs);
            st = cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": out of memory or a name that is not UTF-8", path,
                          t->name);
            goto done;
        }
        int bad_dim = 0;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel)) bad_dim = 1;
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        uint64_t nbytes = 0;
        if (bad_dim || __builtin_mul_overflow(numel, (uint64_t)dt->size, &nbytes)) {
            json_decref(shape), json_decref(offs);
            st = cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": bad shape", path, t->name);
            goto done;
        }
        if (nbytes != t->nbytes || (nbytes && !t->data)) {
            json_decref(shape), json_decref(offs);
            st = cdp_fail(CDP_ERR_INVALID, "%s: tensor \"%s\": %s of %llu elements is %llu bytes, %s %llu", path,
                          t->name, dt->name, (unsigned long long)numel, (unsigned long long)nbytes,
                          t->data ? "nbytes says" : "no data for", (unsigned long long)t->nbytes);
            goto done;
        }
        json_array_append_new(offs, json_integer((json_int_t)at));
        json_array_append_new(offs, json_integer((json_int_t)(at + nbytes)));
        at += nbytes;
        json_object_set_new(e, "dtype", json_string(dt->name));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: cannot format the header", path);
        goto done;
    }
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    char *buf = realloc(text, padded + 1);
    if (!buf) {
        free(text);
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    memset(buf + len, ' ', padded - len);
    buf[padded] = '\0';
    *out = buf;
    *out_len = padded;
done:
    json_decref(root);
    return st;
}

/* A tensor's bytes fetched into stage (at most cap bytes at a time) and
 * written from there. */
static cdp_status write_staged(struct cdp_atomic_file *f, const struct cdp_safetensors_tensor *t,
                               cdp_safetensors_fetch_fn fetch, void *ctx, uint8_t *stage, uint64_t cap,
                               const char *path)
{
    for (uint64_t off = 0; off < t->nbytes;) {
        uint64_t len = t->nbytes - off < cap ? t->nbytes - off : cap;
        cdp_status st = fetch(ctx, t, off, stage, len);
        if (st) return cdp_error_context(st, "%s: tensor \"%s\"", path, t->name);
        if ((st = cdp_atomic_write(f, stage, (size_t)len))) return st;
        off += len;
    }
    return CDP_OK;
}

static cdp_status write_file(const char *path, const struct cdp_safetensors_tensor *tensors, int n,
                             const char *const *meta, int n_meta, cdp_safetensors_fetch_fn fetch, void *ctx,
                             uint64_t chunk)
{
    cdp_status st;
    char *header = NULL;
    struct cdp_atomic_file out = {0};
    int open_out = 0;
    uint8_t *stage = NULL;
    uint64_t stage_cap = 0;
    size_t hlen = 0;
    CDP_ASSERT(path && (n == 0 || tensors) && (n_meta == 0 || meta) && n >= 0 && n_meta >= 0);
    CDP_ASSERT(!fetch || chunk > 0);
    if ((st = build_header(path, tensors, n, meta, n_meta, &header, &hlen))) return st;
    if (fetch) {
        /* one host buffer for every tensor: the largest piece any of them needs */
        for (int i = 0; i < n; i++)
            if (tensors[i].nbytes > stage_cap) stage_cap = tensors[i].nbytes;
        if (stage_cap > chunk) stage_cap = chunk;
        if (stage_cap > SIZE_MAX - 1 || !(stage = malloc((size_t)stage_cap + 1))) {
            st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory for a %llu-byte staging buffer", path,
                          (unsigned long long)stage_cap);
            goto fail;
        }
    }

    if ((st = cdp_atomic_open(path, &out))) goto fail;
    open_out = 1;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    if ((st = cdp_atomic_write(&out, len8, 8)) || (st = cdp_atomic_write(&out, header, hlen))) goto fail;
    for (int i = 0; i < n; i++) {
        if (fetch) st = write_staged(&out, &tensors[i], fetch, ctx, stage, stage_cap, path);
        else st = cdp_atomic_write(&out, tensors[i].data, (size_t)tensors[i].nbytes);
        if (st) goto fail;
    }
    open_out = 0;
    if ((st = cdp_atomic_commit(&out))) goto fail;
    CDP_DEBUG(CKPT, "%s: wrote %d tensors", path, n);
    st = CDP_OK;
fail:
    if (open_out) cdp_atomic_abort(&out);
    free(header);
    free(stage);
    return st;
}

cdp_status cdp_safetensors_write(const char *path, const struct cdp_safetensors_tensor *tensors, int n,
                                 const char *const *meta, int n_meta)
{
    return write_file(path, tensors, n, meta, n_meta, NULL, NULL, 0);
}

cdp_status cdp_safetensors_write_staged(const char *path, const struct cdp_safetensors_tensor *tensors, int n,
                                        const char *const *meta, int n_meta, cdp_safetensors_fetch_fn fetch, void *ctx,
                                        uint64_t chunk)
{
    CDP_ASSERT(fetch && chunk > 0);
    return write_file(path, tensors, n, meta, n_meta, fetch, ctx, chunk);
}
