/* Shared by the benchmark programs: the median of a few timings. */
#ifndef CDP_BENCH_UTIL_H
#define CDP_BENCH_UTIL_H

#include <stdlib.h>

static int cdp_bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place and returns its median. */
static inline double cdp_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cdp_bench_cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
