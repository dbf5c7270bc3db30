/* Suite checkpoint: parts written under one split load bitwise under another
 * (tied copies and optimizer state included), commit and pruning, incomplete
 * folders skipped, every corrupt case a clear error that changes no file,
 * SHA-256 against the FIPS 180-4 vectors, export, and `cdphybrid export`. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/device.h"
#include "cdp/plan.h"
#include "core/hash.h"
#include "harness.h"
#include "model/checkpoint.h"
#include "model/hf.h"
#include "model/model.h"
#include "model/optim.h"
#include "model/safetensors.h"

/* A GPT of 5 units: embedding (0), 3 blocks (1..3), head (4) tied to unit 0. */
#define GPT(layers, embed)                                                                   \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 40, \"context\": 5, \"layers\": " #layers \
    ", \"heads\": 2, \"embed\": " #embed "}}"

static struct cdp_plan *plan_from(const char *json)
{
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string(json, "test.json", NULL, &p), CDP_OK, "%s", cdp_last_error());
    struct cdp_machine_info mi = {0, NULL};
    cr_assert_eq(cdp_plan_resolve(p, &mi), CDP_OK, "%s", cdp_last_error());
    return p;
}

/* Model ranges of one layout with their optimizers. */
struct split {
    int n;
    struct cdp_model *m[4];
    struct cdp_optimizer *o[4];
    cdp_device_t dev;
    struct cdp_plan *plan;
};

static struct split make_split(const char *json, const int *bounds, int n, enum cdp_optimizer_type type,
                               uint64_t seed)
{
    struct split s = {.n = n};
    s.plan = plan_from(json);
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &s.dev), CDP_OK, "%s", cdp_last_error());
    struct cdp_optimizer_desc od = {.type = type, .lr = 1e-3, .weight_decay = 0.1, .momentum = 0.9,
                                    .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    for (int k = 0; k < n; k++) {
        cr_assert_eq(cdp_model_create(&s.plan->model, bounds[k], bounds[k + 1], 2, 1, seed, s.dev, &s.m[k]), CDP_OK,
                     "%s", cdp_last_error());
        cr_assert_eq(cdp_optimizer_create(&od, s.m[k], s.dev, &s.o[k]), CDP_OK, "%s", cdp_last_error());
    }
    return s;
}

static void free_split(struct split *s)
{
    for (int k = 0; k < s->n; k++) {
        cdp_optimizer_destroy(s->o[k]);
        cdp_model_destroy(s->m[k]);
    }
    cdp_device_close(s->dev);
    cdp_plan_free(s->plan);
}

/* Values that depend only on the tensor's name and role, so a tied copy gets
 * exactly its owner's values, as training keeps them. */
static void fill(float *x, int64_t n, const char *name, int role)
{
    uint64_t h = 1469598103934665603ull + (uint64_t)role;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    for (int64_t i = 0; i < n; i++) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((h >> 40) % 100000) / 1e5f - 0.5f + (float)role;
    }
}

static void fill_split(struct split *s)
{
    for (int k = 0; k < s->n; k++) {
        for (int i = 0; i < cdp_model_tensor_count(s->m[k]); i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(s->m[k], i);
            float *a, *b;
            cdp_optimizer_state(s->o[k], s->m[k], i, &a, &b);
            fill(t->data, t->numel, t->name, 0);
            fill(a, t->numel, t->name, 1);
            if (b) fill(b, t->numel, t->name, 2);
        }
    }
}

/* The owner copy of a tensor in a split, with its optimizer state. */
static struct cdp_model_tensor *find_owner(struct split *s, const char *name, float **a, float **b)
{
    for (int k = 0; k < s->n; k++) {
        int first = cdp_model_unit(s->m[k], 0)->index;
        for (int i = 0; i < cdp_model_tensor_count(s->m[k]); i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(s->m[k], i);
            if (strcmp(t->name, name) || t->unit < first) continue;
            cdp_optimizer_state(s->o[k], s->m[k], i, a, b);
            return t;
        }
    }
    return NULL;
}

/* Every tensor of dst (tied copies too) and its optimizer state bitwise equal to src's owner. */
static void assert_same(struct split *dst, struct split *src, int64_t steps)
{
    int copies = 0;
    for (int k = 0; k < dst->n; k++) {
        int first = cdp_model_unit(dst->m[k], 0)->index;
        cr_assert_eq(cdp_optimizer_steps(dst->o[k]), steps);
        for (int i = 0; i < cdp_model_tensor_count(dst->m[k]); i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(dst->m[k], i);
            float *a, *b, *sa, *sb;
            cdp_optimizer_state(dst->o[k], dst->m[k], i, &a, &b);
            struct cdp_model_tensor *w = find_owner(src, t->name, &sa, &sb);
            cr_assert_not_null(w, "%s", t->name);
            size_t bytes = (size_t)t->numel * 4;
            cr_assert_eq(memcmp(t->data, w->data, bytes), 0, "%s differs", t->name);
            cr_assert_eq(memcmp(a, sa, bytes), 0, "state of %s differs", t->name);
            cr_assert_eq(!b, !sb);
            if (b) cr_assert_eq(memcmp(b, sb, bytes), 0, "second state of %s differs", t->name);
            copies += t->unit < first;
        }
    }
    cr_assert_geq(copies, dst->n > 1 ? 1 : 0, "a later range holds a tied copy");
}

static const int two[] = {0, 2, 5}, whole[] = {0, 5}, three[] = {0, 1, 4, 5};

static const char *plan_json = "{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 2}}";

/* Writes a checkpoint of step `step` from the 2-range split s into dir. */
static void save(struct split *s, const char *dir, int64_t step, int keep)
{
    cr_assert_eq(cdp_ckpt_write_part(dir, step, "stage-0-chunk-0", &s->m[0], &s->o[0], 1), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert_eq(cdp_ckpt_write_part(dir, step, "stage-1-chunk-0", &s->m[1], &s->o[1], 1), CDP_OK, "%s",
                 cdp_last_error());
    struct cdp_ckpt_info info = {.step = step, .samples_seen = step * 16, .seed = 1234,
                                 .optimizer = "adamw", .plan_json = (char *)plan_json};
    if (cdp_optimizer_type_of(s->o[0]) == CDP_OPT_SGD) strcpy(info.optimizer, "sgd");
    cr_assert_eq(cdp_ckpt_commit(dir, step, &info, keep), CDP_OK, "%s", cdp_last_error());
}

/* printf into one of a few rotating static buffers */
static const char *fmt(const char *f, ...) CDP_PRINTF(1, 2);
static const char *fmt(const char *f, ...)
{
    static char buf[16][8192];
    static int k;
    k = (k + 1) % 16;
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf[k], sizeof buf[k], f, ap);
    va_end(ap);
    return buf[k];
}

