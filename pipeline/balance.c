/* Load balance across replicas (balance.h). */
#include "pipeline/balance.h"

#include <math.h>

double cdp_balance_step_time(const double *t, int R, int p, const int64_t *shares)
{
    double worst = 0;
    for (int r = 0; r < R; r++) {
        double x = (double)(shares[r] + p - 1) * t[r];
        if (x > worst) worst = x;
    }
    return worst;
}

cdp_status cdp_balance_shares(const double *t, int R, int p, int64_t total, int64_t unit, int64_t cap,
                              int64_t *shares)
{
    if (R < 1 || p < 1 || unit < 1)
        return cdp_fail(CDP_ERR_INVALID, "balance: %d replicas, %d stages, unit %lld", R, p, (long long)unit);
    if (total % unit || total < (int64_t)R * unit)
        return cdp_fail(CDP_ERR_INVALID, "balance: %lld micro-batches cannot give %d replicas at least %lld each "
                        "in multiples of %lld", (long long)total, R, (long long)unit, (long long)unit);
    if (cap > 0 && total > (int64_t)R * cap)
        return cdp_fail(CDP_ERR_INVALID, "balance: %lld micro-batches exceed %d replicas x %lld", (long long)total,
                        R, (long long)cap);
    for (int r = 0; r < R; r++) {
        if (!(t[r] > 0) || !isfinite(t[r]))
            return cdp_fail(CDP_ERR_INVALID, "balance: replica %d has time %g per micro-batch", r, t[r]);
        shares[r] = unit;
    }
    for (int64_t left = total - (int64_t)R * unit; left > 0; left -= unit) {
        int best = -1;
        double best_t = 0;
        for (int r = 0; r < R; r++) {
            if (cap > 0 && shares[r] + unit > cap) continue;
            double x = (double)(shares[r] + unit + p - 1) * t[r];
            if (best < 0 || x < best_t) {
                best = r;
                best_t = x;
            }
        }
        shares[best] += unit;
    }
    return CDP_OK;
}
