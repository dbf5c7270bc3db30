/* Leveled, per-subsystem logging to stderr, with a rank prefix for
 * multi-rank runs. */
#include "cdp/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cdp/core.h" /* CDP_TABLE_CHECK */

static enum cdp_log_level cdp_log_level_now = CDP_LOG_WARN;
static unsigned cdp_log_mask = (1u << CDP_SUBSYS_COUNT) - 1u;
static int cdp_log_rank = 0;
static int cdp_log_size = 1;

static const char *const cdp_subsys_names[] = {
    [CDP_SUBSYS_CORE] = "CORE",     [CDP_SUBSYS_PLAN] = "PLAN",
    [CDP_SUBSYS_DEVICE] = "DEVICE", [CDP_SUBSYS_TOPO] = "TOPO",
    [CDP_SUBSYS_PART] = "PART",     [CDP_SUBSYS_SCHED] = "SCHED",
    [CDP_SUBSYS_EXEC] = "EXEC",     [CDP_SUBSYS_COMM] = "COMM",
    [CDP_SUBSYS_KERNEL] = "KERNEL", [CDP_SUBSYS_DATA] = "DATA",
    [CDP_SUBSYS_CKPT] = "CKPT",     [CDP_SUBSYS_CLI] = "CLI",
};
CDP_TABLE_CHECK(cdp_subsys_names, CDP_SUBSYS_COUNT);

static const char *const cdp_level_names[] = {
    [CDP_LOG_ERROR] = "error",
    [CDP_LOG_WARN] = "warn",
    [CDP_LOG_INFO] = "info",
    [CDP_LOG_DEBUG] = "debug",
};
CDP_TABLE_CHECK(cdp_level_names, CDP_LOG_LEVEL_COUNT);

const char *cdp_log_subsys_name(enum cdp_log_subsys s)
{
    if ((unsigned)s >= CDP_SUBSYS_COUNT) return "?";
    return cdp_subsys_names[s];
}

cdp_status cdp_log_parse_level(const char *s, enum cdp_log_level *out)
{
    for (int i = 0; i < CDP_LOG_LEVEL_COUNT; i++) {
        if (strcasecmp(s, cdp_level_names[i]) == 0) {
            *out = (enum cdp_log_level)i;
            return CDP_OK;
        }
    }
    return cdp_fail(CDP_ERR_INVALID, "unknown log level \"%s\" (expected error, warn, info or debug)", s);
}

void cdp_log_set_level(enum cdp_log_level level) { cdp_log_level_now = level; }
enum cdp_log_level cdp_log_get_level(void) { return cdp_log_level_now; }

cdp_status cdp_log_set_subsystems(const char *list)
{
    if (!list || !*list || strcasecmp(list, "all") == 0) {
        cdp_log_mask = (1u << CDP_SUBSYS_COUNT) - 1u;
        return CDP_OK;
    }
    unsigned mask = 0;
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ",");
        int found = 0;
        for (int i = 0; i < CDP_SUBSYS_COUNT; i++) {
            if (strlen(cdp_subsys_names[i]) == n && strncasecmp(p, cdp_subsys_names[i], n) == 0) {
                mask |= 1u << i;
                found = 1;
            }
        }
        if (!found && n > 0)
            return cdp_fail(CDP_ERR_INVALID, "CDP_LOG_SUBSYS: unknown subsystem \"%.*s\" (expected a "
                            "comma-separated list of core, plan, device, topo, part, sched, exec, "
                            "comm, kernel, data, ckpt, cli)", (int)n, p);
        p += n;
        if (*p == ',') p++;
    }
    cdp_log_mask = mask;
    return CDP_OK;
}

cdp_status cdp_log_init_from_env(void)
{
    const char *lv = getenv("CDP_LOG");
    const char *ss = getenv("CDP_LOG_SUBSYS");
    enum cdp_log_level level = cdp_log_level_now;
    if (lv && *lv && cdp_log_parse_level(lv, &level))
        return cdp_error_context(CDP_ERR_INVALID, "CDP_LOG");
    cdp_status st = cdp_log_set_subsystems(ss);
    if (st) return st;
    cdp_log_level_now = level;
    return CDP_OK;
}

void cdp_log_set_rank(int rank, int size)
{
    cdp_log_rank = rank;
    cdp_log_size = size;
}

int cdp_log_enabled(enum cdp_log_level level, enum cdp_log_subsys s)
{
    if (level > cdp_log_level_now) return 0;
    if (level == CDP_LOG_ERROR) return 1;
    return (unsigned)s < CDP_SUBSYS_COUNT && (cdp_log_mask & (1u << s));
}

void cdp_log_write(enum cdp_log_level level, enum cdp_log_subsys s, const char *fmt, ...)
{
    static const char *const tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    CDP_TABLE_CHECK(tags, CDP_LOG_LEVEL_COUNT);
    char line[2048];
    int n = 0;
    if (cdp_log_size > 1)
        n = snprintf(line, sizeof line, "[rank %d/%d] ", cdp_log_rank, cdp_log_size);
    n += snprintf(line + n, sizeof line - (size_t)n, "%s %s: ",
                  tags[(unsigned)level < CDP_LOG_LEVEL_COUNT ? level : CDP_LOG_DEBUG],
                  cdp_log_subsys_name(s));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One fputs per line keeps lines from concurrent ranks whole. */
    size_t len = strlen(line);
    if (len + 1 < sizeof line) {
        line[len] = '\n';
        line[len + 1] = '\0';
    } else {
        line[sizeof line - 2] = '\n';
    }
    fputs(line, stderr);
}
