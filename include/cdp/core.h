/* Small core utilities shared by every layer: assertions, monotonic time,
 * byte sizes ("16GiB") and their human-readable form. */
#ifndef CDP_CORE_H
#define CDP_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Aborts with file:line on a broken invariant (a programmer error, never bad input). */
#define CDP_ASSERT(cond)                                                             \
    do {                                                                             \
        if (!(cond)) cdp_assert_fail(#cond, __FILE__, __LINE__);                     \
    } while (0)

#if defined(__GNUC__)
__attribute__((noreturn))
#endif
void cdp_assert_fail(const char *cond, const char *file, int line);

/* Monotonic clock in nanoseconds (CLOCK_MONOTONIC); only differences mean anything. */
uint64_t cdp_time_ns(void);

/* Parses a byte size: a non-negative integer, optionally followed (spaces allowed)
 * by a unit B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of
 * 1024), case-insensitive; a decimal fraction is allowed with a unit ("1.5GiB").
 * Returns CDP_ERR_INVALID with a message on anything else or on overflow. */
cdp_status cdp_parse_size(const char *s, uint64_t *out);

/* Writes a human-readable size ("1.50 GiB", "512 B") into buf. Returns buf. */
char *cdp_format_bytes(uint64_t bytes, char *buf, size_t cap);

/* Levenshtein distance between two short strings (for "did you mean"). */
int cdp_edit_distance(const char *a, const char *b);

/* Of the NULL-terminated candidates, the one closest to word if it is close
 * enough to be a likely typo, else NULL. */
const char *cdp_closest_word(const char *word, const char *const *candidates);

#ifdef __cplusplus
}
#endif

#endif
