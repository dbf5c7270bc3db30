/* Suite data: samples depend only on (seed, split, index); file splits are
 * disjoint and every sample comes once per epoch; synthetic data has structure;
 * every bad or truncated file gives a message naming the file and the fault. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "model/data.h"

/* ---- models and files ---------------------------------------------------------- */

static struct cdp_model_desc gpt(int64_t vocab, int64_t context)
{
    struct cdp_model_desc m = {.kind = CDP_MODEL_GPT, .vocab = vocab, .context = context, .layers = 1,
                               .heads = 1, .embed = 8, .tie_embeddings = 1};
    return m;
}

/* input [D] (or [1, H, W] when h > 0) -> linear 16 -> relu -> linear out */
static struct cdp_layer_desc mlp_layers[3] = {
    {.type = CDP_LAYER_LINEAR, .out = 16, .bias = 1},
    {.type = CDP_LAYER_RELU},
    {.type = CDP_LAYER_LINEAR, .out = 5, .bias = 1},
};

static struct cdp_model_desc mlp(int64_t d, int64_t out, enum cdp_loss loss)
{
    mlp_layers[2].out = out;
    struct cdp_model_desc m = {.kind = CDP_MODEL_MLP, .input = {d}, .input_ndim = 1, .classes = out,
                               .layer_list = mlp_layers, .n_layers = 3, .loss = loss};
    return m;
}

static struct cdp_data *open_ok(enum cdp_data_source src, const char *path, const char *labels, uint64_t seed,
                                const struct cdp_model_desc *m)
{
    struct cdp_data_desc dd = {.source = src, .path = (char *)path, .labels = (char *)labels, .seed = seed};
    struct cdp_data *d = NULL;
    cr_assert_eq(cdp_data_open(&dd, m, &d), CDP_OK, "%s", cdp_last_error());
    cr_assert_not_null(d);
    return d;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static char *path_in(const char *dir, const char *name)
{
    static char buf[32][4096]; /* a ring: enough for the paths one test holds */
    static int k;
    char *p = buf[k++ & 31];
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

/* An llm.c token file: header (magic, version, count as written), then the tokens. */
static void write_tokens(const char *path, int32_t magic, int32_t version, int32_t count, const uint16_t *toks,
                         size_t n)
{
    unsigned char *buf = calloc(1, 1024 + 2 * n);
    int32_t hdr[3] = {magic, version, count};
    memcpy(buf, hdr, sizeof hdr);
    memcpy(buf + 1024, toks, 2 * n);
    write_bytes(path, buf, 1024 + 2 * n);
    free(buf);
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8),
    p[3] = (unsigned char)v;
}

/* n images of rows x cols: pixel k of image i is (i + k) % 256, so pixel 0 is i. */
static void write_images(const char *path, uint32_t magic, uint32_t n, uint32_t rows, uint32_t cols, size_t drop)
{
    size_t len = 16 + (size_t)n * rows * cols;
    unsigned char *buf = calloc(1, len);
    put_be32(buf, magic);
    put_be32(buf + 4, n);
    put_be32(buf + 8, rows);
    put_be32(buf + 12, cols);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < (size_t)rows * cols; k++) buf[16 + i * rows * cols + k] = (unsigned char)((i + k) % 256);
    write_bytes(path, buf, len - drop);
    free(buf);
}

/* label of image i: i % classes */
static void write_labels(const char *path, uint32_t magic, uint32_t n, uint32_t classes)
{
    unsigned char *buf = calloc(1, 8 + n);
    put_be32(buf, magic);
    put_be32(buf + 4, n);
    for (uint32_t i = 0; i < n; i++) buf[8 + i] = (unsigned char)(i % classes);
    write_bytes(path, buf, 8 + n);
    free(buf);
}

/* ---- shapes ------------------------------------------------------------------------ */

Test(data, shape_follows_the_model)
{
    struct cdp_model_desc g = gpt(300, 12);
    struct cdp_data *d = open_ok(CDP_DATA_SYNTHETIC, NULL, NULL, 1, &g);
    const struct cdp_sample_shape *s = cdp_data_shape(d);
    cr_assert(s->tokens && s->input_numel == 12 && s->target_numel == 12 && s->vocab == 300 && !s->target_is_float);
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_TRAIN), INT64_MAX);
    cdp_data_close(d);

    struct cdp_layer_desc emb[2] = {{.type = CDP_LAYER_EMBEDDING, .vocab = 77, .dim = 8, .context = 16},
                                    {.type = CDP_LAYER_LINEAR, .out = 77}};
    struct cdp_model_desc l = {.kind = CDP_MODEL_LAYERS, .input = {9}, .input_ndim = 1, .layer_list = emb,
                               .n_layers = 2};
    d = open_ok(CDP_DATA_SYNTHETIC, NULL, NULL, 1, &l);
    s = cdp_data_shape(d);
    cr_assert(s->tokens && s->input_numel == 9 && s->vocab == 77);
    cdp_data_close(d);

    struct cdp_model_desc c = mlp(20, 7, CDP_LOSS_CROSS_ENTROPY);
    c.input[0] = 4, c.input[1] = 5, c.input_ndim = 2;
    d = open_ok(CDP_DATA_SYNTHETIC, NULL, NULL, 1, &c);
    s = cdp_data_shape(d);
    cr_assert(!s->tokens && s->input_numel == 20 && s->target_numel == 1 && s->classes == 7 && !s->target_is_float);
    cdp_data_close(d);

    struct cdp_model_desc r = mlp(6, 3, CDP_LOSS_MSE);
    d = open_ok(CDP_DATA_SYNTHETIC, NULL, NULL, 1, &r);
    s = cdp_data_shape(d);
    cr_assert(!s->tokens && s->input_numel == 6 && s->target_numel == 3 && s->target_is_float);
    cdp_data_close(d);
    cdp_data_close(NULL);
}

/* ---- determinism --------------------------------------------------------------------- */

/* Fetches n samples one call at a time, in reverse, from a second source, and
 * compares with one batched call on the first. */
static void check_deterministic(enum cdp_data_source src, const char *path, const char *labels,
                                const struct cdp_model_desc *m, enum cdp_split split, int64_t first, int n)
{
    struct cdp_data *a = open_ok(src, path, labels, 7, m), *b = open_ok(src, path, labels, 7, m);
    const struct cdp_sample_shape *s = cdp_data_shape(a);
    size_t in_sz = (size_t)s->input_numel * 4, tg_sz = (size_t)s->target_numel * 4;
    unsigned char *ia = malloc(in_sz * n), *ta = malloc(tg_sz * n), *ib = malloc(in_sz * n), *tb = malloc(tg_sz * n);
    cr_assert_eq(cdp_data_fetch(a, split, first, n, ia, ta), CDP_OK, "%s", cdp_last_error());
    for (int i = n - 1; i >= 0; i--)
        cr_assert_eq(cdp_data_fetch(b, split, first + i, 1, ib + i * in_sz, tb + i * tg_sz), CDP_OK);
    cr_assert_eq(memcmp(ia, ib, in_sz * n), 0, "inputs differ between batched and single fetches");
    cr_assert_eq(memcmp(ta, tb, tg_sz * n), 0, "targets differ between batched and single fetches");
    /* chunks of 7 */
    for (int i = 0; i < n; i += 7) {
        int k = n - i < 7 ? n - i : 7;
        cr_assert_eq(cdp_data_fetch(b, split, first + i, k, ib + i * in_sz, tb + i * tg_sz), CDP_OK);
    }
    cr_assert_eq(memcmp(ia, ib, in_sz * n), 0);
    cr_assert_eq(memcmp(ta, tb, tg_sz * n), 0);
    free(ia), free(ta), free(ib), free(tb);
    cdp_data_close(a);
    cdp_data_close(b);
}

