/* Random inputs and zeroed buffers for the kernel suites (ops, grad): a
 * seeded xorshift generator, so every run draws the same values. */
#ifndef CDP_TEST_UTIL_H
#define CDP_TEST_UTIL_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t rng_state = 88172645463325252ull;

static inline void rng_seed(uint64_t s) { rng_state = s * 2654435761ull + 1; }

/* uniform in [0, 1) */
static inline double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* n floats uniform in [lo, hi); the caller frees */
static inline float *randv(size_t n, float lo, float hi)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    cr_assert(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand());
    return x;
}

static inline float *falloc(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof *x);
    cr_assert(x);
    return x;
}

static inline double *dalloc(size_t n)
{
    double *x = calloc(n ? n : 1, sizeof *x);
    cr_assert(x);
    return x;
}

#endif
