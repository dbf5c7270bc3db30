/* CPU sets in the Linux list form ("0-23,48-71") and hwloc's bitmap form:
 * parsing, formatting and conversion, for topology files and rank binding. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"

#define CDP_MAX_CPUS 65536

/* Appends "lo" or "lo-hi"; a range that does not fit is left out whole (the
 * list stays well formed, only shorter), and the DEBUG log says so. */
static void list_append(char *out, size_t cap, size_t *len, int lo, int hi)
{
    char item[32];
    int n;
    if (lo == hi) n = snprintf(item, sizeof item, "%s%d", *len ? "," : "", lo);
    else n = snprintf(item, sizeof item, "%s%d-%d", *len ? "," : "", lo, hi);
    if (n <= 0 || *len + (size_t)n >= cap) {
        CDP_DEBUG(TOPO, "CPU list longer than %zu characters: CPUs %d-%d left out", cap - 1, lo, hi);
        return;
    }
    memcpy(out + *len, item, (size_t)n + 1);
    *len += (size_t)n;
}

cdp_status cdp_cpuset_from_mask(const char *mask, char *out, size_t cap)
{
    /* Words of 32 bits, most significant first, separated by commas; empty = 0. */
    size_t nwords = 1;
    for (const char *p = mask; *p; p++) nwords += *p == ',';
    uint32_t *w = calloc(nwords, sizeof *w);
    if (!w) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    const char *p = mask;
    for (size_t i = 0; i < nwords; i++) {
        while (*p == ' ') p++;
        if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) p += 2;
        uint64_t v = 0;
        int digits = 0;
        while (isxdigit((unsigned char)*p)) {
            v = v * 16 + (uint64_t)(isdigit((unsigned char)*p) ? *p - '0' : (tolower((unsigned char)*p) - 'a' + 10));
            if (v > 0xffffffffull) break;
            p++;
            digits++;
        }
        if (v > 0xffffffffull || (*p && *p != ',')) {
            free(w);
            return cdp_fail(CDP_ERR_INVALID, "CPU mask \"%.40s\": expected comma-separated 32-bit hex words", mask);
        }
        (void)digits;
        w[nwords - 1 - i] = (uint32_t)v;
        if (*p == ',') p++;
    }
    size_t len = 0;
    out[0] = '\0';
    int lo = -1;
    int total = (int)(nwords * 32 < CDP_MAX_CPUS ? nwords * 32 : CDP_MAX_CPUS);
    for (int b = 0; b <= total; b++) {
        int set = b < total && ((w[b / 32] >> (b % 32)) & 1u);
        if (set && lo < 0) lo = b;
        if (!set && lo >= 0) {
            list_append(out, cap, &len, lo, b - 1);
            lo = -1;
        }
    }
    free(w);
    return CDP_OK;
}

cdp_status cdp_cpuset_parse_list(const char *list, int **cpus, int *n)
{
    int cap = 64, k = 0;
    int *v = malloc((size_t)cap * sizeof *v);
    if (!v) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    const char *p = list;
    while (*p) {
        char *end;
        long lo = strtol(p, &end, 10), hi;
        if (end == p || lo < 0 || lo >= CDP_MAX_CPUS) goto bad;
        p = end;
        hi = lo;
        if (*p == '-') {
            hi = strtol(p + 1, &end, 10);
            if (end == p + 1 || hi < lo || hi >= CDP_MAX_CPUS) goto bad;
            p = end;
        }
        for (long c = lo; c <= hi; c++) {
            if (k == cap) {
                int *q = realloc(v, (size_t)(cap *= 2) * sizeof *v);
                if (!q) {
                    free(v);
                    return cdp_fail(CDP_ERR_NOMEM, "out of memory");
                }
                v = q;
            }
            v[k++] = (int)c;
        }
        if (*p == ',') p++;
        else if (*p) goto bad;
    }
    *cpus = v;
    *n = k;
    return CDP_OK;
bad:
    free(v);
    return cdp_fail(CDP_ERR_INVALID, "CPU list \"%.60s\": expected numbers and ranges like \"0-23,48-71\"", list);
}

cdp_status cdp_cpuset_to_mask(const char *list, char **mask)
{
    int *cpus = NULL, n = 0, max = -1;
    cdp_status st = cdp_cpuset_parse_list(list, &cpus, &n);
    if (st) return st;
    for (int i = 0; i < n; i++)
        if (cpus[i] > max) max = cpus[i];
    int nwords = max < 0 ? 1 : max / 32 + 1;
    uint32_t *w = calloc((size_t)nwords, sizeof *w);
    char *s = malloc((size_t)nwords * 12 + 1);
    if (!w || !s) {
        free(w);
        free(s);
        free(cpus);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) w[cpus[i] / 32] |= 1u << (cpus[i] % 32);
    size_t len = 0;
    for (int i = nwords - 1; i >= 0; i--)
        len += (size_t)sprintf(s + len, "%s0x%08x", i == nwords - 1 ? "" : ",", w[i]);
    free(w);
    free(cpus);
    *mask = s;
    return CDP_OK;
}


cdp_status cdp_cpuset_format(const int *cpus, int n, char *out, size_t cap)
{
    size_t len = 0;
    if (cap) out[0] = '\0';
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && cpus[j + 1] == cpus[j] + 1) j++;
        const size_t before = len;
        list_append(out, cap, &len, cpus[i], cpus[j]);
        if (len == before) return cdp_fail(CDP_ERR_INVALID, "a CPU list of %d CPUs is longer than %zu characters", n,
                                           cap ? cap - 1 : 0);
        i = j + 1;
    }
    return CDP_OK;
}