Test(data, synthetic_is_deterministic_by_seed_split_index)
{
    struct cdp_model_desc g = gpt(50, 16), c = mlp(12, 4, CDP_LOSS_CROSS_ENTROPY), r = mlp(12, 3, CDP_LOSS_MSE);
    check_deterministic(CDP_DATA_SYNTHETIC, NULL, NULL, &g, CDP_SPLIT_TRAIN, 0, 40);
    check_deterministic(CDP_DATA_SYNTHETIC, NULL, NULL, &g, CDP_SPLIT_VAL, 1000000007, 30);
    check_deterministic(CDP_DATA_SYNTHETIC, NULL, NULL, &c, CDP_SPLIT_TRAIN, 5, 40);
    check_deterministic(CDP_DATA_SYNTHETIC, NULL, NULL, &r, CDP_SPLIT_VAL, 123456789012345, 20);
}

Test(data, synthetic_differs_by_seed_and_split)
{
    struct cdp_model_desc g = gpt(50, 32);
    struct cdp_data *a = open_ok(CDP_DATA_SYNTHETIC, NULL, NULL, 1, &g), *b = open_ok(CDP_DATA_SYNTHETIC, NULL, NULL, 2, &g);
    int32_t x[4][32], y[4][32];
    cdp_data_fetch(a, CDP_SPLIT_TRAIN, 0, 1, x[0], y[0]);
    cdp_data_fetch(a, CDP_SPLIT_VAL, 0, 1, x[1], y[1]);
    cdp_data_fetch(b, CDP_SPLIT_TRAIN, 0, 1, x[2], y[2]);
    cdp_data_fetch(a, CDP_SPLIT_TRAIN, 1, 1, x[3], y[3]);
    cr_assert_neq(memcmp(x[0], x[1], sizeof x[0]), 0, "train and val differ");
    cr_assert_neq(memcmp(x[0], x[2], sizeof x[0]), 0, "seeds differ");
    cr_assert_neq(memcmp(x[0], x[3], sizeof x[0]), 0, "samples differ");
    cdp_data_close(a);
    cdp_data_close(b);
}

Test(data, bad_fetch_arguments)
{
    struct cdp_model_desc g = gpt(50, 4);
    struct cdp_data *d = open_ok(CDP_DATA_SYNTHETIC, NULL, NULL, 1, &g);
    int32_t x[4], y[4];
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, -1, 1, x, y), CDP_ERR_INVALID);
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 0, -1, x, y), CDP_ERR_INVALID);
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_COUNT, 0, 1, x, y), CDP_ERR_INVALID);
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, INT64_MAX, 2, x, y), CDP_ERR_INVALID);
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 0, 0, NULL, NULL), CDP_OK);
    cdp_data_close(d);
}

/* ---- synthetic structure ----------------------------------------------------------------- */

Test(data, synthetic_tokens_have_markov_structure)
{
    enum { V = 64, T = 64, N = 1000 };
    struct cdp_model_desc g = gpt(V, T);
    struct cdp_data *d = open_ok(CDP_DATA_SYNTHETIC, NULL, NULL, 3, &g);
    int32_t *x = malloc(sizeof(int32_t) * T * N), *y = malloc(sizeof(int32_t) * T * N);
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 0, N, x, y), CDP_OK);
    static long counts[V][V];
    long used[V] = {0};
    for (int i = 0; i < N; i++)
        for (int t = 0; t < T; t++) {
            int a = x[i * T + t], b = y[i * T + t];
            cr_assert(a >= 0 && a < V && b >= 0 && b < V);
            if (t + 1 < T) cr_assert_eq(b, x[i * T + t + 1], "target is the next token");
            counts[a][b]++;
            used[b]++;
        }
    /* conditional entropy of the next token: the chain's is about 1.3 nats,
     * uniform would be log(64) = 4.16 */
    double h = 0, total = 0, top4 = 0;
    for (int a = 0; a < V; a++) {
        long row = 0;
        for (int b = 0; b < V; b++) row += counts[a][b];
        long best[4] = {0};
        for (int b = 0; b < V; b++) {
            if (counts[a][b]) h -= (double)counts[a][b] * log((double)counts[a][b] / (double)row);
            long c = counts[a][b];
            for (int k = 0; k < 4; k++)
                if (c > best[k]) {
                    long tmp = best[k];
                    best[k] = c;
                    c = tmp;
                }
        }
        for (int k = 0; k < 4; k++) top4 += (double)best[k];
        total += (double)row;
    }
    h /= total;
    cr_assert_lt(h, 2.0, "conditional entropy %.3f nats, log(V) = %.3f", h, log(V));
    cr_assert_gt(top4 / total, 0.9, "share of the 4 most frequent successors %.3f", top4 / total);
    int unused = 0;
    for (int b = 0; b < V; b++) unused += used[b] == 0;
    cr_assert_lt(unused, V / 4, "%d of %d tokens never appear", unused, V);
    free(x), free(y);
    cdp_data_close(d);
}

Test(data, synthetic_classes_are_roughly_balanced)
{
    enum { C = 10, D = 24, N = 5000 };
    struct cdp_model_desc m = mlp(D, C, CDP_LOSS_CROSS_ENTROPY);
    struct cdp_data *d = open_ok(CDP_DATA_SYNTHETIC, NULL, NULL, 11, &m);
    float *x = malloc(sizeof(float) * D * N);
    int32_t *y = malloc(sizeof(int32_t) * N);
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 0, N, x, y), CDP_OK);
    long count[C] = {0};
    for (int i = 0; i < N; i++) {
        cr_assert(y[i] >= 0 && y[i] < C);
        count[y[i]]++;
    }
    for (int c = 0; c < C; c++) {
        cr_assert_gt(count[c], N / C / 5, "class %d has %ld of %d samples", c, count[c], N);
        cr_assert_lt(count[c], N / 3, "class %d has %ld of %d samples", c, count[c], N);
    }
    double mean = 0, var = 0;
    for (int i = 0; i < D * N; i++) mean += x[i];
    mean /= D * N;
    for (int i = 0; i < D * N; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= D * N;
    cr_assert_lt(fabs(mean), 0.02, "inputs N(0,1): mean %g", mean);
    cr_assert_lt(fabs(var - 1.0), 0.03, "inputs N(0,1): variance %g", var);
    free(x), free(y);
    cdp_data_close(d);
}

Test(data, synthetic_regression_targets_vary)
{
    enum { D = 8, O = 3, N = 500 };
    struct cdp_model_desc m = mlp(D, O, CDP_LOSS_MSE);
    struct cdp_data *d = open_ok(CDP_DATA_SYNTHETIC, NULL, NULL, 5, &m);
    float *x = malloc(sizeof(float) * D * N), *y = malloc(sizeof(float) * O * N);
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 0, N, x, y), CDP_OK);
    for (int o = 0; o < O; o++) {
        double mean = 0, var = 0;
        for (int i = 0; i < N; i++) mean += y[i * O + o];
        mean /= N;
        for (int i = 0; i < N; i++) var += (y[i * O + o] - mean) * (y[i * O + o] - mean);
        var /= N;
        cr_assert_lt(fabs(mean), 0.15, "output %d: mean %g (centred teacher)", o, mean);
        cr_assert_gt(var, 0.01, "output %d: variance %g", o, var);
        cr_assert(isfinite(var));
    }
    free(x), free(y);
    cdp_data_close(d);
}

