/* Checkpoints (model/checkpoint.h): the manifest, read and checked with its
 * own checksum, and every part's size and checksum verified against it. */
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

/* ---- the manifest -------------------------------------------------------------------- */

/* Writes text to folder/name atomically (core/file.h). */
cdp_status ckpt_write_atomic(const char *folder, const char *name, const char *text)
{
    char *path = cdp_path_join(folder, name);
    if (!path) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    cdp_status st = cdp_write_file_atomic(path, text, strlen(text));
    free(path);
    return st;
}

/* "layers.<N>.<param>" -> N; -1 otherwise. */
int ckpt_unit_of(const char *name)
{
    if (strncmp(name, "layers.", 7) || !isdigit((unsigned char)name[7])) return -1;
    char *end;
    long v = strtol(name + 7, &end, 10);
    return *end == '.' && v <= INT_MAX ? (int)v : -1;
}

static int is_hex64(const char *s)
{
    if (strlen(s) != 64) return 0;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p) && !(*p >= 'a' && *p <= 'f')) return 0;
    return 1;
}

const char *ckpt_optimizer_name(enum cdp_optimizer_type t) { return t == CDP_OPT_ADAMW ? "adamw" : "sgd"; }

/* The manifest's own checksum: SHA-256 of root without manifest_sha256, as
 * compact JSON with sorted keys (what is read back dumps the same: jansson
 * writes reals with 17 digits). Nonzero when out of memory. */
int ckpt_manifest_sum(const json_t *root, char hex[65])
{
    json_t *copy = json_copy((json_t *)root);
    if (!copy) return 1;
    json_object_del(copy, "manifest_sha256");
    char *text = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(copy);
    if (!text) return 1;
    struct cdp_sha256 h;
    cdp_sha256_init(&h);
    cdp_sha256_update(&h, text, strlen(text));
    cdp_sha256_final(&h, hex);
    free(text);
    return 0;
}

/* Reads folder/manifest.json and checks every key and its type, and (version
 * 2) its own checksum; *root on success. */
cdp_status ckpt_read_manifest(const char *folder, json_t **root_out)
{
    char *path = cdp_path_join(folder, MANIFEST);
    if (!path) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    cdp_status st = CDP_OK;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (!ckpt_is_file(path)) st = cdp_fail(CDP_ERR_INVALID, "%s: missing: the checkpoint is incomplete", path);
        else st = cdp_fail(CDP_ERR_INVALID, "%s: not valid JSON (line %d: %s)", path, jerr.line, jerr.text);
        goto fail;
    }
    const struct cdp_json_in in = {.file = path};
    static const char *const optimizers[] = {"adamw", "sgd", NULL};
    int64_t x = 0;
    int which = 0;
    char p[CDP_JSON_PTR_CAP], fp[CDP_JSON_PTR_CAP];
