/* Suite safetensors: round trips, a file written by the Hugging Face library
 * (tools/make_safetensors_fixture.py), every malformed header the reader must
 * refuse, and a writer that never leaves a half file behind. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "cdp/tensor.h"
#include "harness.h"
#include "model/safetensors.h"

/* Number of entries in a folder, "." and ".." excluded. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static char *join(const char *dir, const char *name)
{
    static char buf[32][4096]; /* a ring: enough for the paths one test holds */
    static int k;
    char *p = buf[k++ & 31];
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* A file with an 8-byte length, this header and `data_len` bytes of data. */
static void write_st(const char *path, const char *header, uint64_t hlen, size_t data_len)
{
    size_t n = strlen(header);
    unsigned char *buf = calloc(1, 8 + n + data_len + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, n);
    write_bytes(path, buf, 8 + n + data_len);
    free(buf);
}

Test(safetensors, round_trip_f32_bf16_i32_with_metadata)
{
    const char *dir = cdp_test_tmpdir();
    char *path = join(dir, "w.safetensors");
    float a[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-7f, -1e30f};
    uint16_t b[5];
    for (int i = 0; i < 5; i++) b[i] = cdp_f32_to_bf16(0.1f * (float)(i + 1) - 0.3f);
    int32_t c[3] = {-7, 0, 2147483647};
    struct cdp_safetensors_tensor ts[] = {
        {.name = "layers.1.weight", .dtype = CDP_DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = a, .nbytes = sizeof a},
        {.name = "layers.0.bias", .dtype = CDP_DTYPE_BF16, .ndim = 1, .shape = {5}, .data = b, .nbytes = sizeof b},
        {.name = "step", .dtype = CDP_DTYPE_I32, .ndim = 2, .shape = {3, 1}, .data = c, .nbytes = sizeof c},
        {.name = "scalar", .dtype = CDP_DTYPE_F32, .ndim = 0, .data = a, .nbytes = 4},
    };
    const char *meta[] = {"format", "pt", "plan", "{\"stages\": 2}"};
    cr_assert_eq(cdp_safetensors_write(path, ts, 4, meta, 2), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(count_entries(dir), 1, "the temporary file is gone");

    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0644);

    /* the header: length a multiple of 8, the given order, metadata first */
    char *raw = cdp_test_read_file(path);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | (unsigned char)raw[i];
    cr_assert_eq(hlen % 8, 0);
    cr_assert_eq((uint64_t)sb.st_size, 8 + hlen + sizeof a + sizeof b + sizeof c + 4);
    const char *h = raw + 8;
    cr_assert_eq(strncmp(h, "{\"__metadata__\":", 16), 0, "%.80s", h);
    cr_assert(strstr(h, "layers.1.weight") < strstr(h, "layers.0.bias"));
    cr_assert(strstr(h, "layers.0.bias") < strstr(h, "\"step\""));
    cr_assert(strstr(h, "\"layers.1.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"), "%.300s",
              h);
    free(raw);

    struct cdp_safetensors_file *f = NULL;
    cr_assert_eq(cdp_safetensors_open(path, &f), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_count(f), 4);
    for (int i = 0; i < 4; i++) {
        const struct cdp_safetensors_tensor *t = cdp_safetensors_at(f, i);
        cr_assert_str_eq(t->name, ts[i].name);
        cr_assert_eq(t->dtype, ts[i].dtype);
        cr_assert_eq(t->ndim, ts[i].ndim);
        for (int d = 0; d < t->ndim; d++) cr_assert_eq(t->shape[d], ts[i].shape[d]);
        cr_assert_eq(t->nbytes, ts[i].nbytes);
        cr_assert_eq(memcmp(t->data, ts[i].data, t->nbytes), 0, "%s", t->name);
    }
    cr_assert_str_eq(cdp_safetensors_at(f, 1)->dtype_name, "BF16");
    cr_assert_str_eq(cdp_safetensors_metadata(f, "format"), "pt");
    cr_assert_str_eq(cdp_safetensors_metadata(f, "plan"), "{\"stages\": 2}");
    cr_assert_null(cdp_safetensors_metadata(f, "missing"));
    cr_assert_null(cdp_safetensors_find(f, "layers.2.weight"));
    cr_assert_eq(cdp_safetensors_find(f, "step"), cdp_safetensors_at(f, 2));

    float got[6];
    int64_t shp[2] = {2, 3};
    cr_assert_eq(cdp_safetensors_read_f32(f, "layers.1.weight", 2, shp, got), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(memcmp(got, a, sizeof a), 0);
    int64_t s5 = 5;
    cr_assert_eq(cdp_safetensors_read_f32(f, "layers.0.bias", 1, &s5, got), CDP_OK, "%s", cdp_last_error());
    for (int i = 0; i < 5; i++) cr_assert_eq(got[i], cdp_bf16_to_f32(b[i]));
    cr_assert_eq(cdp_safetensors_read_f32(f, "layers.0.bias", 0, NULL, got), CDP_OK, "shape NULL: no shape check");

    /* wrong shape, wrong dtype, absent */
    int64_t s32[2] = {3, 2};
    cr_assert_eq(cdp_safetensors_read_f32(f, "layers.1.weight", 2, s32, got), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "w.safetensors: tensor \"layers.1.weight\" has shape [2, 3], expected [3, 2]"),
              "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_read_f32(f, "step", 0, NULL, got), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "\"step\" is I32"), "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_read_f32(f, "nope", 0, NULL, got), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "no tensor named \"nope\""), "%s", cdp_last_error());
    cdp_safetensors_close(f);
    cdp_safetensors_close(NULL);
}