/* ---- files: splits and epochs ------------------------------------------------------------ */

/* tokens file whose token i is i, so input[0] is the window's start */
Test(data, tokens_every_window_once_per_epoch_and_splits_disjoint)
{
    enum { N = 2000, T = 8 };
    const char *dir = cdp_test_tmpdir();
    char *path = path_in(dir, "seq.bin");
    uint16_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (uint16_t)i;
    write_tokens(path, 20240520, 1, N, toks, N);
    struct cdp_model_desc g = gpt(N, T);
    struct cdp_data *d = open_ok(CDP_DATA_TOKENS, path, NULL, 9, &g);
    int64_t ntr = cdp_data_split_size(d, CDP_SPLIT_TRAIN), nva = cdp_data_split_size(d, CDP_SPLIT_VAL);
    cr_assert_eq(ntr, 1800 - T);
    cr_assert_eq(nva, 200 - T);

    int32_t *x = malloc(sizeof(int32_t) * T * 2 * ntr), *y = malloc(sizeof(int32_t) * T * 2 * ntr);
    char *seen = calloc(N, 1);
    for (int s = 0; s < 2; s++) {
        int64_t n = s ? nva : ntr, lo = s ? 1800 : 0;
        cr_assert_eq(cdp_data_fetch(d, s ? CDP_SPLIT_VAL : CDP_SPLIT_TRAIN, 0, (int)(2 * n), x, y), CDP_OK);
        for (int e = 0; e < 2; e++) {
            memset(seen, 0, N);
            int in_order = 0;
            for (int64_t i = 0; i < n; i++) {
                const int32_t *xi = x + (e * n + i) * T, *yi = y + (e * n + i) * T;
                int start = xi[0];
                cr_assert(start >= lo && start + T < lo + (s ? 200 : 1800), "window %d..%d leaves its split", start,
                          start + T);
                for (int t = 0; t < T; t++) {
                    cr_assert_eq(xi[t], start + t);
                    cr_assert_eq(yi[t], start + t + 1);
                }
                cr_assert(!seen[start], "start %d twice in epoch %d", start, e);
                seen[start] = 1;
                in_order += start == lo + i;
            }
            cr_assert_lt(in_order, n / 4, "the order is shuffled");
        }
        /* epochs are shuffled differently */
        cr_assert_neq(memcmp(x, x + n * T, sizeof(int32_t) * T * 10), 0);
    }
    free(seen), free(x), free(y);
    cdp_data_close(d);
    check_deterministic(CDP_DATA_TOKENS, path, NULL, &g, CDP_SPLIT_TRAIN, 1700, 300);

    /* another seed, another order */
    struct cdp_data *a = open_ok(CDP_DATA_TOKENS, path, NULL, 9, &g), *b = open_ok(CDP_DATA_TOKENS, path, NULL, 10, &g);
    int32_t xa[10 * T], xb[10 * T], yy[10 * T];
    cdp_data_fetch(a, CDP_SPLIT_TRAIN, 0, 10, xa, yy);
    cdp_data_fetch(b, CDP_SPLIT_TRAIN, 0, 10, xb, yy);
    cr_assert_neq(memcmp(xa, xb, sizeof xa), 0);
    cdp_data_close(a);
    cdp_data_close(b);
}

Test(data, text_bytes_are_tokens_and_splits_are_disjoint)
{
    enum { N = 1000, T = 16 };
    const char *dir = cdp_test_tmpdir();
    char *path = path_in(dir, "t.txt");
    unsigned char bytes[N];
    uint64_t z = 12345;
    for (int i = 0; i < N; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        bytes[i] = (unsigned char)(z >> 56);
    }
    write_bytes(path, bytes, N);
    struct cdp_model_desc g = gpt(256, T);
    struct cdp_data *d = open_ok(CDP_DATA_TEXT, path, NULL, 4, &g);
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_TRAIN), 900 - T);
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_VAL), 100 - T);
    for (int s = 0; s < 2; s++) {
        int64_t n = cdp_data_split_size(d, (enum cdp_split)s), lo = s ? 900 : 0, hi = s ? N : 900;
        int32_t *x = malloc(sizeof(int32_t) * T * n), *y = malloc(sizeof(int32_t) * T * n);
        char seen[N] = {0};
        cr_assert_eq(cdp_data_fetch(d, (enum cdp_split)s, 0, (int)n, x, y), CDP_OK);
        for (int64_t i = 0; i < n; i++) {
            /* find the window in the file: random bytes make it unique */
            int found = -1;
            for (int p = 0; p + T < N && found < 0; p++) {
                int ok = 1;
                for (int t = 0; t < T && ok; t++) ok = x[i * T + t] == bytes[p + t] && y[i * T + t] == bytes[p + t + 1];
                if (ok) found = p;
            }
            cr_assert(found >= lo && found + T < hi, "window at %d outside split [%lld, %lld)", found, (long long)lo,
                      (long long)hi);
            cr_assert(!seen[found]);
            seen[found] = 1;
        }
        free(x), free(y);
    }
    cdp_data_close(d);
    check_deterministic(CDP_DATA_TEXT, path, NULL, &g, CDP_SPLIT_VAL, 0, 200);
}

Test(data, idx_images_scaled_labels_matched_once_per_epoch)
{
    enum { N = 50, R = 4, CC = 5, C = 3 };
    const char *dir = cdp_test_tmpdir();
    char *img = path_in(dir, "img.idx"), *lab = path_in(dir, "lab.idx");
    write_images(img, 0x803, N, R, CC, 0);
    write_labels(lab, 0x801, N, C);
    struct cdp_model_desc m = mlp(R * CC, C, CDP_LOSS_CROSS_ENTROPY);
    struct cdp_data *d = open_ok(CDP_DATA_IDX, img, lab, 2, &m);
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_TRAIN), 45);
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_VAL), 5);
    float x[90 * R * CC];
    int32_t y[90];
    for (int s = 0; s < 2; s++) {
        int n = s ? 5 : 45, lo = s ? 45 : 0;
        cr_assert_eq(cdp_data_fetch(d, (enum cdp_split)s, 0, 2 * n, x, y), CDP_OK);
        for (int e = 0; e < 2; e++) {
            char seen[N] = {0};
            for (int i = 0; i < n; i++) {
                const float *xi = x + (e * n + i) * R * CC;
                int img_i = (int)lroundf(xi[0] * 255.0f);
                cr_assert(img_i >= lo && img_i < lo + n, "image %d outside its split", img_i);
                cr_assert(!seen[img_i]);
                seen[img_i] = 1;
                for (int k = 0; k < R * CC; k++) cr_assert_float_eq(xi[k], (float)((img_i + k) % 256) / 255.0f, 1e-7);
                cr_assert_eq(y[e * n + i], img_i % C);
            }
        }
    }
    cdp_data_close(d);
    check_deterministic(CDP_DATA_IDX, img, lab, &m, CDP_SPLIT_TRAIN, 3, 100);

    /* mse: one-hot targets; a [1, 4, 5] cnn-shaped input takes the same images */
    struct cdp_model_desc r = mlp(R * CC, C, CDP_LOSS_MSE);
    r.input[0] = 1, r.input[1] = R, r.input[2] = CC, r.input_ndim = 3;
    d = open_ok(CDP_DATA_IDX, img, lab, 2, &r);
    float t[4 * C];
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 0, 4, x, t), CDP_OK);
    for (int i = 0; i < 4; i++) {
        int img_i = (int)lroundf(x[i * R * CC] * 255.0f);
        for (int c = 0; c < C; c++) cr_assert_eq(t[i * C + c], c == img_i % C ? 1.0f : 0.0f);
    }
    cdp_data_close(d);
}

