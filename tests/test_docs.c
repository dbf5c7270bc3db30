/* Suite docs: every shell command README.md and the pages of docs/ show is run, and
 * exits as documented (issue 28). What counts, and how it runs:
 *
 * A command is a line of a fenced block (```sh, ```bash, ```shell, ```console
 * or one without a language), after an optional "$ " prompt, that starts with
 * `build/cdphybrid`, `cdphybrid`, `mpirun`, `tools/`, `bench/`, `meson` or
 * `cc`, with the lines it continues with a trailing backslash; or an inline
 * `code span` that starts with `build/cdphybrid `, `cdphybrid ` or `mpirun `
 * and names a path (a word with a '/' after the program: `cdphybrid --plan
 * examples/pipeline.json`); one without (`cdphybrid eval`, `cdphybrid --plan
 * plan.json`) names a command in prose. Lines of a block that start
 * otherwise are its output.
 *
 * Not run, each logged with why:
 *   - a synopsis: a word in capitals standing for a value (FILE, DIR, P, N,
 *     SPEC, OUT.json), or `[`, `|`, `...`, `…`;
 *   - building, testing and installing (`meson`, `cc`, `tools/setup.sh`: the
 *     test runs what follows `tools/setup.sh &&` with the build under test);
 *     the whole test suite is what runs this test;
 *   - benchmarks and GPU checks (`bench/`, `tools/gpu-check.sh`, Python tools):
 *     minutes long, a GPU, or PyPI packages;
 *   - mpirun of another program than cdphybrid (an embedding example);
 *   - training, generate or eval of a plan whose backend is "cuda" (a GPU);
 *   - a block marked on the line before its fence
 *         <!-- commands: skip (why) -->
 * A block whose commands end otherwise than 0 says so the same way:
 *         <!-- commands: exit N -->
 *
 * The commands of a doc run in order, in one temporary folder laid out like
 * the source tree (every top-level entry linked; `build/cdphybrid` and
 * `cdphybrid` on PATH are the binary under test; examples/ holds copies of
 * its plans and an empty runs/), so that one command's outputs are the next
 * one's inputs, as a reader running them would find them. The copies train
 * one step (/train/steps) and validate on one micro-batch
 * (/train/eval_batches), a learning-rate schedule's warmup and decay made to
 * fit that step (warmup_steps 0, decay_steps 1), so that a doc's 300-step demo takes a second, not a
 * minute: the test checks that each command works and exits as documented,
 * not its numbers; everything else is the plan as written. Each command has
 * 120 s (timeout(1) ends it and all it started). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define MAX_STEPS 1

struct tally {
    int ran, skipped, failures;
    char text[16384];
};

/* The temporary tree (see the header); returns its root. Static storage. */
static const char *make_tree(const char *src)
{
    static char root[PATH_MAX];
    snprintf(root, sizeof root, "%s", cdp_test_tmpdir());
    DIR *d = opendir(src);
    cr_assert_not_null(d, "cannot open %s", src);
    char from[PATH_MAX + 256], to[PATH_MAX + 256];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, "examples") ||
            !strncmp(e->d_name, "build", 5))
            continue;
        snprintf(from, sizeof from, "%s/%s", src, e->d_name);
        snprintf(to, sizeof to, "%s/%s", root, e->d_name);
        cr_assert_eq(symlink(from, to), 0, "symlink %s", to);
    }
    closedir(d);
    /* build/cdphybrid: the binary under test (whatever its build folder is called) */
    snprintf(to, sizeof to, "%s/build", root);
    cr_assert_eq(mkdir(to, 0755), 0);
    snprintf(to, sizeof to, "%s/build/cdphybrid", root);
    cr_assert_eq(symlink(getenv("CDP_BIN"), to), 0, "symlink %s", to);
    /* examples/: the plans copied with at most MAX_STEPS steps, the rest linked, runs/ empty */
    snprintf(from, sizeof from, "%s/examples", src);
    snprintf(to, sizeof to, "%s/examples", root);
    cr_assert_eq(mkdir(to, 0755), 0);
    snprintf(to, sizeof to, "%s/examples/runs", root);
    cr_assert_eq(mkdir(to, 0755), 0);
    d = opendir(from);
    cr_assert_not_null(d, "cannot open %s", from);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "runs")) continue;
        char a[PATH_MAX + 512], b[PATH_MAX + 512];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/examples/%s", root, e->d_name);
        const size_t len = strlen(e->d_name);
        json_t *plan = len > 5 && !strcmp(e->d_name + len - 5, ".json") ? json_load_file(a, 0, NULL) : NULL;
        json_t *train = plan ? json_object_get(plan, "train") : NULL;
        json_t *steps = train ? json_object_get(train, "steps") : NULL;
        if (json_is_object(train)) {
            if (!json_is_integer(steps) || json_integer_value(steps) > MAX_STEPS)
                json_object_set_new(train, "steps", json_integer(MAX_STEPS));
            json_t *lrs = json_object_get(train, "lr_schedule");
            if (json_is_object(lrs)) {
                if (json_object_get(lrs, "warmup_steps")) json_object_set_new(lrs, "warmup_steps", json_integer(0));
                if (json_object_get(lrs, "decay_steps")) json_object_set_new(lrs, "decay_steps", json_integer(1));
            }
            const json_t *eb = json_object_get(train, "eval_batches");
            if (!json_is_integer(eb) || json_integer_value(eb) > 1) json_object_set_new(train, "eval_batches", json_integer(1));
            cr_assert_eq(json_dump_file(plan, b, JSON_INDENT(2)), 0, "%s", b);
        } else {
            cr_assert_eq(symlink(a, b), 0, "symlink %s", b);
        }
        json_decref(plan);
    }
    closedir(d);
    return root;
}

