/* Every plan the project shows loads (suite "cli", issue 19): every .json of
 * examples/, and each ```json block of docs/'s pages and README.md that is a
 * whole plan, through `cdphybrid --plan FILE --dry-run`; a failure names the
 * file and the block's line.
 *
 * What counts as a doc plan: a ```json block (its fence may be indented, as in
 * a list) that, with its `//` comments taken out (docs/plan.md's complete
 * example is annotated), is a JSON object with a "model" key. Blocks of other
 * formats (a checkpoint manifest, a topology file) and fragments are skipped,
 * and logged. A block that mentions "model" but is not JSON fails, unless the
 * line before its fence is a marker naming why it is not a plan:
 *
 *     <!-- dry-run: skip (an error message's plan, not meant to load) -->
 *
 * A doc plan is written to a temporary folder laid out like the source tree
 * (the doc's own folder holds links to that folder's files, and every other
 * top-level entry is linked), so paths in it resolve as they would beside the
 * doc. Plans whose /cluster/backend is "cuda" run against the stand-in CUDA
 * module (tests/fake-cuda), so a machine without a GPU checks them too. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

/* What the checks found; the failures one per line. */
struct findings {
    int plans, skipped, failures;
    char text[16384];
};

static void fail_at(struct findings *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_at(struct findings *f, const char *fmt, ...)
{
    size_t n = strlen(f->text);
    f->failures++;
    va_list ap;
    va_start(ap, fmt);
    if (n + 1 < sizeof f->text) vsnprintf(f->text + n, sizeof f->text - n, fmt, ap);
    va_end(ap);
}

/* The text without its // comments (outside strings). Owned by the caller. */
static char *strip_comments(const char *s)
{
    char *out = malloc(strlen(s) + 1), *o = out;
    cr_assert_not_null(out);
    int in_str = 0;
    for (const char *c = s; *c; c++) {
        if (in_str) {
            *o++ = *c;
            if (*c == '\\' && c[1]) *o++ = *++c;
            else if (*c == '"') in_str = 0;
        } else if (c[0] == '/' && c[1] == '/') {
            while (c[1] && c[1] != '\n') c++;
        } else {
            if (*c == '"') in_str = 1;
            *o++ = *c;
        }
    }
    *o = '\0';
    return out;
}

/* `--plan path --dry-run`: 0 when it loads, else its exit code with the
 * message in msg. A cuda plan runs on the stand-in CUDA module. */
static int dry_run(const char *path, int cuda, char *msg, size_t cap)
{
    const char *fake = getenv("CDP_FAKE_CUDA_DIR");
    char *saved = getenv("CDP_MODULE_DIR") ? strdup(getenv("CDP_MODULE_DIR")) : NULL;
    if (cuda) {
        cr_assert_not_null(fake, "CDP_FAKE_CUDA_DIR is not set (run the tests through meson test)");
        setenv("CDP_MODULE_DIR", fake, 1);
    } else {
        setenv("CUDA_VISIBLE_DEVICES", "", 1); /* "auto" plans plan for the CPU */
    }
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", path, "--dry-run", NULL}), 0, "could not run the binary");
    if (saved) setenv("CDP_MODULE_DIR", saved, 1);
    else unsetenv("CDP_MODULE_DIR");
    free(saved);
    unsetenv("CUDA_VISIBLE_DEVICES");
    const int code = r.exit_code;
    snprintf(msg, cap, "%s", r.err[0] ? r.err : "(nothing on stderr)\n");
    cdp_test_run_free(&r);
    return code;
}

static int is_cuda_plan(const json_t *plan)
{
    const char *b = json_string_value(json_object_get(json_object_get(plan, "cluster"), "backend"));
    return b && !strcmp(b, "cuda");
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The names in dir ending in suffix, sorted; *n of them. */
static char **list_dir(const char *dir, const char *suffix, int *n)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s", dir);
    char **names = NULL;
    int count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const size_t len = strlen(e->d_name), sl = strlen(suffix);
        if (e->d_name[0] == '.' || len < sl || strcmp(e->d_name + len - sl, suffix)) continue;
        names = realloc(names, (size_t)(count + 1) * sizeof *names);
        cr_assert_not_null(names);
        names[count++] = strdup(e->d_name);
    }
    closedir(d);
    if (count) qsort(names, (size_t)count, sizeof *names, by_name);
    *n = count;
    return names;
}