static const char *path_in(const char *dir, const char *rel) { return fmt("%s/%s", dir, rel); }

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void roundtrip(enum cdp_optimizer_type type)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/runs/a/ckpt", cdp_test_tmpdir()); /* made with mkdir -p */
    struct split src = make_split(GPT(3, 8), two, 2, type, 1);
    fill_split(&src);
    save(&src, dir, 7, 3);

    /* the tied copy is written once, by its owner's part */
    struct cdp_safetensors_file *f;
    cr_assert_eq(cdp_safetensors_open(path_in(dir, "step-00000007/stage-1-chunk-0.safetensors"), &f), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert_null(cdp_safetensors_find(f, "layers.0.wte"));
    cr_assert_not_null(cdp_safetensors_find(f, "layers.4.ln_f.weight"));
    cr_assert_str_eq(cdp_safetensors_metadata(f, "format"), "cdphybrid-checkpoint-part");
    cr_assert_str_eq(cdp_safetensors_metadata(f, "step"), "7");
    cdp_safetensors_close(f);
    cr_assert_eq(cdp_safetensors_open(path_in(dir, "step-00000007/stage-0-chunk-0.safetensors"), &f), CDP_OK);
    cr_assert_not_null(cdp_safetensors_find(f, "layers.0.wte"));
    cr_assert_not_null(
        cdp_safetensors_find(f, type == CDP_OPT_ADAMW ? "optim.v.layers.0.wte" : "optim.velocity.layers.0.wte"));
    cr_assert_null(
        cdp_safetensors_find(f, type == CDP_OPT_ADAMW ? "optim.velocity.layers.0.wte" : "optim.m.layers.0.wte"));
    cdp_safetensors_close(f);

    char *path = NULL;
    struct cdp_ckpt_info info;
    cr_assert_eq(cdp_ckpt_find_latest(dir, &path, &info), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(path, path_in(dir, "step-00000007"));
    cr_assert_eq(info.step, 7);
    cr_assert_eq(info.samples_seen, 112);
    cr_assert_eq(info.seed, 1234);
    cr_assert_str_eq(info.optimizer, type == CDP_OPT_ADAMW ? "adamw" : "sgd");
    cr_assert_not_null(info.plan_json);
    cr_assert(strstr(info.plan_json, "\"stages\""), "%s", info.plan_json);

    struct split w = make_split(GPT(3, 8), whole, 1, type, 2);
    cr_assert_eq(cdp_ckpt_load(path, &info, w.m, w.o, w.n), CDP_OK, "%s", cdp_last_error());
    assert_same(&w, &src, 7);
    struct split t3 = make_split(GPT(3, 8), three, 3, type, 3);
    cr_assert_eq(cdp_ckpt_load(path, &info, t3.m, t3.o, t3.n), CDP_OK, "%s", cdp_last_error());
    assert_same(&t3, &src, 7);

    /* a step folder itself is accepted too, with a trailing slash */
    char *path2 = NULL;
    struct cdp_ckpt_info info2;
    char step_dir[4200];
    snprintf(step_dir, sizeof step_dir, "%s/", path);
    cr_assert_eq(cdp_ckpt_find_latest(step_dir, &path2, &info2), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(path2, path);
    cr_assert_eq(info2.step, 7);
    free(path2);
    cdp_ckpt_info_free(&info2);

    free(path);
    cdp_ckpt_info_free(&info);
    free_split(&t3);
    free_split(&w);
    free_split(&src);
}

Test(checkpoint, two_ranges_load_bitwise_into_whole_and_three_ranges_adamw) { roundtrip(CDP_OPT_ADAMW); }
Test(checkpoint, two_ranges_load_bitwise_into_whole_and_three_ranges_sgd) { roundtrip(CDP_OPT_SGD); }

/* A Llama (grouped-query attention; the head tied, which this file's checks
 * of tied copies need) saved by two ranges loads bitwise into one and into
 * three: its tensors are named by global unit and Hugging Face's names inside
 * a unit (docs/models.md). */
Test(checkpoint, llama_two_ranges_load_bitwise_into_whole_and_three_ranges)
{
    const char *llama = "{\"model\": {\"preset\": \"llama\", \"vocab\": 40, \"context\": 5, \"layers\": 3, "
                        "\"heads\": 4, \"kv_heads\": 2, \"dim\": 8, \"hidden\": 12, "
                        "\"tie_embeddings\": true}}";
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/runs/llama/ckpt", cdp_test_tmpdir());
    struct split src = make_split(llama, two, 2, CDP_OPT_ADAMW, 1);
    fill_split(&src);
    save(&src, dir, 7, 3);
    struct cdp_safetensors_file *f;
    cr_assert_eq(cdp_safetensors_open(path_in(dir, "step-00000007/stage-1-chunk-0.safetensors"), &f), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert_null(cdp_safetensors_find(f, "layers.4.lm_head.weight")); /* the tied copy: its owner's part */
    static const char *const names[] = {"layers.4.norm.weight",
                                        "layers.3.self_attn.k_proj.weight", "layers.3.post_attention_layernorm.weight",
                                        "optim.m.layers.3.mlp.down_proj.weight"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        cr_assert_not_null(cdp_safetensors_find(f, names[i]), "%s", names[i]);
    cr_assert_eq(cdp_safetensors_find(f, "layers.3.self_attn.k_proj.weight")->shape[0], 4);
    cdp_safetensors_close(f);
    char *path = NULL;
    struct cdp_ckpt_info info;
    cr_assert_eq(cdp_ckpt_find_latest(dir, &path, &info), CDP_OK, "%s", cdp_last_error());
    struct split w = make_split(llama, whole, 1, CDP_OPT_ADAMW, 2);
    cr_assert_eq(cdp_ckpt_load(path, &info, w.m, w.o, w.n), CDP_OK, "%s", cdp_last_error());
    assert_same(&w, &src, 7);
    struct split t3 = make_split(llama, three, 3, CDP_OPT_ADAMW, 3);
    cr_assert_eq(cdp_ckpt_load(path, &info, t3.m, t3.o, t3.n), CDP_OK, "%s", cdp_last_error());
    assert_same(&t3, &src, 7);
    free(path);
    cdp_ckpt_info_free(&info);
    free_split(&t3);
    free_split(&w);
    free_split(&src);
}

Test(checkpoint, manifest_lists_parts_with_checksums_and_which_part_holds_each_weight)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 1);
    fill_split(&src);
    cr_assert_eq(cdp_ckpt_write_part(dir, 5, "stage-0-chunk-0", &src.m[0], &src.o[0], 1), CDP_OK);
    cr_assert_eq(cdp_ckpt_write_part(dir, 5, "stage-1-chunk-0", &src.m[1], &src.o[1], 1), CDP_OK);
    /* a temporary left by a writer that died is not a part */
    cdp_test_write_file(path_in(dir, ".step-00000005.partial"), ".stage-2-chunk-0.safetensors.tmp-abcdef", "partial");
    struct cdp_ckpt_info info = {.step = 5, .samples_seen = 80, .seed = 9, .optimizer = "adamw"};
    cr_assert_eq(cdp_ckpt_commit(dir, 5, &info, 3), CDP_OK, "%s", cdp_last_error());
    char *text = cdp_test_read_file(path_in(dir, "step-00000005/manifest.json"));
    cr_assert_not_null(text);
    cr_assert(strstr(text, "\"format\": \"cdphybrid-checkpoint\""), "%s", text);
    cr_assert(strstr(text, "\"version\": 2"), "%s", text);
    cr_assert(strstr(text, "\"manifest_sha256\": \""), "the manifest's own checksum: %s", text);
    cr_assert(!exists(path_in(dir, ".step-00000005.partial")), "committed by a rename");
    cr_assert(strstr(text, "\"samples_seen\": 80"), "%s", text);
    cr_assert(strstr(text, "\"plan\": null"), "%s", text);
    cr_assert(strstr(text, "\"layers.0.wte\": \"stage-0-chunk-0.safetensors\""), "%s", text);
    cr_assert(strstr(text, "\"layers.4.ln_f.bias\": \"stage-1-chunk-0.safetensors\""), "%s", text);
    cr_assert_null(strstr(text, "optim."), "optimizer state is not in the tensors map");
    cr_assert_null(strstr(text, "tmp-abcdef"), "temporaries are not parts");
    char sha[65];
    cr_assert_eq(cdp_sha256_file(path_in(dir, "step-00000005/stage-1-chunk-0.safetensors"), sha), CDP_OK);
    cr_assert(strstr(text, sha), "the manifest holds the part's SHA-256 %s", sha);
    free(text);
    free_split(&src);
}

Test(checkpoint, keep_removes_older_complete_checkpoints)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 1);
    for (int s = 1; s <= 3; s++) save(&src, dir, s, 2);
    cr_assert(!exists(path_in(dir, "step-00000001")), "the oldest is removed with keep=2");
    cr_assert(exists(path_in(dir, "step-00000002/manifest.json")));
    cr_assert(exists(path_in(dir, "step-00000003/manifest.json")));
    save(&src, dir, 4, 1);
    cr_assert(!exists(path_in(dir, "step-00000002")));
    cr_assert(!exists(path_in(dir, "step-00000003")));
    cr_assert(exists(path_in(dir, "step-00000004/stage-1-chunk-0.safetensors")));
    /* a newer complete checkpoint (a resume from an older one) never removes the one just committed */
    save(&src, dir, 2, 1);
    cr_assert(exists(path_in(dir, "step-00000002/manifest.json")));
    cr_assert(exists(path_in(dir, "step-00000004/manifest.json")));
    free_split(&src);
}

Test(checkpoint, incomplete_folder_is_skipped_then_removed_by_the_next_commit)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 1);
    save(&src, dir, 10, 3);
    /* step 20: one part written, then a crash: the save is still a hidden .partial folder */
    cr_assert_eq(cdp_ckpt_write_part(dir, 20, "stage-0-chunk-0", &src.m[0], &src.o[0], 1), CDP_OK);
    char *path = NULL;
    struct cdp_ckpt_info info;
    cr_assert_eq(cdp_ckpt_find_latest(dir, &path, &info), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(path, path_in(dir, "step-00000010"));
    cr_assert_eq(info.step, 10);
    free(path);
    cdp_ckpt_info_free(&info);
    cr_assert(exists(path_in(dir, ".step-00000020.partial")) && !exists(path_in(dir, "step-00000020")));
    /* the incomplete folder itself is not a checkpoint */
    cr_assert_eq(cdp_ckpt_find_latest(path_in(dir, ".step-00000020.partial"), &path, &info), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "no complete checkpoint"), "%s", cdp_last_error());
    save(&src, dir, 30, 3);
    cr_assert(!exists(path_in(dir, ".step-00000020.partial")), "the leftover of the crash is removed");
    cr_assert(exists(path_in(dir, "step-00000010/manifest.json")));
    cr_assert(exists(path_in(dir, "step-00000030/manifest.json")));
    free_split(&src);
}

