/* Thread-local error messages: set where an error is first seen, prefixed with
 * context by each caller on the way up. */
#include "cdp/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cdp/core.h" /* CDP_TABLE_CHECK */

#define CDP_ERROR_CAP 4096

static _Thread_local char cdp_error_buf[CDP_ERROR_CAP];

static const char *const cdp_status_names[] = {
    [CDP_OK] = "ok",
    [CDP_ERR_INVALID] = "invalid input",
    [CDP_ERR_NOMEM] = "out of memory",
    [CDP_ERR_IO] = "i/o error",
    [CDP_ERR_UNSUPPORTED] = "unsupported",
    [CDP_ERR_DEVICE] = "device error",
    [CDP_ERR_COMM] = "communication error",
    [CDP_ERR_INTERNAL] = "internal error",
};
CDP_TABLE_CHECK(cdp_status_names, CDP_STATUS_COUNT);

const char *cdp_status_str(cdp_status st)
{
    if ((unsigned)st >= CDP_STATUS_COUNT) return "unknown status";
    return cdp_status_names[st];
}

const char *cdp_last_error(void) { return cdp_error_buf; }

void cdp_clear_error(void) { cdp_error_buf[0] = '\0'; }

/* Both format into a buffer of their own first and then copy: an argument may
 * be cdp_last_error() itself (the message so far), and vsnprintf from a
 * buffer into the same buffer is undefined behaviour. */
cdp_status cdp_fail(cdp_status st, const char *fmt, ...)
{
    char msg[CDP_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(cdp_error_buf, msg, strlen(msg) + 1);
    return st;
}

cdp_status cdp_error_context(cdp_status st, const char *fmt, ...)
{
    char old[CDP_ERROR_CAP], ctx[CDP_ERROR_CAP];
    va_list ap;
    memcpy(old, cdp_error_buf, sizeof old);
    if (!old[0]) snprintf(old, sizeof old, "%s", cdp_status_str(st));
    va_start(ap, fmt);
    int n = vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    size_t used = (size_t)n < sizeof ctx ? (size_t)n : sizeof ctx - 1;
    memcpy(cdp_error_buf, ctx, used);
    cdp_error_buf[used] = '\0';
    /* The message keeps its tail when context and message together overflow. */
    size_t room = sizeof cdp_error_buf - used;
    if (room > 2) {
        cdp_error_buf[used] = ':';
        cdp_error_buf[used + 1] = ' ';
        size_t k = strlen(old);
        if (k > room - 3) k = room - 3;
        memcpy(cdp_error_buf + used + 2, old, k);
        cdp_error_buf[used + 2 + k] = '\0';
    }
    return st;
}
