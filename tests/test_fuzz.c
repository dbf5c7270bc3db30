/* Suite fuzz: a seeded mutation loop over every reader of outside input (the
 * plan loader, the three topology readers, safetensors and its index of
 * shards, a Hugging Face config.json, the checkpoint manifest, token files
 * (.npy, llm.c uint32), tokenizer.json). Each target mutates real seed files (flipped bits, interesting
 * bytes and tokens, cut and repeated ranges) for CDP_FUZZ_SECONDS (default 4)
 * or at least 200 inputs, and every input must be accepted or refused with a
 * message: never a crash, a hang (the test's timeout) or, under ASan and
 * UBSan (CI's second pass), a memory error or undefined behaviour. The seed
 * of a run is printed; CDP_FUZZ_SEED repeats it. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cdp/log.h"
#include "cdp/plan.h"
#include "cdp/topology.h"
#include "core/file.h"
#include "harness.h"
#include "model/bpe.h"
#include "model/checkpoint.h"
#include "model/data.h"
#include "model/hf.h"
#include "model/safetensors.h"
#include "pipeline/layout.h"

struct rng {
    uint64_t s;
};

static uint64_t next(struct rng *r)
{
    r->s += 0x9e3779b97f4a7c15ull;
    uint64_t z = r->s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t below(struct rng *r, size_t n) { return n ? (size_t)(next(r) % n) : 0; }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double budget_s(void)
{
    const char *v = getenv("CDP_FUZZ_SECONDS");
    const double s = v ? atof(v) : 4.0;
    return s > 0 ? s : 4.0;
}

static uint64_t seed_of(const char *target)
{
    const char *v = getenv("CDP_FUZZ_SEED");
    uint64_t s = v ? strtoull(v, NULL, 0) : (uint64_t)time(NULL);
    for (const char *p = target; *p; p++) s = s * 131 + (unsigned char)*p;
    return s;
}

struct blob {
    char *p;
    size_t n;
};

static struct blob read_blob(const char *path)
{
    struct blob b = {0};
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    cr_assert_geq(n, 0);
    b.p = malloc((size_t)n + 1);
    cr_assert_not_null(b.p);
    b.n = fread(b.p, 1, (size_t)n, f);
    b.p[b.n] = '\0';
    fclose(f);
    return b;
}

static const char *const tokens[] = {"1e308", "-1", "0", "2147483648", "9223372036854775808", "null", "[]", "{}",
                                     "\"\"", "nan", "inf", "-0", "1e-324", "\"auto\"", "true", "\"x\"", ",", ":",
                                     "\"layers\"", "99999999999", "<", ">", "=\"", "\xff\xfe", "\\u0000"};

/* One mutant of seed into out (malloc'd, NUL-terminated; *n its length). */
static char *mutate(struct rng *r, const struct blob *seed, size_t *n)
{
    size_t cap = seed->n * 2 + 256, len = seed->n;
    char *b = malloc(cap + 1);
    cr_assert_not_null(b);
    memcpy(b, seed->p, seed->n);
    const int ops = 1 + (int)below(r, 6);
    for (int k = 0; k < ops; k++) {
        const size_t at = below(r, len + 1);
        switch (below(r, 6)) {
        case 0: /* a bit */
            if (len) b[below(r, len)] ^= (char)(1u << below(r, 8));
            break;
        case 1: { /* an interesting byte */
            static const char bytes[] = {0, '\xff', '"', '{', '}', '[', ']', '9', '-', '.', 'e', '<', '/', '\n'};
            if (len) b[below(r, len)] = bytes[below(r, sizeof bytes)];
            break;
        }
        case 2: { /* cut a range */
            const size_t cut = below(r, len - (at < len ? at : len) + 1) % 64;
            if (at + cut <= len) memmove(b + at, b + at + cut, len - at - cut), len -= cut;
            break;
        }
        case 3: { /* repeat a range */
            const size_t from = below(r, len + 1), m = below(r, 48);
            if (from + m <= len && len + m <= cap) {
                memmove(b + at + m, b + at, len - at);
                memmove(b + at, b + (from < at ? from : from + m), m);
                len += m;
            }
            break;
        }
        default: { /* a token, over what was there or inserted */
            const char *t = tokens[below(r, sizeof tokens / sizeof *tokens)];
            const size_t m = strlen(t);
            if (len + m > cap) break;
            if (below(r, 2) && at + m <= len) {
                memcpy(b + at, t, m);
            } else {
                memmove(b + at + m, b + at, len - at);
                memcpy(b + at, t, m);
                len += m;
            }
            break;
        }
        }
    }
    b[len] = '\0';
    *n = len;
    return b;
}