Test(checkpoint, leftover_part_of_another_layout_at_the_same_step_is_refused)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 1);
    struct split old = make_split(GPT(3, 8), three, 3, CDP_OPT_ADAMW, 1);
    /* an earlier attempt at step 9 under 3 stages died after one part */
    cr_assert_eq(cdp_ckpt_write_part(dir, 9, "stage-2-chunk-0", &old.m[2], &old.o[2], 1), CDP_OK);
    cr_assert_eq(cdp_ckpt_write_part(dir, 9, "stage-0-chunk-0", &src.m[0], &src.o[0], 1), CDP_OK);
    cr_assert_eq(cdp_ckpt_write_part(dir, 9, "stage-1-chunk-0", &src.m[1], &src.o[1], 1), CDP_OK);
    struct cdp_ckpt_info info = {.step = 9, .optimizer = "adamw"};
    cr_assert_eq(cdp_ckpt_commit(dir, 9, &info, 3), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "tensor layers.4.ln_f.bias is in both stage-1-chunk-0.safetensors and "
                                       "stage-2-chunk-0.safetensors"), "%s", cdp_last_error());
    cr_assert(!exists(path_in(dir, "step-00000009")), "nothing is committed");
    /* a part whose metadata names another step is refused too */
    cr_assert_eq(unlink(path_in(dir, ".step-00000009.partial/stage-2-chunk-0.safetensors")), 0);
    cr_assert_eq(rename(path_in(dir, ".step-00000009.partial"), path_in(dir, ".step-00000010.partial")), 0);
    info.step = 10;
    cr_assert_eq(cdp_ckpt_commit(dir, 10, &info, 3), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "not a part of checkpoint step 10 (its metadata says format "
                                       "cdphybrid-checkpoint-part, step 9)"), "%s", cdp_last_error());
    free_split(&old);
    free_split(&src);
}

Test(checkpoint, no_checkpoint_is_a_clear_error)
{
    const char *dir = cdp_test_tmpdir();
    char *path = NULL;
    struct cdp_ckpt_info info;
    cr_assert_eq(cdp_ckpt_find_latest(dir, &path, &info), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "no complete checkpoint"), "%s", cdp_last_error());
    cr_assert_eq(cdp_ckpt_find_latest(path_in(dir, "nothing-here"), &path, &info), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "nothing-here: no complete checkpoint (no such folder)"), "%s",
              cdp_last_error());
    cr_assert_null(path);
    struct cdp_ckpt_info none = {.step = 1, .optimizer = "adamw"};
    cr_assert_eq(cdp_ckpt_commit(dir, 1, &none, 3), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "no part of this step was written"), "%s", cdp_last_error());
}

/* ---- corrupt checkpoints: each a clear error, and no file changes ---------------------- */

struct snap {
    int n;
    char name[16][256];
    char *data[16];
    long size[16];
};

static struct snap snapshot(const char *folder)
{
    struct snap s = {0};
    DIR *d = opendir(folder);
    cr_assert_not_null(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        cr_assert_lt(s.n, 16);
        snprintf(s.name[s.n], sizeof s.name[s.n], "%s", de->d_name);
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", folder, de->d_name);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f);
        fseek(f, 0, SEEK_END);
        s.size[s.n] = ftell(f);
        rewind(f);
        s.data[s.n] = malloc((size_t)s.size[s.n] + 1);
        cr_assert_eq(fread(s.data[s.n], 1, (size_t)s.size[s.n], f), (size_t)s.size[s.n]);
        fclose(f);
        s.n++;
    }
    closedir(d);
    return s;
}

static void assert_unchanged(struct snap *before, const char *folder)
{
    struct snap after = snapshot(folder);
    cr_assert_eq(after.n, before->n, "files were added or removed in %s", folder);
    for (int i = 0; i < before->n; i++) {
        int j = 0;
        while (j < after.n && strcmp(after.name[j], before->name[i])) j++;
        cr_assert_lt(j, after.n, "%s is gone", before->name[i]);
        cr_assert_eq(after.size[j], before->size[i], "%s changed", before->name[i]);
        cr_assert_eq(memcmp(after.data[j], before->data[i], (size_t)before->size[i]), 0, "%s changed",
                     before->name[i]);
    }
    for (int i = 0; i < after.n; i++) free(after.data[i]);
    for (int i = 0; i < before->n; i++) free(before->data[i]);
}

/* A good checkpoint at step 50 and the newest at step 100 under dir. */
static struct split corrupt_fixture(const char *dir)
{
    struct split src = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 1);
    fill_split(&src);
    save(&src, dir, 50, 3);
    save(&src, dir, 100, 3);
    return src;
}

static void expect_find_error(const char *dir, const char *want)
{
    char *path = NULL;
    struct cdp_ckpt_info info;
    struct snap s100 = snapshot(path_in(dir, "step-00000100")), s50 = snapshot(path_in(dir, "step-00000050"));
    cr_assert_eq(cdp_ckpt_find_latest(dir, &path, &info), CDP_ERR_INVALID, "a corrupt newest checkpoint is an error");
    cr_assert(strstr(cdp_last_error(), want), "expected \"%s\" in: %s", want, cdp_last_error());
    cr_assert_null(path);
    assert_unchanged(&s100, path_in(dir, "step-00000100"));
    assert_unchanged(&s50, path_in(dir, "step-00000050"));
}

Test(checkpoint, flipped_byte_is_a_checksum_mismatch_naming_the_part)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    const char *part = path_in(dir, "step-00000100/stage-1-chunk-0.safetensors");
    FILE *f = fopen(part, "r+b");
    cr_assert_not_null(f);
    fseek(f, -5, SEEK_END);
    int c = fgetc(f);
    fseek(f, -5, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
    const char *want = fmt("%s: checksum mismatch (manifest says ", part);
    expect_find_error(dir, want);
    cr_assert(strstr(cdp_last_error(), ", file has "), "%s", cdp_last_error());
    free_split(&src);
}

Test(checkpoint, truncated_part_names_the_file_and_sizes)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    const char *part = path_in(dir, "step-00000100/stage-0-chunk-0.safetensors");
    struct stat sb;
    cr_assert_eq(stat(part, &sb), 0);
    cr_assert_eq(truncate(part, sb.st_size - 100), 0);
    const char *want = fmt("%s: truncated: %lld bytes, the manifest says %lld", part,
             (long long)sb.st_size - 100, (long long)sb.st_size);
    expect_find_error(dir, want);
    free_split(&src);
}

/* The manifest as JSON, edited by fn, written back with its own checksum
 * recomputed as the writer computes it (what someone fixing it up would do);
 * fix_sum 0 leaves the old checksum. */
static void edit_manifest(const char *folder, void (*fn)(json_t *), int fix_sum)
{
    const char *path = path_in(folder, "manifest.json");
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    cr_assert_not_null(root, "%s", e.text);
    fn(root);
    if (fix_sum) {
        json_object_del(root, "manifest_sha256");
        char *text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
        struct cdp_sha256 h;
        char hex[65];
        cdp_sha256_init(&h);
        cdp_sha256_update(&h, text, strlen(text));
        cdp_sha256_final(&h, hex);
        free(text);
        json_object_set_new(root, "manifest_sha256", json_string(hex));
    }
    cr_assert_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
    json_decref(root);
}

static void flip_samples_seen(json_t *root)
{
    json_object_set_new(root, "samples_seen", json_integer(json_integer_value(json_object_get(root, "samples_seen")) + 1));
}

/* A flipped samples_seen (a different data position: another run) is caught
 * by the manifest's own checksum. */
Test(checkpoint, edited_manifest_fails_its_own_checksum)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    edit_manifest(path_in(dir, "step-00000100"), flip_samples_seen, 0);
    expect_find_error(dir, "step-00000100/manifest.json: /manifest_sha256: ");
    cr_assert(strstr(cdp_last_error(), "does not match the manifest's contents"), "%s", cdp_last_error());
    free_split(&src);
}

static const char *moved_part; /* for use_moved_part */
static void use_moved_part(json_t *root)
{
    json_t *files = json_object_get(root, "files"), *f;
    size_t i;
    json_array_foreach(files, i, f) {
        if (strcmp(json_string_value(json_object_get(f, "name")), "stage-0-chunk-0.safetensors")) continue;
        char sha[65];
        struct stat sb;
        cr_assert_eq(stat(moved_part, &sb), 0);
        cr_assert_eq(cdp_sha256_file(moved_part, sha), CDP_OK);
        json_object_set_new(f, "sha256", json_string(sha));
        json_object_set_new(f, "bytes", json_integer((json_int_t)sb.st_size));
    }
}