static void free_list(char **names, int n)
{
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* A folder laid out like root for plans of root/sub ("" : root itself):
 * returns the folder a plan of sub is written to. Static storage. */
static const char *mirror(const char *root, const char *sub)
{
    static char base[PATH_MAX], at[PATH_MAX + 256];
    snprintf(base, sizeof base, "%s", cdp_test_tmpdir());
    DIR *d = opendir(root);
    cr_assert_not_null(d, "cannot open %s", root);
    char from[PATH_MAX + 256], to[PATH_MAX + 256];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(from, sizeof from, "%s/%s", root, e->d_name);
        snprintf(to, sizeof to, "%s/%s", base, e->d_name);
        if (sub[0] && !strcmp(e->d_name, sub)) {
            cr_assert_eq(mkdir(to, 0755), 0, "mkdir %s", to);
            DIR *s = opendir(from);
            cr_assert_not_null(s, "cannot open %s", from);
            for (struct dirent *f; (f = readdir(s));) {
                if (!strcmp(f->d_name, ".") || !strcmp(f->d_name, "..")) continue;
                char a[PATH_MAX + 512], b[PATH_MAX + 512];
                snprintf(a, sizeof a, "%s/%s", from, f->d_name);
                snprintf(b, sizeof b, "%s/%s", to, f->d_name);
                cr_assert_eq(symlink(a, b), 0, "symlink %s", b);
            }
            closedir(s);
        } else {
            cr_assert_eq(symlink(from, to), 0, "symlink %s", to);
        }
    }
    closedir(d);
    snprintf(at, sizeof at, "%s%s%s", base, sub[0] ? "/" : "", sub);
    return at;
}

/* A block's check: a plan dry-runs; anything else is skipped or, mentioning
 * "model" without being JSON, fails. */
static void check_block(struct findings *f, const char *doc, int line, const char *body, const char *marker,
                        const char *plan_dir)
{
    if (marker) {
        f->skipped++;
        cr_log_info("%s:%d: skipped, marked: %s", doc, line, marker);
        return;
    }
    char *text = strip_comments(body);
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    if (!json_is_object(j) || !json_object_get(j, "model")) {
        if (!j && strstr(text, "\"model\"")) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s (block line %d)", err.text, err.line);
            fail_at(f, "%s:%d: a ```json block with \"model\" that is not JSON: %s; fix it, or mark it "
                       "<!-- dry-run: skip (why) --> on the line before its fence\n", doc, line, msg);
        } else {
            f->skipped++;
            cr_log_info("%s:%d: skipped, not a whole plan (no \"model\" key)", doc, line);
        }
        json_decref(j);
        free(text);
        return;
    }
    char name[64], path[PATH_MAX + 512], msg[4096];
    snprintf(name, sizeof name, "block-%d.json", line);
    snprintf(path, sizeof path, "%s", cdp_test_write_file(plan_dir, name, text));
    f->plans++;
    if (dry_run(path, is_cuda_plan(j), msg, sizeof msg)) fail_at(f, "%s:%d: --dry-run: %s", doc, line, msg);
    json_decref(j);
    free(text);
}

