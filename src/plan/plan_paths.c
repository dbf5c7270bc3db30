/* Paths a plan names, relative to its folder: files that must exist (of the
 * kind expected) and output paths whose folder must be writable. */
#include "cdp/plan.h"
#include "plan/plan_load_internal.h"

#include <errno.h>
#include <glob.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "core/path.h"
#include "plan/schedule_header.h"
#include "plan/schedule_kind.h"
#include "cdp/log.h"
#include "cdp/topology_spec.h"
#include "core/json_check.h"
#include "model/hf.h"
#include "model/layer_def.h"
#include "plan/plan_internal.h"

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a folder" : "not a regular file";
}

/* A string path to an existing regular file; *out = its absolute, canonical form. */
cdp_status cdp_plan_get_existing_file(struct ld *c, const json_t *v, const char *ptr, char **out)
{
    if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v))
        return cdp_json_expected(&c->in, ptr, "a file path", v);
    char *joined = cdp_path_join(c->base, json_string_value(v));
    if (!joined) return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
    char *abs = realpath(joined, NULL);
    if (!abs) {
        int e = errno;
        cdp_status st = cdp_json_fail(&c->in, ptr, "cannot open \"%s\": %s", joined, strerror(e));
        free(joined);
        return st;
    }
    struct stat sb;
    if (stat(abs, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        cdp_status st = cdp_json_fail(&c->in, ptr, "\"%s\" is %s", joined,
                                      stat(abs, &sb) != 0 ? "unreadable" : file_kind(sb.st_mode));
        free(joined);
        free(abs);
        return st;
    }
    free(joined);
    *out = abs;
    return CDP_OK;
}

/* A path that will be written: its folder must exist (it need not). When dir_ok,
 * the path itself may be an existing folder (a checkpoint folder); otherwise an
 * existing folder there is an error. */
cdp_status cdp_plan_get_output_path(struct ld *c, const json_t *v, const char *ptr, int dir_ok, char **out)
{
    const char *what = dir_ok ? "a folder path" : "a file path";
    if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v))
        return cdp_json_expected(&c->in, ptr, what, v);
    char *joined = cdp_path_join(c->base, json_string_value(v));
    if (!joined) return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
    size_t n = strlen(joined);
    while (n > 1 && joined[n - 1] == '/') joined[--n] = '\0';
    cdp_status st = CDP_OK;
    char *abs = NULL, *parent_abs = NULL;
    struct stat sb;
    if (stat(joined, &sb) == 0) {
        if (S_ISDIR(sb.st_mode) && !dir_ok) {
            st = cdp_json_fail(&c->in, ptr, "\"%s\" is a folder; expected a file path", joined);
            goto done;
        }
        if (!S_ISDIR(sb.st_mode) && dir_ok) {
            st = cdp_json_fail(&c->in, ptr, "\"%s\" exists and is not a folder", joined);
            goto done;
        }
        abs = realpath(joined, NULL);
        if (!abs) {
            st = cdp_json_fail(&c->in, ptr, "cannot resolve \"%s\": %s", joined, strerror(errno));
            goto done;
        }
        goto done;
    }
    char *slash = strrchr(joined, '/');
    const char *leaf = slash ? slash + 1 : joined;
    if (!*leaf || strcmp(leaf, ".") == 0 || strcmp(leaf, "..") == 0) {
        st = cdp_json_expected(&c->in, ptr, what, v);
        goto done;
    }
    if (slash == joined) {
        parent_abs = strdup("/");
    } else {
        *slash = '\0';
        parent_abs = realpath(joined, NULL);
        int e = errno;
        if (!parent_abs) {
            st = cdp_json_fail(&c->in, ptr, "the folder \"%s\" does not exist (%s); create it first", joined,
                               strerror(e));
            *slash = '/';
            goto done;
        }
        *slash = '/';
    }
    if (!parent_abs) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
        goto done;
    }
    if (stat(parent_abs, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        st = cdp_json_fail(&c->in, ptr, "\"%s\" is not a folder", parent_abs);
        goto done;
    }
    {
        size_t np = strlen(parent_abs), nl = strlen(leaf);
        abs = malloc(np + nl + 2);
        if (!abs) {
            st = cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
            goto done;
        }
        snprintf(abs, np + nl + 2, "%s%s%s", parent_abs, np > 1 ? "/" : "", leaf);
    }
done:
    free(parent_abs);
    free(joined);
    if (st) {
        free(abs);
        return st;
    }
    *out = abs;
    return CDP_OK;
}