/* Runs fn on mutants of the seeds for the budget; counts the refusals, each
 * of which must come with a message. */
typedef cdp_status (*target_fn)(const char *data, size_t n, void *ctx);

static void fuzz(const char *name, const struct blob *seeds, int n_seeds, target_fn fn, void *ctx)
{
    struct rng r = {seed_of(name)};
    const uint64_t first = r.s;
    const double t0 = now_s(), budget = budget_s();
    long runs = 0, refused = 0;
    cdp_log_set_level(CDP_LOG_ERROR); /* the readers' warnings on mutants are expected */
    while (runs < 200 || now_s() - t0 < budget) {
        const struct blob *s = runs < n_seeds ? &seeds[runs] : &seeds[below(&r, (size_t)n_seeds)];
        size_t n = 0;
        char *m = runs < n_seeds ? NULL : mutate(&r, s, &n);
        const cdp_status st = m ? fn(m, n, ctx) : fn(s->p, s->n, ctx);
        if (!m) cr_assert_eq(st, CDP_OK, "%s: seed %ld is refused: %s", name, runs, cdp_last_error());
        if (st) {
            refused++;
            cr_assert(cdp_last_error()[0], "%s: a refusal without a message (seed %#llx, input %ld)", name,
                      (unsigned long long)first, runs);
        }
        free(m);
        runs++;
        if (runs > 100000) break;
    }
    cr_log_info("%s: %ld inputs in %.1f s, %ld refused with a message (CDP_FUZZ_SEED to repeat: seed %#llx)", name,
                runs, now_s() - t0, refused, (unsigned long long)first);
}

/* ---- targets ----------------------------------------------------------------- */

static cdp_status plan_target(const char *data, size_t n, void *ctx)
{
    (void)n;
    struct cdp_plan *p = NULL;
    cdp_status st = cdp_plan_load_string(data, "fuzz.json", (const char *)ctx, &p); /* relative to examples/ */
    if (!st) cdp_plan_free(p);
    return st;
}

static cdp_status topology_target(const char *data, size_t n, void *ctx)
{
    struct cdp_topology *t = NULL;
    cdp_status st = cdp_topology_load_text(data, n, (const char *)ctx, &t);
    if (!st) cdp_topology_free(t);
    return st;
}

struct file_ctx {
    char path[4200];
    int manifest; /* write into a checkpoint folder and find it */
    char folder[4096];
};

static cdp_status write_raw(const char *path, const char *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
    return CDP_OK;
}

static cdp_status safetensors_target(const char *data, size_t n, void *vctx)
{
    struct file_ctx *c = vctx;
    write_raw(c->path, data, n);
    struct cdp_safetensors_file *f = NULL;
    cdp_status st = cdp_safetensors_open(c->path, &f);
    if (st) return st;
    /* read every tensor's bytes, as a load would */
    volatile unsigned sum = 0;
    for (int i = 0; i < cdp_safetensors_count(f); i++) {
        const struct cdp_safetensors_tensor *t = cdp_safetensors_at(f, i);
        const unsigned char *d = t->data;
        for (uint64_t k = 0; k < t->nbytes; k += 61) sum += d[k];
    }
    (void)sum;
    cdp_safetensors_close(f);
    return CDP_OK;
}

static cdp_status manifest_target(const char *data, size_t n, void *vctx)
{
    struct file_ctx *c = vctx;
    write_raw(c->path, data, n);
    char *path = NULL;
    struct cdp_ckpt_info info;
    cdp_status st = cdp_ckpt_find_latest(c->folder, &path, &info);
    if (st) return st;
    free(path);
    cdp_ckpt_info_free(&info);
    return CDP_OK;
}

/* A token file (any of the kinds data.h reads): open it, then read every
 * sample of both splits. */