Test(safetensors, empty_file_and_zero_sized_tensors)
{
    const char *dir = cdp_test_tmpdir();
    char *p1 = join(dir, "none.safetensors"), *p2 = join(dir, "zero.safetensors");
    cr_assert_eq(cdp_safetensors_write(p1, NULL, 0, NULL, 0), CDP_OK, "%s", cdp_last_error());
    struct cdp_safetensors_file *f = NULL;
    cr_assert_eq(cdp_safetensors_open(p1, &f), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_count(f), 0);
    cdp_safetensors_close(f);
    float x = 1.0f;
    struct cdp_safetensors_tensor ts[] = {
        {.name = "e", .dtype = CDP_DTYPE_F32, .ndim = 2, .shape = {0, 4}, .data = NULL, .nbytes = 0},
        {.name = "x", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &x, .nbytes = 4},
        {.name = "e2", .dtype = CDP_DTYPE_I32, .ndim = 1, .shape = {0}, .data = NULL, .nbytes = 0},
    };
    cr_assert_eq(cdp_safetensors_write(p2, ts, 3, NULL, 0), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_open(p2, &f), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_count(f), 3);
    cr_assert_eq(cdp_safetensors_find(f, "e")->nbytes, 0);
    cr_assert_eq(*(const float *)cdp_safetensors_find(f, "x")->data, 1.0f);
    cdp_safetensors_close(f);
}