/* ---- data order: the formulas of docs/training.md#data-order, reimplemented here ---- */

static struct cdp_data *open_order(enum cdp_data_source src, const char *path, const char *labels, uint64_t seed,
                                   enum cdp_data_order order, const struct cdp_model_desc *m)
{
    struct cdp_data_desc dd = {.source = src, .path = (char *)path, .labels = (char *)labels, .seed = seed,
                               .order = order};
    struct cdp_data *d = NULL;
    cr_assert_eq(cdp_data_open(&dd, m, &d), CDP_OK, "%s", cdp_last_error());
    return d;
}

/* Training index of row b of micro-batch j of step s (from 1) on replica r, with
 * equal shares of m micro-batches of B rows (G = R * m * B). */
static int64_t doc_index(int64_t s, int r, int m, int j, int B, int R, int b)
{
    return (s - 1) * (int64_t)R * m * B + ((int64_t)r * m + j) * B + b;
}

Test(data, sequential_windows_follow_the_documented_formula)
{
    enum { N = 2000, T = 8, B = 4, M = 2, R = 2 };
    const char *dir = cdp_test_tmpdir();
    char *path = path_in(dir, "seq.bin");
    uint16_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (uint16_t)i; /* a token is its offset */
    write_tokens(path, 20240520, 1, N, toks, N);
    struct cdp_model_desc g = gpt(N, T);
    struct cdp_data *d = open_order(CDP_DATA_TOKENS, path, NULL, 9, CDP_DATA_ORDER_SEQUENTIAL, &g);
    const int64_t ntr = (1800 - 1) / T, nva = (200 - 1) / T; /* 224 and 24 windows */
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_TRAIN), ntr);
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_VAL), nva);
    int32_t x[B * T], y[B * T];
    /* the first steps' micro-batches on every replica, and steps that wrap past the end */
    const int64_t steps[] = {1, 2, 3, 14, 15, 29};
    for (size_t si = 0; si < sizeof steps / sizeof *steps; si++)
        for (int r = 0; r < R; r++)
            for (int j = 0; j < M; j++) {
                int64_t first = doc_index(steps[si], r, M, j, B, R, 0);
                cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, first, B, x, y), CDP_OK);
                for (int b = 0; b < B; b++) {
                    int64_t p = (doc_index(steps[si], r, M, j, B, R, b) % ntr) * T;
                    for (int t = 0; t < T; t++) {
                        cr_assert_eq(x[b * T + t], p + t, "step %lld replica %d micro-batch %d row %d", (long long)steps[si],
                                     r, j, b);
                        cr_assert_eq(y[b * T + t], p + t + 1);
                    }
                }
            }
    /* step 1 is llm.c's first batch: B*T + 1 consecutive tokens from 0 */
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 0, B, x, y), CDP_OK);
    for (int k = 0; k < B * T; k++) cr_assert(x[k] == k && y[k] == k + 1);
    /* the last window ends inside the split; the next index starts again at 0 */
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, ntr - 1, 2, x, y), CDP_OK);
    cr_assert_eq(x[0], (ntr - 1) * T);
    cr_assert_eq(y[T - 1], ntr * T);
    cr_assert_lt(y[T - 1], 1800);
    cr_assert_eq(x[T], 0);
    /* validation micro-batch k: indices f..f+B-1, f = k*B mod (n_val - B + 1) */
    for (int k = 0; k < 8; k++) {
        int64_t f = ((int64_t)k * B) % (nva - B + 1);
        cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_VAL, f, B, x, y), CDP_OK);
        for (int b = 0; b < B; b++) cr_assert_eq(x[b * T], 1800 + (f + b) * T, "validation batch %d row %d", k, b);
    }
    cdp_data_close(d);
    check_deterministic(CDP_DATA_TOKENS, path, NULL, &g, CDP_SPLIT_TRAIN, 200, 60);

    /* the seed does not matter in file order; text reads the same windows of bytes */
    enum { NB = 500 };
    char *tpath = path_in(dir, "t.txt");
    unsigned char bytes[NB];
    for (int i = 0; i < NB; i++) bytes[i] = (unsigned char)(i * 7 + 3);
    write_bytes(tpath, bytes, NB);
    struct cdp_model_desc g2 = gpt(256, T);
    struct cdp_data *a = open_order(CDP_DATA_TEXT, tpath, NULL, 1, CDP_DATA_ORDER_SEQUENTIAL, &g2),
                    *c = open_order(CDP_DATA_TEXT, tpath, NULL, 2, CDP_DATA_ORDER_SEQUENTIAL, &g2);
    int64_t n = cdp_data_split_size(a, CDP_SPLIT_TRAIN);
    cr_assert_eq(n, (450 - 1) / T);
    int32_t xa[3 * T], xc[3 * T], ya[3 * T];
    cr_assert_eq(cdp_data_fetch(a, CDP_SPLIT_TRAIN, 5, 3, xa, ya), CDP_OK);
    cr_assert_eq(cdp_data_fetch(c, CDP_SPLIT_TRAIN, 5, 3, xc, ya), CDP_OK);
    cr_assert_eq(memcmp(xa, xc, sizeof xa), 0);
    for (int b = 0; b < 3; b++)
        for (int t = 0; t < T; t++) cr_assert_eq(xa[b * T + t], bytes[(5 + b) * T + t]);
    cr_assert_eq(cdp_data_fetch(a, CDP_SPLIT_VAL, 1, 1, xa, ya), CDP_OK);
    for (int t = 0; t < T; t++) cr_assert_eq(xa[t], bytes[450 + T + t]);
    cdp_data_close(a);
    cdp_data_close(c);
}

Test(data, sequential_idx_is_file_order)
{
    enum { N = 50, R = 4, CC = 5, C = 3 };
    const char *dir = cdp_test_tmpdir();
    char *img = path_in(dir, "img.idx"), *lab = path_in(dir, "lab.idx");
    write_images(img, 0x803, N, R, CC, 0);
    write_labels(lab, 0x801, N, C);
    struct cdp_model_desc m = mlp(R * CC, C, CDP_LOSS_CROSS_ENTROPY);
    struct cdp_data *d = open_order(CDP_DATA_IDX, img, lab, 2, CDP_DATA_ORDER_SEQUENTIAL, &m);
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_TRAIN), 45);
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_VAL), 5);
    float x[100 * R * CC];
    int32_t y[100];
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 40, 100, x, y), CDP_OK);
    for (int i = 0; i < 100; i++) {
        int want = (40 + i) % 45;
        cr_assert_eq((int)lroundf(x[i * R * CC] * 255.0f), want, "index %d", 40 + i);
        cr_assert_eq(y[i], want % C);
    }
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_VAL, 3, 4, x, y), CDP_OK);
    for (int i = 0; i < 4; i++) cr_assert_eq((int)lroundf(x[i * R * CC] * 255.0f), 45 + (3 + i) % 5);
    cdp_data_close(d);
}