static cdp_status tokens_target(const char *data, size_t n, void *vctx)
{
    struct file_ctx *c = vctx;
    write_raw(c->path, data, n);
    struct cdp_model_desc g = {.kind = CDP_MODEL_GPT, .vocab = 70000, .context = 4, .layers = 1, .heads = 1,
                               .embed = 8};
    char *paths[1] = {c->path};
    struct cdp_data_desc dd = {.source = CDP_DATA_TOKENS, .path = c->path, .paths = paths, .n_paths = 1, .seed = 1};
    struct cdp_data *d = NULL;
    cdp_status st = cdp_data_open(&dd, &g, &d);
    if (st) return st;
    int32_t in[4 * 8], tg[4 * 8];
    for (int s = 0; s < CDP_SPLIT_COUNT && !st; s++)
        for (int64_t i = 0; i < cdp_data_split_size(d, (enum cdp_split)s) && i < 512 && !st; i += 8)
            st = cdp_data_fetch(d, (enum cdp_split)s, i, 8, in, tg);
    cdp_data_close(d);
    return st;
}

/* A tokenizer.json: load it, then encode a few scripts with it. */
static cdp_status tokenizer_target(const char *data, size_t n, void *vctx)
{
    struct file_ctx *c = vctx;
    write_raw(c->path, data, n);
    struct cdp_bpe *b = NULL;
    cdp_status st = cdp_bpe_load_json(c->path, &b);
    if (st) return st;
    static const char text[] = "Hello, wörld! Привет 123456 你好 \t\r\n  x";
    int32_t *ids = NULL;
    int64_t k = 0;
    st = cdp_bpe_encode(b, text, sizeof text - 1, &ids, &k);
    free(ids);
    cdp_bpe_free(b);
    return st;
}

/* A Hugging Face folder's config.json (ctx: the folder, its weights beside). */
static cdp_status hf_config_target(const char *data, size_t n, void *vctx)
{
    struct file_ctx *c = vctx;
    write_raw(c->path, data, n);
    struct cdp_model_desc md;
    char *weights = NULL;
    cdp_status st = cdp_hf_read_config(c->folder, &md, &weights);
    free(weights);
    return st;
}

static cdp_status layout_target(const char *data, size_t n, void *ctx)
{
    (void)ctx;
    json_error_t je;
    json_t *j = json_loadb(data, n, 0, &je);
    if (!j) return cdp_fail(CDP_ERR_INVALID, "fuzz.json: line %d: %s", je.line, je.text);
    struct cdp_layout *l = NULL;
    cdp_status st = cdp_layout_from_json(j, "fuzz.json", "/layout", &l);
    json_decref(j);
    cdp_layout_free(l);
    return st;
}

/* ---- tests ------------------------------------------------------------------- */

/* planned.json's "layout" (pipeline/layout_json.c): seeds written by
 * cdp_layout_to_json, an interleaved 2 x 2 x 2 with CPU sets and a one-rank one. */
Test(fuzz, layout_json, .timeout = 300)
{
    struct blob seeds[2];
    for (int k = 0; k < 2; k++) {
        struct cdp_layout *l = NULL;
        const int p = k ? 1 : 2, v = k ? 1 : 2, R = k ? 1 : 2;
        cr_assert_eq(cdp_layout_create(p, v, R, &l), CDP_OK);
        l->schedule = k ? CDP_SCHEDULE_GPIPE : CDP_SCHEDULE_INTERLEAVED;
        l->micro_batches = 4, l->micro_batch = 2;
        for (int r = 0; r < R; r++) l->shares[r] = 4;
        for (int i = 0; i < p * v; i++) l->ranges[i][0] = i, l->ranges[i][1] = i + 1;
        for (int i = 0; i < p * R; i++) {
            l->rank[i] = (struct cdp_layout_rank){.stage = i / R, .replica = i % R, .device = i, .gpu = i};
            snprintf(l->rank[i].cpuset, sizeof l->rank[i].cpuset, "%d-%d", 2 * i, 2 * i + 1);
        }
        json_t *j = cdp_layout_to_json(l);
        char *text = json_dumps(j, JSON_INDENT(2));
        cr_assert_not_null(text);
        seeds[k] = (struct blob){.p = text, .n = strlen(text)};
        json_decref(j);
        cdp_layout_free(l);
    }
    fuzz("layout", seeds, 2, layout_target, NULL);
    for (int i = 0; i < 2; i++) free(seeds[i].p);
}