/* A part of step 50 copied into step 100, sizes and checksums fixed up
 * (the manifest's own too): its step metadata gives it away at the load. */
Test(checkpoint, part_of_another_step_with_checksums_fixed_is_refused)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    char from[4300], to[4300];
    snprintf(from, sizeof from, "%s", path_in(dir, "step-00000050/stage-0-chunk-0.safetensors"));
    snprintf(to, sizeof to, "%s", path_in(dir, "step-00000100/stage-0-chunk-0.safetensors"));
    char *bytes = cdp_test_read_file(from);
    struct stat sb;
    cr_assert_eq(stat(from, &sb), 0);
    FILE *f = fopen(to, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(bytes, 1, (size_t)sb.st_size, f), (size_t)sb.st_size);
    fclose(f);
    free(bytes);
    moved_part = to;
    edit_manifest(path_in(dir, "step-00000100"), use_moved_part, 1);
    char *path = NULL;
    struct cdp_ckpt_info info;
    cr_assert_eq(cdp_ckpt_find_latest(dir, &path, &info), CDP_OK, "checksums agree: %s", cdp_last_error());
    struct split dst = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 1);
    cr_assert_eq(cdp_ckpt_load(path, &info, dst.m, dst.o, 2), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "stage-0-chunk-0.safetensors: a part of step 50, not of the manifest's step "
                                       "100"), "%s", cdp_last_error());
    free(path);
    cdp_ckpt_info_free(&info);
    free_split(&dst);
    free_split(&src);
}

/* A committed folder has had its manifest (it is renamed into place with
 * it): one without is a loss, not an interrupted save, so it is not skipped
 * for an older step (nor removed). */
Test(checkpoint, deleted_manifest_is_an_error_not_an_older_resume)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    cr_assert_eq(unlink(path_in(dir, "step-00000100/manifest.json")), 0);
    expect_find_error(dir, "step-00000100/manifest.json is missing, though the folder was committed");
    save(&src, dir, 60, 3); /* a commit meanwhile leaves it as it is */
    cr_assert(exists(path_in(dir, "step-00000100/stage-0-chunk-0.safetensors")));
    free_split(&src);
}

/* A save never touches a committed step: resuming from step 50 with step 100
 * in the folder is refused before training (cdp_ckpt_check_no_later), and a
 * commit onto a committed step fails with the old one intact. */
Test(checkpoint, a_committed_step_is_never_written_over)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    cr_assert_eq(cdp_ckpt_check_no_later(dir, 100), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_ckpt_check_no_later(dir, 50), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "checkpoints after step 50 are there (the newest ") &&
                  strstr(cdp_last_error(), "step-00000100)"),
              "%s", cdp_last_error());
    struct snap s100 = snapshot(path_in(dir, "step-00000100"));
    struct split other = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 2);
    cr_assert_eq(cdp_ckpt_write_part(dir, 100, "stage-0-chunk-0", &other.m[0], &other.o[0], 1), CDP_OK);
    cr_assert_eq(cdp_ckpt_write_part(dir, 100, "stage-1-chunk-0", &other.m[1], &other.o[1], 1), CDP_OK);
    struct cdp_ckpt_info info = {.step = 100, .optimizer = "adamw"};
    cr_assert_eq(cdp_ckpt_commit(dir, 100, &info, 3), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "step-00000100 exists: a committed checkpoint is never written over"), "%s",
              cdp_last_error());
    assert_unchanged(&s100, path_in(dir, "step-00000100"));
    free_split(&other);
    free_split(&src);
}

Test(checkpoint, missing_part_is_named)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    const char *part = path_in(dir, "step-00000100/stage-1-chunk-0.safetensors");
    cr_assert_eq(unlink(part), 0);
    const char *want = fmt("%s is missing", part);
    expect_find_error(dir, want);
    free_split(&src);
}

Test(checkpoint, manifest_that_is_not_json_is_named)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    cdp_test_write_file(path_in(dir, "step-00000100"), "manifest.json", "{\"format\": \"cdphybrid-checkpoint\", ");
    expect_find_error(dir, "step-00000100/manifest.json: not valid JSON");
    free_split(&src);
}

Test(checkpoint, manifest_without_files_names_the_key)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    cdp_test_write_file(path_in(dir, "step-00000100"), "manifest.json",
                        "{\"format\": \"cdphybrid-checkpoint\", \"version\": 1, \"step\": 100, \"samples_seen\": 0, "
                        "\"seed\": 1, \"optimizer\": \"adamw\", \"tensors\": {}, \"plan\": null}");
    expect_find_error(dir, "step-00000100/manifest.json: /files: missing");
    free_split(&src);
}

/* load fails with the message; the target's weights and state are untouched */
static void expect_load_error(const char *dir, struct split *dst, const char *want)
{
    char *path = NULL;
    struct cdp_ckpt_info info;
    cr_assert_eq(cdp_ckpt_find_latest(dir, &path, &info), CDP_OK, "%s", cdp_last_error());
    struct snap before = snapshot(path);
    int64_t total = 0;
    for (int k = 0; k < dst->n; k++) total += cdp_model_param_floats(dst->m[k]);
    float *copy = malloc((size_t)total * 4 * 2), *p = copy;
    for (int k = 0; k < dst->n; k++)
        for (int i = 0; i < cdp_model_tensor_count(dst->m[k]); i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(dst->m[k], i);
            float *a, *b;
            cdp_optimizer_state(dst->o[k], dst->m[k], i, &a, &b);
            memcpy(p, t->data, (size_t)t->numel * 4);
            memcpy(p + t->numel, a, (size_t)t->numel * 4);
            p += 2 * t->numel;
        }
    cr_assert_eq(cdp_ckpt_load(path, &info, dst->m, dst->o, dst->n), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), want), "expected \"%s\" in: %s", want, cdp_last_error());
    p = copy;
    for (int k = 0; k < dst->n; k++) {
        cr_assert_eq(cdp_optimizer_steps(dst->o[k]), 0);
        for (int i = 0; i < cdp_model_tensor_count(dst->m[k]); i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(dst->m[k], i);
            float *a, *b;
            cdp_optimizer_state(dst->o[k], dst->m[k], i, &a, &b);
            cr_assert_eq(memcmp(p, t->data, (size_t)t->numel * 4), 0, "%s was changed by a failed load", t->name);
            cr_assert_eq(memcmp(p + t->numel, a, (size_t)t->numel * 4), 0, "state of %s changed", t->name);
            p += 2 * t->numel;
        }
    }
    free(copy);
    assert_unchanged(&before, path);
    free(path);
    cdp_ckpt_info_free(&info);
}

Test(checkpoint, checkpoint_of_another_model_is_a_shape_mismatch)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    struct split other = make_split(GPT(3, 16), whole, 1, CDP_OPT_ADAMW, 2);
    const char *want = fmt("%s: tensor layers.0.wte: shape [40, 8] in the checkpoint, [40, 16] in the model",
             path_in(dir, "step-00000100/stage-0-chunk-0.safetensors"));
    expect_load_error(dir, &other, want);
    free_split(&other);
    free_split(&src);
}

Test(checkpoint, missing_tensor_names_it_and_the_checkpoint_units)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    /* 4 blocks: unit 4 is a block here and the head in the checkpoint; the
     * units before it load fine, and still nothing may change */
    static const int b[] = {0, 6};
    struct split deeper = make_split(GPT(4, 8), b, 1, CDP_OPT_ADAMW, 2);
    const char *want = fmt("%s: no tensor layers.4.ln_1.weight (the checkpoint's model has units 0..4)",
             path_in(dir, "step-00000100/manifest.json"));
    expect_load_error(dir, &deeper, want);
    free_split(&deeper);
    free_split(&src);
}

Test(checkpoint, another_optimizer_type_names_the_plan_key_and_both_types)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    struct split sgd = make_split(GPT(3, 8), whole, 1, CDP_OPT_SGD, 2);
    expect_load_error(dir, &sgd, "/train/optimizer/type is \"sgd\", and the checkpoint holds the state of \"adamw\"");
    free_split(&sgd);
    free_split(&src);
}

Test(checkpoint, weights_only_load_without_optimizers)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    struct split w = make_split(GPT(3, 8), whole, 1, CDP_OPT_SGD, 2);
    char *path = NULL;
    struct cdp_ckpt_info info;
    cr_assert_eq(cdp_ckpt_find_latest(dir, &path, &info), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_ckpt_load(path, &info, w.m, NULL, 1), CDP_OK, "%s", cdp_last_error());
    for (int i = 0; i < cdp_model_tensor_count(w.m[0]); i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(w.m[0], i);
        float *a, *b;
        struct cdp_model_tensor *o = find_owner(&src, t->name, &a, &b);
        cr_assert_eq(memcmp(t->data, o->data, (size_t)t->numel * 4), 0, "%s", t->name);
    }
    free(path);
    cdp_ckpt_info_free(&info);
    free_split(&w);
    free_split(&src);
}