/* The shuffle, as docs/training.md writes it. */
static uint64_t doc_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t doc_perm(uint64_t seed, uint64_t split, uint64_t epoch, uint64_t n, uint64_t x)
{
    uint64_t key = doc_mix(doc_mix(doc_mix(doc_mix(seed ^ 0x6364706879627264ull) ^ 3) ^ split) ^ epoch);
    int bits = 2;
    while ((1ull << bits) < n) bits += 2;
    int h = bits / 2;
    uint64_t mask = (1ull << h) - 1, K[4];
    for (int r = 0; r < 4; r++) K[r] = doc_mix(key + (uint64_t)r * 0x632be59bd9b4e019ull);
    do {
        uint64_t L = x >> h, R = x & mask;
        for (int r = 0; r < 4; r++) {
            uint64_t nl = R;
            R = L ^ (doc_mix(R ^ K[r]) & mask);
            L = nl;
        }
        x = L << h | R;
    } while (x >= n);
    return x;
}

Test(data, shuffle_follows_the_documented_permutation)
{
    enum { N = 3000, T = 8 };
    const char *dir = cdp_test_tmpdir();
    char *path = path_in(dir, "seq.bin");
    uint16_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (uint16_t)i;
    write_tokens(path, 20240520, 1, N, toks, N);
    struct cdp_model_desc g = gpt(N, T);
    struct cdp_data *d = open_order(CDP_DATA_TOKENS, path, NULL, 77, CDP_DATA_ORDER_SHUFFLE, &g);
    const int64_t ntr = 2700 - T, nva = 300 - T; /* 2692 (12 bits: cycle walking), 292 */
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_TRAIN), ntr);
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_VAL), nva);
    int32_t x[64 * T], y[64 * T];
    const int64_t firsts[] = {0, 1000, ntr - 20, 3 * ntr + 5};
    for (int s = 0; s < 2; s++) {
        int64_t n = s ? nva : ntr, begin = s ? 2700 : 0;
        for (size_t f = 0; f < sizeof firsts / sizeof *firsts; f++) {
            cr_assert_eq(cdp_data_fetch(d, (enum cdp_split)s, firsts[f], 64, x, y), CDP_OK);
            for (int b = 0; b < 64; b++) {
                int64_t i = firsts[f] + b;
                int64_t p = begin + (int64_t)doc_perm(77, (uint64_t)s, (uint64_t)(i / n), (uint64_t)n, (uint64_t)(i % n));
                cr_assert_eq(x[b * T], p, "split %d index %lld", s, (long long)i);
                cr_assert_eq(y[b * T + T - 1], p + T);
            }
        }
    }
    cdp_data_close(d);
    /* the default order is the shuffle */
    struct cdp_data *a = open_ok(CDP_DATA_TOKENS, path, NULL, 77, &g);
    cr_assert_eq(cdp_data_fetch(a, CDP_SPLIT_TRAIN, 1000, 64, y, x), CDP_OK);
    cr_assert_eq(y[0], (int32_t)doc_perm(77, 0, 0, (uint64_t)ntr, 1000));
    cdp_data_close(a);
}

/* ---- bad files ------------------------------------------------------------------------------ */

static void expect_fail(enum cdp_data_source src, const char *path, const char *labels,
                        const struct cdp_model_desc *m, cdp_status want, const char *msg)
{
    struct cdp_data_desc dd = {.source = src, .path = (char *)path, .labels = (char *)labels, .seed = 1};
    struct cdp_data *d = NULL;
    cr_assert_eq(cdp_data_open(&dd, m, &d), want, "status for %s: %s", path, cdp_last_error());
    cr_assert_null(d);
    cr_assert(strstr(cdp_last_error(), msg), "got: %s\nwant: %s", cdp_last_error(), msg);
}

Test(data, bad_text_files)
{
    const char *dir = cdp_test_tmpdir();
    struct cdp_model_desc g = gpt(256, 64);
    char *p = path_in(dir, "short.txt");
    cdp_test_write_file(dir, "short.txt", "hello world, this is far too short for a window of 64 bytes");
    char want[512];
    snprintf(want, sizeof want,
             "%s: too short for one sample of 65 tokens in the validation split (the last 10%% of the file; "
             "needs at least 650 bytes, the file has 59)", p);
    expect_fail(CDP_DATA_TEXT, p, NULL, &g, CDP_ERR_INVALID, want);
    char *e = path_in(dir, "empty.txt");
    cdp_test_write_file(dir, "empty.txt", "");
    expect_fail(CDP_DATA_TEXT, e, NULL, &g, CDP_ERR_INVALID, "the file has 0)");

    struct cdp_model_desc small = gpt(100, 4);
    expect_fail(CDP_DATA_TEXT, p, NULL, &small, CDP_ERR_INVALID,
                "short.txt: text data gives byte tokens 0..255, but the model's vocabulary has only 100 tokens");
    struct cdp_model_desc m = mlp(10, 2, CDP_LOSS_CROSS_ENTROPY);
    expect_fail(CDP_DATA_TEXT, p, NULL, &m, CDP_ERR_INVALID, "short.txt: text data gives byte tokens, but the model");
    expect_fail(CDP_DATA_TEXT, path_in(dir, "absent.txt"), NULL, &g, CDP_ERR_IO,
                "absent.txt: cannot open: No such file or directory");
    expect_fail(CDP_DATA_TEXT, dir, NULL, &g, CDP_ERR_INVALID, ": not a regular file");
}

Test(data, bad_token_files)
{
    const char *dir = cdp_test_tmpdir();
    struct cdp_model_desc g = gpt(100, 8);
    uint16_t toks[1000];
    for (int i = 0; i < 1000; i++) toks[i] = (uint16_t)(i % 100);

    char *p = path_in(dir, "magic.bin");
    write_tokens(p, 20240521, 1, 1000, toks, 1000);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID,
                "magic.bin: not an llm.c token file (magic 20240521, expected 20240520)");
    p = path_in(dir, "version.bin");
    write_tokens(p, 20240520, 2, 1000, toks, 1000);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID, "version.bin: unsupported token file version 2");
    p = path_in(dir, "trunc.bin");
    write_tokens(p, 20240520, 1, 1000, toks, 617);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID,
                "trunc.bin: truncated: header says 1000 tokens (2000 bytes), the file has 1234 bytes after the header");
    p = path_in(dir, "long.bin");
    write_tokens(p, 20240520, 1, 900, toks, 1000);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID,
                "long.bin: header says 900 tokens (1800 bytes), but the file has 2000 bytes after the header");
    p = path_in(dir, "neg.bin");
    write_tokens(p, 20240520, 1, -5, toks, 0);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID, "neg.bin: bad header: negative token count -5");
    p = path_in(dir, "vocab.bin");
    toks[777] = 100;
    write_tokens(p, 20240520, 1, 1000, toks, 1000);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID,
                "vocab.bin: token 100 at position 777 is outside the model's vocabulary (vocab 100)");
    toks[777] = 0;
    p = path_in(dir, "header.bin");
    cdp_test_write_file(dir, "header.bin", "not a token file");
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID,
                "header.bin: too short for an llm.c token file header (16 bytes, needs 1024)");
    p = path_in(dir, "few.bin");
    write_tokens(p, 20240520, 1, 89, toks, 89);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID,
                "few.bin: too short for one sample of 9 tokens in the validation split (the last 10% of the file; "
                "needs at least 90 tokens, the file has 89)");
    write_tokens(p, 20240520, 1, 90, toks, 90);
    struct cdp_data *d = open_ok(CDP_DATA_TOKENS, p, NULL, 1, &g);
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_VAL), 1, "90 tokens are just enough");
    cdp_data_close(d);
    struct cdp_model_desc m = mlp(10, 2, CDP_LOSS_CROSS_ENTROPY);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &m, CDP_ERR_INVALID, "few.bin: token data needs a token model");
}

