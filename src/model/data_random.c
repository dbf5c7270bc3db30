/* Data sources (data.h): counter-based random numbers (xoshiro256** keyed
 * by a hash of seed, domain and indices; no global state) and a seeded
 * permutation of [0, count), so a sample depends only on its index. */
#include "model/data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/hash.h"
#include "model/data_internal.h"

/* ---- counter-based random numbers -------------------------------------------
 * Every stream is keyed by a hash of (seed, domain, a, b); no global state. */

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t data_hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    uint64_t h = mix64(a ^ 0x6364706879627264ull);
    h = mix64(h ^ b);
    h = mix64(h ^ c);
    return mix64(h ^ d);
}

void data_rng_seed(struct rng *r, uint64_t key)
{
    uint64_t x = key;
    for (int i = 0; i < 4; i++) r->s[i] = cdp_splitmix64(&x);
    r->have_spare = 0;
    r->spare = 0.0;
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1). */
double data_rng_uniform(struct rng *r) { return (double)(rng_next(r) >> 11) * 0x1p-53; }

/* Uniform in [0, n), n > 0, without modulo bias. */
uint64_t data_rng_below(struct rng *r, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = rng_next(r);
    while (x >= limit);
    return x % n;
}

double data_rng_normal(struct rng *r)
{
    if (r->have_spare) {
        r->have_spare = 0;
        return r->spare;
    }
    double u1 = 1.0 - data_rng_uniform(r); /* (0, 1]: log stays finite */
    double u2 = data_rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
    r->spare = rad * sin(th);
    r->have_spare = 1;
    return rad * cos(th);
}

/* ---- a seeded permutation of [0, count): Feistel network + cycle walking ----- */

void data_perm_init(struct perm *p, uint64_t count, uint64_t key)
{
    int bits = 2;
    while (bits < 64 && (1ull << bits) < count) bits++;
    if (bits & 1) bits++;
    p->count = count;
    p->half = bits / 2;
    p->mask = (1ull << p->half) - 1;
    for (int i = 0; i < 4; i++) p->keys[i] = mix64(key + (uint64_t)i * 0x632be59bd9b4e019ull);
}

uint64_t data_perm_apply(const struct perm *p, uint64_t x)
{
    do {
        uint64_t L = x >> p->half, R = x & p->mask;
        for (int i = 0; i < 4; i++) {
            uint64_t f = mix64(R ^ p->keys[i]) & p->mask;
            uint64_t nl = R;
            R = L ^ f;
            L = nl;
        }
        x = (L << p->half) | R;
    } while (x >= p->count); /* the walk ends: the cycle through x holds a value < count */
    return x;
}