/* ---- device memory the host cannot address ------------------------------------------------ */

/* The stand-in CUDA module of tests/fake-cuda: host memory that the core
 * treats as a GPU's (not host visible), so that checkpoints stage weights and
 * optimizer state through host copies as they do on a GPU. An MLP whose first
 * matrix (1100 x 2000 floats, 8.8 MB) is more than one 8 MiB staging piece. */
#define BIG_MLP "{\"model\": {\"preset\": \"mlp\", \"input\": [1100], \"hidden\": [2000], \"classes\": 3}}"

static cdp_device_t open_cuda(void)
{
    const char *fake = getenv("CDP_FAKE_CUDA_DIR");
    cr_assert_not_null(fake, "CDP_FAKE_CUDA_DIR is not set (run the tests through meson test)");
    setenv("CDP_MODULE_DIR", fake, 1);
    cdp_device_t d = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CUDA, 0, 0, &d), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_device_host_visible(d), 0);
    return d;
}

/* One range of the whole model (units 0..U) on dev (owned by the split). */
static struct split whole_on(const char *json, cdp_device_t dev, enum cdp_optimizer_type type, uint64_t seed)
{
    struct split s = {.n = 1, .dev = dev};
    s.plan = plan_from(json);
    struct cdp_optimizer_desc od = {.type = type, .lr = 1e-3, .weight_decay = 0.1, .momentum = 0.9,
                                    .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    cr_assert_eq(cdp_model_create(&s.plan->model, 0, s.plan->model.n_layers, 2, 1, seed, dev, &s.m[0]), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert_eq(cdp_optimizer_create(&od, s.m[0], dev, &s.o[0]), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_optimizer_device(s.o[0]), dev);
    return s;
}

/* Tensor i's weights (role 0) or optimizer state (1, 2) copied to the host
 * (malloc'd); NULL when the optimizer has no such state. */
static float *get_role(struct split *s, int i, int role)
{
    struct cdp_model_tensor *t = cdp_model_tensor(s->m[0], i);
    float *a, *b;
    cdp_optimizer_state(s->o[0], s->m[0], i, &a, &b);
    const float *src = role == 0 ? t->data : role == 1 ? a : b;
    if (!src) return NULL;
    float *h = malloc((size_t)t->numel * 4);
    cr_assert_not_null(h);
    cr_assert_eq(cdp_device_read(s->dev, h, src, (uint64_t)t->numel * 4), CDP_OK, "%s", cdp_last_error());
    return h;
}

/* fill_split's values, written through the device's copies. */
static void fill_device(struct split *s)
{
    for (int i = 0; i < cdp_model_tensor_count(s->m[0]); i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(s->m[0], i);
        float *a, *b, *h = malloc((size_t)t->numel * 4);
        cr_assert_not_null(h);
        cdp_optimizer_state(s->o[0], s->m[0], i, &a, &b);
        float *dst[3] = {t->data, a, b};
        for (int role = 0; role < 3; role++) {
            if (!dst[role]) continue;
            fill(h, t->numel, t->name, role);
            cr_assert_eq(cdp_device_write(s->dev, dst[role], h, (uint64_t)t->numel * 4), CDP_OK, "%s",
                         cdp_last_error());
        }
        free(h);
    }
}

/* Every tensor and state of a and b bitwise equal (read through their devices). */
static void assert_same_devices(struct split *a, struct split *b, int64_t steps)
{
    cr_assert_eq(cdp_optimizer_steps(a->o[0]), steps);
    cr_assert_eq(cdp_model_tensor_count(a->m[0]), cdp_model_tensor_count(b->m[0]));
    for (int i = 0; i < cdp_model_tensor_count(a->m[0]); i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(a->m[0], i);
        for (int role = 0; role < 3; role++) {
            float *x = get_role(a, i, role), *y = get_role(b, i, role);
            cr_assert_eq(!x, !y);
            if (x) cr_assert_eq(memcmp(x, y, (size_t)t->numel * 4), 0, "%s (role %d) differs", t->name, role);
            free(x);
            free(y);
        }
    }
}

static void save_whole(struct split *s, const char *dir, int64_t step)
{
    cr_assert_eq(cdp_ckpt_write_part(dir, step, "stage-0", s->m, s->o, 1), CDP_OK, "%s", cdp_last_error());
    struct cdp_ckpt_info info = {.step = step, .samples_seen = step * 8, .seed = 7, .optimizer = "adamw"};
    if (cdp_optimizer_type_of(s->o[0]) == CDP_OPT_SGD) strcpy(info.optimizer, "sgd");
    cr_assert_eq(cdp_ckpt_commit(dir, step, &info, 2), CDP_OK, "%s", cdp_last_error());
}

static void load_whole(const char *dir, struct split *s)
{
    char *path = NULL;
    struct cdp_ckpt_info info;
    cr_assert_eq(cdp_ckpt_find_latest(dir, &path, &info), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_ckpt_load(path, &info, s->m, s->o, 1), CDP_OK, "%s", cdp_last_error());
    free(path);
    cdp_ckpt_info_free(&info);
}

static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    cr_assert(fa && fb, "%s, %s", a, b);
    int x, y;
    do {
        x = fgetc(fa);
        y = fgetc(fb);
    } while (x == y && x != EOF);
    fclose(fa);
    fclose(fb);
    return x == y;
}

static void device_roundtrip(enum cdp_optimizer_type type)
{
    char gdir[4096], cdir[4096];
    snprintf(gdir, sizeof gdir, "%s/gpu", cdp_test_tmpdir());
    snprintf(cdir, sizeof cdir, "%s/cpu", cdp_test_tmpdir());
    cdp_device_t cpu;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &cpu), CDP_OK, "%s", cdp_last_error());
    struct split c = whole_on(BIG_MLP, cpu, type, 1), g = whole_on(BIG_MLP, open_cuda(), type, 1);
    int big = 0;
    for (int i = 0; i < cdp_model_tensor_count(g.m[0]); i++) big |= cdp_model_tensor(g.m[0], i)->numel * 4 > (8 << 20);
    cr_assert(big, "a tensor spans several staging pieces");
    fill_device(&c);
    fill_device(&g);
    save_whole(&c, cdir, 3);
    save_whole(&g, gdir, 3);
    /* staged out of device memory, the part is byte for byte the cpu's */
    cr_assert(same_file(path_in(cdir, "step-00000003/stage-0.safetensors"),
                        path_in(gdir, "step-00000003/stage-0.safetensors")), "the parts differ");
    /* and it loads back into device memory, and across backends both ways */
    struct split g2 = whole_on(BIG_MLP, open_cuda(), type, 2), c2 = whole_on(BIG_MLP, cpu, type, 2);
    load_whole(gdir, &g2);
    assert_same_devices(&g2, &c, 3);
    load_whole(cdir, &g2);
    assert_same_devices(&g2, &c, 3);
    load_whole(gdir, &c2);
    assert_same_devices(&c2, &c, 3);
    free_split(&g2);
    free_split(&g);
    c2.dev = NULL; /* c closes the cpu device */
    free_split(&c2);
    free_split(&c);
}

Test(checkpoint, device_memory_is_staged_both_ways_bitwise_adamw) { device_roundtrip(CDP_OPT_ADAMW); }
Test(checkpoint, device_memory_is_staged_both_ways_bitwise_sgd) { device_roundtrip(CDP_OPT_SGD); }

/* A part in bf16 (any float type loads) is widened piece by piece on its way to
 * device memory, to exactly what the cpu backend reads in one go. */