Test(data, bad_idx_files)
{
    const char *dir = cdp_test_tmpdir();
    struct cdp_model_desc m = mlp(12, 3, CDP_LOSS_CROSS_ENTROPY);
    char *img = path_in(dir, "img.idx"), *lab = path_in(dir, "lab.idx");
    write_images(img, 0x803, 20, 3, 4, 0);
    write_labels(lab, 0x801, 20, 3);
    cdp_data_close(open_ok(CDP_DATA_IDX, img, lab, 1, &m));

    /* the labels file given as images */
    char want[512];
    snprintf(want, sizeof want, "%s: not an IDX images file (magic 0x00000801, expected 0x00000803", lab);
    expect_fail(CDP_DATA_IDX, lab, lab, &m, CDP_ERR_INVALID, want);
    expect_fail(CDP_DATA_IDX, img, img, &m, CDP_ERR_INVALID,
                "img.idx: not an IDX labels file (magic 0x00000803, expected 0x00000801)");

    char *p = path_in(dir, "trunc.idx");
    write_images(p, 0x803, 20, 3, 4, 5);
    expect_fail(CDP_DATA_IDX, p, lab, &m, CDP_ERR_INVALID,
                "trunc.idx: truncated: header says 20 images of 3x4 (240 bytes), the file has 235 bytes after the header");
    p = path_in(dir, "hdr.idx");
    write_images(p, 0x803, 0, 3, 4, 6);
    expect_fail(CDP_DATA_IDX, p, lab, &m, CDP_ERR_INVALID, "hdr.idx: truncated IDX header (10 bytes, needs 16)");
    p = path_in(dir, "size.idx");
    write_images(p, 0x803, 20, 4, 4, 0);
    expect_fail(CDP_DATA_IDX, p, lab, &m, CDP_ERR_INVALID,
                "size.idx: images are 4x4 (16 values), but the model's input [12] takes 12");
    struct cdp_model_desc cnn = mlp(12, 3, CDP_LOSS_CROSS_ENTROPY);
    cnn.input[0] = 1, cnn.input[1] = 4, cnn.input[2] = 3, cnn.input_ndim = 3;
    expect_fail(CDP_DATA_IDX, img, lab, &cnn, CDP_ERR_INVALID,
                "img.idx: images are 3x4 (12 values), but the model's input [1, 4, 3] takes 12");

    char *l2 = path_in(dir, "l2.idx");
    write_labels(l2, 0x801, 19, 3);
    snprintf(want, sizeof want, "%s has 20 images but %s has 19 labels", img, l2);
    expect_fail(CDP_DATA_IDX, img, l2, &m, CDP_ERR_INVALID, want);
    write_labels(l2, 0x801, 20, 7);
    expect_fail(CDP_DATA_IDX, img, l2, &m, CDP_ERR_INVALID, "l2.idx: label 3 of image 3 is outside the model's 3 classes");
    unsigned char lt[8 + 10];
    put_be32(lt, 0x801);
    put_be32(lt + 4, 20);
    write_bytes(l2, lt, sizeof lt);
    expect_fail(CDP_DATA_IDX, img, l2, &m, CDP_ERR_INVALID,
                "l2.idx: truncated: header says 20 labels, the file has 10 bytes after the header");

    p = path_in(dir, "few.idx");
    char *fl = path_in(dir, "fewl.idx");
    write_images(p, 0x803, 9, 3, 4, 0);
    write_labels(fl, 0x801, 9, 3);
    expect_fail(CDP_DATA_IDX, p, fl, &m, CDP_ERR_INVALID,
                "few.idx: too short for one sample in the validation split (the last 10% of the images; needs at "
                "least 10 images, the file has 9)");
    expect_fail(CDP_DATA_IDX, img, path_in(dir, "nolabels.idx"), &m, CDP_ERR_IO, "nolabels.idx: cannot open");

    struct cdp_model_desc g = gpt(256, 8);
    expect_fail(CDP_DATA_IDX, img, lab, &g, CDP_ERR_INVALID, "img.idx: idx images need a model with float inputs");
}

/* The fixtures of tests/plans/data are for the plan loader, not for training;
 * they are far too small for a validation split, which open must say. */
Test(data, plan_fixture_idx_is_too_small)
{
    struct cdp_model_desc m = mlp(784, 10, CDP_LOSS_CROSS_ENTROPY);
    char img[4096];
    snprintf(img, sizeof img, "%s", cdp_test_source_path("tests/plans/data/images.idx"));
    expect_fail(CDP_DATA_IDX, img, cdp_test_source_path("tests/plans/data/labels.idx"), &m, CDP_ERR_INVALID,
                "images.idx: too short for one sample in the validation split");
}

/* ---- shards: lists of files, llm.c uint32 files, .npy arrays, val_path ---------- */

/* An llm.c file of uint32 tokens (llm.c's Llama 3 header: 20240801, version 7). */
static void write_tokens32(const char *path, const uint32_t *toks, size_t n)
{
    unsigned char *buf = calloc(1, 1024 + 4 * n);
    int32_t hdr[3] = {20240801, 7, (int32_t)n};
    memcpy(buf, hdr, sizeof hdr);
    memcpy(buf + 1024, toks, 4 * n);
    write_bytes(path, buf, 1024 + 4 * n);
    free(buf);
}

/* A .npy file as numpy.save writes it (version 1.0, header padded to 64 bytes),
 * with the header's dictionary given as text. */
static void write_npy_dict(const char *path, const char *dict, const void *data, size_t bytes)
{
    char hdr[256];
    int len = snprintf(hdr, sizeof hdr, "%s", dict);
    while ((10 + len + 1) % 64) hdr[len++] = ' ';
    hdr[len++] = '\n';
    unsigned char *buf = malloc(10 + (size_t)len + bytes);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(len & 0xff), buf[9] = (unsigned char)(len >> 8);
    memcpy(buf + 10, hdr, (size_t)len);
    if (bytes) memcpy(buf + 10 + len, data, bytes);
    write_bytes(path, buf, 10 + (size_t)len + bytes);
    free(buf);
}

static void write_npy(const char *path, const char *descr, const void *data, size_t n, size_t width)
{
    char dict[128];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%zu,), }", descr, n);
    write_npy_dict(path, dict, data, n * width);
}

static struct cdp_data *open_files(enum cdp_data_source src, char **paths, int n, char **val, int nv,
                                   enum cdp_data_order order, const struct cdp_model_desc *m)
{
    struct cdp_data_desc dd = {.source = src, .path = paths[0], .paths = paths, .n_paths = n, .val_paths = val,
                               .n_val_paths = nv, .seed = 7, .order = order};
    struct cdp_data *d = NULL;
    cr_assert_eq(cdp_data_open(&dd, m, &d), CDP_OK, "%s", cdp_last_error());
    return d;
}

/* Every sample of both splits of a and b, equal. */
static void same_samples(struct cdp_data *a, struct cdp_data *b, int64_t T)
{
    for (int s = 0; s < CDP_SPLIT_COUNT; s++) {
        int64_t n = cdp_data_split_size(a, (enum cdp_split)s);
        cr_assert_eq(cdp_data_split_size(b, (enum cdp_split)s), n, "split %d", s);
        int32_t *ia = malloc((size_t)(2 * n * T) * sizeof *ia), *ib = malloc((size_t)(2 * n * T) * sizeof *ib);
        int32_t *ta = malloc((size_t)(2 * n * T) * sizeof *ta), *tb = malloc((size_t)(2 * n * T) * sizeof *tb);
        /* two epochs, in one fetch each */
        cr_assert_eq(cdp_data_fetch(a, (enum cdp_split)s, 0, (int)(2 * n), ia, ta), CDP_OK, "%s", cdp_last_error());
        cr_assert_eq(cdp_data_fetch(b, (enum cdp_split)s, 0, (int)(2 * n), ib, tb), CDP_OK, "%s", cdp_last_error());
        cr_assert(!memcmp(ia, ib, (size_t)(2 * n * T) * sizeof *ia), "split %d: inputs differ", s);
        cr_assert(!memcmp(ta, tb, (size_t)(2 * n * T) * sizeof *ta), "split %d: targets differ", s);
        free(ia), free(ib), free(ta), free(tb);
    }
}

