/* Checkpoints (model/checkpoint.h): the run id of this process's saves, and
 * the folders of a checkpoint directory: step names, listing, making and
 * removing them. */
#include "model/checkpoint.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/path.h"
#include "core/file.h"
#include "core/hash.h"
#include "core/json_check.h"
#include "model/checkpoint_internal.h"

/* The run this process's parts and commits belong to (cdp_ckpt_set_run). */
char ckpt_run_id[40];

void cdp_ckpt_set_run(const char *id) { snprintf(ckpt_run_id, sizeof ckpt_run_id, "%s", id ? id : ""); }

/* ---- paths and folders ------------------------------------------------------------ */

/* A copy of a path without trailing slashes (except a lone "/"). */
char *ckpt_trimmed(const char *p)
{
    char *s = strdup(p);
    if (!s) return NULL;
    size_t n = strlen(s);
    while (n > 1 && s[n - 1] == '/') s[--n] = '\0';
    return s;
}

char *ckpt_step_folder(const char *dir, int64_t step)
{
    char name[40];
    snprintf(name, sizeof name, "step-%08lld", (long long)step);
    return cdp_path_join(dir, name);
}

/* Where a step's save is written until it is complete: a hidden folder,
 * renamed to ckpt_step_folder's name by the commit (so a folder named step-N is
 * only ever a complete save, and a save never writes into one). */
#define PARTIAL_SUFFIX ".partial"
char *ckpt_partial_folder(const char *dir, int64_t step)
{
    char name[48];
    snprintf(name, sizeof name, ".step-%08lld" PARTIAL_SUFFIX, (long long)step);
    return cdp_path_join(dir, name);
}

/* "step-<digits>" -> step, *partial 0; ".step-<digits>.partial" -> step,
 * *partial 1; 0 when the name is anything else. */
static int parse_folder_name(const char *name, int64_t *step, int *partial)
{
    *partial = name[0] == '.';
    const char *p = name + *partial;
    if (strncmp(p, "step-", 5) || !isdigit((unsigned char)p[5])) return 0;
    int64_t v = 0;
    for (p += 5; *p && isdigit((unsigned char)*p); p++) {
        if (v > (INT64_MAX - 9) / 10) return 0;
        v = v * 10 + (*p - '0');
    }
    if (*partial ? strcmp(p, PARTIAL_SUFFIX) : *p != '\0') return 0;
    *step = v;
    return 1;
}

int ckpt_parse_step_name(const char *name, int64_t *step)
{
    int partial = 0;
    return parse_folder_name(name, step, &partial) && !partial;
}

int ckpt_is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int ckpt_is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* mkdir that accepts an existing folder (another rank may make it at the same time). */
cdp_status ckpt_make_dir(const char *path)
{
    if (mkdir(path, 0755) == 0 || (errno == EEXIST && ckpt_is_dir(path))) return CDP_OK;
    if (errno == EEXIST) return cdp_fail(CDP_ERR_IO, "%s: exists and is not a folder", path);
    return cdp_fail(CDP_ERR_IO, "%s: cannot make the folder: %s", path, strerror(errno));
}

/* mkdir -p */
cdp_status ckpt_make_dirs(const char *path)
{
    char *p = strdup(path);
    if (!p) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    cdp_status st = CDP_OK;
    for (char *q = p + 1; *q && !st; q++) {
        if (*q != '/') continue;
        *q = '\0';
        if (!ckpt_is_dir(p)) st = ckpt_make_dir(p);
        *q = '/';
    }
    if (!st) st = ckpt_make_dir(p);
    free(p);
    return st;
}

static int cmp_step_desc(const void *a, const void *b)
{
    const struct ckpt_step_ent *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

void ckpt_free_steps(struct ckpt_step_ent *e, int n)
{
    for (int i = 0; i < n; i++) free(e[i].path);
    free(e);
}

/* The step folders under dir, newest first. A missing dir is an empty list. */
cdp_status ckpt_list_steps(const char *dir, struct ckpt_step_ent **out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return CDP_OK;
        return cdp_fail(CDP_ERR_IO, "%s: cannot list the folder: %s", dir, strerror(errno));
    }
    struct ckpt_step_ent *e = NULL;
    int n = 0, cap = 0;
    cdp_status st = CDP_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t step;
        int partial = 0;
        if (!parse_folder_name(de->d_name, &step, &partial)) continue;
        char *path = cdp_path_join(dir, de->d_name);
        char *man = path ? cdp_path_join(path, MANIFEST) : NULL;
        if (!man) {
            free(path);
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
            break;
        }
        struct stat lsb;
        /* a step folder that is a link to nothing is listed, so that the
         * newest checkpoint gone is an error and not an older one's resume */
        const int broken = lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode) && !ckpt_is_dir(path) && !partial;
        if (!broken && !ckpt_is_dir(path)) {
            free(path);
            free(man);
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            struct ckpt_step_ent *ne = realloc(e, (size_t)cap * sizeof *e);
            if (!ne) {
                free(path);
                free(man);
                st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
                break;
            }
            e = ne;
        }
        e[n].step = step;
        e[n].partial = partial;
        e[n].complete = !partial && !broken && ckpt_is_file(man);
        e[n].broken = broken;
        e[n].path = path;
        n++;
        free(man);
    }
    closedir(d);
    if (st) {
        ckpt_free_steps(e, n);
        return st;
    }
    if (n) qsort(e, (size_t)n, sizeof *e, cmp_step_desc);
    *out = e;
    *n_out = n;
    return CDP_OK;
}

/* Removes a checkpoint folder: first renamed out of sight (".removing-NAME",
 * which no listing takes for a checkpoint), so that a crash halfway leaves
 * neither a complete-looking folder with parts missing nor a committed one
 * without its manifest. Failures are warnings: the new checkpoint is in place. */
void ckpt_remove_folder(const char *path)
{
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    const size_t dl = (size_t)(base - path), n = strlen(path) + 16;
    char *gone = malloc(n);
    if (gone) snprintf(gone, n, "%.*s.removing-%s", (int)dl, path, base);
    const char *at = gone && rename(path, gone) == 0 ? gone : path;
    DIR *d = opendir(at);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char *f = cdp_path_join(at, de->d_name);
            if (f && unlink(f) != 0) CDP_WARN(CKPT, "cannot remove %s: %s", f, strerror(errno));
            free(f);
        }
        closedir(d);
    }
    if (rmdir(at) != 0) CDP_WARN(CKPT, "cannot remove the folder %s: %s", at, strerror(errno));
    free(gone);
}