Test(checkpoint, a_bf16_part_loads_into_device_memory_as_into_host_memory)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    cdp_device_t cpu;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &cpu), CDP_OK, "%s", cdp_last_error());
    struct split c = whole_on(BIG_MLP, cpu, CDP_OPT_ADAMW, 1), g = whole_on(BIG_MLP, open_cuda(), CDP_OPT_ADAMW, 2);
    int nt = cdp_model_tensor_count(c.m[0]);
    struct cdp_safetensors_tensor ts[3 * 16];
    char names[3 * 16][96];
    uint16_t *bufs[3 * 16];
    cr_assert_leq(nt, 16);
    int k = 0;
    for (int i = 0; i < nt; i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(c.m[0], i);
        float *h = malloc((size_t)t->numel * 4);
        cr_assert_not_null(h);
        static const char *const prefix[3] = {"", "optim.m.", "optim.v."};
        for (int role = 0; role < 3; role++, k++) {
            fill(h, t->numel, t->name, role);
            bufs[k] = malloc((size_t)t->numel * 2);
            cr_assert_not_null(bufs[k]);
            for (int64_t e = 0; e < t->numel; e++) bufs[k][e] = cdp_f32_to_bf16(h[e]);
            snprintf(names[k], sizeof names[k], "%s%s", prefix[role], t->name);
            ts[k] = (struct cdp_safetensors_tensor){.name = names[k],
                                                    .dtype = CDP_DTYPE_BF16,
                                                    .ndim = t->ndim,
                                                    .data = bufs[k],
                                                    .nbytes = (uint64_t)t->numel * 2};
            memcpy(ts[k].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        }
        free(h);
    }
    cr_assert_eq(mkdir(path_in(dir, ".step-00000004.partial"), 0755), 0);
    const char *meta[4] = {"format", "cdphybrid-checkpoint-part", "step", "4"};
    cr_assert_eq(cdp_safetensors_write(path_in(dir, ".step-00000004.partial/stage-0.safetensors"), ts, k, meta, 2),
                 CDP_OK, "%s",
                 cdp_last_error());
    for (int i = 0; i < k; i++) free(bufs[i]);
    struct cdp_ckpt_info info = {.step = 4, .optimizer = "adamw"};
    cr_assert_eq(cdp_ckpt_commit(dir, 4, &info, 2), CDP_OK, "%s", cdp_last_error());
    load_whole(dir, &c);
    load_whole(dir, &g);
    assert_same_devices(&g, &c, 4);
    free_split(&g);
    free_split(&c);
}

/* ---- SHA-256 (FIPS 180-4 and NIST example vectors) ---------------------------------------- */

static void expect_sha(const char *dir, const char *data, size_t n, const char *want)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/v", dir);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
    char hex[65];
    cr_assert_eq(cdp_sha256_file(path, hex), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(hex, want, "SHA-256 of %zu bytes", n);
}

Test(checkpoint, sha256_standard_vectors)
{
    const char *dir = cdp_test_tmpdir();
    expect_sha(dir, "", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect_sha(dir, "abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    expect_sha(dir, m448, strlen(m448), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m896 =
        "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
        "mnopqrstnopqrstu";
    expect_sha(dir, m896, strlen(m896), "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    char *million = malloc(1000000);
    memset(million, 'a', 1000000);
    expect_sha(dir, million, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* padding edges: 55 bytes fit one block, 56 need two; 64 is one whole block */
    expect_sha(dir, million, 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
    expect_sha(dir, million, 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
    expect_sha(dir, million, 63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34");
    expect_sha(dir, million, 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
    expect_sha(dir, million, 65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0");
    free(million);
    char hex[65];
    cr_assert_eq(cdp_sha256_file(path_in(dir, "absent"), hex), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "absent: cannot open"), "%s", cdp_last_error());
}

/* ---- export ---------------------------------------------------------------------------------- */

static void assert_export(const char *out, struct split *src, const char *step)
{
    struct split w = make_split(GPT(3, 8), whole, 1, CDP_OPT_ADAMW, 2);
    struct cdp_safetensors_file *f;
    cr_assert_eq(cdp_safetensors_open(out, &f), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(cdp_safetensors_metadata(f, "format"), "cdphybrid");
    cr_assert_str_eq(cdp_safetensors_metadata(f, "step"), step);
    cr_assert_eq(cdp_safetensors_count(f), cdp_model_tensor_count(w.m[0]), "every weight once, no optimizer state");
    int last_unit = -1;
    for (int i = 0; i < cdp_safetensors_count(f); i++) {
        const char *name = cdp_safetensors_at(f, i)->name;
        cr_assert(strncmp(name, "optim.", 6), "%s in an export", name);
        int unit = atoi(name + 7);
        cr_assert_geq(unit, last_unit, "tensors ordered by unit: %s", name);
        last_unit = unit;
    }
    for (int i = 0; i < cdp_model_tensor_count(w.m[0]); i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(w.m[0], i);
        float *a, *b;
        struct cdp_model_tensor *o = find_owner(src, t->name, &a, &b);
        const struct cdp_safetensors_tensor *x = cdp_safetensors_find(f, t->name);
        cr_assert_not_null(x, "%s", t->name);
        cr_assert_str_eq(x->dtype_name, "F32");
        cr_assert_eq(x->nbytes, (uint64_t)t->numel * 4);
        cr_assert_eq(memcmp(x->data, o->data, x->nbytes), 0, "%s", t->name);
    }
    cdp_safetensors_close(f);
    /* the file loads as the model's weights */
    cr_assert_eq(cdp_model_load(w.m[0], out), CDP_OK, "%s", cdp_last_error());
    free_split(&w);
}

Test(checkpoint, export_writes_every_weight_and_no_optimizer_state)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    const char *out = path_in(dir, "model.safetensors");
    cr_assert_eq(cdp_ckpt_export(path_in(dir, "step-00000100"), out), CDP_OK, "%s", cdp_last_error());
    assert_export(out, &src, "100");
    cr_assert_eq(cdp_ckpt_export(path_in(dir, "step-00000100"), path_in(dir, "no/such/folder/m.safetensors")),
                 CDP_ERR_IO);
    cr_assert_eq(cdp_ckpt_export(path_in(dir, "step-00000077"), out), CDP_ERR_INVALID);
    free_split(&src);
}

Test(checkpoint, export_command_exit_codes)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    char ckpt[4096], out[4200], empty[4200];
    snprintf(ckpt, sizeof ckpt, "%s", dir);
    snprintf(out, sizeof out, "%s/exported.safetensors", dir);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", ckpt, "--out", out, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    cr_assert(strstr(r.out, "exported step 100"), "%s", r.out);
    cdp_test_run_free(&r);
    assert_export(out, &src, "100");

    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--help", NULL}), 0);
    cr_assert_eq(r.exit_code, 0);
    cr_assert(strstr(r.out, "usage: cdphybrid export --checkpoint DIR --out FILE"), "%s", r.out);
    cdp_test_run_free(&r);

    snprintf(empty, sizeof empty, "%s/empty", dir);
    cr_assert_eq(mkdir(empty, 0755), 0);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", empty, "--out", out, NULL}), 0);
    cr_assert_eq(r.exit_code, 2, "stderr: %s", r.err);
    cr_assert(strstr(r.err, "no complete checkpoint"), "%s", r.err);
    cdp_test_run_free(&r);

    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", ckpt, NULL}), 0);
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "--out"), "%s", r.err);
    cdp_test_run_free(&r);

    char bad_out[4300];
    snprintf(bad_out, sizeof bad_out, "%s/no/such/folder/m.safetensors", dir);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", ckpt, "--out", bad_out, NULL}), 0);
    cr_assert_eq(r.exit_code, 1, "a file that cannot be written is a failed run; stderr: %s", r.err);
    cdp_test_run_free(&r);

    /* corrupt: exit 2, naming the file, and the export is not replaced */
    struct stat before;
    cr_assert_eq(stat(out, &before), 0);
    cr_assert_eq(truncate(path_in(dir, "step-00000100/stage-1-chunk-0.safetensors"), 10), 0);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", ckpt, "--out", out, NULL}), 0);
    cr_assert_eq(r.exit_code, 2, "stderr: %s", r.err);
    cr_assert(strstr(r.err, "stage-1-chunk-0.safetensors: truncated"), "%s", r.err);
    cdp_test_run_free(&r);
    struct stat after;
    cr_assert_eq(stat(out, &after), 0);
    cr_assert_eq(after.st_ino, before.st_ino, "the earlier export is left alone");
    free_split(&src);
}

/* ---- export in the Hugging Face GPT-2 layout (issue 19) -------------------------------- */

/* Writes checkpoint `step` of split s (one part per range) into dir, its
 * manifest holding s's resolved plan as a run writes it. */
static void save_with_plan(struct split *s, const char *dir, int64_t step)
{
    char *plan = NULL;
    cr_assert_eq(cdp_plan_to_json(s->plan, &plan), CDP_OK, "%s", cdp_last_error());
    for (int k = 0; k < s->n; k++)
        cr_assert_eq(cdp_ckpt_write_part(dir, step, fmt("stage-%d-chunk-0", k), &s->m[k], &s->o[k], 1), CDP_OK,
                     "%s", cdp_last_error());
    struct cdp_ckpt_info info = {.step = step, .samples_seen = 0, .seed = 1, .optimizer = "adamw", .plan_json = plan};
    cr_assert_eq(cdp_ckpt_commit(dir, step, &info, 3), CDP_OK, "%s", cdp_last_error());
    free(plan);
}

static json_t *read_json(const char *path)
{
    json_error_t e;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    cr_assert_not_null(j, "%s: %s", path, e.text);
    return j;
}

/* The names save_pretrained gives GPT-2's tensors, written out here rather
 * than taken from the name table the export uses. */
static const char *const hf_block[] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                       "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                       "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};

Test(checkpoint, export_hf_writes_gpt2_names_layout_and_config)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 1);
    fill_split(&src);
    save_with_plan(&src, dir, 7);
    const char *out = path_in(dir, "hf/gpt"); /* made, parents too */
    cr_assert_eq(cdp_ckpt_export_hf(path_in(dir, "step-00000007"), out, CDP_HF_SHARD_BYTES), CDP_OK, "%s", cdp_last_error());

    struct cdp_safetensors_file *f;
    cr_assert_eq(cdp_safetensors_open(path_in(dir, "hf/gpt/model.safetensors"), &f), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(cdp_safetensors_metadata(f, "format"), "pt", "transformers reads only format pt");
    cr_assert_eq(cdp_safetensors_count(f), 2 + 3 * 12 + 2, "wte, wpe, 3 blocks, ln_f; a tied head once");
    cr_assert_null(cdp_safetensors_find(f, "lm_head.weight"), "a tied head is the embedding");
    const struct {
        const char *name;
        int64_t rows, cols; /* cols 0: a vector */
    } want[] = {{"transformer.wte.weight", 40, 8}, {"transformer.wpe.weight", 5, 8},
                {"transformer.ln_f.weight", 8, 0}, {"transformer.ln_f.bias", 8, 0}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct cdp_safetensors_tensor *x = cdp_safetensors_find(f, want[i].name);
        cr_assert_not_null(x, "%s", want[i].name);
        cr_assert_eq(x->ndim, want[i].cols ? 2 : 1, "%s", want[i].name);
        cr_assert_eq(x->shape[0], want[i].rows, "%s", want[i].name);
        if (want[i].cols) cr_assert_eq(x->shape[1], want[i].cols, "%s", want[i].name);
    }
    /* every block: Conv1D weights in x out, the values ours transposed */
    for (int b = 0; b < 3; b++) {
        for (size_t k = 0; k < sizeof hf_block / sizeof hf_block[0]; k++) {
            char name[96], ours[96];
            snprintf(name, sizeof name, "transformer.h.%d.%s", b, hf_block[k]);
            snprintf(ours, sizeof ours, "layers.%d.%s", b + 1, hf_block[k]);
            const struct cdp_safetensors_tensor *x = cdp_safetensors_find(f, name);
            cr_assert_not_null(x, "%s", name);
            cr_assert_str_eq(x->dtype_name, "F32");
            float *sa, *sb;
            const struct cdp_model_tensor *t = find_owner(&src, ours, &sa, &sb);
            cr_assert_not_null(t, "%s", ours);
            const float *theirs = x->data;
            if (t->ndim == 1) {
                cr_assert_eq(x->ndim, 1, "%s", name);
                cr_assert_eq(memcmp(theirs, t->data, x->nbytes), 0, "%s", name);
                continue;
            }
            cr_assert(x->ndim == 2 && x->shape[0] == t->shape[1] && x->shape[1] == t->shape[0],
                      "%s: [%lld, %lld], ours [%lld, %lld] transposed", name, (long long)x->shape[0],
                      (long long)x->shape[1], (long long)t->shape[0], (long long)t->shape[1]);
            for (int64_t r = 0; r < t->shape[0]; r++)
                for (int64_t c = 0; c < t->shape[1]; c++)
                    cr_assert_eq(theirs[c * t->shape[0] + r], t->data[r * t->shape[1] + c], "%s[%lld][%lld]", name,
                                 (long long)c, (long long)r);
        }
    }
    cr_assert_eq(cdp_safetensors_find(f, "transformer.h.0.attn.c_attn.weight")->shape[1], 24, "in 8 x out 24");
    cr_assert_eq(cdp_safetensors_find(f, "transformer.h.2.mlp.c_proj.weight")->shape[0], 32, "in 32 x out 8");
    cdp_safetensors_close(f);

    json_t *c = read_json(path_in(dir, "hf/gpt/config.json"));
    cr_assert_str_eq(json_string_value(json_object_get(c, "model_type")), "gpt2");
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)), "GPT2LMHeadModel");
    const struct {
        const char *key;
        json_int_t v;
    } ints[] = {{"vocab_size", 40}, {"n_positions", 5}, {"n_embd", 8}, {"n_layer", 3}, {"n_head", 2}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        json_t *v = json_object_get(c, ints[i].key);
        cr_assert(json_is_integer(v) && json_integer_value(v) == ints[i].v, "%s", ints[i].key);
    }
    cr_assert(json_is_null(json_object_get(c, "n_inner")), "4 x n_embd, as ours");
    cr_assert_str_eq(json_string_value(json_object_get(c, "activation_function")), "gelu_new", "the tanh GELU");
    cr_assert_float_eq(json_number_value(json_object_get(c, "layer_norm_epsilon")), 1e-5, 1e-12);
    cr_assert(json_is_true(json_object_get(c, "tie_word_embeddings")));
    for (const char *const *k = (const char *const[]){"resid_pdrop", "embd_pdrop", "attn_pdrop", NULL}; *k; k++)
        cr_assert(json_number_value(json_object_get(c, *k)) == 0.0 && json_is_real(json_object_get(c, *k)), "%s",
                  *k);
    json_decref(c);

    /* our Hugging Face import reads it back as the same weights */
    struct split back = make_split(GPT(3, 8), whole, 1, CDP_OPT_ADAMW, 99);
    cr_assert_eq(cdp_model_load(back.m[0], path_in(dir, "hf/gpt/model.safetensors")), CDP_OK, "%s",
                 cdp_last_error());
    for (int i = 0; i < cdp_model_tensor_count(back.m[0]); i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(back.m[0], i);
        float *sa, *sb;
        const struct cdp_model_tensor *o = find_owner(&src, t->name, &sa, &sb);
        cr_assert_eq(memcmp(t->data, o->data, (size_t)t->numel * 4), 0, "%s after the round trip", t->name);
    }
    cr_assert_eq(cdp_model_check_weights(&back.plan->model, path_in(dir, "hf/gpt/model.safetensors")), CDP_OK,
                 "%s", cdp_last_error());
    free_split(&back);
    free_split(&src);
}

