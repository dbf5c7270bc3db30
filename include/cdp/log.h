/* Logging with levels, subsystems and a rank prefix. Configured from the
 * environment (CDP_LOG=error|warn|info|debug, CDP_LOG_SUBSYS=plan,device,...)
 * or by the program; the level is checked before anything is formatted. */
#ifndef CDP_LOG_H
#define CDP_LOG_H

#include "cdp/api.h"

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum cdp_log_level {
    CDP_LOG_ERROR = 0,
    CDP_LOG_WARN,
    CDP_LOG_INFO,
    CDP_LOG_DEBUG,
    CDP_LOG_LEVEL_COUNT
};

enum cdp_log_subsys {
    CDP_SUBSYS_CORE = 0,
    CDP_SUBSYS_PLAN,
    CDP_SUBSYS_DEVICE,
    CDP_SUBSYS_TOPO,
    CDP_SUBSYS_PART,
    CDP_SUBSYS_SCHED,
    CDP_SUBSYS_EXEC,
    CDP_SUBSYS_COMM,
    CDP_SUBSYS_KERNEL,
    CDP_SUBSYS_DATA,
    CDP_SUBSYS_CKPT,
    CDP_SUBSYS_CLI,
    CDP_SUBSYS_COUNT
};

/* Upper-case subsystem name ("PLAN"); "?" for an out-of-range value. */
CDP_API const char *cdp_log_subsys_name(enum cdp_log_subsys s);

/* Reads CDP_LOG and CDP_LOG_SUBSYS. An unknown value is reported through
 * cdp_last_error() and CDP_ERR_INVALID; the settings are then left unchanged. */
CDP_API cdp_status cdp_log_init_from_env(void);

/* Parses "error" / "warn" / "info" / "debug" (case-insensitive). */
CDP_API cdp_status cdp_log_parse_level(const char *s, enum cdp_log_level *out);

CDP_API void cdp_log_set_level(enum cdp_log_level level);
CDP_API enum cdp_log_level cdp_log_get_level(void);

/* Enables only the subsystems named in a comma-separated list ("comm,exec");
 * NULL or "" or "all" enables every subsystem. */
CDP_API cdp_status cdp_log_set_subsystems(const char *list);

/* Rank prefix for multi-rank runs: every line starts with "[rank R/N]" when
 * size > 1. */
CDP_API void cdp_log_set_rank(int rank, int size);

/* Nonzero when a message at this level and subsystem would be printed. */
CDP_API int cdp_log_enabled(enum cdp_log_level level, enum cdp_log_subsys s);

/* Prints one line to stderr (a newline is added). Prefer the macros below. */
CDP_API void cdp_log_write(enum cdp_log_level level, enum cdp_log_subsys s, const char *fmt, ...)
    CDP_PRINTF(3, 4);

#define CDP_LOG_AT(level, subsys, ...)                                               \
    do {                                                                             \
        if (cdp_log_enabled((level), CDP_SUBSYS_##subsys))                           \
            cdp_log_write((level), CDP_SUBSYS_##subsys, __VA_ARGS__);                \
    } while (0)
#define CDP_ERROR(subsys, ...) CDP_LOG_AT(CDP_LOG_ERROR, subsys, __VA_ARGS__)
#define CDP_WARN(subsys, ...) CDP_LOG_AT(CDP_LOG_WARN, subsys, __VA_ARGS__)
#define CDP_INFO(subsys, ...) CDP_LOG_AT(CDP_LOG_INFO, subsys, __VA_ARGS__)
#define CDP_DEBUG(subsys, ...) CDP_LOG_AT(CDP_LOG_DEBUG, subsys, __VA_ARGS__)

/* What the core lends code built as a separate module (the CUDA module's
 * device backend, kernels and NCCL table): its error and logging functions,
 * so messages from the module land in the caller's thread-local error buffer
 * and a process has one copy of the core. abi is the device ABI
 * (src/device/backend.h). */
struct cdp_module_host {
    int abi;
    cdp_status (*fail)(cdp_status st, const char *fmt, ...);
    void (*log)(int level, int subsys, const char *fmt, ...);
};

#ifdef __cplusplus
}
#endif

#endif