/* Whether word w (up to a space) stands for a value: capitals (and digits,
 * '_'), with an optional extension (FILE, P, N, OUT.json, FILE.xml). */
static int is_placeholder(const char *w, size_t n)
{
    size_t caps = 0, k = 0;
    while (k < n && ((w[k] >= 'A' && w[k] <= 'Z') || w[k] == '_' || (caps && w[k] >= '0' && w[k] <= '9'))) {
        caps += w[k] >= 'A' && w[k] <= 'Z';
        k++;
    }
    return caps >= 1 && (k == n || w[k] == '.' || w[k] == ',' || w[k] == ')') && strncmp(w, "OMPI_", 5) != 0;
}

/* Why cmd is not run, or NULL. */
static const char *why_not(const char *root, const char *cmd)
{
    if (strstr(cmd, "[") || strstr(cmd, " | ") || strstr(cmd, "...") || strstr(cmd, "\xe2\x80\xa6"))
        return "a synopsis";
    for (const char *w = cmd; *w;) {
        while (*w == ' ' || *w == '\\' || *w == '\n' || *w == '"' || *w == '\'') w++;
        size_t n = strcspn(w, " \n\"'");
        if (n && w[0] != '-' && is_placeholder(w, n)) return "a synopsis";
        if (n > 2 && w[0] == '-' && w[1] == '-' && strchr(w, '=') && is_placeholder(strchr(w, '=') + 1, n - (size_t)(strchr(w, '=') + 1 - w)))
            return "a synopsis";
        w += n;
    }
    if (!strncmp(cmd, "meson", 5) || !strncmp(cmd, "cc ", 3) || !strncmp(cmd, "tools/setup.sh", 14))
        return "building, testing or installing";
    if (!strncmp(cmd, "bench/", 6) || !strncmp(cmd, "tools/", 6)) return "a benchmark or a GPU check";
    if (!strncmp(cmd, "mpirun", 6) && !strstr(cmd, "cdphybrid ")) return "mpirun of another program";
    /* training, generate, eval of a cuda plan */
    const char *p = strstr(cmd, "--plan ");
    if (p && !strstr(cmd, "--dry-run") && !strstr(cmd, "--schedule") && !strstr(cmd, "--simulate") &&
        !strstr(cmd, "--no-launch")) {
        char path[PATH_MAX + 512], file[PATH_MAX];
        if (sscanf(p + 7, "%4095s", file) == 1) {
            snprintf(path, sizeof path, "%s/%s", root, file);
            json_t *j = json_load_file(path, 0, NULL);
            const char *backend = json_string_value(json_object_get(json_object_get(j, "cluster"), "backend"));
            const int cuda = backend && !strcmp(backend, "cuda");
            json_decref(j);
            if (cuda) return "a cuda plan: it needs a GPU";
        }
    }
    return NULL;
}

static const char *const prefixes[] = {"build/cdphybrid", "cdphybrid", "mpirun", "tools/", "bench/", "meson",
                                       "cc ", NULL};