/* The golden GPT's weights, through a checkpoint and the export, are the
 * very bytes PyTorch wrote in the Hugging Face layout (tools/gen_golden.py,
 * Conv1D weights transposed by torch), whose loss the model suite checks. */
Test(checkpoint, export_hf_of_the_golden_gpt_is_what_pytorch_wrote)
{
    const char *dir = cdp_test_tmpdir();
    struct split g = make_split("{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 2, "
                                "\"heads\": 2, \"embed\": 16}}", (const int[]){0, 4}, 1, CDP_OPT_ADAMW, 1);
    cr_assert_eq(cdp_model_load(g.m[0], cdp_test_source_path("tests/fixtures/golden/gpt-tiny.safetensors")), CDP_OK,
                 "%s", cdp_last_error());
    save_with_plan(&g, dir, 1);
    cr_assert_eq(cdp_ckpt_export_hf(path_in(dir, "step-00000001"), path_in(dir, "hf"), CDP_HF_SHARD_BYTES), CDP_OK, "%s",
                 cdp_last_error());
    struct cdp_safetensors_file *a, *b;
    cr_assert_eq(cdp_safetensors_open(path_in(dir, "hf/model.safetensors"), &a), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_open(cdp_test_source_path("tests/fixtures/golden/gpt-tiny-hf.safetensors"), &b),
                 CDP_OK);
    cr_assert_eq(cdp_safetensors_count(a), cdp_safetensors_count(b));
    for (int i = 0; i < cdp_safetensors_count(b); i++) {
        const struct cdp_safetensors_tensor *y = cdp_safetensors_at(b, i), *x = cdp_safetensors_find(a, y->name);
        cr_assert_not_null(x, "%s", y->name);
        cr_assert_eq(x->ndim, y->ndim, "%s", y->name);
        for (int d = 0; d < y->ndim; d++) cr_assert_eq(x->shape[d], y->shape[d], "%s", y->name);
        cr_assert_eq(memcmp(x->data, y->data, y->nbytes), 0, "%s differs from PyTorch's", y->name);
    }
    cdp_safetensors_close(a);
    cdp_safetensors_close(b);
    free_split(&g);
}

