/* Balanced contiguous partitions by dynamic programming. */
#include "partitioner/partition.h"

#include <stdlib.h>

cdp_status cdp_partition_balanced(const double *cost, int n, int k, int64_t (*ranges)[2])
{
    if (k < 1 || k > n)
        return cdp_fail(CDP_ERR_INVALID, "cannot split %d units into %d non-empty stages", n, k);
    double *prefix = malloc((size_t)(n + 1) * sizeof *prefix);
    double *best = malloc((size_t)(k + 1) * (size_t)(n + 1) * sizeof *best);
    int *cut = malloc((size_t)(k + 1) * (size_t)(n + 1) * sizeof *cut);
    if (!prefix || !best || !cut) {
        free(prefix);
        free(best);
        free(cut);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory partitioning %d units", n);
    }
    prefix[0] = 0;
    for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + cost[i];
#define B(j, i) best[(size_t)(j) * (size_t)(n + 1) + (size_t)(i)]
#define CUT(j, i) cut[(size_t)(j) * (size_t)(n + 1) + (size_t)(i)]
    /* B(j, i): the best largest cost of splitting the first i units into j ranges */
    for (int i = 1; i <= n; i++) {
        B(1, i) = prefix[i];
        CUT(1, i) = 0;
    }
    for (int j = 2; j <= k; j++) {
        for (int i = j; i <= n; i++) {
            double b = -1;
            int bc = j - 1;
            for (int c = j - 1; c < i; c++) {
                double last = prefix[i] - prefix[c];
                double v = B(j - 1, c) > last ? B(j - 1, c) : last;
                if (b < 0 || v < b) {
                    b = v;
                    bc = c;
                }
            }
            B(j, i) = b;
            CUT(j, i) = bc;
        }
    }
    int end = n;
    for (int j = k; j >= 1; j--) {
        int c = CUT(j, end);
        ranges[j - 1][0] = c;
        ranges[j - 1][1] = end;
        end = c;
    }
#undef B
#undef CUT
    free(prefix);
    free(best);
    free(cut);
    return CDP_OK;
}