/* The ```json blocks of root/rel (a doc in root or in one of its folders). */
static void check_doc(struct findings *f, const char *root, const char *rel)
{
    char path[PATH_MAX + 256], sub[256] = "";
    snprintf(path, sizeof path, "%s/%s", root, rel);
    const char *slash = strrchr(rel, '/');
    if (slash) snprintf(sub, sizeof sub, "%.*s", (int)(slash - rel), rel);
    cr_assert_null(strchr(sub, '/'), "%s: docs one folder deep only", rel);
    char *text = cdp_test_read_file(path);
    cr_assert_not_null(text, "cannot read %s", path);
    const char *plan_dir = NULL;
    char marker[256], *prev = NULL; /* the last non-blank line before this one */
    int line = 0;
    for (char *c = text; *c;) {
        char *end = strchr(c, '\n');
        if (!end) end = c + strlen(c);
        line++;
        const char *t = c;
        while (*t == ' ' || *t == '\t') t++;
        const size_t indent = (size_t)(t - c);
        if (!strncmp(t, "```", 3)) {
            const int fence_line = line;
            const int json = !strncmp(t + 3, "json", 4) && (t[7] == '\n' || t[7] == ' ' || t[7] == '\r' ||
                                                             t + 7 == end);
            const char *m = NULL;
            if (prev && sscanf(prev, " <!-- dry-run: skip %255[^\n]", marker) == 1) {
                char *close = strstr(marker, "-->");
                if (close) *close = '\0';
                for (size_t k = strlen(marker); k > 0 && marker[k - 1] == ' '; k--) marker[k - 1] = '\0';
                m = marker;
            }
            /* the body: up to the closing fence, its indent taken off */
            size_t cap = 4096, n = 0;
            char *body = malloc(cap);
            cr_assert_not_null(body);
            c = *end ? end + 1 : end;
            for (;;) {
                if (!*c) {
                    fail_at(f, "%s:%d: a ``` block that never closes\n", rel, fence_line);
                    break;
                }
                char *e2 = strchr(c, '\n');
                if (!e2) e2 = c + strlen(c);
                line++;
                const char *u = c;
                while (*u == ' ' || *u == '\t') u++;
                if (!strncmp(u, "```", 3)) {
                    c = *e2 ? e2 + 1 : e2;
                    break;
                }
                const char *from = (size_t)(u - c) >= indent ? c + indent : u;
                const size_t len = (size_t)(e2 - from);
                if (n + len + 2 > cap) {
                    cap = 2 * (n + len + 2);
                    body = realloc(body, cap);
                    cr_assert_not_null(body);
                }
                memcpy(body + n, from, len);
                n += len;
                body[n++] = '\n';
                c = *e2 ? e2 + 1 : e2;
            }
            body[n] = '\0';
            if (json) {
                if (!plan_dir) plan_dir = strdup(mirror(root, sub));
                check_block(f, rel, fence_line, body, m, plan_dir);
            }
            free(body);
            prev = NULL;
            continue;
        }
        if (t != end) prev = c;
        c = *end ? end + 1 : end;
    }
    free((void *)plan_dir);
    free(text);
}

Test(cli, every_example_plan_dry_runs, .timeout = 240)
{
    char dir[PATH_MAX], path[PATH_MAX + 256], msg[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_source_path("examples"));
    int n = 0;
    char **names = list_dir(dir, ".json", &n);
    struct findings *f = calloc(1, sizeof *f);
    cr_assert_not_null(f);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        json_error_t err;
        json_t *j = json_load_file(path, 0, &err);
        if (!j) {
            fail_at(f, "examples/%s:%d: not JSON: %s\n", names[i], err.line, err.text);
            continue;
        }
        f->plans++;
        if (dry_run(path, is_cuda_plan(j), msg, sizeof msg)) fail_at(f, "examples/%s: --dry-run: %s", names[i], msg);
        json_decref(j);
    }
    cr_log_info("examples/: %d plans dry-run", f->plans);
    cr_assert_geq(n, 10, "only %d plans in examples/", n);
    cr_assert_eq(f->failures, 0, "%d of %d example plans do not load:\n%s", f->failures, n, f->text);
    free_list(names, n);
    free(f);
}

