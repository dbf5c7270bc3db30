/* The JSON checks every file format shares (json_check.h). */
#include "core/json_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"

/* The shortest %g form of x that reads back as x, with ".0" when it has
 * neither a point nor an exponent (so 4.0 shows as 4.0, not 4). */
static void real_text(double x, char *buf, size_t cap)
{
    if (!isfinite(x)) {
        snprintf(buf, cap, "%g", x);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    if (!strpbrk(buf, ".eEn")) {
        size_t n = strlen(buf);
        if (n + 2 < cap) memcpy(buf + n, ".0", 3);
    }
}

const char *cdp_json_got(const json_t *v, char *buf, size_t cap)
{
    if (!v) {
        snprintf(buf, cap, "nothing");
        return buf;
    }
    if (json_is_real(v)) {
        real_text(json_real_value(v), buf, cap);
        return buf;
    }
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s) {
        snprintf(buf, cap, "a value that cannot be shown");
        return buf;
    }
    size_t n = strlen(s);
    if (n < cap) {
        memcpy(buf, s, n + 1);
    } else {
        memcpy(buf, s, cap - 4);
        memcpy(buf + cap - 4, "...", 4);
    }
    free(s);
    return buf;
}

cdp_status cdp_json_fail(const struct cdp_json_in *in, const char *ptr, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cdp_fail(CDP_ERR_INVALID, "%s: %s: %s", in->file, ptr, msg);
}

cdp_status cdp_json_context(const struct cdp_json_in *in, const char *ptr)
{
    return cdp_error_context(CDP_ERR_INVALID, "%s: %s", in->file, ptr);
}

cdp_status cdp_json_expected(const struct cdp_json_in *in, const char *ptr, const char *what, const json_t *got)
{
    char g[CDP_JSON_GOT_CAP];
    return cdp_json_fail(in, ptr, "expected %s, got %s", what, cdp_json_got(got, g, sizeof g));
}

void cdp_json_ptr_key(char *dst, const char *base, const char *key)
{
    size_t n = (size_t)snprintf(dst, CDP_JSON_PTR_CAP, "%s/", base);
    for (const char *k = key; *k && n + 3 < CDP_JSON_PTR_CAP; k++) {
        if (*k == '~' || *k == '/') {
            dst[n++] = '~';
            dst[n++] = *k == '~' ? '0' : '1';
        } else {
            dst[n++] = *k;
        }
    }
    if (n >= CDP_JSON_PTR_CAP) n = CDP_JSON_PTR_CAP - 1;
    dst[n] = '\0';
}

void cdp_json_ptr_index(char *dst, const char *base, size_t i)
{
    if (snprintf(dst, CDP_JSON_PTR_CAP, "%s/%zu", base, i) >= CDP_JSON_PTR_CAP) dst[CDP_JSON_PTR_CAP - 1] = '\0';
}

int cdp_json_word_index(const char *w, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (strcmp(w, list[i]) == 0) return i;
    return -1;
}

void cdp_json_list_words(char *buf, size_t cap, const char *const *list)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; list[i] && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s\"%s\"", i ? ", " : "", list[i]);
}

cdp_status cdp_json_check_keys(const struct cdp_json_in *in, const json_t *obj, const char *ptr,
                               const char *const *known, const char *what)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        if (cdp_json_word_index(key, known) >= 0) continue;
        char kp[CDP_JSON_PTR_CAP], words[512];
        cdp_json_ptr_key(kp, ptr, key);
        const char *s = cdp_closest_word(key, known);
        if (s) return cdp_json_fail(in, kp, "unknown key (did you mean \"%s\"?)", s);
        if (!what) return cdp_json_fail(in, kp, "unknown key");
        cdp_json_list_words(words, sizeof words, known);
        return cdp_json_fail(in, kp, "unknown key (%s takes %s)", what, words);
    }
    return CDP_OK;
}

cdp_status cdp_json_need_object(const struct cdp_json_in *in, const json_t *v, const char *ptr)
{
    if (v && !json_is_object(v)) return cdp_json_expected(in, ptr, "an object", v);
    return CDP_OK;
}

static const char *int_what(int64_t min, int allow_auto, char *buf, size_t cap)
{
    const char *base = min > 1 ? "an integer" : min == 1 ? "a positive integer" : "a non-negative integer";
    if (min > 1)
        snprintf(buf, cap, "an integer >= %lld%s", (long long)min, allow_auto ? " or \"auto\"" : "");
    else
        snprintf(buf, cap, "%s%s", base, allow_auto ? " or \"auto\"" : "");
    return buf;
}

