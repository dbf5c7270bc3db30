/* Checking JSON read with jansson, for every file format of cdphybrid (plans,
 * topologies, cost tables, checkpoint manifests): each bad value fails with
 * CDP_ERR_INVALID and "FILE: /json/pointer: expected WHAT, got VALUE", the
 * value as written (shortened when long). One toolkit, so every format says
 * the same things the same way. Getters of a member leave *out as it is when
 * the member is absent. */
#ifndef CDP_CORE_JSON_CHECK_H
#define CDP_CORE_JSON_CHECK_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "cdp/plan_types.h" /* CDP_AUTO */
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDP_JSON_PTR_CAP 256 /* a JSON pointer's buffer */
#define CDP_JSON_GOT_CAP 128 /* a value as shown in a message */

/* What a message names: the file (as the user named it). */
struct cdp_json_in {
    const char *file;
};

/* The value as written in JSON ("nothing" for NULL), shortened to cap with
 * "..."; a real number in its shortest form that reads back the same, with
 * ".0" when it would look like an integer. Returns buf. */
const char *cdp_json_got(const json_t *v, char *buf, size_t cap);

/* CDP_ERR_INVALID with "FILE: PTR: message". */
cdp_status cdp_json_fail(const struct cdp_json_in *in, const char *ptr, const char *fmt, ...) CDP_PRINTF(3, 4);
/* CDP_ERR_INVALID with "FILE: PTR: " before the message a callee set (a size,
 * rate or CPU list that did not parse). */
cdp_status cdp_json_context(const struct cdp_json_in *in, const char *ptr);
/* CDP_ERR_INVALID with "FILE: PTR: expected WHAT, got VALUE". */
cdp_status cdp_json_expected(const struct cdp_json_in *in, const char *ptr, const char *what, const json_t *got);

/* JSON pointers (RFC 6901: "~" -> "~0", "/" -> "~1"), into dst of
 * CDP_JSON_PTR_CAP bytes: base + "/" + key, base + "/" + i. */
void cdp_json_ptr_key(char *dst, const char *base, const char *key);
void cdp_json_ptr_index(char *dst, const char *base, size_t i);

/* Index of w in a NULL-terminated list, or -1. */
int cdp_json_word_index(const char *w, const char *const *list);
/* "\"a\", \"b\", \"c\"" into buf. */
void cdp_json_list_words(char *buf, size_t cap, const char *const *list);

/* Every key of obj is one of known (NULL-terminated); else "unknown key (did
 * you mean ...?)", or, with no close word, "unknown key (WHAT takes "a",
 * "b")" where what is given, plain "unknown key" where it is NULL. */
cdp_status cdp_json_check_keys(const struct cdp_json_in *in, const json_t *obj, const char *ptr,
                               const char *const *known, const char *what);

/* v is an object, or absent (NULL). */
cdp_status cdp_json_need_object(const struct cdp_json_in *in, const json_t *v, const char *ptr);

/* An integer in [min, max] (or "auto" -> CDP_AUTO where allow_auto). The
 * expectation is named by what, or when what is NULL from min: "a positive
 * integer", "a non-negative integer", "an integer >= N"; past max, "expected
 * ... no larger than MAX". */
cdp_status cdp_json_int(const struct cdp_json_in *in, const json_t *v, const char *ptr, int64_t min, int64_t max,
                        int allow_auto, const char *what, int64_t *out);
cdp_status cdp_json_get_int(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                            int64_t min, int64_t max, int allow_auto, int64_t *out);

cdp_status cdp_json_get_bool(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                             int *out);

/* What a number may be. */
enum cdp_json_range {
    CDP_JSON_POSITIVE, /* > 0 */
    CDP_JSON_NONNEG,   /* >= 0 */
    CDP_JSON_UNIT      /* [0, 1) */
};
/* A finite number in the range; -0.0 reads as 0.0. */
cdp_status cdp_json_number(const struct cdp_json_in *in, const json_t *v, const char *ptr, enum cdp_json_range r,
                           double *out);
cdp_status cdp_json_get_number(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                               enum cdp_json_range r, double *out);

/* One of names (NULL-terminated): *out is its index; a near miss says "did
 * you mean". */
cdp_status cdp_json_enum(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *const *names,
                         int *out);
cdp_status cdp_json_get_enum(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                             const char *const *names, int *out);

/* A string shorter than cap, copied into out. */
cdp_status cdp_json_string(const struct cdp_json_in *in, const json_t *v, const char *ptr, char *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
