/* Status codes and the thread-local error message that travels up with context.
 * Every fallible cdphybrid function returns a cdp_status and fills the message
 * where the error is first seen; callers add context on the way up. */
#ifndef CDP_STATUS_H
#define CDP_STATUS_H

#include "cdp/api.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CDP_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#else
#define CDP_PRINTF(fmt_idx, arg_idx)
#endif

typedef enum cdp_status {
    CDP_OK = 0,
    CDP_ERR_INVALID,     /* bad input: a plan, a file, an argument */
    CDP_ERR_NOMEM,       /* out of memory, or over a device's memory cap */
    CDP_ERR_IO,          /* a file could not be read or written */
    CDP_ERR_UNSUPPORTED, /* not built in, or not available on this machine */
    CDP_ERR_DEVICE,      /* a device backend (CUDA, ...) reported a failure */
    CDP_ERR_COMM,        /* a communicator reported a failure */
    CDP_ERR_INTERNAL,    /* a broken invariant that is not the caller's fault */
    CDP_STATUS_COUNT
} cdp_status;

/* Short name of a status ("invalid input", ...); never NULL. */
CDP_API const char *cdp_status_str(cdp_status st);

/* The message of the last error set on this thread ("" when none). The pointer
 * stays valid until the next cdp_fail / cdp_error_context on this thread. */
CDP_API const char *cdp_last_error(void);

/* Sets this thread's message (printf-style) and returns st, so a failure reads
 * `return cdp_fail(CDP_ERR_INVALID, "...", ...);`. To add context to the
 * message a callee set, use cdp_error_context, not cdp_fail with
 * cdp_last_error() as an argument (that is defined, but repeats by hand what
 * cdp_error_context does). */
CDP_API cdp_status cdp_fail(cdp_status st, const char *fmt, ...) CDP_PRINTF(2, 3);

/* Prefixes the current message with context ("plan.json: " + message) and
 * returns st unchanged, so a caller can write `return cdp_error_context(st, ...)`.
 * Both functions format into a buffer of their own first, so an argument may
 * point into the current message. */
CDP_API cdp_status cdp_error_context(cdp_status st, const char *fmt, ...) CDP_PRINTF(2, 3);

/* Clears this thread's message. */
CDP_API void cdp_clear_error(void);

#ifdef __cplusplus
}
#endif

#endif