Test(data, shards_of_any_format_read_as_the_one_file_they_cut)
{
    const char *dir = cdp_test_tmpdir();
    enum { N = 3000, T = 8 };
    struct cdp_model_desc g = gpt(70000, T);
    uint16_t t16[N];
    uint32_t t32[N];
    for (int i = 0; i < N; i++) t16[i] = (uint16_t)((i * 7919u) % 65000u), t32[i] = t16[i];
    char *whole = path_in(dir, "whole.bin");
    write_tokens(whole, 20240520, 1, N, t16, N);
    /* [0, 1000) llm.c v1, [1000, 1001) npy uint32, an empty shard, [1001, 1700) llm.c uint32,
     * [1700, 3000) npy uint16: windows cross every boundary */
    char *parts[5] = {path_in(dir, "a.bin"), path_in(dir, "b.npy"), path_in(dir, "c.bin"), path_in(dir, "d.bin"),
                      path_in(dir, "e.npy")};
    write_tokens(parts[0], 20240520, 1, 1000, t16, 1000);
    write_npy(parts[1], "<u4", t32 + 1000, 1, 4);
    write_tokens(parts[2], 20240520, 1, 0, t16, 0);
    write_tokens32(parts[3], t32 + 1001, 699);
    write_npy(parts[4], "<u2", t16 + 1700, 1300, 2);
    for (int o = 0; o < CDP_DATA_ORDER_COUNT; o++) {
        char *one[1] = {whole};
        struct cdp_data *a = open_files(CDP_DATA_TOKENS, one, 1, NULL, 0, (enum cdp_data_order)o, &g);
        struct cdp_data *b = open_files(CDP_DATA_TOKENS, parts, 5, NULL, 0, (enum cdp_data_order)o, &g);
        same_samples(a, b, T);
        cdp_data_close(a);
        cdp_data_close(b);
    }
}

Test(data, text_files_concatenate_too)
{
    const char *dir = cdp_test_tmpdir();
    struct cdp_model_desc g = gpt(256, 16);
    char text[2001];
    for (int i = 0; i < 2000; i++) text[i] = (char)('a' + (i * 31) % 26);
    text[2000] = '\0';
    cdp_test_write_file(dir, "whole.txt", text);
    char second[1200];
    memcpy(second, text + 800, 1200);
    text[800] = '\0';
    cdp_test_write_file(dir, "p1.txt", text);
    char *f2 = path_in(dir, "p2.txt");
    write_bytes(f2, second, 1200);
    char *one[1] = {path_in(dir, "whole.txt")}, *two[2] = {path_in(dir, "p1.txt"), f2};
    struct cdp_data *a = open_files(CDP_DATA_TEXT, one, 1, NULL, 0, CDP_DATA_ORDER_SHUFFLE, &g);
    struct cdp_data *b = open_files(CDP_DATA_TEXT, two, 2, NULL, 0, CDP_DATA_ORDER_SHUFFLE, &g);
    same_samples(a, b, 16);
    cdp_data_close(a);
    cdp_data_close(b);
}

Test(data, val_path_is_the_validation_split)
{
    const char *dir = cdp_test_tmpdir();
    enum { T = 4 };
    struct cdp_model_desc g = gpt(1000, T);
    uint16_t tr[500], va[41];
    for (int i = 0; i < 500; i++) tr[i] = (uint16_t)i;
    for (int i = 0; i < 41; i++) va[i] = (uint16_t)(900 + i);
    char *train[1] = {path_in(dir, "train.bin")}, *val[1] = {path_in(dir, "val.bin")};
    write_tokens(train[0], 20240520, 1, 500, tr, 500);
    write_tokens(val[0], 20240520, 1, 41, va, 41);
    struct cdp_data *d = open_files(CDP_DATA_TOKENS, train, 1, val, 1, CDP_DATA_ORDER_SEQUENTIAL, &g);
    /* all 500 training tokens are training now: (500 - 1) / 4 windows */
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_TRAIN), 124);
    cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_VAL), 10);
    int32_t in[2 * T], tg[2 * T];
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_VAL, 9, 2, in, tg), CDP_OK, "%s", cdp_last_error());
    for (int t = 0; t < T; t++) {
        cr_assert_eq(in[t], 900 + 36 + t);   /* window 9 starts at 36 */
        cr_assert_eq(tg[t], 900 + 37 + t);
        cr_assert_eq(in[T + t], 900 + t);    /* index 10 is window 0 again */
    }
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 123, 1, in, tg), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(in[0], 492);
    cr_assert_eq(tg[T - 1], 496);
    cdp_data_close(d);

    /* a validation file too short for one window */
    write_tokens(val[0], 20240520, 1, 4, va, 4);
    struct cdp_data_desc dd = {.source = CDP_DATA_TOKENS, .path = train[0], .paths = train, .n_paths = 1,
                               .val_paths = val, .n_val_paths = 1, .seed = 1};
    cr_assert_eq(cdp_data_open(&dd, &g, &d), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "val.bin: too short for one sample of 5 tokens in the validation split "
                                       "(the file has 4 tokens)"), "%s", cdp_last_error());
}

Test(data, uint32_tokens_beyond_65535)
{
    const char *dir = cdp_test_tmpdir();
    struct cdp_model_desc g = gpt(128256, 4);
    uint32_t t[200];
    for (int i = 0; i < 200; i++) t[i] = 128000u + (uint32_t)i;
    char *files[2] = {path_in(dir, "l3.bin"), path_in(dir, "l3.npy")};
    write_tokens32(files[0], t, 200);
    write_npy(files[1], "<u4", t, 200, 4);
    for (int f = 0; f < 2; f++) {
        struct cdp_data *d = open_files(CDP_DATA_TOKENS, files + f, 1, NULL, 0, CDP_DATA_ORDER_SEQUENTIAL, &g);
        int32_t in[4], tg[4];
        cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 3, 1, in, tg), CDP_OK, "%s", cdp_last_error());
        cr_assert_eq(in[0], 128012, "%s", files[f]);
        cr_assert_eq(tg[3], 128016, "%s", files[f]);
        cdp_data_close(d);
    }
    t[150] = 128256;
    write_npy(files[1], "<u4", t, 200, 4);
    expect_fail(CDP_DATA_TOKENS, files[1], NULL, &g, CDP_ERR_INVALID,
                "l3.npy: token 128256 at position 150 is outside the model's vocabulary (vocab 128256)");
}