#define CHECK(call)                                 \
    do {                                            \
        if ((st = (call))) goto fail;               \
    } while (0)
    if (!json_is_object(root)) CHECK(cdp_json_expected(&in, "(top)", "a JSON object", root));
    static const char *const keys[] = {"format", "version", "step", "samples_seen", "seed",
                                       "optimizer", "files", "tensors", "plan", NULL};
    for (int i = 0; keys[i]; i++) {
        cdp_json_ptr_key(p, "", keys[i]);
        if (!json_object_get(root, keys[i])) CHECK(cdp_json_fail(&in, p, "missing"));
    }
    json_t *v = json_object_get(root, "format");
    if (!json_is_string(v) || strcmp(json_string_value(v), "cdphybrid-checkpoint"))
        CHECK(cdp_json_expected(&in, "/format", "\"cdphybrid-checkpoint\"", v));
    v = json_object_get(root, "version");
    CHECK(cdp_json_int(&in, v, "/version", 1, INT64_MAX, 0, NULL, &x));
    if (x > MANIFEST_VERSION)
        CHECK(cdp_json_fail(&in, "/version", "%lld is newer than this cdphybrid reads (%d)", (long long)x,
                            MANIFEST_VERSION));
    v = json_object_get(root, "manifest_sha256");
    if (x >= 2) {
        char have[65];
        if (!json_is_string(v) || !is_hex64(json_string_value(v)))
            CHECK(cdp_json_expected(&in, "/manifest_sha256", "64 lowercase hex digits", v));
        if (ckpt_manifest_sum(root, have)) CHECK(cdp_fail(CDP_ERR_NOMEM, "out of memory"));
        if (strcmp(have, json_string_value(v)))
            CHECK(cdp_json_fail(&in, "/manifest_sha256", "%s does not match the manifest's contents (%s): it was "
                                "edited or is corrupt", json_string_value(v), have));
    } else {
        CDP_WARN(CKPT, "%s: version 1 has no checksum of its own: its step and position are not verified", path);
    }
    CHECK(cdp_json_int(&in, json_object_get(root, "step"), "/step", 0, INT64_MAX, 0, NULL, &x));
    CHECK(cdp_json_int(&in, json_object_get(root, "samples_seen"), "/samples_seen", 0, INT64_MAX, 0, NULL, &x));
    CHECK(cdp_json_int(&in, json_object_get(root, "seed"), "/seed", INT64_MIN, INT64_MAX, 0, "an integer", &x));
    CHECK(cdp_json_enum(&in, json_object_get(root, "optimizer"), "/optimizer", optimizers, &which));
    v = json_object_get(root, "plan");
    if (!json_is_object(v) && !json_is_null(v)) CHECK(cdp_json_expected(&in, "/plan", "an object or null", v));
    json_t *files = json_object_get(root, "files");
    if (!json_is_array(files)) CHECK(cdp_json_expected(&in, "/files", "an array", files));
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        cdp_json_ptr_index(fp, "/files", i);
        if (!json_is_object(f)) CHECK(cdp_json_expected(&in, fp, "an object", f));
        json_t *name = json_object_get(f, "name"), *sha = json_object_get(f, "sha256");
        cdp_json_ptr_key(p, fp, "name");
        if (!json_is_string(name) || !ckpt_valid_part_name(json_string_value(name)))
            CHECK(cdp_json_expected(&in, p, "a file name", name));
        cdp_json_ptr_key(p, fp, "bytes");
        CHECK(cdp_json_int(&in, json_object_get(f, "bytes"), p, 0, INT64_MAX, 0, NULL, &x));
        cdp_json_ptr_key(p, fp, "sha256");
        if (!json_is_string(sha) || !is_hex64(json_string_value(sha)))
            CHECK(cdp_json_expected(&in, p, "64 lowercase hex digits", sha));
    }
    json_t *tensors = json_object_get(root, "tensors");
    if (!json_is_object(tensors)) CHECK(cdp_json_expected(&in, "/tensors", "an object", tensors));
    const char *key;
    json_object_foreach(tensors, key, v) {
        int listed = 0;
        if (json_is_string(v)) {
            json_array_foreach(files, i, f) {
                if (!strcmp(json_string_value(json_object_get(f, "name")), json_string_value(v))) listed = 1;
            }
        }
        cdp_json_ptr_key(p, "/tensors", key);
        if (!listed) CHECK(cdp_json_expected(&in, p, "the name of a file in /files", v));
    }
#undef CHECK
    free(path);
    *root_out = root;
    return CDP_OK;
fail:
    json_decref(root);
    free(path);
    return st;
}

/* Every file of the manifest has its size and checksum. */
cdp_status ckpt_verify_files(const char *folder, json_t *root)
{
    json_t *files = json_object_get(root, "files"), *f;
    size_t i;
    json_array_foreach(files, i, f) {
        const char *name = json_string_value(json_object_get(f, "name"));
        const char *want = json_string_value(json_object_get(f, "sha256"));
        long long bytes = (long long)json_integer_value(json_object_get(f, "bytes"));
        char *path = cdp_path_join(folder, name);
        if (!path) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
        struct stat sb;
        if (stat(path, &sb) != 0) {
            cdp_status st = errno == ENOENT
                                ? cdp_fail(CDP_ERR_INVALID, "%s is missing (the manifest lists it)", path)
                                : cdp_fail(CDP_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
            free(path);
            return st;
        }
        if ((long long)sb.st_size != bytes) {
            cdp_status st = cdp_fail(CDP_ERR_INVALID, "%s: %s: %lld bytes, the manifest says %lld", path,
                                     (long long)sb.st_size < bytes ? "truncated" : "size mismatch",
                                     (long long)sb.st_size, bytes);
            free(path);
            return st;
        }
        char have[65];
        cdp_status st = cdp_sha256_file(path, have);
        if (!st && strcmp(have, want))
            st = cdp_fail(CDP_ERR_INVALID, "%s: checksum mismatch (manifest says %s, file has %s)", path, want, have);
        free(path);
        if (st) return st;
    }
    return CDP_OK;
}