/* Written by the Python safetensors library (tools/make_safetensors_fixture.py). */
Test(safetensors, python_written_fixture_loads)
{
    const char *path = cdp_test_source_path("tests/fixtures/safetensors/python.safetensors");
    struct cdp_safetensors_file *f = NULL;
    cr_assert_eq(cdp_safetensors_open(path, &f), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_count(f), 8);
    cr_assert_str_eq(cdp_safetensors_metadata(f, "format"), "pt");
    cr_assert_str_eq(cdp_safetensors_metadata(f, "producer"), "tools/make_safetensors_fixture.py");

    float w[12];
    int64_t s34[2] = {3, 4};
    cr_assert_eq(cdp_safetensors_read_f32(f, "layers.1.weight", 2, s34, w), CDP_OK, "%s", cdp_last_error());
    for (int i = 0; i < 12; i++) cr_assert_eq(w[i], (float)i * 0.5f - 1.0f);
    float bias[3];
    int64_t s3 = 3;
    cr_assert_eq(cdp_safetensors_read_f32(f, "layers.0.bias", 1, &s3, bias), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(bias[0], 1.5f);
    cr_assert_eq(bias[1], -2.25f);
    cr_assert_eq(bias[2], 3.0f);

    /* F16 widened: normal, negative, max, smallest normal, smallest subnormal */
    float half[5];
    int64_t s5 = 5;
    cr_assert_eq(cdp_safetensors_read_f32(f, "half", 1, &s5, half), CDP_OK, "%s", cdp_last_error());
    const float want[5] = {0.5f, -1.0f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f};
    for (int i = 0; i < 5; i++) cr_assert_eq(half[i], want[i], "half[%d] = %g", i, (double)half[i]);

    const struct cdp_safetensors_tensor *ids = cdp_safetensors_find(f, "ids");
    cr_assert_not_null(ids);
    cr_assert_eq(ids->dtype, CDP_DTYPE_I32);
    cr_assert_eq(ids->ndim, 2);
    cr_assert_eq(ids->shape[0], 2);
    cr_assert_eq(ids->shape[1], 3);
    int32_t iv[6];
    memcpy(iv, ids->data, sizeof iv);
    for (int i = 0; i < 6; i++) cr_assert_eq(iv[i], i - 3);

    const struct cdp_safetensors_tensor *steps = cdp_safetensors_find(f, "steps");
    cr_assert_str_eq(steps->dtype_name, "I64");
    cr_assert_eq(steps->dtype, CDP_DTYPE_COUNT, "no library dtype for I64");
    int64_t sv[2];
    memcpy(sv, steps->data, sizeof sv);
    cr_assert_eq(sv[0], 7);
    cr_assert_eq(sv[1], (int64_t)1 << 40);
    cr_assert_str_eq(cdp_safetensors_find(f, "mask")->dtype_name, "U8");
    cr_assert_eq(cdp_safetensors_find(f, "scalar")->ndim, 0);
    float sc;
    cr_assert_eq(cdp_safetensors_read_f32(f, "scalar", 0, NULL, &sc), CDP_OK);
    cr_assert_eq(sc, 2.5f);
    cr_assert_eq(cdp_safetensors_find(f, "empty")->nbytes, 0);
    cdp_safetensors_close(f);
}

struct bad_header {
    const char *header; /* NULL: use raw_len bytes of zeros as the whole file */
    int64_t hlen;       /* -1: strlen(header) */
    size_t data_len;
    const char *expect;
};

static struct bad_header bad_headers[] = {
    {NULL, 0, 5, "too short for a safetensors file (5 bytes, needs at least 8)"},
    {"{}", (int64_t)1 << 40, 0, "header length 1099511627776 is absurd"},
    {"{}", 1000, 100, "header length 1000 runs past the end of the file (110 bytes)"},
    {"{\"a\": ", -1, 0, "header JSON:"},
    {"[1, 2]", -1, 0, "header JSON is not an object"},
    {"{\"a\": 3}", -1, 0, "tensor \"a\": expected an object with dtype, shape and data_offsets"},
    {"{\"a\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4,
     "tensor \"a\": unknown dtype \"F33\""},
    {"{\"a\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4, "tensor \"a\": dtype missing"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", -1, 4,
     "tensor \"a\": F32 of 2 elements needs 8 bytes, data_offsets [0, 4] hold 4"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", -1, 4,
     "shape[0] is not a non-negative integer"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": 4, \"data_offsets\": [0, 4]}}", -1, 4, "shape missing or not an array"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", -1, 4, "7 dimensions"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", -1, 4,
     "data_offsets must be [begin, end]"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 0]}}", -1, 4, "end before they begin"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", -1, 4,
     "data_offsets [4, 8] run past the data section (4 bytes)"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], \"extra\": 1}}", -1, 4,
     "unknown key \"extra\""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
     " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
     -1, 4, "overlaps"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
     " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
     -1, 8, "overlaps"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", -1, 8, "leaving a hole after byte 0"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 8,
     "the tensors cover 4 bytes of data, but the file holds 8"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
     " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
     -1, 4, "duplicate object key"},
    {"{\"__metadata__\": {\"k\": 1}}", -1, 0, "__metadata__ \"k\": expected a string value"},
    {"{\"__metadata__\": [\"k\"]}", -1, 0, "__metadata__ must be an object of strings"},
    {"{\"\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4, "empty name"},
};