Test(fuzz, plan_loader, .timeout = 300)
{
    static const char *const files[] = {"examples/quickstart.json", "examples/gpt-tiny.json", "examples/cnn.json",
                                        "examples/gpt2-124m.json", "examples/larger-than-device.json"};
    struct blob seeds[8];
    int n = 0;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        struct stat sb;
        const char *p = cdp_test_source_path(files[i]);
        if (stat(p, &sb) == 0) seeds[n++] = read_blob(p);
    }
    cr_assert_geq(n, 3, "the example plans are the seeds");
    char base[4096];
    snprintf(base, sizeof base, "%s", cdp_test_source_path("examples"));
    fuzz("plan", seeds, n, plan_target, base);
    for (int i = 0; i < n; i++) free(seeds[i].p);
}

static void fuzz_topology(const char *name, const char *const *files, int n_files, const char *as)
{
    struct blob seeds[8];
    for (int i = 0; i < n_files; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fixtures/topology/%s", files[i]);
        seeds[i] = read_blob(cdp_test_source_path(rel));
    }
    fuzz(name, seeds, n_files, topology_target, (void *)as);
    for (int i = 0; i < n_files; i++) free(seeds[i].p);
}

Test(fuzz, topology_json, .timeout = 300)
{
    /* our JSON: a preset's export and a cluster file */
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load("dgx1-v100", NULL, &t), CDP_OK, "%s", cdp_last_error());
    char *text = NULL;
    cr_assert_eq(cdp_topology_to_native_json(t, &text), CDP_OK, "%s", cdp_last_error());
    cdp_topology_free(t);
    struct blob seeds[2] = {{text, strlen(text)},
                            read_blob(cdp_test_source_path("tests/fixtures/topology/cluster-2x-custom.json"))};
    fuzz("topology JSON", seeds, 2, topology_target, (void *)"fuzz.json");
    free(seeds[0].p);
    free(seeds[1].p);
}

Test(fuzz, topology_hwloc_xml, .timeout = 300)
{
    static const char *const files[] = {"hwloc-4gpu-nvlink.xml", "hwloc-nvswitch.xml"};
    fuzz_topology("hwloc XML", files, 2, "fuzz-hwloc.xml");
}

Test(fuzz, topology_nccl_xml, .timeout = 300)
{
    static const char *const files[] = {"nccl-4gpu.xml", "nccl-nvswitch.xml"};
    fuzz_topology("NCCL XML", files, 2, "fuzz-nccl.xml");
}

Test(fuzz, safetensors, .timeout = 300)
{
    const char *dir = cdp_test_tmpdir();
    struct file_ctx c = {0};
    snprintf(c.path, sizeof c.path, "%s/seed.safetensors", dir);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[4] = {0x3f80, 0x4000, 0xc040, 0};
    struct cdp_safetensors_tensor ts[2] = {
        {.name = "layers.0.weight", .dtype = CDP_DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = a, .nbytes = 24},
        {.name = "layers.1.bias", .dtype = CDP_DTYPE_BF16, .ndim = 1, .shape = {4}, .data = h, .nbytes = 8}};
    const char *meta[2] = {"format", "pt"};
    cr_assert_eq(cdp_safetensors_write(c.path, ts, 2, meta, 1), CDP_OK, "%s", cdp_last_error());
    struct blob seed = read_blob(c.path);
    snprintf(c.path, sizeof c.path, "%s/fuzz.safetensors", dir);
    fuzz("safetensors", &seed, 1, safetensors_target, &c);
    free(seed.p);
}

Test(fuzz, checkpoint_manifest, .timeout = 300)
{
    /* a real committed checkpoint of a one-unit model; its manifest is mutated */
    const char *dir = cdp_test_tmpdir();
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"mlp\", \"input\": [3], \"hidden\": [4], "
                                      "\"classes\": 2}}", "m.json", NULL, &p),
                 CDP_OK, "%s", cdp_last_error());
    cdp_device_t dev = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev), CDP_OK, "%s", cdp_last_error());
    struct cdp_model *m = NULL;
    cr_assert_eq(cdp_model_create(&p->model, 0, (int)cdp_plan_model_units(p), 1, 1, 1, dev, &m), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert_eq(cdp_ckpt_write_part(dir, 3, "stage-0", &m, NULL, 1), CDP_OK, "%s", cdp_last_error());
    struct cdp_ckpt_info info = {.step = 3, .samples_seen = 12, .seed = 1, .optimizer = "sgd"};
    cr_assert_eq(cdp_ckpt_commit(dir, 3, &info, 2), CDP_OK, "%s", cdp_last_error());
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
    struct file_ctx c = {0};
    snprintf(c.folder, sizeof c.folder, "%.4000s/step-00000003", dir);
    snprintf(c.path, sizeof c.path, "%s/manifest.json", c.folder);
    struct blob seed = read_blob(c.path);
    fuzz("checkpoint manifest", &seed, 1, manifest_target, &c);
    free(seed.p);
}