static int starts_command(const char *t, int inline_span)
{
    for (int i = 0; prefixes[i]; i++) {
        if (inline_span && i >= 3) break;
        const size_t n = strlen(prefixes[i]);
        if (!strncmp(t, prefixes[i], n) && (inline_span ? t[n] == ' ' : (t[n] == ' ' || !strcmp(prefixes[i], "tools/") ||
                                                                     !strcmp(prefixes[i], "bench/"))))
            return 1;
    }
    return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Runs cmd in root under sh; records a failure when its exit is not `want`. */
static void run_command(struct tally *t, const char *root, const char *doc, int line, const char *cmd0, int want)
{
    const char *cmd = cmd0;
    if (!strncmp(cmd, "tools/setup.sh && ", 18)) cmd += 18; /* the build is the one under test */
    const char *why = why_not(root, cmd);
    if (why) {
        t->skipped++;
        cr_log_info("%s:%d: not run (%s): %s", doc, line, why, cmd0);
        return;
    }
    /* sh, not the harness's runner: its 60 s deadline kills only the shell and
     * would leave a slow (sanitizer-built, loaded machine) job's ranks behind;
     * timeout ends the whole command, and its output is kept for the message */
    char *script = malloc(2 * strlen(cmd) + 2 * PATH_MAX + 256);
    cr_assert_not_null(script);
    size_t k = (size_t)sprintf(script, "cd '%s' && PATH='%s/build':\"$PATH\" && export PATH && timeout -k 5 120 sh -c '",
                               root, root);
    for (const char *c = cmd; *c; c++) k += (size_t)(*c == '\'' ? sprintf(script + k, "'\\''") : sprintf(script + k, "%c", *c));
    sprintf(script + k, "' </dev/null 2>&1");
    fflush(NULL);
    FILE *p = popen(script, "r");
    cr_assert_not_null(p, "popen: %s", script);
    char out[4096] = "", buf[4096];
    size_t n_out = 0;
    for (size_t got; (got = fread(buf, 1, sizeof buf, p)) > 0;) /* the tail: where a failure says why */
        for (size_t i = 0; i < got; i++) {
            if (n_out == sizeof out - 1) {
                memmove(out, out + 1024, n_out - 1024);
                n_out -= 1024;
            }
            out[n_out++] = buf[i];
        }
    out[n_out] = '\0';
    const int status = pclose(p);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    t->ran++;
    if (code != want) {
        const size_t n = strlen(t->text);
        t->failures++;
        if (n + 1 < sizeof t->text)
            snprintf(t->text + n, sizeof t->text - n, "%s:%d: exit %d, documented %d: %s\n  %.800s\n", doc, line,
                     code, want, cmd, n_out > 800 ? out + n_out - 800 : out);
    } else {
        cr_log_info("%s:%d: exit %d: %s", doc, line, code, cmd);
    }
    free(script);
}

/* The marker on the line before a fence: "skip" (1, why in why), "exit N" (2, N in *code), else 0. */
static int marker(const char *prev, char *why, size_t cap, int *code)
{
    if (!prev) return 0;
    while (*prev == ' ') prev++;
    if (strncmp(prev, "<!-- commands: ", 15)) return 0;
    prev += 15;
    if (sscanf(prev, "exit %d", code) == 1) return 2;
    if (!strncmp(prev, "skip", 4)) {
        snprintf(why, cap, "%.*s", (int)strcspn(prev, "\n"), prev);
        return 1;
    }
    return 0;
}

/* Every command of root/rel, in order. A page names only documents the
 * repository holds: not the internal notes it was built from. */
static void run_doc(struct tally *t, const char *src, const char *rel)
{
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", src, rel);
    char *text = cdp_test_read_file(path);
    cr_assert_not_null(text, "cannot read %s", path);
    static const char *const absent[] = {"DESIGN.md", "REFERENCES.md", NULL};
    for (int i = 0; absent[i]; i++) {
        const size_t n = strlen(t->text);
        if (strstr(text, absent[i]) && n + 1 < sizeof t->text) {
            t->failures++;
            snprintf(t->text + n, sizeof t->text - n, "%s: cites %s, which is not in the repository\n", rel, absent[i]);
        }
    }
    const char *root = make_tree(src);
    char *lines[8192];
    int n = 0;
    for (char *c = text; *c && n < 8192;) {
        lines[n++] = c;
        char *e = strchr(c, '\n');
        if (!e) break;
        *e = '\0';
        c = e + 1;
    }
    const char *prev = NULL;
    for (int i = 0; i < n; i++) {
        const char *s = lines[i];
        while (*s == ' ' || *s == '\t') s++;
        if (!strncmp(s, "```", 3)) {
            const char *lang = s + 3;
            const int shell = !*lang || !strcmp(lang, "sh") || !strcmp(lang, "bash") || !strcmp(lang, "shell") ||
                              !strcmp(lang, "console");
            char why[256] = "";
            int want = 0;
            const int mk = marker(prev, why, sizeof why, &want);
            int j = i + 1;
            for (; j < n; j++) {
                const char *u = lines[j];
                while (*u == ' ' || *u == '\t') u++;
                if (!strncmp(u, "```", 3)) break;
                if (!shell) continue;
                if (!strncmp(u, "$ ", 2)) u += 2;
                if (!starts_command(u, 0)) continue;
                /* the command and the lines it continues */
                char cmd[4096];
                size_t len = 0;
                const int at = j + 1;
                for (;;) {
                    const char *v = lines[j];
                    while (*v == ' ' || *v == '\t') v++;
                    if (j == at - 1 && !strncmp(v, "$ ", 2)) v += 2;
                    len += (size_t)snprintf(cmd + len, sizeof cmd - len, "%s%s", len ? " " : "", v);
                    if (len >= sizeof cmd) len = sizeof cmd - 1;
                    if (len && cmd[len - 1] == '\\' && j + 1 < n) {
                        cmd[--len] = '\0';
                        j++;
                        continue;
                    }
                    break;
                }
                if (mk == 1) {
                    t->skipped++;
                    cr_log_info("%s:%d: not run (marked: %s): %s", rel, at, why, cmd);
                } else {
                    run_command(t, root, rel, at, cmd, want);
                }
            }
            i = j;
            prev = NULL;
            continue;
        }
        /* inline spans of this line (a span may go on to the next line) */
        for (const char *c = lines[i]; (c = strchr(c, '`'));) {
            if (c[1] == '`') {
                c += 2;
                continue;
            }
            const char *e = strchr(c + 1, '`');
            char span[1024];
            if (e) {
                snprintf(span, sizeof span, "%.*s", (int)(e - c - 1), c + 1);
            } else if (i + 1 < n && (e = strchr(lines[i + 1], '`'))) {
                snprintf(span, sizeof span, "%s %.*s", c + 1, (int)(e - lines[i + 1]), lines[i + 1]);
            } else {
                break;
            }
            const char *path = strchr(span + (strncmp(span, "build/", 6) ? 0 : 6), '/');
            if (starts_command(span, 1) && path) run_command(t, root, rel, i + 1, span, 0);
            if (e >= lines[i] && e < lines[i] + strlen(lines[i])) c = e + 1;
            else break;
        }
        if (*s) prev = s;
    }
    free(text);
}

Test(docs, every_command_shown_runs_as_documented, .timeout = 300)
{
    const char *root = getenv("CDP_SOURCE_ROOT");
    cr_assert_not_null(root, "CDP_SOURCE_ROOT is not set (run the tests through meson test)");
    char src[PATH_MAX];
    cr_assert_not_null(realpath(root, src), "%s", root);
    char docs[PATH_MAX + 16];
    snprintf(docs, sizeof docs, "%s/docs", src);
    struct tally *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    run_doc(t, src, "README.md");
    DIR *d = opendir(docs);
    cr_assert_not_null(d, "cannot open %s", docs);
    char *names[256];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 256;) {
        const size_t len = strlen(e->d_name);
        if (len > 3 && !strcmp(e->d_name + len - 3, ".md")) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    for (int i = 0; i < n; i++) {
        char rel[512];
        snprintf(rel, sizeof rel, "docs/%s", names[i]);
        run_doc(t, src, rel);
        free(names[i]);
    }
    cr_log_info("%d commands run, %d not run", t->ran, t->skipped);
    cr_assert_geq(t->ran, 8, "only %d commands ran (the parser missed some?)", t->ran);
    cr_assert_eq(t->failures, 0, "%d of %d commands did not exit as documented:\n%s", t->failures, t->ran, t->text);
    free(t);
}