/* Criterion runs each parameter in a fresh process image, so the parameter is
 * an index into the table rather than a struct holding pointers. */
ParameterizedTestParameters(safetensors, malformed_header_is_refused)
{
    static int idx[sizeof bad_headers / sizeof bad_headers[0]];
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++) idx[i] = (int)i;
    return cr_make_param_array(int, idx, sizeof idx / sizeof idx[0]);
}

ParameterizedTest(int *which, safetensors, malformed_header_is_refused)
{
    const struct bad_header *c = &bad_headers[*which];
    const char *dir = cdp_test_tmpdir();
    char *path = join(dir, "bad.safetensors");
    if (!c->header) {
        unsigned char zeros[16] = {0};
        write_bytes(path, zeros, c->data_len);
    } else {
        write_st(path, c->header, c->hlen < 0 ? strlen(c->header) : (uint64_t)c->hlen, c->data_len);
    }
    struct cdp_safetensors_file *f = NULL;
    cr_assert_eq(cdp_safetensors_open(path, &f), CDP_ERR_INVALID, "accepted: %s", c->header ? c->header : "(short)");
    cr_assert_null(f);
    cr_assert(strstr(cdp_last_error(), c->expect), "got: %s\nwant: %s", cdp_last_error(), c->expect);
    cr_assert(strstr(cdp_last_error(), "bad.safetensors: "), "names the file: %s", cdp_last_error());
}

Test(safetensors, missing_file_is_an_io_error)
{
    struct cdp_safetensors_file *f = NULL;
    cr_assert_eq(cdp_safetensors_open("/nonexistent/x.safetensors", &f), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "/nonexistent/x.safetensors: cannot open: No such file"), "%s",
              cdp_last_error());
}

static float one = 1.0f;

Test(safetensors, writer_refuses_missing_folder_and_leaves_nothing)
{
    const char *dir = cdp_test_tmpdir();
    char *path = join(dir, "missing/w.safetensors");
    struct cdp_safetensors_tensor t = {
        .name = "x", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &one, .nbytes = 4};
    cr_assert_eq(cdp_safetensors_write(path, &t, 1, NULL, 0), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "cannot create a temporary file in"), "%s", cdp_last_error());
    cr_assert(strstr(cdp_last_error(), "No such file or directory"), "%s", cdp_last_error());
    cr_assert_eq(count_entries(dir), 0);
}

struct bad_write {
    struct cdp_safetensors_tensor t[2];
    int n;
    const char *meta[4];
    int n_meta;
    const char *expect;
};

static struct bad_write bad_writes[] = {
    {{{.name = "x", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &one, .nbytes = 4},
      {.name = "x", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &one, .nbytes = 4}},
     2, {NULL}, 0, "tensor name \"x\" is given twice"},
    {{{.name = "", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &one, .nbytes = 4}}, 1, {NULL}, 0,
     "tensor 0 has no name"},
    {{{.name = "__metadata__", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &one, .nbytes = 4}}, 1,
     {NULL}, 0, "reserved"},
    {{{.name = "x", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {2}, .data = &one, .nbytes = 4}}, 1, {NULL}, 0,
     "F32 of 2 elements is 8 bytes, nbytes says 4"},
    {{{.name = "x", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {-1}, .data = &one, .nbytes = 4}}, 1, {NULL}, 0,
     "bad shape"},
    {{{.name = "x", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &one, .nbytes = 4}}, 1,
     {"k", "v", "k", "w"}, 2, "metadata key \"k\" is given twice"},
    {{{.name = "x", .dtype_name = "F31", .ndim = 1, .shape = {1}, .data = &one, .nbytes = 4}}, 1, {NULL}, 0,
     "unknown dtype F31"},
};