Test(fuzz, token_files, .timeout = 300)
{
    const char *dir = cdp_test_tmpdir();
    struct file_ctx c = {0};
    snprintf(c.path, sizeof c.path, "%s/fuzz.tokens", dir);
    struct blob seeds[2];
    /* a .npy of 200 uint16 tokens, and an llm.c uint32 file of 200 */
    char npy[128 + 400];
    memset(npy, ' ', 128);
    memcpy(npy, "\x93NUMPY\x01\x00\x76\x00", 10);
    int l = snprintf(npy + 10, 118, "{'descr': '<u2', 'fortran_order': False, 'shape': (200,), }");
    npy[10 + l] = ' ';
    npy[127] = '\n';
    for (int i = 0; i < 200; i++) npy[128 + 2 * i] = (char)i, npy[129 + 2 * i] = (char)(i % 3);
    seeds[0] = (struct blob){malloc(sizeof npy), sizeof npy};
    memcpy(seeds[0].p, npy, sizeof npy);
    seeds[1] = (struct blob){calloc(1, 1024 + 800), 1024 + 800};
    const int32_t hdr[3] = {20240801, 7, 200};
    memcpy(seeds[1].p, hdr, sizeof hdr);
    for (int i = 0; i < 200; i++) {
        const uint32_t v = 65000u + (uint32_t)i;
        memcpy(seeds[1].p + 1024 + 4 * i, &v, 4);
    }
    fuzz("token files", seeds, 2, tokens_target, &c);
    free(seeds[0].p);
    free(seeds[1].p);
}

/* A copy of a fixture folder of tests/fixtures/hf in dir/name. */
static void copy_fixture(const char *name, const char *to)
{
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp -r '%s/%s' '%s'", cdp_test_source_path("tests/fixtures/hf"), name, to);
    cr_assert_eq(system(cmd), 0);
}

Test(fuzz, hf_config, .timeout = 300)
{
    const char *dir = cdp_test_tmpdir();
    struct blob seeds[2];
    const char *names[2] = {"gpt2-tiny", "llama-tiny"};
    struct file_ctx c = {0};
    for (int i = 0; i < 2; i++) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s/config.json", cdp_test_source_path("tests/fixtures/hf"), names[i]);
        seeds[i] = read_blob(path);
    }
    snprintf(c.folder, sizeof c.folder, "%.4000s/hf", dir);
    copy_fixture("gpt2-tiny", c.folder);
    snprintf(c.path, sizeof c.path, "%s/config.json", c.folder);
    fuzz("hf config.json", seeds, 2, hf_config_target, &c);
    free(seeds[0].p);
    free(seeds[1].p);
}

Test(fuzz, tokenizer_json, .timeout = 300)
{
    const char *dir = cdp_test_tmpdir();
    struct file_ctx c = {0};
    snprintf(c.path, sizeof c.path, "%s/tokenizer.json", dir);
    struct blob seed = read_blob(cdp_test_source_path("tests/fixtures/tokenize/llama3/tokenizer.json"));
    fuzz("tokenizer.json", &seed, 1, tokenizer_target, &c);
    free(seed.p);
}

Test(fuzz, safetensors_index, .timeout = 300)
{
    /* the index of transformers' four shards, mutated beside them */
    const char *dir = cdp_test_tmpdir();
    struct file_ctx c = {0};
    snprintf(c.folder, sizeof c.folder, "%.4000s/hf", dir);
    copy_fixture("gpt2-tiny", c.folder);
    snprintf(c.path, sizeof c.path, "%s/model.safetensors.index.json", c.folder);
    struct blob seed = read_blob(c.path);
    fuzz("safetensors index", &seed, 1, safetensors_target, &c);
    free(seed.p);
}