cdp_status cdp_json_int(const struct cdp_json_in *in, const json_t *v, const char *ptr, int64_t min, int64_t max,
                        int allow_auto, const char *what, int64_t *out)
{
    char words[96];
    if (allow_auto && json_is_string(v) && strcmp(json_string_value(v), "auto") == 0) {
        *out = CDP_AUTO;
        return CDP_OK;
    }
    if (!what) what = int_what(min, allow_auto, words, sizeof words);
    if (!json_is_integer(v)) return cdp_json_expected(in, ptr, what, v);
    json_int_t x = json_integer_value(v);
    if (x < min) return cdp_json_expected(in, ptr, what, v);
    if (x > max) {
        char g[CDP_JSON_GOT_CAP];
        if (what != words) return cdp_json_expected(in, ptr, what, v);
        return cdp_json_fail(in, ptr, "expected %s no larger than %lld, got %s", what, (long long)max,
                             cdp_json_got(v, g, sizeof g));
    }
    *out = (int64_t)x;
    return CDP_OK;
}

cdp_status cdp_json_get_int(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                            int64_t min, int64_t max, int allow_auto, int64_t *out)
{
    const json_t *v = json_object_get(obj, key);
    char kp[CDP_JSON_PTR_CAP];
    if (!v) return CDP_OK;
    cdp_json_ptr_key(kp, ptr, key);
    return cdp_json_int(in, v, kp, min, max, allow_auto, NULL, out);
}

cdp_status cdp_json_get_bool(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                             int *out)
{
    const json_t *v = json_object_get(obj, key);
    char kp[CDP_JSON_PTR_CAP];
    if (!v) return CDP_OK;
    cdp_json_ptr_key(kp, ptr, key);
    if (!json_is_boolean(v)) return cdp_json_expected(in, kp, "true or false", v);
    *out = json_is_true(v);
    return CDP_OK;
}

cdp_status cdp_json_number(const struct cdp_json_in *in, const json_t *v, const char *ptr, enum cdp_json_range r,
                           double *out)
{
    static const char *const whats[] = {"a positive number", "a non-negative number", "a number in [0, 1)"};
    if (!json_is_number(v)) return cdp_json_expected(in, ptr, whats[r], v);
    double x = json_number_value(v);
    int ok = r == CDP_JSON_POSITIVE ? x > 0 : r == CDP_JSON_NONNEG ? x >= 0 : (x >= 0 && x < 1);
    if (!ok || !isfinite(x)) return cdp_json_expected(in, ptr, whats[r], v);
    *out = x == 0 ? 0.0 : x; /* -0.0 -> 0.0 */
    return CDP_OK;
}

cdp_status cdp_json_get_number(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                               enum cdp_json_range r, double *out)
{
    const json_t *v = json_object_get(obj, key);
    char kp[CDP_JSON_PTR_CAP];
    if (!v) return CDP_OK;
    cdp_json_ptr_key(kp, ptr, key);
    return cdp_json_number(in, v, kp, r, out);
}

cdp_status cdp_json_enum(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *const *names,
                         int *out)
{
    char words[512], g[CDP_JSON_GOT_CAP], what[600];
    cdp_json_list_words(words, sizeof words, names);
    snprintf(what, sizeof what, "one of %s", words);
    if (!json_is_string(v)) return cdp_json_expected(in, ptr, what, v);
    int i = cdp_json_word_index(json_string_value(v), names);
    if (i >= 0) {
        *out = i;
        return CDP_OK;
    }
    const char *s = cdp_closest_word(json_string_value(v), names);
    if (s)
        return cdp_json_fail(in, ptr, "expected %s, got %s (did you mean \"%s\"?)", what,
                             cdp_json_got(v, g, sizeof g), s);
    return cdp_json_expected(in, ptr, what, v);
}

cdp_status cdp_json_get_enum(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                             const char *const *names, int *out)
{
    const json_t *v = json_object_get(obj, key);
    char kp[CDP_JSON_PTR_CAP];
    if (!v) return CDP_OK;
    cdp_json_ptr_key(kp, ptr, key);
    return cdp_json_enum(in, v, kp, names, out);
}

cdp_status cdp_json_string(const struct cdp_json_in *in, const json_t *v, const char *ptr, char *out, size_t cap)
{
    if (!json_is_string(v)) return cdp_json_expected(in, ptr, "a string", v);
    if (json_string_length(v) >= cap) return cdp_json_fail(in, ptr, "longer than %zu characters", cap - 1);
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return CDP_OK;
}