ParameterizedTestParameters(safetensors, failed_write_keeps_the_old_file)
{
    static int idx[sizeof bad_writes / sizeof bad_writes[0]];
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++) idx[i] = (int)i;
    return cr_make_param_array(int, idx, sizeof idx / sizeof idx[0]);
}

ParameterizedTest(int *which, safetensors, failed_write_keeps_the_old_file)
{
    const struct bad_write *c = &bad_writes[*which];
    const char *dir = cdp_test_tmpdir();
    char *fresh = join(dir, "fresh.safetensors");
    cr_assert_eq(cdp_safetensors_write(fresh, c->t, c->n, c->meta, c->n_meta), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), c->expect), "got: %s\nwant: %s", cdp_last_error(), c->expect);
    cr_assert(strstr(cdp_last_error(), "fresh.safetensors: "), "%s", cdp_last_error());
    cr_assert_eq(count_entries(dir), 0, "no file and no temporary");

    char *old = join(dir, "old.safetensors");
    cdp_test_write_file(dir, "old.safetensors", "previous contents");
    cr_assert_neq(cdp_safetensors_write(old, c->t, c->n, c->meta, c->n_meta), CDP_OK);
    char *txt = cdp_test_read_file(old);
    cr_assert_str_eq(txt, "previous contents");
    free(txt);
    cr_assert_eq(count_entries(dir), 1);
}

/* The rename itself fails (the target is a folder): the temporary, already
 * written and synced, is removed. */
Test(safetensors, failed_rename_removes_the_temporary)
{
    const char *dir = cdp_test_tmpdir();
    char *target = join(dir, "taken");
    cr_assert_eq(mkdir(target, 0755), 0);
    cdp_test_write_file(target, "keep", "x");
    struct cdp_safetensors_tensor t = {
        .name = "x", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &one, .nbytes = 4};
    cr_assert_eq(cdp_safetensors_write(target, &t, 1, NULL, 0), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "cannot rename"), "%s", cdp_last_error());
    cr_assert_eq(count_entries(dir), 1, "only the folder");
    cr_assert_eq(count_entries(target), 1);
}

Test(safetensors, overwrite_replaces_a_valid_file)
{
    const char *dir = cdp_test_tmpdir();
    char *path = join(dir, "w.safetensors");
    float v1[2] = {1, 2}, v2[3] = {3, 4, 5};
    struct cdp_safetensors_tensor t1 = {
        .name = "a", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {2}, .data = v1, .nbytes = 8};
    struct cdp_safetensors_tensor t2 = {
        .name = "b", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {3}, .data = v2, .nbytes = 12};
    cr_assert_eq(cdp_safetensors_write(path, &t1, 1, NULL, 0), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_write(path, &t2, 1, NULL, 0), CDP_OK, "%s", cdp_last_error());
    struct cdp_safetensors_file *f = NULL;
    cr_assert_eq(cdp_safetensors_open(path, &f), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_count(f), 1);
    cr_assert_not_null(cdp_safetensors_find(f, "b"));
    cdp_safetensors_close(f);
    cr_assert_eq(count_entries(dir), 1);
}

/* A write that fails halfway (the file size limit stands in for a full disk):
 * the old file stays as it was and the temporary is removed. */
Test(safetensors, failed_data_write_keeps_the_old_file)
{
    const char *dir = cdp_test_tmpdir();
    char *path = join(dir, "w.safetensors");
    cdp_test_write_file(dir, "w.safetensors", "previous contents");
    static float big[4096];
    struct cdp_safetensors_tensor t = {
        .name = "big", .dtype = CDP_DTYPE_F32, .ndim = 1, .shape = {4096}, .data = big, .nbytes = sizeof big};
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {.rlim_cur = 4096, .rlim_max = 4096};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    cr_assert_eq(cdp_safetensors_write(path, &t, 1, NULL, 0), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "w.safetensors: cannot write"), "%s", cdp_last_error());
    cr_assert(strstr(cdp_last_error(), "File too large"), "%s", cdp_last_error());
    char *txt = cdp_test_read_file(path);
    cr_assert_str_eq(txt, "previous contents");
    free(txt);
    cr_assert_eq(count_entries(dir), 1, "the temporary is gone");
}