Test(cli, every_plan_in_the_docs_dry_runs, .timeout = 120)
{
    char root[PATH_MAX], docs[PATH_MAX + 8], rel[PATH_MAX];
    snprintf(root, sizeof root, "%s", cdp_test_source_path("."));
    snprintf(docs, sizeof docs, "%s/docs", root);
    int n = 0;
    char **names = list_dir(docs, ".md", &n);
    struct findings *f = calloc(1, sizeof *f);
    cr_assert_not_null(f);
    check_doc(f, root, "README.md");
    for (int i = 0; i < n; i++) {
        snprintf(rel, sizeof rel, "docs/%s", names[i]);
        check_doc(f, root, rel);
    }
    cr_log_info("README.md and %d docs: %d plans dry-run, %d blocks skipped", n, f->plans, f->skipped);
    /* docs/plan.md's complete example at least */
    cr_assert_geq(f->plans, 1, "no plan found in the docs: the block scanner is broken");
    cr_assert_eq(f->failures, 0, "%d doc plans do not load:\n%s", f->failures, f->text);
    free_list(names, n);
    free(f);
}

/* The check itself, on a made-up tree: a good plan (with a // comment and a
 * data path beside the doc), a plan with an unknown key, a fragment, another
 * format, a marked block and a broken plan; the failures name file and line. */
Test(cli, the_doc_plan_check_names_file_and_line)
{
    char root[PATH_MAX], docs[PATH_MAX + 8];
    snprintf(root, sizeof root, "%s", cdp_test_tmpdir());
    snprintf(docs, sizeof docs, "%s/docs", root);
    cr_assert_eq(mkdir(docs, 0755), 0);
    cdp_test_write_file(docs, "tiny.txt", "hello, plans. hello, plans. hello, plans. hello, plans.\n");
    cdp_test_write_file(
        docs, "t.md",
        "# t\n"                                                                        /* 1 */
        "\n"                                                                           /* 2 */
        "```json\n"                                                                    /* 3: good */
        "{ \"model\": { \"preset\": \"mlp\", \"input\": [4], \"classes\": 2 },  // an MLP\n"
        "  \"data\": { \"source\": \"synthetic\" } }\n"
        "```\n"
        "- in a list:\n"                                                               /* 7 */
        "  ```json\n"                                                                  /* 8: good, indented, a file */
        "  { \"model\": { \"preset\": \"gpt\", \"vocab\": 256, \"context\": 4, \"layers\": 1, \"heads\": 1,\n"
        "               \"embed\": 8 }, \"data\": { \"source\": \"text\", \"path\": \"tiny.txt\" } }\n"
        "  ```\n"
        "```json\n"                                                                    /* 12: unknown key */
        "{ \"model\": { \"preset\": \"gpt\" }, \"trian\": {} }\n"
        "```\n"
        "```json\n"                                                                    /* 15: a fragment */
        "\"train\": { \"steps\": 5 }\n"
        "```\n"
        "```json\n"                                                                    /* 18: another format */
        "{ \"format\": \"cdphybrid-topology\" }\n"
        "```\n"
        "<!-- dry-run: skip (shows an error) -->\n"                                    /* 21 */
        "```json\n"                                                                    /* 22: marked */
        "{ \"model\": { \"preset\": \"nope\" } }\n"
        "```\n"
        "```json\n"                                                                    /* 25: broken */
        "{ \"model\": { \"preset\": \"gpt\" }, }\n"
        "```\n"
        "```sh\n"                                                                      /* 28: not json */
        "{ \"model\": 1 }\n"
        "```\n");
    struct findings *f = calloc(1, sizeof *f);
    cr_assert_not_null(f);
    check_doc(f, root, "docs/t.md");
    cr_expect_eq(f->plans, 3, "plans %d: %s", f->plans, f->text);
    cr_expect_eq(f->skipped, 3, "skipped %d", f->skipped);
    cr_expect_eq(f->failures, 2, "failures %d: %s", f->failures, f->text);
    cr_expect(strstr(f->text, "docs/t.md:12: --dry-run: ") && strstr(f->text, "/trian: unknown key"), "%s", f->text);
    cr_expect(strstr(f->text, "docs/t.md:25: a ```json block with \"model\" that is not JSON"), "%s", f->text);
    cr_expect(!strstr(f->text, "t.md:3:") && !strstr(f->text, "t.md:8:"), "the good plans failed: %s", f->text);
    free(f);
}
