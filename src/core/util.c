/* Core utilities: assertions, monotonic time, byte sizes, near-miss words. */
#include "cdp/core.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

void cdp_assert_fail(const char *cond, const char *file, int line)
{
    fprintf(stderr, "cdphybrid: assertion failed at %s:%d: %s\n", file, line, cond);
    fflush(stderr);
    abort();
}

uint64_t cdp_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const struct {
    const char *name;
    uint64_t mult;
} cdp_size_units[] = {
    {"b", 1},
    {"kb", 1000ull},
    {"mb", 1000ull * 1000},
    {"gb", 1000ull * 1000 * 1000},
    {"tb", 1000ull * 1000 * 1000 * 1000},
    {"kib", 1ull << 10},
    {"mib", 1ull << 20},
    {"gib", 1ull << 30},
    {"tib", 1ull << 40},
};

cdp_status cdp_parse_size(const char *s, uint64_t *out)
{
    const char *p = s;
    uint64_t whole = 0;
    int digits = 0;
    if (!s) return cdp_fail(CDP_ERR_INVALID, "expected a size, got nothing");
    while (isdigit((unsigned char)*p)) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10)
            return cdp_fail(CDP_ERR_INVALID, "size \"%s\" is too large", s);
        whole = whole * 10 + d;
        p++;
        digits++;
    }
    /* The fraction is kept as an exact decimal: digits after the point over 10^k. */
    uint64_t frac = 0, frac_den = 1;
    int has_point = 0;
    if (*p == '.') {
        has_point = 1;
        p++;
        while (isdigit((unsigned char)*p)) {
            if (frac_den < 1000000000000ull) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                frac_den *= 10;
            }
            p++;
            digits++;
        }
    }
    if (digits == 0)
        return cdp_fail(CDP_ERR_INVALID,
                        "expected a size like 16GiB, 512MB or a number of bytes, got \"%s\"", s);
    while (*p == ' ') p++;
    uint64_t mult = 1;
    if (*p) {
        size_t i, n = sizeof cdp_size_units / sizeof cdp_size_units[0];
        for (i = 0; i < n; i++)
            if (strcasecmp(p, cdp_size_units[i].name) == 0) break;
        if (i == n)
            return cdp_fail(CDP_ERR_INVALID,
                            "unknown size unit in \"%s\" (expected B, KB, MB, GB, TB, KiB, MiB, "
                            "GiB or TiB)", s);
        mult = cdp_size_units[i].mult;
    } else if (has_point) {
        return cdp_fail(CDP_ERR_INVALID, "a fractional size needs a unit, got \"%s\"", s);
    }
    if (whole > UINT64_MAX / mult)
        return cdp_fail(CDP_ERR_INVALID, "size \"%s\" is too large", s);
    uint64_t v = whole * mult;
    if (frac) {
        /* mult <= 2^40 and frac < 10^12 keep this product under 2^80; split it. */
        long double extra = (long double)frac * (long double)mult / (long double)frac_den;
        if ((long double)(UINT64_MAX - v) < extra)
            return cdp_fail(CDP_ERR_INVALID, "size \"%s\" is too large", s);
        v += (uint64_t)extra;
    }
    *out = v;
    return CDP_OK;
}

char *cdp_format_bytes(uint64_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes == UINT64_MAX) { /* a saturated count (cdp_sat_add) */
        snprintf(buf, cap, "16 EiB or more");
        return buf;
    }
    if (bytes < 1024) {
        snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

/* What each backend is, in enum order: asked (cdp_backend_host_visible,
 * cdp_backend_is_gpu) wherever a rule depends on it, never compared by value. */
static const struct {
    const char *name;
    int host_visible; /* the host reads and writes device memory directly */
    int gpu;          /* devices are accelerators of a node, counted and opened by index */
} backends[] = {
    {"cpu", 1, 0},
    {"cuda", 0, 1},
};
CDP_TABLE_CHECK(backends, CDP_BACKEND_COUNT);

const char *cdp_backend_name(enum cdp_backend b)
{
    return (unsigned)b < CDP_BACKEND_COUNT ? backends[b].name : "?";
}

int cdp_backend_host_visible(enum cdp_backend b) { return (unsigned)b < CDP_BACKEND_COUNT && backends[b].host_visible; }

int cdp_backend_is_gpu(enum cdp_backend b) { return (unsigned)b < CDP_BACKEND_COUNT && backends[b].gpu; }

/* Optimal string alignment distance: insertions, deletions, substitutions and
 * swaps of neighbours ("setps" -> "steps") each cost 1; case is ignored. */
int cdp_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return (int)(la > lb ? la : lb);
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            int best = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[la][lb];
}

const char *cdp_closest_word(const char *word, const char *const *candidates)
{
    const char *best = NULL;
    int best_d = 1 << 30;
    size_t lw = strlen(word);
    for (const char *const *c = candidates; *c; c++) {
        int d = cdp_edit_distance(word, *c);
        if (d < best_d) {
            best_d = d;
            best = *c;
        }
    }
    if (!best) return NULL;
    size_t lb = strlen(best);
    int limit = (int)((lw > lb ? lw : lb) / 3);
    if (limit < 1) limit = 1;
    if (limit > 3) limit = 3;
    if (best_d <= limit) return best;
    /* Substring matches: "batch" -> "micro_batch" is less likely than a typo; only
     * suggest when the word is a long enough piece of exactly one candidate. */
    const char *sub = NULL;
    if (lw >= 4) {
        for (const char *const *c = candidates; *c; c++) {
            if (strstr(*c, word)) {
                if (sub) return NULL;
                sub = *c;
            }
        }
    }
    return sub;
}

void cdp_shard(uint64_t n, int R, int r, uint64_t *off, uint64_t *len)
{
    const uint64_t q = R > 0 ? n / (uint64_t)R : 0, extra = R > 0 ? n % (uint64_t)R : 0, k = (uint64_t)r;
    *len = q + (k < extra ? 1 : 0);
    *off = k * q + (k < extra ? k : extra);
}

void cdp_shard_in_window(uint64_t n, int R, int r, uint64_t from, uint64_t count, uint64_t *at, uint64_t *len)
{
    uint64_t off, l;
    cdp_shard(n, R, r, &off, &l);
    const uint64_t lo = off > from ? off : from, hi = off + l < from + count ? off + l : from + count;
    *at = lo < hi ? lo - from : 0;
    *len = lo < hi ? hi - lo : 0;
}