Test(checkpoint, export_hf_of_an_untied_head_writes_it)
{
    const char *dir = cdp_test_tmpdir();
    struct split s = make_split("{\"model\": {\"preset\": \"gpt\", \"vocab\": 40, \"context\": 5, \"layers\": 1, "
                                "\"heads\": 2, \"embed\": 8, \"tie_embeddings\": false}}", (const int[]){0, 3}, 1,
                                CDP_OPT_ADAMW, 1);
    fill_split(&s);
    save_with_plan(&s, dir, 3);
    cr_assert_eq(cdp_ckpt_export_hf(path_in(dir, "step-00000003"), path_in(dir, "hf"), CDP_HF_SHARD_BYTES), CDP_OK, "%s",
                 cdp_last_error());
    struct cdp_safetensors_file *f;
    cr_assert_eq(cdp_safetensors_open(path_in(dir, "hf/model.safetensors"), &f), CDP_OK, "%s", cdp_last_error());
    const struct cdp_safetensors_tensor *x = cdp_safetensors_find(f, "lm_head.weight");
    cr_assert(x && x->ndim == 2 && x->shape[0] == 40 && x->shape[1] == 8, "the head, unprefixed, [vocab, embed]");
    float *sa, *sb;
    cr_assert_eq(memcmp(x->data, find_owner(&s, "layers.2.lm_head.weight", &sa, &sb)->data, x->nbytes), 0);
    cr_assert_eq(cdp_safetensors_count(f), 2 + 12 + 2 + 1);
    cdp_safetensors_close(f);
    json_t *c = read_json(path_in(dir, "hf/config.json"));
    cr_assert(json_is_false(json_object_get(c, "tie_word_embeddings")));
    json_decref(c);
    free_split(&s);
}

Test(checkpoint, export_hf_refuses_what_is_not_a_gpt)
{
    const char *dir = cdp_test_tmpdir();
    struct split m = make_split("{\"model\": {\"preset\": \"mlp\", \"input\": [4], \"hidden\": [8], \"classes\": 3}}",
                                (const int[]){0, 3}, 1, CDP_OPT_ADAMW, 1);
    fill_split(&m);
    save_with_plan(&m, dir, 2);
    cr_assert_eq(cdp_ckpt_export_hf(path_in(dir, "step-00000002"), path_in(dir, "hf"), CDP_HF_SHARD_BYTES), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "step-00000002/manifest.json: /plan/model: a \"mlp\", not a GPT preset; only a "
                                       "GPT (the gpt and gpt2* presets) has a Hugging Face GPT-2 layout"),
              "%s", cdp_last_error());
    struct stat sb;
    cr_assert_neq(stat(path_in(dir, "hf"), &sb), 0, "nothing written");
    /* a manifest without its plan: the heads are unknown */
    struct split g = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 1);
    struct cdp_ckpt_info info = {.step = 5, .optimizer = "adamw"};
    cr_assert_eq(cdp_ckpt_write_part(dir, 5, "stage-0-chunk-0", &g.m[0], &g.o[0], 1), CDP_OK);
    cr_assert_eq(cdp_ckpt_write_part(dir, 5, "stage-1-chunk-0", &g.m[1], &g.o[1], 1), CDP_OK);
    cr_assert_eq(cdp_ckpt_commit(dir, 5, &info, 3), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_ckpt_export_hf(path_in(dir, "step-00000005"), path_in(dir, "hf"), CDP_HF_SHARD_BYTES), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "step-00000005/manifest.json: /plan: no plan in the manifest"), "%s",
              cdp_last_error());
    free_split(&g);
    free_split(&m);
}

Test(checkpoint, export_command_format_hf)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 1);
    fill_split(&src);
    save_with_plan(&src, dir, 4);
    char ckpt[4096], out[4200];
    snprintf(ckpt, sizeof ckpt, "%s", dir);
    snprintf(out, sizeof out, "%s/gpt-hf", dir);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", ckpt, "--format", "hf", "--out", out,
                                                   NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    cr_assert(strstr(r.out, "exported step 4") && strstr(r.out, "(Hugging Face GPT-2: config.json, "
                                                               "generation_config.json, safetensors)"), "%s", r.out);
    cdp_test_run_free(&r);
    json_t *c = read_json(path_in(dir, "gpt-hf/config.json"));
    cr_assert_eq(json_integer_value(json_object_get(c, "n_layer")), 3);
    json_decref(c);
    c = read_json(path_in(dir, "gpt-hf/generation_config.json"));
    cr_assert(json_is_object(c));
    json_decref(c);
    /* our names stay the default */
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", ckpt, "--out", path_in(dir, "w.st"),
                                                   NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    struct cdp_safetensors_file *f;
    cr_assert_eq(cdp_safetensors_open(path_in(dir, "w.st"), &f), CDP_OK);
    cr_assert_str_eq(cdp_safetensors_metadata(f, "format"), "cdphybrid");
    cr_assert_not_null(cdp_safetensors_find(f, "layers.0.wte"));
    cdp_safetensors_close(f);
    cdp_test_run_free(&r);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", ckpt, "--format", "onnx", "--out", out,
                                                   NULL}), 0);
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "--format: expected cdphybrid or hf, got \"onnx\""), "%s", r.err);
    cdp_test_run_free(&r);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--help", NULL}), 0);
    cr_assert(strstr(r.out, "--format hf --out DIR") && strstr(r.out, "GPT2LMHeadModel.from_pretrained"), "%s",
              r.out);
    cdp_test_run_free(&r);
    free_split(&src);
}

/* ---- a job's life (docs/jobs.md) ------------------------------------------------------ */

/* Two runs saving into one folder: each part carries its run's id, and a
 * commit refuses a step whose parts come from another run, naming the part. */
Test(checkpoint, a_part_of_another_run_is_refused_at_commit)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 1);
    fill_split(&src);
    cdp_ckpt_set_run("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    cr_assert_eq(cdp_ckpt_write_part(dir, 4, "stage-0-chunk-0", &src.m[0], &src.o[0], 1), CDP_OK);
    cdp_ckpt_set_run("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"); /* the other job's rank writes stage 1 */
    cr_assert_eq(cdp_ckpt_write_part(dir, 4, "stage-1-chunk-0", &src.m[1], &src.o[1], 1), CDP_OK);
    cdp_ckpt_set_run("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    struct cdp_ckpt_info info = {.step = 4, .optimizer = "adamw"};
    cr_assert_eq(cdp_ckpt_commit(dir, 4, &info, 3), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "stage-1-chunk-0.safetensors: written by run bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb, "
                                       "not by this run (aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa)"), "%s", cdp_last_error());
    cr_assert(!exists(path_in(dir, "step-00000004")), "nothing is committed");
    /* the same run's parts commit, and the manifest names the run */
    cr_assert_eq(cdp_ckpt_write_part(dir, 6, "stage-0-chunk-0", &src.m[0], &src.o[0], 1), CDP_OK);
    cr_assert_eq(cdp_ckpt_write_part(dir, 6, "stage-1-chunk-0", &src.m[1], &src.o[1], 1), CDP_OK);
    info.step = 6;
    cr_assert_eq(cdp_ckpt_commit(dir, 6, &info, 3), CDP_OK, "%s", cdp_last_error());
    char *man = cdp_test_read_file(path_in(dir, "step-00000006/manifest.json"));
    cr_assert(man && strstr(man, "\"run\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\""), "%s", man);
    free(man);
    cdp_ckpt_set_run(NULL);
    free_split(&src);
}

/* The newest step folder a link to nothing: an error naming it, not a resume
 * from an older one. */
Test(checkpoint, a_dangling_link_as_the_newest_step_is_an_error)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = corrupt_fixture(dir);
    cr_assert_eq(symlink("/nonexistent/step-00000150", path_in(dir, "step-00000150")), 0);
    expect_find_error(dir, fmt("%s is a symbolic link to /nonexistent/step-00000150, which is not there",
                               path_in(dir, "step-00000150")));
    free_split(&src);
}

/* A checkpoint whose weights hold a NaN: the load names the file and the
 * tensor (not a learning rate to lower after the first step's loss). */
Test(checkpoint, a_weight_that_is_not_a_number_is_named_at_load)
{
    const char *dir = cdp_test_tmpdir();
    struct split src = make_split(GPT(3, 8), two, 2, CDP_OPT_ADAMW, 1);
    fill_split(&src);
    struct cdp_model_tensor *t = cdp_model_tensor(src.m[1], 1);
    t->data[3] = NAN;
    save(&src, dir, 8, 3);
    struct split dst = make_split(GPT(3, 8), whole, 1, CDP_OPT_ADAMW, 2);
    char *path = NULL;
    struct cdp_ckpt_info info;
    cr_assert_eq(cdp_ckpt_find_latest(dir, &path, &info), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_ckpt_load(path, &info, dst.m, dst.o, dst.n), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), fmt("stage-1-chunk-0.safetensors: tensor %s holds NaN at element 3", t->name)),
              "%s", cdp_last_error());
    /* no advice to lower the learning rate; read past the folder's name,
     * which is random and may itself hold "lr" */
    const char *advice = strstr(cdp_last_error(), "holds NaN");
    cr_assert(advice && !strstr(advice, "lr") && !strstr(advice, "learning rate"), "%s", cdp_last_error());
    free(path);
    cdp_ckpt_info_free(&info);
    free_split(&dst);
    free_split(&src);
}
