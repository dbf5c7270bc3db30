/* Small core utilities shared by every layer: assertions, monotonic time,
 * byte sizes ("16GiB") and their human-readable form. */
#ifndef CDP_CORE_H
#define CDP_CORE_H

#include "cdp/api.h"

#include <stddef.h>
#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backends a device (and a plan's /cluster/backend) is of. */
enum cdp_backend { CDP_BACKEND_CPU = 0, CDP_BACKEND_CUDA, CDP_BACKEND_COUNT };

/* "cpu" / "cuda"; "?" out of range. */
CDP_API const char *cdp_backend_name(enum cdp_backend b);

/* What a backend is, for the rules that depend on it (ask these; do not
 * compare backends): its device memory is the host's (copies between ranks
 * need no staging, a device's bytes count against the node's memory), and its
 * devices are GPUs (counted per node, opened by index, shared by
 * /cluster/ranks_per_device, running bf16). */
CDP_API int cdp_backend_host_visible(enum cdp_backend b);
CDP_API int cdp_backend_is_gpu(enum cdp_backend b);

/* Byte counts that saturate: a sum or product too large for 64 bits is
 * UINT64_MAX, which no device holds, so a fit check refuses it (and
 * cdp_format_bytes writes it as "16 EiB or more"). Memory models use these
 * wherever a count of micro-batches or slots multiplies a size. */
static inline uint64_t cdp_sat_add(uint64_t a, uint64_t b)
{
    uint64_t x;
    return __builtin_add_overflow(a, b, &x) ? UINT64_MAX : x;
}
static inline uint64_t cdp_sat_mul(uint64_t a, uint64_t b)
{
    uint64_t x;
    return __builtin_mul_overflow(a, b, &x) ? UINT64_MAX : x;
}

/* Shard r of n elements split R ways, contiguous, the first n % R shards one
 * longer: [*off, *off + *len). The one home of that rule (ZeRO's optimizer
 * shards, the collectives that move them, the memory model). */
CDP_API void cdp_shard(uint64_t n, int R, int r, uint64_t *off, uint64_t *len);
/* Shard r's overlap with the window [from, from + count) of those n elements
 * (ZeRO-2 reduces one layer's window at a time): *at is where it starts in
 * the window (from's coordinates), *len its length, 0 (and *at 0) when they
 * do not meet. */
CDP_API void cdp_shard_in_window(uint64_t n, int R, int r, uint64_t from, uint64_t count, uint64_t *at, uint64_t *len);

/* A compile-time check that table t has n entries: every table indexed by
 * one of our enums is checked against the enum's _COUNT. */
#ifdef __cplusplus
#define CDP_TABLE_CHECK(t, n) static_assert(sizeof(t) / sizeof((t)[0]) == (n), #t ": one entry per enum value")
#else
#define CDP_TABLE_CHECK(t, n) _Static_assert(sizeof(t) / sizeof((t)[0]) == (n), #t ": one entry per enum value")
#endif

/* Aborts with file:line on a broken invariant (a programmer error, never bad input). */
#define CDP_ASSERT(cond)                                                             \
    do {                                                                             \
        if (!(cond)) cdp_assert_fail(#cond, __FILE__, __LINE__);                     \
    } while (0)

#if defined(__GNUC__)
__attribute__((noreturn))
#endif
CDP_API void cdp_assert_fail(const char *cond, const char *file, int line);

/* Monotonic clock in nanoseconds (CLOCK_MONOTONIC); only differences mean anything. */
CDP_API uint64_t cdp_time_ns(void);

/* Parses a byte size: a non-negative integer, optionally followed (spaces allowed)
 * by a unit B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of
 * 1024), case-insensitive; a decimal fraction is allowed with a unit ("1.5GiB").
 * Returns CDP_ERR_INVALID with a message on anything else or on overflow. */
CDP_API cdp_status cdp_parse_size(const char *s, uint64_t *out);

/* Writes a human-readable size ("1.50 GiB", "512 B") into buf. Returns buf. */
CDP_API char *cdp_format_bytes(uint64_t bytes, char *buf, size_t cap);

/* Levenshtein distance between two short strings (for "did you mean"). */
CDP_API int cdp_edit_distance(const char *a, const char *b);

/* Of the NULL-terminated candidates, the one closest to word if it is close
 * enough to be a likely typo, else NULL. */
CDP_API const char *cdp_closest_word(const char *word, const char *const *candidates);

/* CPU sets. Linux list form "0-23,48-71"; hwloc bitmap form
 * "0x00000303,0x03030000,,0x03030303" (NCCL writes it without 0x). */
/* The bitmap form to a list in out (cap bytes); CDP_ERR_INVALID on bad text. */
CDP_API cdp_status cdp_cpuset_from_mask(const char *mask, char *out, size_t cap);
/* A list to an array of CPU numbers in the order written (*cpus malloc'd); CDP_ERR_INVALID. */
CDP_API cdp_status cdp_cpuset_parse_list(const char *list, int **cpus, int *n);
/* A list to the bitmap form (*mask malloc'd). */
CDP_API cdp_status cdp_cpuset_to_mask(const char *list, char **mask);
/* n ascending CPU numbers to a list in out; CDP_ERR_INVALID when it does not fit in cap. */
CDP_API cdp_status cdp_cpuset_format(const int *cpus, int n, char *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