Test(data, bad_npy_and_uint32_files)
{
    const char *dir = cdp_test_tmpdir();
    struct cdp_model_desc g = gpt(100, 4);
    uint16_t t[100] = {0};
    char *p = path_in(dir, "x.npy");
    write_npy(p, "<i4", t, 50, 4);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID,
                "x.npy: a .npy array of '<i4'; token arrays must be uint16 ('<u2') or uint32 ('<u4')");
    write_npy(p, ">u2", t, 100, 2);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID, "x.npy: a .npy array of '>u2'");
    write_npy_dict(p, "{'descr': '<u2', 'fortran_order': False, 'shape': (10, 10), }", t, 200);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID, "x.npy: a .npy array of 2 dimensions");
    write_npy_dict(p, "{'descr': '<u2', 'shape': (100,), }", t, 200);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID, "x.npy: .npy header lacks 'fortran_order'");
    write_npy_dict(p, "{'descr': '<u2', 'fortran_order': False, 'shape': (100,), }", t, 150);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID,
                "x.npy: truncated: header says 100 tokens (200 bytes), the file has 150 bytes after the header");
    write_npy_dict(p, "{'descr': '<u2', 'fortran_order': False, 'shape': (100,), 'x': 1}", t, 200);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID, "x.npy: .npy header: unknown key 'x'");
    write_bytes(p, "\x93NUMPY\x01\x00\xff\x00{", 11);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID, "x.npy: truncated .npy header (255 bytes announced");
    write_bytes(p, "\x93NUMPY\x04\x00\x10\x00", 10);
    expect_fail(CDP_DATA_TOKENS, p, NULL, &g, CDP_ERR_INVALID, "x.npy: .npy format version 4.0");
    char *b = path_in(dir, "v.bin");
    write_tokens(b, 20240801, 1, 100, t, 100);
    expect_fail(CDP_DATA_TOKENS, b, NULL, &g, CDP_ERR_INVALID,
                "v.bin: unsupported token file version 1 for magic 20240801 (expected 7: uint32 tokens)");
}

/* A file too large to be checked whole at open (a sparse file of zeros, no disk
 * used) is checked window by window as it is read. */
Test(data, large_files_are_checked_as_read)
{
    const char *dir = cdp_test_tmpdir();
    struct cdp_model_desc g = gpt(100, 4);
    char *p = path_in(dir, "big.bin");
    const int64_t n = 40 << 20; /* 80 MiB of tokens */
    FILE *f = fopen(p, "wb");
    int32_t hdr[256] = {20240520, 1, (int32_t)n};
    fwrite(hdr, sizeof hdr, 1, f);
    cr_assert_eq(fseeko(f, 1024 + 2 * (n - 1000), SEEK_SET), 0);
    uint16_t bad = 4242;
    fwrite(&bad, 2, 1, f);
    cr_assert_eq(fseeko(f, 1024 + 2 * n - 1, SEEK_SET), 0);
    fputc(0, f);
    fclose(f);
    char *one[1] = {p};
    struct cdp_data *d = open_files(CDP_DATA_TOKENS, one, 1, NULL, 0, CDP_DATA_ORDER_SEQUENTIAL, &g);
    int32_t in[4], tg[4];
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_VAL, 0, 1, in, tg), CDP_OK, "%s", cdp_last_error());
    /* validation begins at n - n/10; window k starts at k*4 */
    const int64_t k = (n - 1000 - (n - n / 10)) / 4;
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_VAL, k, 1, in, tg), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "big.bin: token 4242 at position 41942040 is outside the model's vocabulary"),
              "%s", cdp_last_error());
    cdp_data_close(d);
}

/* A file that shrinks while it is mapped: the read that would raise SIGBUS is an
 * error naming the file (issue: a shrunk data file killed the rank with a signal). */
Test(data, a_file_that_shrinks_while_mapped_is_an_error_not_a_signal)
{
    const char *dir = cdp_test_tmpdir();
    struct cdp_model_desc g = gpt(1000, 16);
    enum { N = 100000 };
    uint16_t *t = malloc(N * sizeof *t);
    for (int i = 0; i < N; i++) t[i] = (uint16_t)(i % 1000);
    char *p = path_in(dir, "shrink.bin");
    write_tokens(p, 20240520, 1, N, t, N);
    char *one[1] = {p};
    struct cdp_data *d = open_files(CDP_DATA_TOKENS, one, 1, NULL, 0, CDP_DATA_ORDER_SEQUENTIAL, &g);
    int32_t in[16 * 4], tg[16 * 4];
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 5000, 4, in, tg), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(truncate(p, 8192), 0);
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 5000, 4, in, tg), CDP_ERR_IO);
    char want[512];
    snprintf(want, sizeof want, "%s: the file changed while training read it: it has 8192 bytes now, %d when opened",
             p, 1024 + 2 * N);
    cr_assert(strstr(cdp_last_error(), want), "got: %s\nwant: %s", cdp_last_error(), want);
    /* the first page is still there: reading it works */
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 0, 1, in, tg), CDP_OK, "%s", cdp_last_error());
    cdp_data_close(d);

    /* text, and a file that is gone */
    char *txt = path_in(dir, "shrink.txt");
    write_bytes(txt, t, N * sizeof *t);
    struct cdp_model_desc b = gpt(256, 16);
    char *tx[1] = {txt};
    d = open_files(CDP_DATA_TEXT, tx, 1, NULL, 0, CDP_DATA_ORDER_SEQUENTIAL, &b);
    cr_assert_eq(truncate(txt, 0), 0);
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_VAL, 10, 1, in, tg), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "shrink.txt: the file changed while training read it: it has 0 bytes now"),
              "%s", cdp_last_error());
    cdp_data_close(d);
    free(t);
}

/* The same for idx images and labels. */
Test(data, a_shrunk_idx_file_is_an_error_naming_it)
{
    enum { N = 2000, R = 28, CC = 28, C = 10 };
    const char *dir = cdp_test_tmpdir();
    char *img = path_in(dir, "img.idx"), *lab = path_in(dir, "lab.idx");
    write_images(img, 0x803, N, R, CC, 0);
    write_labels(lab, 0x801, N, C);
    struct cdp_model_desc m = mlp(R * CC, C, CDP_LOSS_CROSS_ENTROPY);
    struct cdp_data_desc dd = {.source = CDP_DATA_IDX, .path = img, .labels = lab, .seed = 1,
                               .order = CDP_DATA_ORDER_SEQUENTIAL};
    struct cdp_data *d = NULL;
    cr_assert_eq(cdp_data_open(&dd, &m, &d), CDP_OK, "%s", cdp_last_error());
    static float x[4 * R * CC];
    int32_t y[4];
    cr_assert_eq(truncate(img, 4096), 0);
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_VAL, 0, 4, x, y), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "img.idx: the file changed while training read it: it has 4096 bytes now"),
              "%s", cdp_last_error());
    cr_assert_eq(truncate(lab, 0), 0);
    cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 0, 1, x, y), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "lab.idx: the file changed while training read it: it has 0 bytes now"),
              "%s", cdp_last_error());
    cdp_data_close(d);
}

/* A SIGBUS that is not a data read keeps its usual meaning (the guard passes it on). */
Test(data, other_bus_errors_are_not_swallowed, .signal = SIGBUS)
{
    signal(SIGBUS, SIG_DFL); /* the disposition the guard passes on (a sanitizer's own handler would exit otherwise) */
    const char *dir = cdp_test_tmpdir();
    struct cdp_model_desc g = gpt(256, 4);
    cdp_test_write_file(dir, "t.txt", "abcdefghijklmnopqrstuvwxyz abcdefghijklmnopqrstuvwxyz abcdefghijklmnopqrstuvwxyz");
    char *one[1] = {path_in(dir, "t.txt")};
    struct cdp_data *d = open_files(CDP_DATA_TEXT, one, 1, NULL, 0, CDP_DATA_ORDER_SHUFFLE, &g);
    raise(SIGBUS);
    cdp_data_close(d);
}
