/* The MPI side of suite comm: one scenario per run, started by test_comm.c
 * under `mpirun -np N`. Every rank checks what it sees; on success each rank
 * prints "rank R/N: <scenario> ok", on a failed check it prints "FAIL ..."
 * and aborts the job with exit code 3.
 * usage: comm_probe world|split|allreduce|p2p|gather|barrier|timeout|errors|
 *                   bigmsg|allreduce_timeout|abort|kill|bcast|bcast_timeout|
 *                   nccl_refused|nccl_fake|nccl|nccl_timeout|zero|zero_timeout|
 *                   layout_mismatch|iallreduce|tensor_group
 * (nccl and nccl_timeout need one GPU per rank; nccl_fake loads the stand-in
 * CUDA module of tests/fake-cuda; the others run anywhere) */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/plan.h"
#include "cdp/tensor.h"
#include "cdp/planner.h"
#include "cdp/train.h"
#include "comm/comm.h"
#include "comm/nccl.h"
#include "fake-cuda/fake_stats.h"
#include "model/layers.h"
#include "pipeline/layout.h"
#include "pipeline/run/exec_internal.h"

static cdp_comm_t world;
static int R, N;

#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "FAIL rank %d/%d at %s:%d: %s: ", R, N, __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, "\n");                                                          \
            cdp_comm_abort(world, 3);                                                       \
        }                                                                                   \
    } while (0)
#define OK(call) CHECK((call) == CDP_OK, "%s", cdp_last_error())

static double now_s(void) { return (double)cdp_time_ns() * 1e-9; }

static void sleep_s(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    nanosleep(&ts, NULL);
}

/* periodic in i, period PATTERN_PERIOD (fill and first_bad below rely on it) */
static unsigned char pattern(int src, int tag, size_t i) { return (unsigned char)(src * 131 + tag * 17 + i * 7); }

/* The pattern repeats every 256 bytes (i * 7 mod 256), so a message is
 * filled and checked a block at a time with memcpy and memcmp: every byte is
 * still written and compared, in a fraction of a byte loop's time (the 2 GiB
 * message of bigmsg took most of suite comm's time, more under the sanitizers). */
#define PATTERN_PERIOD 256

static void fill(unsigned char *p, size_t n, int src, int tag)
{
    unsigned char block[PATTERN_PERIOD];
    for (size_t i = 0; i < PATTERN_PERIOD; i++) block[i] = pattern(src, tag, i);
    for (size_t at = 0; at < n; at += PATTERN_PERIOD)
        memcpy(p + at, block, n - at < PATTERN_PERIOD ? n - at : PATTERN_PERIOD);
}

static size_t first_bad(const unsigned char *p, size_t n, int src, int tag)
{
    unsigned char block[PATTERN_PERIOD];
    for (size_t i = 0; i < PATTERN_PERIOD; i++) block[i] = pattern(src, tag, i);
    for (size_t at = 0; at < n; at += PATTERN_PERIOD) {
        const size_t len = n - at < PATTERN_PERIOD ? n - at : PATTERN_PERIOD;
        if (memcmp(p + at, block, len))
            for (size_t i = at; i < at + len; i++)
                if (p[i] != pattern(src, tag, i)) return i;
    }
    return SIZE_MAX;
}

/* ---- scenarios ------------------------------------------------------------ */

static void scen_world(void)
{
    CHECK(!strcmp(cdp_comm_name(world), "mpi"), "name %s", cdp_comm_name(world));
    const char *env_rank = getenv("OMPI_COMM_WORLD_RANK"), *env_size = getenv("OMPI_COMM_WORLD_SIZE");
    CHECK(env_rank && atoi(env_rank) == R, "OMPI_COMM_WORLD_RANK %s", env_rank ? env_rank : "(unset)");
    CHECK(env_size && atoi(env_size) == N, "OMPI_COMM_WORLD_SIZE %s", env_size ? env_size : "(unset)");
    cdp_comm_t again = NULL;
    OK(cdp_comm_world(&again));
    CHECK(again == world, "a second cdp_comm_world gives the same world");
    cdp_comm_free(again);
    CHECK(cdp_comm_launched_by_mpi(), "launched");
}

/* The members of c, as world ranks in c's rank order, checked on every rank. */
static void check_members(cdp_comm_t c, const int *expect, int n, const char *what)
{
    CHECK(cdp_comm_size(c) == n, "%s: size %d, expected %d", what, cdp_comm_size(c), n);
    void *out = NULL;
    size_t *lens = NULL;
    int me = R;
    OK(cdp_comm_gather_bytes(c, &me, sizeof me, &out, &lens, 30));
    if (cdp_comm_rank(c) == 0) {
        for (int i = 0; i < n; i++) {
            CHECK(lens[i] == sizeof(int), "%s: length %zu", what, lens[i]);
            CHECK(((int *)out)[i] == expect[i], "%s: member %d is world rank %d, expected %d", what, i,
                  ((int *)out)[i], expect[i]);
        }
    } else {
        CHECK(!out && !lens, "%s: only rank 0 gets the data", what);
    }
    free(out);
    free(lens);
    /* and every rank agrees on the sum of the members */
    double sum = R, want = 0;
    for (int i = 0; i < n; i++) want += expect[i];
    OK(cdp_comm_allreduce_f64(c, &sum, 1, CDP_REDUCE_SUM, 30));
    CHECK(sum == want, "%s: sum of members %g, expected %g", what, sum, want);
}

static void scen_split(void)
{
    /* a grid of S stages x P replicas; world rank = replica * S + stage */
    int S = N % 2 == 0 ? 2 : 1, P = N / S;
    int stage = R % S, replica = R / S;
    cdp_comm_t dp = NULL, pp = NULL;
    OK(cdp_comm_split(world, stage, replica, &dp));
    OK(cdp_comm_split(world, replica, stage, &pp));
    CHECK(dp && pp, "members get a communicator");
    CHECK(cdp_comm_rank(dp) == replica, "data-parallel rank %d, expected %d", cdp_comm_rank(dp), replica);
    CHECK(cdp_comm_rank(pp) == stage, "pipeline rank %d, expected %d", cdp_comm_rank(pp), stage);
    int members[64];
    for (int r = 0; r < P; r++) members[r] = r * S + stage;
    check_members(dp, members, P, "stage group");
    for (int s = 0; s < S; s++) members[s] = replica * S + s;
    check_members(pp, members, S, "pipeline group");

    /* key orders the ranks: reversed */
    cdp_comm_t rev = NULL;
    OK(cdp_comm_split(world, 0, N - R, &rev));
    CHECK(cdp_comm_rank(rev) == N - 1 - R, "reversed rank %d", cdp_comm_rank(rev));
    for (int r = 0; r < N; r++) members[r] = N - 1 - r;
    check_members(rev, members, N, "reversed group");

    /* color < 0: not a member */
    cdp_comm_t some = (cdp_comm_t)&some;
    OK(cdp_comm_split(world, R == 0 ? -1 : 5, R, &some));
    if (R == 0) {
        CHECK(some == NULL, "color -1 gives NULL");
    } else {
        for (int r = 1; r < N; r++) members[r - 1] = r;
        check_members(some, members, N - 1, "group without rank 0");
    }
    cdp_comm_free(some);
    cdp_comm_free(rev);
    cdp_comm_free(pp);
    cdp_comm_free(dp);
}

static void scen_allreduce(void)
{
    static const size_t sizes[] = { 1, 7, 1000003 };
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        float *f = malloc(n * sizeof *f);
        double *d = malloc(n * sizeof *d);
        CHECK(f && d, "memory");
        for (int op = 0; op < CDP_REDUCE_OP_COUNT; op++) {
            for (size_t i = 0; i < n; i++) {
                f[i] = (float)(R + 1 + (int)(i % 7));
                d[i] = 0.25 * (R + 1) + (double)(i % 5);
            }
            OK(cdp_comm_allreduce_f32(world, f, n, (enum cdp_reduce_op)op, 60));
            OK(cdp_comm_allreduce_f64(world, d, n, (enum cdp_reduce_op)op, 60));
            for (size_t i = 0; i < n; i++) {
                /* closed forms: sum over r of (r + 1 + i%7) etc. */
                double fs = N * (N + 1) / 2.0 + N * (double)(i % 7);
                double ds = 0.25 * N * (N + 1) / 2.0 + N * (double)(i % 5);
                double fw = op == CDP_REDUCE_SUM ? fs : op == CDP_REDUCE_AVG ? fs / N : N + (double)(i % 7);
                double dw = op == CDP_REDUCE_SUM ? ds : op == CDP_REDUCE_AVG ? ds / N : 0.25 * N + (double)(i % 5);
                CHECK(fabs(f[i] - fw) <= 1e-6 * fabs(fw), "f32 op %d n %zu [%zu] = %.9g, expected %.9g", op, n, i,
                      (double)f[i], fw);
                CHECK(fabs(d[i] - dw) <= 1e-14 * fabs(dw), "f64 op %d n %zu [%zu] = %.17g, expected %.17g", op, n,
                      i, d[i], dw);
            }
        }
        free(f);
        free(d);
    }
    /* n == 0 is a no-op on every rank */
    OK(cdp_comm_allreduce_f32(world, NULL, 0, CDP_REDUCE_SUM, 10));
}

/* Ring: every rank sends to the right and receives from the left, with many
 * tags in flight, receives posted before and after the sends, and completed
 * in an order unrelated to the posting order. */
static void scen_p2p(void)
{
    enum { K = 8 };
    int right = (R + 1) % N, left = (R + N - 1) % N;
    size_t sizes[K];
    unsigned char *sbuf[K], *rbuf[K];
    cdp_request_t sreq[K], rreq[K];
    for (int t = 0; t < K; t++) {
        sizes[t] = t == 5 ? (1u << 20) + 3 : (size_t)t * 1000 + (t % 2 ? 0 : 1);
        sbuf[t] = malloc(sizes[t] + 1);
        rbuf[t] = malloc(sizes[t] + 1);
        fill(sbuf[t], sizes[t], R, t);
        memset(rbuf[t], 0xEE, sizes[t]);
    }
    /* tags 0..3: receive first; 4..7: send first (tag numbers spread out) */
    for (int t = 0; t < K / 2; t++) OK(cdp_comm_irecv(world, rbuf[t], sizes[t], left, 1000 * t, &rreq[t]));
    for (int t = K - 1; t >= 0; t--) OK(cdp_comm_isend(world, sbuf[t], sizes[t], right, 1000 * t, &sreq[t]));
    for (int t = K / 2; t < K; t++) OK(cdp_comm_irecv(world, rbuf[t], sizes[t], left, 1000 * t, &rreq[t]));
    /* complete out of order: odd receives by testing, then the rest by waiting in reverse */
    int pending = K / 2;
    double t0 = now_s();
    while (pending > 0 && now_s() - t0 < 30) {
        for (int t = 1; t < K; t += 2) {
            if (!rreq[t]) continue;
            int r = cdp_comm_test(rreq[t]);
            CHECK(r >= 0, "test: %s", cdp_last_error());
            if (r) rreq[t] = NULL, pending--;
        }
    }
    CHECK(pending == 0, "odd receives completed by cdp_comm_test");
    for (int t = K - 2; t >= 0; t -= 2) OK(cdp_comm_wait(rreq[t], 30));
    for (int t = 0; t < K; t++) OK(cdp_comm_wait(sreq[t], 30));
    for (int t = 0; t < K; t++) {
        size_t bad = first_bad(rbuf[t], sizes[t], left, t);
        CHECK(bad == SIZE_MAX, "tag %d: byte %zu of %zu differs", 1000 * t, bad, sizes[t]);
        free(sbuf[t]);
        free(rbuf[t]);
    }

    /* ping-pong between ranks 0 and 1 (or rank 0 and itself) with 3 tags in flight */
    if (R < 2) {
        int peer = N > 1 ? 1 - R : 0;
        unsigned char out[3][64], in[3][64];
        for (int it = 0; it < 200; it++) {
            cdp_request_t rq[3], sq[3];
            for (int t = 0; t < 3; t++) OK(cdp_comm_irecv(world, in[t], sizeof in[t], peer, 7 + t, &rq[t]));
            if (R == 0 || N == 1) {
                for (int t = 0; t < 3; t++) {
                    fill(out[t], sizeof out[t], it, t);
                    OK(cdp_comm_isend(world, out[t], sizeof out[t], peer, 7 + t, &sq[t]));
                }
                for (int t = 2; t >= 0; t--) OK(cdp_comm_wait(rq[t], 30));
                for (int t = 0; t < 3; t++) OK(cdp_comm_wait(sq[t], 30));
            } else {
                for (int t = 2; t >= 0; t--) OK(cdp_comm_wait(rq[t], 30));
                for (int t = 0; t < 3; t++) {
                    memcpy(out[t], in[t], sizeof out[t]);
                    OK(cdp_comm_isend(world, out[t], sizeof out[t], peer, 7 + t, &sq[t]));
                }
                for (int t = 0; t < 3; t++) OK(cdp_comm_wait(sq[t], 30));
            }
            for (int t = 0; t < 3; t++)
                CHECK(first_bad(in[t], sizeof in[t], it, t) == SIZE_MAX, "ping-pong %d tag %d", it, 7 + t);
        }
    }
    OK(cdp_comm_barrier(world, 30));
}

static void scen_gather(void)
{
    for (int round = 0; round < 3; round++) {
        size_t mine = R == 1 ? 0 : (size_t)R * 1000 + 7 + (size_t)round * 100000;
        unsigned char *buf = malloc(mine + 1);
        fill(buf, mine, R, round);
        void *out = (void *)1;
        size_t *lens = (size_t *)1;
        OK(cdp_comm_gather_bytes(world, buf, mine, &out, &lens, 30));
        if (R == 0) {
            size_t off = 0;
            for (int r = 0; r < N; r++) {
                size_t want = r == 1 ? 0 : (size_t)r * 1000 + 7 + (size_t)round * 100000;
                CHECK(lens[r] == want, "round %d: rank %d sent %zu bytes, expected %zu", round, r, lens[r], want);
                CHECK(first_bad((unsigned char *)out + off, want, r, round) == SIZE_MAX, "round %d: rank %d's bytes",
                      round, r);
                off += want;
            }
        } else {
            CHECK(out == NULL && lens == NULL, "non-root gets NULL");
        }
        free(out);
        free(lens);
        free(buf);
    }
}

static void scen_barrier(void)
{
    OK(cdp_comm_barrier(world, 30));
    double t0 = now_s();
    sleep_s(0.1 * R);
    OK(cdp_comm_barrier(world, 30));
    double el = now_s() - t0;
    CHECK(el >= 0.1 * (N - 1) - 0.02, "left the barrier after %.3f s, before the last rank arrived (%.1f s)", el,
          0.1 * (N - 1));
}

static void scen_timeout(void)
{
    if (R == 0) {
        char buf[16];
        cdp_request_t rq = NULL;
        int peer = N - 1;
        OK(cdp_comm_irecv(world, buf, sizeof buf, peer, 77, &rq));
        double t0 = now_s();
        cdp_status st = cdp_comm_wait(rq, 1.0);
        double el = now_s() - t0;
        CHECK(st == CDP_ERR_COMM, "status %d: %s", (int)st, cdp_last_error());
        CHECK(strstr(cdp_last_error(), "timed out after 1 s"), "%s", cdp_last_error());
        CHECK(strstr(cdp_last_error(), "receive from rank"), "%s", cdp_last_error());
        CHECK(el >= 1.0, "timed out after %.3f s", el);
        printf("rank 0: timed out after %.3f s: %s\n", el, cdp_last_error());
    }
    /* the communicator still works after a point-to-point timeout */
    OK(cdp_comm_barrier(world, 30));
    int v = 1;
    char *p = (char *)&v;
    cdp_request_t s, r;
    int w = 0;
    OK(cdp_comm_irecv(world, &w, sizeof w, (R + N - 1) % N, 77, &r));
    OK(cdp_comm_isend(world, p, sizeof v, (R + 1) % N, 77, &s));
    OK(cdp_comm_wait(r, 30));
    OK(cdp_comm_wait(s, 30));
    CHECK(w == 1, "after the timeout, a message on the same tag arrives intact");
}

static void scen_errors(void)
{
    char a[200] = { 0 }, b[200];
    cdp_request_t rq = NULL, sq = NULL;
    CHECK(cdp_comm_isend(world, a, 1, N, 0, &sq) == CDP_ERR_INVALID && strstr(cdp_last_error(), "no such rank"),
          "%s", cdp_last_error());
    CHECK(cdp_comm_irecv(world, a, 1, -1, 0, &rq) == CDP_ERR_INVALID, "%s", cdp_last_error());
    CHECK(cdp_comm_isend(world, a, 1, 0, 1 << 20, &sq) == CDP_ERR_INVALID && strstr(cdp_last_error(), "tag"), "%s",
          cdp_last_error());
    CHECK(cdp_comm_irecv(world, a, 1, 0, -3, &rq) == CDP_ERR_INVALID, "%s", cdp_last_error());
    CHECK(!rq && !sq, "no request on a bad argument");

    /* a shorter message than expected (to self) */
    OK(cdp_comm_irecv(world, b, 200, R, 5, &rq));
    OK(cdp_comm_isend(world, a, 100, R, 5, &sq));
    OK(cdp_comm_wait(sq, 10));
    CHECK(cdp_comm_wait(rq, 10) == CDP_ERR_COMM && strstr(cdp_last_error(), "expected 200 bytes"), "%s",
          cdp_last_error());
    /* a longer one, rank 0 to rank 1: MPI's own truncation error, with its
     * text (Open MPI 4.1 does not report truncation of a message to self) */
    if (N >= 2 && R < 2) {
        if (R == 0) {
            OK(cdp_comm_isend(world, a, 200, 1, 6, &sq));
            OK(cdp_comm_wait(sq, 10));
        } else {
            OK(cdp_comm_irecv(world, b, 100, 0, 6, &rq));
            int r = 0;
            double t0 = now_s();
            while (!(r = cdp_comm_test(rq)) && now_s() - t0 < 10) {
            }
            CHECK(r == -1 && strstr(cdp_last_error(), "MPI_ERR_TRUNCATE"), "test gives -1 on an error: %d, %s", r,
                  cdp_last_error());
            printf("rank %d: truncation reads: %s\n", R, cdp_last_error());
        }
    }
    OK(cdp_comm_barrier(world, 30));
}

/* A message above MPI's int count: travels in chunks (1 GiB, or
 * CDP_COMM_CHUNK_BYTES). Ranks 0 and 1 only. */
static void scen_bigmsg(void)
{
    size_t n = getenv("CDP_COMM_CHUNK_BYTES") ? (size_t)1000003 : ((size_t)1 << 31) + 13;
    if (R < 2 && N >= 2) {
        unsigned char *p = malloc(n);
        CHECK(p, "memory for %zu bytes", n);
        cdp_request_t q;
        if (R == 0) {
            fill(p, n, 0, 3);
            OK(cdp_comm_isend(world, p, n, 1, 3, &q));
        } else {
            memset(p, 0, n);
            OK(cdp_comm_irecv(world, p, n, 0, 3, &q));
        }
        OK(cdp_comm_wait(q, 120));
        if (R == 1) CHECK(first_bad(p, n, 0, 3) == SIZE_MAX, "big message intact");
        free(p);
    }
    /* and a chunked all-reduce and gather when the chunk is small */
    if (getenv("CDP_COMM_CHUNK_BYTES")) {
        size_t m = 10007;
        float *f = malloc(m * sizeof *f);
        for (size_t i = 0; i < m; i++) f[i] = (float)(R + (int)(i % 3));
        OK(cdp_comm_allreduce_f32(world, f, m, CDP_REDUCE_SUM, 30));
        for (size_t i = 0; i < m; i++)
            CHECK(f[i] == (float)(N * (N - 1) / 2 + N * (int)(i % 3)), "chunked all-reduce [%zu] = %g", i, (double)f[i]);
        free(f);
        scen_gather();
    }
    OK(cdp_comm_barrier(world, 120));
}

/* A collective that times out: rank 0 reports it, finds the communicator
 * unusable afterwards, and ends the job with exit code 42 (the documented
 * recovery); the others never join. */
static void scen_allreduce_timeout(void)
{
    if (R == 0) {
        float v = 1;
        double t0 = now_s();
        cdp_status st = cdp_comm_allreduce_f32(world, &v, 1, CDP_REDUCE_SUM, 0.5);
        double el = now_s() - t0;
        CHECK(N == 1 || st == CDP_ERR_COMM, "status %d", (int)st);
        if (N > 1) {
            CHECK(strstr(cdp_last_error(), "timed out after 0.5 s") && strstr(cdp_last_error(), "all-reduce"), "%s",
                  cdp_last_error());
            CHECK(el >= 0.5, "after %.3f s", el);
            CHECK(cdp_comm_barrier(world, 1) == CDP_ERR_COMM && strstr(cdp_last_error(), "unusable"), "%s",
                  cdp_last_error());
        }
        printf("rank %d/%d: allreduce_timeout ok\n", R, N);
        fflush(stdout);
        cdp_comm_abort(world, 42);
    }
    sleep_s(10); /* mpirun ends this rank within about a second of the abort */
    CHECK(0, "rank 0 should have ended the job");
}

static void scen_abort(void)
{
    printf("pid %d %d\n", R, (int)getpid());
    fflush(stdout);
    OK(cdp_comm_barrier(world, 30));
    if (R == N - 1) {
        printf("rank %d/%d: aborting at %.3f\n", R, N, now_s());
        cdp_comm_abort(world, 7);
    }
    char c;
    cdp_request_t q;
    OK(cdp_comm_irecv(world, &c, 1, N - 1, 1, &q));
    cdp_status st = cdp_comm_wait(q, 60);
    CHECK(0, "still running after the abort: %d %s", (int)st, cdp_last_error());
}

static void scen_kill(void)
{
    printf("pid %d %d\n", R, (int)getpid());
    fflush(stdout);
    OK(cdp_comm_barrier(world, 30));
    if (R == N - 1) raise(SIGKILL);
    /* no deadline: only the launcher can end this */
    char c;
    cdp_request_t q;
    OK(cdp_comm_irecv(world, &c, 1, N - 1, 1, &q));
    cdp_status st = cdp_comm_wait(q, 0);
    CHECK(0, "the receive from a killed rank returned: %d %s", (int)st, cdp_last_error());
}

/* Every root, sizes from 0 to ~1 MB (several chunks when CDP_COMM_CHUNK_BYTES
 * is small), then the argument checks, which fail before any collective. */
static void scen_bcast(void)
{
    static const size_t sizes[] = { 0, 1, 128, 10007, 1000003 };
    for (int root = 0; root < N; root++) {
        for (int k = 0; k < (int)(sizeof sizes / sizeof *sizes); k++) {
            size_t n = sizes[k];
            unsigned char *p = malloc(n + 1);
            CHECK(p, "memory");
            if (R == root) fill(p, n, root, k);
            else memset(p, 0xEE, n);
            OK(cdp_comm_bcast_bytes(world, p, n, root, 30));
            size_t bad = first_bad(p, n, root, k);
            CHECK(bad == SIZE_MAX, "root %d, %zu bytes: byte %zu differs", root, n, bad);
            free(p);
        }
    }
    OK(cdp_comm_bcast_bytes(world, NULL, 0, N - 1, 30));
    char b[4];
    CHECK(cdp_comm_bcast_bytes(world, b, 4, N, 30) == CDP_ERR_INVALID && strstr(cdp_last_error(), "no such rank"),
          "%s", cdp_last_error());
    CHECK(cdp_comm_bcast_bytes(world, b, 4, -1, 30) == CDP_ERR_INVALID, "%s", cdp_last_error());
    CHECK(cdp_comm_bcast_bytes(world, NULL, 4, 0, 30) == CDP_ERR_INVALID && strstr(cdp_last_error(), "NULL"), "%s",
          cdp_last_error());
    /* the broadcasts and the other collectives stay in step */
    double v = 1;
    OK(cdp_comm_allreduce_f64(world, &v, 1, CDP_REDUCE_SUM, 30));
    CHECK(v == N, "sum %g after the broadcasts", v);
}

/* A broadcast whose root never comes: the last rank times out, finds the
 * communicator unusable, and ends the job with exit code 42. */
static void scen_bcast_timeout(void)
{
    if (N > 1 && R == N - 1) {
        unsigned char id[128];
        double t0 = now_s();
        cdp_status st = cdp_comm_bcast_bytes(world, id, sizeof id, 0, 0.5);
        double el = now_s() - t0;
        CHECK(st == CDP_ERR_COMM, "status %d: %s", (int)st, cdp_last_error());
        CHECK(strstr(cdp_last_error(), "timed out after 0.5 s") &&
                  strstr(cdp_last_error(), "broadcast of 128 bytes from rank 0"),
              "%s", cdp_last_error());
        CHECK(el >= 0.5, "after %.3f s", el);
        printf("rank %d/%d: %s\n", R, N, cdp_last_error());
        CHECK(cdp_comm_barrier(world, 1) == CDP_ERR_COMM && strstr(cdp_last_error(), "unusable"), "%s",
              cdp_last_error());
        printf("rank %d/%d: bcast_timeout ok\n", R, N);
        fflush(stdout);
        cdp_comm_abort(world, 42);
    }
    sleep_s(10); /* mpirun ends this rank within about a second of the abort */
    CHECK(0, "rank %d should have ended the job", N - 1);
}

/* ---- ZeRO's reduce-scatter and all-gather ------------------------------------------- */

/* Rank r's i-th input: signs and magnitudes from 2^-12 to 2^12 that vary, so
 * that sums of the same values in different orders round differently. */
static float zval(int r, size_t i)
{
    uint32_t h = (uint32_t)i * 2654435761u ^ ((uint32_t)r * 40503u + 17u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float v = 1.0f + (float)(h & 0xFFFFF) / (float)(1 << 20);
    for (int e = (int)((h >> 20) % 25) - 12; e != 0; e += e > 0 ? -1 : 1) v *= e > 0 ? 2.0f : 0.5f;
    return h >> 31 ? -v : v;
}

/* The first element where a and b differ bitwise, or SIZE_MAX. */
static size_t first_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a)) return i;
    return SIZE_MAX;
}

/* On c: for each n and op, the reduce-scatter leaves this rank's shard
 * bit-identical to the all-reduce of the same inputs, and an all-gather of
 * the shards (the rest of the buffer poisoned) rebuilds the all-reduce's
 * whole buffer bit for bit. */
static void zero_checks(cdp_comm_t c)
{
    const int size = cdp_comm_size(c), rank = cdp_comm_rank(c);
    const size_t sizes[] = { 0, 1, (size_t)size - 1, 7, 1000, 1001 };
    const float poison = -12345.5f;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k], off = 0, len = 0;
        cdp_comm_shard(n, size, rank, &off, &len);
        float *a = malloc((n + 1) * sizeof *a), *b = malloc((n + 1) * sizeof *b);
        float *sum = malloc((n + 1) * sizeof *sum);
        CHECK(a && b && sum, "memory");
        for (int op = 0; op < CDP_REDUCE_OP_COUNT; op++) {
            for (size_t i = 0; i < n; i++) a[i] = b[i] = zval(rank, i);
            OK(cdp_comm_allreduce_f32(c, a, n, (enum cdp_reduce_op)op, 30));
            if (op == CDP_REDUCE_SUM && n) memcpy(sum, a, n * sizeof *a);
            OK(cdp_comm_reduce_scatter_f32(c, b, n, (enum cdp_reduce_op)op, 30));
            size_t d = first_diff(b + off, a + off, len);
            CHECK(d == SIZE_MAX, "%d ranks, n %zu, op %d: reduce-scatter [%zu] = %.9g, all-reduce %.9g", size, n, op,
                  off + d, (double)b[off + d], (double)a[off + d]);
            for (size_t i = 0; i < n; i++)
                if (i < off || i >= off + len) b[i] = poison;
            OK(cdp_comm_allgather_f32(c, b, n, 30));
            d = first_diff(b, a, n);
            CHECK(d == SIZE_MAX, "%d ranks, n %zu, op %d: all-gather [%zu] = %.9g, all-reduce %.9g", size, n, op, d,
                  (double)b[d], (double)a[d]);
        }
        /* over windows (ZeRO-2 reduces one layer at a time): this rank's
         * shard's overlap with the window equals the all-reduce there */
        const size_t windows[][2] = { { 0, n }, { n / 3, n / 2 }, { 1, n > 2 ? n - 2 : 0 }, { n ? n - 1 : 0, n ? 1 : 0 } };
        for (size_t w = 0; w < sizeof windows / sizeof *windows && n; w++) {
            const size_t from = windows[w][0], count = windows[w][1];
            if (!count) continue;
            for (size_t i = 0; i < n; i++) a[i] = zval(rank, i);
            OK(cdp_comm_allreduce_f32(c, a, n, CDP_REDUCE_SUM, 30));
            for (size_t i = 0; i < count; i++) b[i] = zval(rank, from + i);
            OK(cdp_comm_reduce_scatter_window_f32(c, b, n, from, count, CDP_REDUCE_SUM, 30));
            const size_t s0 = off > from ? off : from, s1 = off + len < from + count ? off + len : from + count;
            for (size_t i = s0; i < s1; i++)
                CHECK(memcmp(&b[i - from], &a[i], sizeof *a) == 0,
                      "%d ranks, n %zu, window [%zu, %zu): [%zu] = %.9g, all-reduce %.9g", size, n, from,
                      from + count, i, (double)b[i - from], (double)a[i]);
        }
        /* the bit-identity above means something: on these inputs the order
         * of the sum changes the result (left fold against right fold) */
        if (size >= 3 && n == 1001) {
            size_t differ = 0, as_left = 0;
            for (size_t i = 0; i < n; i++) {
                float left = zval(0, i), right = zval(size - 1, i);
                for (int r = 1; r < size; r++) left += zval(r, i);
                for (int r = size - 2; r >= 0; r--) right = zval(r, i) + right;
                differ += memcmp(&left, &right, sizeof left) != 0;
                as_left += memcmp(&left, &sum[i], sizeof left) == 0;
            }
            CHECK(differ > 0, "%d ranks: no input whose sum depends on the order", size);
            if (rank == 0)
                printf("rank 0 of %d: %zu of %zu sums depend on the order; the all-reduce's is the left fold's "
                       "for %zu\n", size, differ, n, as_left);
        }
        free(a);
        free(b);
        free(sum);
    }
    float f = 0;
    CHECK(cdp_comm_reduce_scatter_f32(c, NULL, 3, CDP_REDUCE_SUM, 1) == CDP_ERR_INVALID &&
              strstr(cdp_last_error(), "reduce-scatter of 3 floats: buffer is NULL"),
          "%s", cdp_last_error());
    CHECK(cdp_comm_reduce_scatter_f32(c, &f, 1, CDP_REDUCE_OP_COUNT, 1) == CDP_ERR_INVALID &&
              strstr(cdp_last_error(), "unknown reduce op"),
          "%s", cdp_last_error());
    CHECK(cdp_comm_allgather_f32(c, NULL, 3, 1) == CDP_ERR_INVALID, "%s", cdp_last_error());
    CHECK(cdp_comm_reduce_scatter_window_f32(c, &f, 3, 2, 2, CDP_REDUCE_SUM, 1) == CDP_ERR_INVALID &&
              strstr(cdp_last_error(), "reduce-scatter of floats [2, 4) of a 3-float buffer"),
          "%s", cdp_last_error());
}

/* On 1 to N ranks of one job: the first R world ranks split off, R = N .. 1. */
static void scen_zero(void)
{
    for (int size = N; size >= 1; size--) {
        cdp_comm_t c = NULL;
        OK(cdp_comm_split(world, R < size ? 0 : -1, R, &c));
        if (c) {
            CHECK(cdp_comm_size(c) == size, "size %d, expected %d", cdp_comm_size(c), size);
            zero_checks(c);
        }
        cdp_comm_free(c);
    }
    OK(cdp_comm_barrier(world, 30));
}

/* ---- bf16 on the wire --------------------------------------------------------------- */

static float bf16_round(float x) { return cdp_bf16_to_f32(cdp_f32_to_bf16(x)); }

/* Rank 0's n floats handed to every rank; 1 where some rank's differ bitwise
 * (told to every rank). */
static int differs_anywhere(cdp_comm_t c, const float *v, size_t n)
{
    float *r0 = malloc((n + 1) * sizeof *r0);
    CHECK(r0, "memory");
    memcpy(r0, v, n * sizeof *v);
    OK(cdp_comm_bcast_bytes(c, r0, n * sizeof *r0, 0, 30));
    double d = first_diff(r0, v, n) != SIZE_MAX;
    OK(cdp_comm_allreduce_f64(c, &d, 1, CDP_REDUCE_MAX, 30));
    free(r0);
    return d > 0;
}

static void bf16_checks(cdp_comm_t c)
{
    const int size = cdp_comm_size(c), rank = cdp_comm_rank(c);
    const enum cdp_comm_wire w = CDP_COMM_WIRE_BF16;
    const size_t sizes[] = {1, (size_t)size + 1, 7, 333};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const size_t n = sizes[k];
        size_t off = 0, len = 0;
        cdp_comm_shard(n, size, rank, &off, &len);
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *f = malloc(n * sizeof *f);
        CHECK(a && b && f, "memory");
        for (size_t i = 0; i < n; i++) a[i] = f[i] = zval(rank, i);
        OK(cdp_comm_allreduce_wire(c, a, n, CDP_REDUCE_SUM, w, 30));
        OK(cdp_comm_allreduce_f32(c, f, n, CDP_REDUCE_SUM, 30));
        CHECK(!differs_anywhere(c, a, n), "%d ranks, n %zu: the bf16 all-reduce differs between ranks", size, n);
        int rounded = 0;
        for (size_t i = 0; i < n; i++) {
            /* each of the size - 1 additions and the size roundings of the inputs moves the sum by at most
             * half an ulp of bf16 (2^-9 relative) of what it rounds, all below the sum of |inputs| (1% for
             * the second-order terms); the fp32 sum errs by at most size x 2^-24 of it */
            double mag = 0;
            for (int r = 0; r < size; r++) mag += fabs((double)zval(r, i));
            const double bound = ((2.0 * size - 1) * 0x1p-9 * 1.01 * (size > 1) + size * 0x1p-23) * mag;
            CHECK(fabs((double)a[i] - (double)f[i]) <= bound, "%d ranks, n %zu: [%zu] "
                  "bf16 sum %.9g, fp32 sum %.9g, bound %.3g", size, n, i, (double)a[i], (double)f[i], bound);
            CHECK(size == 1 ? a[i] == zval(rank, i) : a[i] == bf16_round(a[i]),
                  "%d ranks: [%zu] = %.9g is not what the wire gives", size, i, (double)a[i]);
            rounded += a[i] != f[i];
            if (size == 2) {
                const float want = bf16_round(bf16_round(zval(0, i)) + bf16_round(zval(1, i)));
                CHECK(memcmp(&a[i], &want, sizeof want) == 0, "2 ranks: [%zu] = %.9g, by hand %.9g", i,
                      (double)a[i], (double)want);
            }
        }
        CHECK(size == 1 || n < 7 || rounded > 0, "%d ranks, n %zu: bf16 equal to fp32 everywhere", size, n);
        /* the average is the sum over the size, in fp32 */
        for (size_t i = 0; i < n; i++) b[i] = zval(rank, i);
        OK(cdp_comm_allreduce_wire(c, b, n, CDP_REDUCE_AVG, w, 30));
        for (size_t i = 0; i < n; i++)
            CHECK(b[i] == a[i] / (float)size, "%d ranks: average [%zu] %.9g, sum %.9g", size, i, (double)b[i],
                  (double)a[i]);
        /* non-blocking: the same bits */
        cdp_request_t rq = NULL;
        for (size_t i = 0; i < n; i++) b[i] = zval(rank, i);
        OK(cdp_comm_iallreduce_wire(c, b, n, CDP_REDUCE_SUM, w, 30, &rq));
        OK(cdp_comm_wait(rq, 30));
        CHECK(first_diff(a, b, n) == SIZE_MAX, "%d ranks, n %zu: non-blocking differs", size, n);
        /* the reduce-scatter: this rank's shard as the all-reduce has it, blocking and not, whole and in windows */
        for (size_t i = 0; i < n; i++) b[i] = zval(rank, i);
        OK(cdp_comm_reduce_scatter_window_wire(c, b, n, 0, n, CDP_REDUCE_SUM, w, 30));
        size_t d = first_diff(b + off, a + off, len);
        CHECK(d == SIZE_MAX, "%d ranks, n %zu: reduce-scatter [%zu] = %.9g, all-reduce %.9g", size, n, off + d,
              (double)b[off + d], (double)a[off + d]);
        const size_t from = n / 3, count = n - n / 3 - (n > 2);
        for (size_t i = 0; i < count; i++) b[i] = zval(rank, from + i);
        OK(cdp_comm_ireduce_scatter_window_wire(c, b, n, from, count, CDP_REDUCE_SUM, w, 30, &rq));
        OK(cdp_comm_wait(rq, 30));
        for (size_t i = off > from ? off : from; i < off + len && i < from + count; i++)
            CHECK(memcmp(&b[i - from], &a[i], sizeof *a) == 0, "%d ranks, n %zu, window [%zu, %zu): [%zu] = %.9g, "
                  "all-reduce %.9g", size, n, from, from + count, i, (double)b[i - from], (double)a[i]);
        /* the all-gather: every shard rounded, this rank's own too, the same everywhere */
        for (size_t i = 0; i < n; i++) b[i] = i >= off && i < off + len ? zval(rank, i) : -12345.5f;
        OK(cdp_comm_allgather_wire(c, b, n, w, 30));
        for (size_t i = 0; i < n; i++) {
            int owner = 0;
            for (int r = 0; r < size; r++) {
                size_t o = 0, l = 0;
                cdp_comm_shard(n, size, r, &o, &l);
                if (i >= o && i < o + l) owner = r;
            }
            const float want = size == 1 ? zval(owner, i) : bf16_round(zval(owner, i));
            CHECK(memcmp(&b[i], &want, sizeof want) == 0, "%d ranks, n %zu: all-gather [%zu] = %.9g, expected %.9g",
                  size, n, i, (double)b[i], (double)want);
        }
        /* fp32 is untouched by all this: the same call without the wire is the fp32 sum */
        for (size_t i = 0; i < n; i++) b[i] = zval(rank, i);
        OK(cdp_comm_allreduce_wire(c, b, n, CDP_REDUCE_SUM, CDP_COMM_WIRE_F32, 30));
        CHECK(first_diff(b, f, n) == SIZE_MAX, "%d ranks, n %zu: the fp32 wire differs from fp32", size, n);
        free(a), free(b), free(f);
    }
    float x = 1;
    CHECK(cdp_comm_allreduce_wire(c, &x, 1, CDP_REDUCE_MAX, w, 30) == CDP_ERR_INVALID &&
              strstr(cdp_last_error(), "not a max"), "%s", cdp_last_error());
}

static void scen_bf16(void)
{
    for (int size = N; size >= 1; size--) {
        cdp_comm_t c = NULL;
        OK(cdp_comm_split(world, R < size ? 0 : -1, R, &c));
        if (c) bf16_checks(c);
        cdp_comm_free(c);
    }
    OK(cdp_comm_barrier(world, 30));
}

/* A reduce-scatter and an all-gather that the other ranks never join: rank 0
 * times out on each (the all-gather on a second communicator, since the
 * first is unusable after its timeout), then ends the job with exit code 42. */
static void scen_zero_timeout(void)
{
    cdp_comm_t other = NULL;
    OK(cdp_comm_split(world, 0, R, &other));
    if (N > 1 && R == 0) {
        float v[7] = { 0 };
        double t0 = now_s();
        cdp_status st = cdp_comm_reduce_scatter_f32(world, v, 7, CDP_REDUCE_AVG, 0.3);
        double el = now_s() - t0;
        CHECK(st == CDP_ERR_COMM &&
                  strstr(cdp_last_error(), "reduce-scatter (average) of 7 floats: timed out after 0.3 s"),
              "status %d: %s", (int)st, cdp_last_error());
        CHECK(el >= 0.3, "after %.3f s", el);
        printf("rank %d/%d: %s\n", R, N, cdp_last_error());
        CHECK(cdp_comm_allgather_f32(world, v, 7, 1) == CDP_ERR_COMM && strstr(cdp_last_error(), "unusable"), "%s",
              cdp_last_error());
        t0 = now_s();
        st = cdp_comm_allgather_f32(other, v, 7, 0.3);
        el = now_s() - t0;
        CHECK(st == CDP_ERR_COMM && strstr(cdp_last_error(), "all-gather of 7 floats: timed out after 0.3 s"),
              "status %d: %s", (int)st, cdp_last_error());
        CHECK(el >= 0.3, "after %.3f s", el);
        printf("rank %d/%d: %s\n", R, N, cdp_last_error());
        printf("rank %d/%d: zero_timeout ok\n", R, N);
        fflush(stdout);
        cdp_comm_abort(world, 42);
    }
    sleep_s(10); /* mpirun ends this rank within about a second of the abort */
    CHECK(0, "rank 0 should have ended the job");
}

/* Rank 0 offers a CPU device, the others their GPU (or none where there is
 * no GPU): no rank gets an nccl communicator, all fail at once (not at the
 * deadline), each saying why, and the host world still works. */
static void scen_nccl_refused(void)
{
    cdp_device_t dev = NULL;
    int ngpu = 0, gpu = 0;
    if (R == 0) OK(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev));
    else if (cdp_device_count(CDP_BACKEND_CUDA, &ngpu) == CDP_OK && ngpu > 0)
        gpu = cdp_device_open(CDP_BACKEND_CUDA, R % ngpu, 0, &dev) == CDP_OK;
    cdp_nccl_t nc = (cdp_nccl_t)&nc;
    double t0 = now_s();
    cdp_status st = cdp_nccl_world(world, dev, 60, &nc);
    double el = now_s() - t0;
    const char *m = cdp_last_error();
    CHECK(st == CDP_ERR_UNSUPPORTED, "status %d: %s", (int)st, m);
    CHECK(nc == (cdp_nccl_t)&nc, "out is written only on success");
    if (R == 0) CHECK(strstr(m, "nccl: needs a CUDA device, got cpu:0"), "%s", m);
    else if (gpu) CHECK(strstr(m, "rank 0 cannot use NCCL"), "%s", m);
    else CHECK(strstr(m, "nccl: unavailable: "), "%s", m);
    CHECK(el < 20, "failed after %.1f s: at once, not at the 60 s deadline", el);
    printf("rank %d/%d: refused: %s\n", R, N, m);
    OK(cdp_comm_barrier(world, 30));
    cdp_device_close(dev);
}

/* The nccl front's bootstrap over real MPI ranks, with the stand-in module
 * (fake-cuda/ beside this program): every rank's init gets rank 0's id; with
 * CDP_FAKE_NCCL=fail_init:F, rank F's init fails and every other rank aborts
 * the member it made and names rank F. */
static void scen_nccl_fake(void)
{
    char dir[PATH_MAX], path[PATH_MAX + 64];
    ssize_t k = readlink("/proc/self/exe", dir, sizeof dir - 1);
    CHECK(k > 0, "readlink /proc/self/exe");
    dir[k] = '\0';
    *strrchr(dir, '/') = '\0';
    snprintf(path, sizeof path, "%s/fake-cuda", dir);
    setenv("CDP_MODULE_DIR", path, 1);
    cdp_device_t dev = NULL;
    OK(cdp_device_open(CDP_BACKEND_CUDA, 0, 0, &dev));
    snprintf(path + strlen(path), 64, "/libcdphybrid-cuda.so");
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    CHECK(h, "the stand-in module is loaded: %s", dlerror());
    struct fake_stats *fs = dlsym(h, "cdp_fake_nccl_stats");
    CHECK(fs, "cdp_fake_nccl_stats");

    const char *mode = getenv("CDP_FAKE_NCCL");
    int fail = mode && !strncmp(mode, "fail_init:", 10) ? atoi(mode + 10) : -1;
    cdp_nccl_t nw = (cdp_nccl_t)&nw;
    cdp_status st = cdp_nccl_world(world, dev, 30, &nw);
    const char *m = cdp_last_error();
    if (fail >= 0 && fail < N) {
        CHECK(st == CDP_ERR_COMM, "status %d: %s", (int)st, m);
        CHECK(nw == (cdp_nccl_t)&nw, "no communicator");
        if (R == fail) {
            CHECK(strstr(m, "creating the world communicator") && strstr(m, "fake failure of rank"), "%s", m);
        } else {
            char want[96];
            snprintf(want, sizeof want, "rank %d failed to create its member of the world communicator", fail);
            CHECK(strstr(m, want), "%s", m);
            CHECK(fs->aborts == 1, "this rank's member was aborted (%d aborts)", fs->aborts);
        }
        CHECK(fs->live == 0, "%d communicators left", fs->live);
        printf("rank %d/%d: %s\n", R, N, m);
    } else {
        CHECK(st == CDP_OK, "%s", m);
        CHECK(cdp_nccl_rank(nw) == R && cdp_nccl_size(nw) == N, "rank %d/%d", cdp_nccl_rank(nw), cdp_nccl_size(nw));
        /* every rank's init was given rank 0's id */
        void *out = NULL;
        size_t *lens = NULL;
        OK(cdp_comm_gather_bytes(world, fs->last_id, sizeof fs->last_id, &out, &lens, 30));
        if (R == 0) {
            unsigned char zero[CDP_NCCL_ID_BYTES] = { 0 };
            CHECK(memcmp(out, zero, sizeof zero) != 0, "an id was made");
            for (int r = 1; r < N; r++)
                CHECK(lens[r] == CDP_NCCL_ID_BYTES && !memcmp((unsigned char *)out + (size_t)r * CDP_NCCL_ID_BYTES, out,
                                                              CDP_NCCL_ID_BYTES),
                      "rank %d's init got another id than rank 0's", r);
        }
        free(out);
        free(lens);
        /* ZeRO's collectives hand the module every rank's shard, which the
         * stand-in checks tile the buffer; this rank's is the rule's */
        cdp_buffer_t zb = NULL;
        size_t off = 0, len = 0;
        cdp_comm_shard(1001, N, R, &off, &len);
        OK(cdp_buffer_create(dev, 1001 * sizeof(float), &zb));
        OK(cdp_nccl_reduce_scatter_f32(nw, cdp_buffer_data(zb), 1001, CDP_REDUCE_AVG, 30));
        OK(cdp_nccl_allgather_f32(nw, cdp_buffer_data(zb), 1001, 30));
        CHECK(fs->sharded == 2 && fs->shard_off == off && fs->shard_len == len,
              "%d calls, shard [%zu, +%zu), expected [%zu, +%zu)", fs->sharded, fs->shard_off, fs->shard_len, off, len);
        cdp_buffer_destroy(zb);
        cdp_nccl_free(nw);
        CHECK(fs->destroys == 1 && fs->live == 0, "freed: %d destroys, %d live", fs->destroys, fs->live);
    }
    OK(cdp_comm_barrier(world, 30));
    cdp_device_close(dev);
}

/* ---- nccl on GPUs (one per rank) ------------------------------------------------ */

static cdp_device_t gpu_dev;

static cdp_buffer_t gpu_buf(const void *host, size_t bytes)
{
    cdp_buffer_t b = NULL;
    OK(cdp_buffer_create(gpu_dev, bytes, &b));
    if (host && bytes) OK(cdp_buffer_write(b, 0, host, bytes));
    return b;
}

static void gpu_read(cdp_buffer_t b, void *host, size_t bytes)
{
    if (bytes) OK(cdp_buffer_read(b, 0, host, bytes));
}

static void nccl_allreduce_checks(cdp_nccl_t nw)
{
    static const size_t sizes[] = { 1, 7, 1000003 };
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        float *f = malloc(n * sizeof *f);
        double *d = malloc(n * sizeof *d);
        CHECK(f && d, "memory");
        for (int op = 0; op < CDP_REDUCE_OP_COUNT; op++) {
            for (size_t i = 0; i < n; i++) {
                f[i] = (float)(R + 1 + (int)(i % 7));
                d[i] = 0.25 * (R + 1) + (double)(i % 5);
            }
            cdp_buffer_t fb = gpu_buf(f, n * sizeof *f), db = gpu_buf(d, n * sizeof *d);
            OK(cdp_nccl_allreduce_f32(nw, cdp_buffer_data(fb), n, (enum cdp_reduce_op)op, 60));
            OK(cdp_nccl_allreduce_f64(nw, cdp_buffer_data(db), n, (enum cdp_reduce_op)op, 60));
            gpu_read(fb, f, n * sizeof *f);
            gpu_read(db, d, n * sizeof *d);
            cdp_buffer_destroy(fb);
            cdp_buffer_destroy(db);
            for (size_t i = 0; i < n; i++) {
                double fs = N * (N + 1) / 2.0 + N * (double)(i % 7);
                double ds = 0.25 * N * (N + 1) / 2.0 + N * (double)(i % 5);
                double fw = op == CDP_REDUCE_SUM ? fs : op == CDP_REDUCE_AVG ? fs / N : N + (double)(i % 7);
                double dw = op == CDP_REDUCE_SUM ? ds : op == CDP_REDUCE_AVG ? ds / N : 0.25 * N + (double)(i % 5);
                CHECK(fabs(f[i] - fw) <= 1e-6 * fabs(fw), "nccl f32 op %d n %zu [%zu] = %.9g, expected %.9g", op, n,
                      i, (double)f[i], fw);
                CHECK(fabs(d[i] - dw) <= 1e-14 * fabs(dw), "nccl f64 op %d n %zu [%zu] = %.17g, expected %.17g", op,
                      n, i, d[i], dw);
            }
        }
        free(f);
        free(d);
    }
    OK(cdp_nccl_allreduce_f32(nw, NULL, 0, CDP_REDUCE_SUM, 10));
    CHECK(cdp_nccl_allreduce_f32(nw, NULL, 3, CDP_REDUCE_SUM, 10) == CDP_ERR_INVALID, "%s", cdp_last_error());
}

/* ZeRO's collectives on GPUs, for the sizes of zero_checks: the
 * reduce-scatter's shard against the all-reduce of the same inputs, within
 * rounding (NCCL may sum the two in different orders: each order is within
 * (N - 1) u sum|x| of the exact sum, u = 2^-24, so they differ by at most
 * 2 (N - 1) u sum|x|; an average that NCCL divides before summing adds at
 * most one more rounding of each term, hence 2 N u sum|x|, over N for the
 * average); the max bit for bit. Then an all-gather of every rank's shard of
 * known values (the rest poisoned) rebuilds them bit for bit. */
static void nccl_zero_checks(cdp_nccl_t nw)
{
    const size_t sizes[] = { 0, 1, (size_t)N - 1, 7, 1000, 1001 };
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k], off = 0, len = 0, bytes = n * sizeof(float);
        cdp_comm_shard(n, N, R, &off, &len);
        float *a = malloc(bytes + 4), *b = malloc(bytes + 4);
        CHECK(a && b, "memory");
        for (int op = 0; op < CDP_REDUCE_OP_COUNT; op++) {
            for (size_t i = 0; i < n; i++) a[i] = zval(R, i);
            cdp_buffer_t ab = gpu_buf(a, bytes), bb = gpu_buf(a, bytes);
            OK(cdp_nccl_allreduce_f32(nw, n ? cdp_buffer_data(ab) : NULL, n, (enum cdp_reduce_op)op, 60));
            OK(cdp_nccl_reduce_scatter_f32(nw, n ? cdp_buffer_data(bb) : NULL, n, (enum cdp_reduce_op)op, 60));
            gpu_read(ab, a, bytes);
            gpu_read(bb, b, bytes);
            cdp_buffer_destroy(ab);
            cdp_buffer_destroy(bb);
            for (size_t i = off; i < off + len; i++) {
                double mag = 0;
                for (int r = 0; r < N; r++) mag += fabs((double)zval(r, i));
                double tol = op == CDP_REDUCE_MAX ? 0 : 2.0 * N * ldexp(mag, -24) / (op == CDP_REDUCE_AVG ? N : 1);
                CHECK(fabs((double)b[i] - (double)a[i]) <= tol,
                      "nccl %d ranks, n %zu, op %d: reduce-scatter [%zu] = %.9g, all-reduce %.9g (tolerance %.3g)",
                      N, n, op, i, (double)b[i], (double)a[i], tol);
            }
        }
        for (size_t i = 0; i < n; i++) a[i] = zval(1000 + (int)i % 7, i);
        for (size_t i = 0; i < n; i++) b[i] = i >= off && i < off + len ? a[i] : -12345.5f;
        cdp_buffer_t gb = gpu_buf(b, bytes);
        OK(cdp_nccl_allgather_f32(nw, n ? cdp_buffer_data(gb) : NULL, n, 60));
        gpu_read(gb, b, bytes);
        cdp_buffer_destroy(gb);
        size_t d = first_diff(b, a, n);
        CHECK(d == SIZE_MAX, "nccl %d ranks, n %zu: all-gather [%zu] = %.9g, expected %.9g", N, n, d, (double)b[d],
              (double)a[d]);
        free(a);
        free(b);
    }
}

/* The sum of the world ranks of c's members, checked against the expected members. */
static void nccl_check_members(cdp_nccl_t c, const int *expect, int n, const char *what)
{
    CHECK(cdp_nccl_size(c) == n, "%s: size %d, expected %d", what, cdp_nccl_size(c), n);
    double v = R, want = 0;
    for (int i = 0; i < n; i++) want += expect[i];
    cdp_buffer_t b = gpu_buf(&v, sizeof v);
    OK(cdp_nccl_allreduce_f64(c, cdp_buffer_data(b), 1, CDP_REDUCE_SUM, 60));
    gpu_read(b, &v, sizeof v);
    cdp_buffer_destroy(b);
    CHECK(v == want, "%s: sum of members %g, expected %g", what, v, want);
}

/* A ring inside one group (the receive listed before the send: the group
 * makes the order irrelevant), plus a message to self and an empty one. */
static void nccl_p2p_checks(cdp_nccl_t nw)
{
    int right = (R + 1) % N, left = (R + N - 1) % N;
    size_t big = (1u << 20) + 3, small = 64;
    unsigned char *h = malloc(big);
    CHECK(h, "memory");
    fill(h, big, R, 1);
    cdp_buffer_t sb = gpu_buf(h, big), rb = gpu_buf(NULL, big);
    fill(h, small, R, 2);
    cdp_buffer_t ss = gpu_buf(h, small), rs = gpu_buf(NULL, small);
    struct cdp_nccl_p2p ops[] = {
        { 0, left, cdp_buffer_data(rb), big },
        { 1, right, cdp_buffer_data(sb), big },
        { 1, R, cdp_buffer_data(ss), small },
        { 0, R, cdp_buffer_data(rs), small },
        { 1, right, NULL, 0 },
        { 0, left, NULL, 0 },
    };
    OK(cdp_nccl_sendrecv(nw, ops, (int)(sizeof ops / sizeof *ops), 60));
    gpu_read(rb, h, big);
    CHECK(first_bad(h, big, left, 1) == SIZE_MAX, "ring: bytes from rank %d", left);
    gpu_read(rs, h, small);
    CHECK(first_bad(h, small, R, 2) == SIZE_MAX, "message to self");
    OK(cdp_nccl_sendrecv(nw, NULL, 0, 10));
    struct cdp_nccl_p2p bad = { 1, N, cdp_buffer_data(ss), small };
    CHECK(cdp_nccl_sendrecv(nw, &bad, 1, 10) == CDP_ERR_INVALID && strstr(cdp_last_error(), "no such rank"), "%s",
          cdp_last_error());
    cdp_buffer_destroy(sb);
    cdp_buffer_destroy(rb);
    cdp_buffer_destroy(ss);
    cdp_buffer_destroy(rs);
    free(h);
}

static void nccl_open(void)
{
    int ngpu = 0;
    OK(cdp_device_count(CDP_BACKEND_CUDA, &ngpu));
    CHECK(ngpu >= N, "%d ranks need %d GPUs, %d here", N, N, ngpu);
    OK(cdp_device_open(CDP_BACKEND_CUDA, R, 0, &gpu_dev));
}

static void scen_nccl(void)
{
    nccl_open();
    cdp_nccl_t nw = NULL;
    OK(cdp_nccl_world(world, gpu_dev, 60, &nw));
    CHECK(cdp_nccl_rank(nw) == R && cdp_nccl_size(nw) == N, "world rank %d/%d", cdp_nccl_rank(nw),
          cdp_nccl_size(nw));
    nccl_allreduce_checks(nw);
    nccl_zero_checks(nw);
    nccl_p2p_checks(nw);

    /* stages x replicas, as scen_split: world rank = replica * S + stage */
    int S = N % 2 == 0 ? 2 : 1, P = N / S, stage = R % S, replica = R / S, members[64];
    cdp_nccl_t dp = NULL, pp = NULL, some = (cdp_nccl_t)&some;
    OK(cdp_nccl_split(nw, stage, replica, &dp));
    OK(cdp_nccl_split(nw, replica, stage, &pp));
    CHECK(dp && pp && cdp_nccl_rank(dp) == replica && cdp_nccl_rank(pp) == stage, "split ranks");
    for (int r = 0; r < P; r++) members[r] = r * S + stage;
    nccl_check_members(dp, members, P, "stage group");
    for (int s = 0; s < S; s++) members[s] = replica * S + s;
    nccl_check_members(pp, members, S, "pipeline group");
    OK(cdp_nccl_split(nw, R == 0 ? -1 : 5, R, &some));
    if (R == 0) {
        CHECK(some == NULL, "color -1 gives NULL");
    } else {
        for (int r = 1; r < N; r++) members[r - 1] = r;
        nccl_check_members(some, members, N - 1, "group without rank 0");
    }
    cdp_nccl_free(some);
    cdp_nccl_free(pp);
    cdp_nccl_free(dp);
    cdp_nccl_free(nw);

    /* the failure path: abort everything, then every call says so */
    cdp_nccl_t w2 = NULL;
    OK(cdp_nccl_world(world, gpu_dev, 60, &w2));
    cdp_nccl_t half = NULL;
    OK(cdp_nccl_split(w2, 0, R, &half));
    cdp_nccl_abort_all();
    float one = 1;
    cdp_buffer_t b = gpu_buf(&one, sizeof one);
    CHECK(cdp_nccl_allreduce_f32(w2, cdp_buffer_data(b), 1, CDP_REDUCE_SUM, 10) == CDP_ERR_COMM &&
              strstr(cdp_last_error(), "aborted"),
          "%s", cdp_last_error());
    cdp_buffer_destroy(b);
    cdp_nccl_free(half);
    cdp_nccl_free(w2);
    cdp_device_close(gpu_dev);
    OK(cdp_comm_barrier(world, 30));
}

/* An all-reduce that rank 0 never joins: the last rank times out, finds the
 * communicator unusable, aborts every nccl communicator and ends the job with
 * exit code 42. */
static void scen_nccl_timeout(void)
{
    nccl_open();
    cdp_nccl_t nw = NULL;
    OK(cdp_nccl_world(world, gpu_dev, 60, &nw));
    if (N > 1 && R == N - 1) {
        float one = 1;
        cdp_buffer_t b = gpu_buf(&one, sizeof one);
        double t0 = now_s();
        cdp_status st = cdp_nccl_allreduce_f32(nw, cdp_buffer_data(b), 1, CDP_REDUCE_SUM, 0.5);
        double el = now_s() - t0;
        CHECK(st == CDP_ERR_COMM && strstr(cdp_last_error(), "timed out after 0.5 s") &&
                  strstr(cdp_last_error(), "all-reduce (sum) of 1 floats"),
              "status %d: %s", (int)st, cdp_last_error());
        CHECK(el >= 0.5, "after %.3f s", el);
        CHECK(cdp_nccl_allreduce_f32(nw, cdp_buffer_data(b), 1, CDP_REDUCE_SUM, 1) == CDP_ERR_COMM &&
                  strstr(cdp_last_error(), "unusable"),
              "%s", cdp_last_error());
        cdp_nccl_abort_all();
        printf("rank %d/%d: nccl_timeout ok\n", R, N);
        fflush(stdout);
        cdp_comm_abort(world, 42);
    }
    sleep_s(10); /* mpirun ends this rank within about a second of the abort */
    CHECK(0, "rank %d should have ended the job", N - 1);
}

/* cdp_train under MPI with a layout that differs on the last rank (an
 * embedding program whose ranks planned apart): every rank fails before the
 * first step, naming that rank, instead of waiting at a transfer. */
static void scen_layout_mismatch(void)
{
    struct cdp_plan *p = NULL;
    char json[512];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 16, \"context\": 8, \"layers\": 2, \"heads\": 2, "
             "\"embed\": 8}, \"train\": {\"steps\": 1, \"timeout_s\": 20}, \"parallel\": {\"stages\": %d, "
             "\"replicas\": 1, \"micro_batches\": %d}, \"cluster\": {\"backend\": \"cpu\"}}", N, N);
    CHECK(!cdp_plan_load_string(json, "mismatch.json", NULL, &p), "plan: %s", cdp_last_error());
    struct cdp_planned *planned = NULL;
    CHECK(!cdp_plan_layout(p, NULL, NULL, &planned), "planner: %s", cdp_last_error());
    struct cdp_layout *l = (struct cdp_layout *)cdp_planned_layout(planned);
    if (R == N - 1 && N > 1) { /* move the last boundary by one unit */
        CHECK(l->ranges[N - 1][1] - l->ranges[N - 1][0] > 1, "the last stage has one unit");
        l->ranges[N - 2][1]++;
        l->ranges[N - 1][0]++;
    }
    struct cdp_train_opts o = CDP_TRAIN_OPTS_INIT;
    o.world = CDP_TRAIN_MPI;
    const cdp_status st = cdp_train(p, l, &o, NULL);
    char want[64];
    snprintf(want, sizeof want, "rank %d's layout differs from rank 0's", N - 1);
    CHECK(st == CDP_ERR_INVALID && strstr(cdp_last_error(), want), "cdp_train gave %d: %s", (int)st,
          cdp_last_error());
    cdp_planned_free(planned);
    cdp_plan_free(p);
}

/* Non-blocking collectives (issue 17): several all-reduces, a windowed
 * reduce-scatter and an all-gather in flight at once on one communicator,
 * progressed by cdp_comm_test while the rank "computes", each bit-identical to
 * the blocking call on the same inputs; then a request whose peer never
 * joins times out at its wait, names the operation, and leaves the
 * communicator unusable. */
static void scen_iallreduce(void)
{
    enum { K = 3, NF = 1000 };
    float *a[K], *b[K];
    cdp_request_t rq[K + 2];
    for (int k = 0; k < K; k++) {
        a[k] = malloc(NF * sizeof(float));
        b[k] = malloc(NF * sizeof(float));
        CHECK(a[k] && b[k], "malloc");
        for (int i = 0; i < NF; i++) a[k][i] = b[k][i] = (float)(R + 1) * 0.1f + (float)(i * (k + 1)) * 1e-3f;
        OK(cdp_comm_allreduce_f32(world, b[k], NF, k == 2 ? CDP_REDUCE_MAX : CDP_REDUCE_SUM, 30));
    }
    float *w = malloc(NF * sizeof(float)), *wb = malloc(NF * sizeof(float)), *g = malloc(NF * sizeof(float));
    CHECK(w && wb && g, "malloc");
    for (int i = 0; i < NF; i++) w[i] = wb[i] = (float)(R * 7 + i) * 0.25f, g[i] = -1;
    OK(cdp_comm_reduce_scatter_window_f32(world, wb + 100, NF, 100, 500, CDP_REDUCE_SUM, 30));
    size_t off, len;
    cdp_comm_shard(NF, N, R, &off, &len);
    for (size_t i = off; i < off + len; i++) g[i] = (float)(R * 3 + (int)i);
    for (int k = 0; k < K; k++)
        OK(cdp_comm_iallreduce_f32(world, a[k], NF, k == 2 ? CDP_REDUCE_MAX : CDP_REDUCE_SUM, 30, &rq[k]));
    OK(cdp_comm_ireduce_scatter_window_f32(world, w + 100, NF, 100, 500, CDP_REDUCE_SUM, 30, &rq[K]));
    OK(cdp_comm_iallgather_f32(world, g, NF, 30, &rq[K + 1]));
    int left = K + 2;
    double t0 = now_s();
    while (left && now_s() - t0 < 30) {
        for (int k = 0; k < K + 2; k++) {
            if (!rq[k]) continue;
            int r = cdp_comm_test(rq[k]);
            CHECK(r >= 0, "request %d: %s", k, cdp_last_error());
            if (r) rq[k] = NULL, left--;
        }
        sleep_s(1e-4); /* the rank's compute */
    }
    CHECK(!left, "%d requests left after 30 s", left);
    for (int k = 0; k < K; k++)
        CHECK(!memcmp(a[k], b[k], NF * sizeof(float)), "all-reduce %d differs from the blocking one", k);
    uint64_t at, n;
    cdp_shard_in_window(NF, N, R, 100, 500, &at, &n);
    CHECK(!memcmp(w + 100 + at, wb + 100 + at, n * sizeof(float)), "the window's reduce-scatter differs");
    for (int r = 0; r < N; r++) {
        cdp_comm_shard(NF, N, r, &off, &len);
        for (size_t i = off; i < off + len; i++)
            CHECK(g[i] == (float)(r * 3 + (int)i), "all-gather [%zu] = %g", i, (double)g[i]);
    }
    for (int k = 0; k < K; k++) free(a[k]), free(b[k]);
    free(w), free(wb), free(g);
    cdp_request_t none = NULL;
    CHECK(cdp_comm_iallreduce_f32(world, NULL, 0, CDP_REDUCE_SUM, 1, &none) == CDP_OK && none, "empty");
    CHECK(cdp_comm_wait(none, 1) == CDP_OK, "%s", cdp_last_error());
    OK(cdp_comm_barrier(world, 30));
    if (N == 1) return;
    /* rank 1 never joins the next one */
    if (R == 0) {
        float v = 1;
        cdp_request_t q = NULL;
        OK(cdp_comm_iallreduce_f32(world, &v, 1, CDP_REDUCE_SUM, 0.3, &q));
        double t1 = now_s();
        cdp_status st = cdp_comm_wait(q, 0.3);
        CHECK(st == CDP_ERR_COMM && now_s() - t1 >= 0.3, "status %d after %.3f s", (int)st, now_s() - t1);
        CHECK(strstr(cdp_last_error(), "mpi rank 0/") && strstr(cdp_last_error(), "all-reduce (sum) of 1 floats: "
              "timed out after 0.3 s"), "%s", cdp_last_error());
        CHECK(cdp_comm_barrier(world, 1) == CDP_ERR_COMM && strstr(cdp_last_error(), "unusable"), "%s",
              cdp_last_error());
        printf("rank %d/%d: iallreduce ok\n", R, N);
        fflush(stdout);
        cdp_comm_abort(world, 42);
    }
    sleep_s(10); /* mpirun ends this rank within about a second of the abort */
    CHECK(0, "rank 0 should have ended the job");
}

static float tg_val(int k, int64_t i) { return (float)((k + 1) * 1000 + i); } /* exact in float, and their sums */

/* Sequence parallelism's moves (cdp_unit_seq_gather, cdp_unit_seq_scatter)
 * on the CPU kernels over tensor group tg of size ranks: B samples of T rows
 * of C, rank k's shard rows [k T/t, (k + 1) T/t) of each. */
static void seq_checks(const struct cdp_tensor_group *tg, int size)
{
    cdp_device_t dev = NULL;
    OK(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev));
    const struct cdp_kernels kk = { cdp_device_ops(dev), cdp_device_kernel_state(dev) };
    struct cdp_unit u;
    memset(&u, 0, sizeof u);
    u.desc.type = CDP_LAYER_TRANSFORMER_BLOCK;
    u.index = 3;
    u.tp_size = size;
    u.tp_index = tg->index;
    u.tp = tg;
    const int B = 2, k = tg->index;
    const int64_t T = 3 * size, C = 2, Tt = T / size, n = B * T * C;
    float *full = malloc((size_t)n * sizeof *full), *stage = malloc((size_t)n * sizeof *stage);
    float *shard = malloc((size_t)(B * Tt * C) * sizeof *shard);
    CHECK(full && stage && shard, "memory");
#define SEQ_VAL(j, b, row, c) ((float)((j) * 100000 + (b) * 1000 + (row) * 10 + (c)))
    for (int b = 0; b < B; b++)
        for (int64_t r = 0; r < Tt; r++)
            for (int64_t c = 0; c < C; c++) shard[(b * Tt + r) * C + c] = SEQ_VAL(0, b, k * Tt + r, c);
    for (int64_t i = 0; i < n; i++) full[i] = -12345.5f;
    OK(cdp_unit_seq_gather(&kk, &u, shard, full, stage, B, T, C));
    for (int b = 0; b < B; b++)
        for (int64_t row = 0; row < T; row++)
            for (int64_t c = 0; c < C; c++)
                CHECK(full[(b * T + row) * C + c] == SEQ_VAL(0, b, row, c),
                      "%d ranks: gathered sample %d row %lld col %lld = %g, expected %g", size, b, (long long)row,
                      (long long)c, (double)full[(b * T + row) * C + c], (double)SEQ_VAL(0, b, row, c));
    for (int b = 0; b < B; b++)
        for (int64_t row = 0; row < T; row++)
            for (int64_t c = 0; c < C; c++) full[(b * T + row) * C + c] = SEQ_VAL(k + 1, b, row, c);
    OK(cdp_unit_seq_scatter(&kk, &u, full, shard, stage, B, T, C));
    for (int b = 0; b < B; b++)
        for (int64_t r = 0; r < Tt; r++)
            for (int64_t c = 0; c < C; c++) {
                float want = 0;
                for (int j = 0; j < size; j++) want += SEQ_VAL(j + 1, b, k * Tt + r, c);
                CHECK(shard[(b * Tt + r) * C + c] == want,
                      "%d ranks: rank %d's scattered sample %d row %lld col %lld = %g, expected %g", size, k, b,
                      (long long)(k * Tt + r), (long long)c, (double)shard[(b * Tt + r) * C + c], (double)want);
            }
#undef SEQ_VAL
    if (size > 1) {
        CHECK(cdp_unit_seq_gather(&kk, &u, shard, full, stage, B, T + 1, C) == CDP_ERR_INVALID &&
                  strstr(cdp_last_error(), "unit 3: a sequence of") && strstr(cdp_last_error(), "does not split"),
              "%s", cdp_last_error());
        u.tp = NULL;
        CHECK(cdp_unit_seq_scatter(&kk, &u, full, shard, stage, B, T, C) == CDP_ERR_INTERNAL &&
                  strstr(cdp_last_error(), "has no tensor group"),
              "%s", cdp_last_error());
    }
    free(full);
    free(stage);
    free(shard);
    cdp_device_close(dev);
}

/* Unit i of a one-block GPT or Llama (the embedding, the transformer_block
 * or llama_block, the head)
 * run sequence parallel (cdp_unit_set_sequence_parallel) by rank k of tensor
 * group tg of size ranks equals the whole unit on one rank: its output and
 * input gradient are the whole's rows of its shard (the head's output: its
 * vocabulary columns of every row), its parameter gradients the whole's (a
 * slice's: the whole's slice; a norm's, summed over the group inside the
 * unit: the whole's), each to 1e-5 of its tensor's largest value. The
 * block's recomputed tail is the forward's to the bit. */
static void seq_unit_check(const struct cdp_tensor_group *tg, int size, const struct cdp_model_desc *md, int i)
{
    struct cdp_unit *one = NULL, *mine = NULL;
    int n = 0, m = 0;
    const int kx = tg->index;
    OK(cdp_units_build(md, &one, &n));
    OK(cdp_units_build_tensor(md, size, kx, &mine, &m));
    struct cdp_unit *w = &one[i], *u = &mine[i];
    u->tp = tg;
    const int emb = w->desc.type == CDP_LAYER_EMBEDDING, head = w->desc.type == CDP_LAYER_LM_HEAD;
    const int64_t T = w->out.d[0], C = emb ? w->out.d[1] : w->in.d[1], Ts = T / size;
    const int64_t V = head ? w->out.d[1] : C, Vr = head ? u->out.d[1] : C; /* the output's width, whole and here */
    int64_t off = 0, valid = V;
    if (head) CHECK(cdp_unit_vocab_split(u, &off, &valid), "the head splits by vocabulary");
    const int64_t act_before = u->act_floats;
    OK(cdp_unit_set_sequence_parallel(u));
    /* kept on the shard's rows: the block's output, res2 and norm statistics (GPT's mean and 1/std, Llama's
     * 1/rms); the embedding's output; the head's norm statistics */
    const int rms = w->desc.type == CDP_LAYER_LLAMA_BLOCK || (head && w->desc.rms);
    const int64_t gone = (T - Ts) * (emb ? C : head ? 2 - rms : 2 * C + 4 - 2 * rms);
    CHECK(u->act_floats == act_before - gone && u->keep_floats == u->act_floats,
          "unit %d: %lld floats kept a sample, expected %lld - %lld", i, (long long)u->act_floats,
          (long long)act_before, (long long)gone);
    CHECK(u->seq_parallel && (emb || u->in.d[0] == Ts) && (head || (u->out.d[0] == Ts && u->out_floats == Ts * C)),
          "unit %d: the shard [%lld, %lld] where the residual stream is", i, (long long)Ts, (long long)C);
    cdp_device_t dev = NULL;
    OK(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev));
    const struct cdp_kernels kk = { cdp_device_ops(dev), cdp_device_kernel_state(dev) };
    const int B = 2;
    float *wp[CDP_UNIT_MAX_PARAMS], *wg[CDP_UNIT_MAX_PARAMS], *up[CDP_UNIT_MAX_PARAMS], *ug[CDP_UNIT_MAX_PARAMS];
    for (int q = 0; q < w->n_params; q++) {
        wp[q] = malloc((size_t)w->params[q].numel * sizeof(float));
        wg[q] = calloc((size_t)w->params[q].numel, sizeof(float));
        up[q] = malloc((size_t)u->params[q].numel * sizeof(float));
        ug[q] = calloc((size_t)u->params[q].numel, sizeof(float));
        CHECK(wp[q] && wg[q] && up[q] && ug[q], "memory");
        cdp_param_init(w, q, 5, wp[q]);
        cdp_param_init(u, q, 5, up[q]);
        if (u->params[q].shard_dim < 0) /* the norms start at 1 and 0: make them count */
            for (int64_t e = 0; e < w->params[q].numel; e++)
                up[q][e] = wp[q][e] += 0.01f * (float)((e * 7 + q) % 13) - 0.05f;
    }
    const int64_t n_in = B * T * (emb ? 1 : C), n_out = B * T * V, n_outr = head ? B * T * Vr : B * Ts * C;
    float *x = malloc((size_t)n_in * sizeof *x), *dy = malloc((size_t)n_out * sizeof *dy);
    float *dx = calloc((size_t)n_in, sizeof *dx), *xs = malloc((size_t)n_in * sizeof *xs);
    float *dys = calloc((size_t)n_outr, sizeof *dys), *dxs = calloc((size_t)n_in, sizeof *dxs);
    /* the rank's activations and scratch exactly as the unit says, then a guard that must stay */
    enum { GUARD = 64 };
    const int64_t n_ua = B * u->act_floats, n_us = cdp_unit_scratch_floats(u, B);
    float *wa = calloc((size_t)(B * w->act_floats), sizeof *wa), *ua = calloc((size_t)(n_ua + GUARD), sizeof *ua);
    float *ws = calloc((size_t)cdp_unit_scratch_floats(w, B) + 1, sizeof *ws);
    float *us = calloc((size_t)(n_us + GUARD), sizeof *us);
    for (int e = 0; ua && us && e < GUARD; e++) ua[n_ua + e] = us[n_us + e] = 777.25f;
    CHECK(x && dy && dx && xs && dys && dxs && wa && ua && ws && us, "memory");
    for (int64_t e = 0; e < n_in; e++) {
        if (emb) ((int32_t *)x)[e] = (int32_t)((e * 5 + 3) % 11);
        else x[e] = sinf(0.37f * (float)e) + 0.1f * (float)(e % 5);
    }
    for (int64_t e = 0; e < n_out; e++) dy[e] = cosf(0.23f * (float)e);
    if (emb) memcpy(xs, x, (size_t)n_in * sizeof *xs); /* every token id on every rank */
    else
        for (int b = 0; b < B; b++) memcpy(xs + b * Ts * C, x + (b * T + kx * Ts) * C, (size_t)(Ts * C) * sizeof *xs);
    for (int b = 0; b < B; b++)
        for (int64_t r = 0; r < (head ? T : Ts); r++)
            for (int64_t c = 0; c < (head ? valid : C); c++)
                dys[(b * (head ? T : Ts) + r) * Vr + c] = head ? dy[(b * T + r) * V + off + c]
                                                               : dy[(b * T + kx * Ts + r) * C + c];
    OK(cdp_unit_forward(&kk, w, wp, x, wa, ws, B));
    OK(cdp_unit_backward(&kk, w, wp, wg, x, wa, dy, emb ? NULL : dx, ws, B));
    OK(cdp_unit_forward(&kk, u, up, xs, ua, us, B));
    /* the block: its tail computed again, gathered again, the same to the bit */
    const int64_t tail_n = B * cdp_unit_tail_floats(u);
    float *tail = ua + B * (u->act_floats - cdp_unit_tail_floats(u));
    if (tail_n > 0) {
        float *kept = malloc((size_t)tail_n * sizeof *kept);
        CHECK(kept, "memory");
        memcpy(kept, tail, (size_t)tail_n * sizeof *kept);
        for (int64_t e = 0; e < tail_n; e++) tail[e] = -12345.5f;
        OK(cdp_unit_recompute_tail(&kk, u, up, xs, ua, tail, us, B));
        CHECK(!memcmp(kept, tail, (size_t)tail_n * sizeof *kept), "%d ranks: unit %d's recomputed tail differs", size,
              i);
        free(kept);
    }
    OK(cdp_unit_backward(&kk, u, up, ug, xs, ua, dys, emb ? NULL : dxs, us, B));
    for (int e = 0; e < GUARD; e++)
        CHECK(ua[n_ua + e] == 777.25f && us[n_us + e] == 777.25f, "unit %d wrote past its %s", i,
              ua[n_ua + e] != 777.25f ? "activations" : "scratch");
    for (int f = 0; f < 2; f++) {
        if (f && emb) break; /* tokens: no input gradient */
        const float *whole = f ? dx : wa, *got = f ? dxs : ua;
        const int64_t W = f ? C : V, nw = f ? n_in : n_out;
        float big = 0;
        for (int64_t e = 0; e < nw; e++) big = fmaxf(big, fabsf(whole[e]));
        CHECK(big > 0, "unit %d: a zero %s tests nothing", i, f ? "input gradient" : "output");
        const int rowsplit = f || !head; /* the shard's rows, or the head's logits: its columns */
        for (int b = 0; b < B; b++)
            for (int64_t r = 0; r < (rowsplit ? Ts : T); r++)
                for (int64_t c = 0; c < (rowsplit ? W : valid); c++) {
                    const float want = rowsplit ? whole[(b * T + kx * Ts + r) * W + c] : whole[(b * T + r) * W + off + c];
                    const float g = rowsplit ? got[(b * Ts + r) * W + c] : got[(b * T + r) * Vr + c];
                    CHECK(fabsf(g - want) <= 1e-5f * big, "%d ranks: rank %d's unit %d %s [%d, %lld, %lld] = %.9g, "
                          "the whole's %.9g", size, kx, i, f ? "input gradient" : "output", b,
                          (long long)(rowsplit ? kx * Ts + r : r), (long long)c, (double)g, (double)want);
                }
    }
    for (int q = 0; q < w->n_params; q++) {
        const struct cdp_param_desc *s = &u->params[q];
        float *want = calloc((size_t)s->numel, sizeof *want);
        CHECK(want, "memory");
        if (s->shard_dim < 0) memcpy(want, wg[q], (size_t)s->numel * sizeof *want);
        else cdp_param_slice_copy(s, wg[q], want, 0);
        float big = 0;
        for (int64_t e = 0; e < s->numel; e++) big = fmaxf(big, fabsf(want[e]));
        CHECK(big > 0, "%s: a zero gradient tests nothing", s->name);
        for (int64_t e = 0; e < s->numel; e++)
            CHECK(fabsf(ug[q][e] - want[e]) <= 1e-5f * big, "%d ranks: rank %d's gradient of unit %d's %s [%lld] = "
                  "%.9g, the whole's %.9g", size, kx, i, s->name, (long long)e, (double)ug[q][e], (double)want[e]);
        free(want);
    }
    /* split backward (B, then W from the W-state): the combined backward's bits */
    float *wsb = calloc((size_t)(B * u->wstate_floats) + 1, sizeof *wsb), *dx2 = calloc((size_t)n_in, sizeof *dx2);
    CHECK(wsb && dx2, "memory");
    float *ug2[CDP_UNIT_MAX_PARAMS];
    for (int q = 0; q < u->n_params; q++) CHECK((ug2[q] = calloc((size_t)u->params[q].numel, sizeof(float))), "memory");
    OK(cdp_unit_backward_input(&kk, u, up, xs, ua, tail, dys, emb ? NULL : dx2, wsb, us, B));
    OK(cdp_unit_backward_weight(&kk, u, up, ug2, xs, ua, tail, cdp_unit_weight_takes_dout(u) ? dys : NULL, wsb, us, B));
    CHECK(emb || !memcmp(dx2, dxs, (size_t)n_in * sizeof *dx2), "%d ranks: unit %d's split backward's input gradient "
          "differs from the combined one's", size, i);
    for (int q = 0; q < u->n_params; q++) {
        for (int64_t e = 0; e < u->params[q].numel; e++)
            CHECK(ug2[q][e] == ug[q][e], "%d ranks: unit %d's split backward's gradient of %s [%lld] = %.9g, the "
                  "combined one's %.9g", size, i, u->params[q].name, (long long)e, (double)ug2[q][e], (double)ug[q][e]);
        free(ug2[q]);
    }
    free(wsb);
    free(dx2);
    for (int q = 0; q < w->n_params; q++) {
        free(wp[q]);
        free(wg[q]);
        free(up[q]);
        free(ug[q]);
    }
    free(x), free(dy), free(dx), free(xs), free(dys), free(dxs), free(wa), free(ua), free(ws), free(us);
    cdp_device_close(dev);
    free(one);
    free(mine);
}

static void seq_block_checks(const struct cdp_tensor_group *tg, int size)
{
    struct cdp_plan *p = NULL;
    /* a vocabulary of 11: padded at t = 2 and 4 */
    OK(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt\", \"vocab\": 11, \"context\": 8, \"layers\": 1, "
                            "\"heads\": 4, \"embed\": 16}}", "sp.json", NULL, &p));
    struct cdp_machine_info mi = { 0, NULL };
    OK(cdp_plan_resolve(p, &mi));
    for (int i = 0; i < 3; i++) seq_unit_check(tg, size, &p->model, i);
    struct cdp_plan *lp = NULL;
    /* Llama: grouped-query attention (2 heads a kv head) split over 4, an untied head with its RMS norm */
    OK(cdp_plan_load_string("{\"model\": {\"preset\": \"llama\", \"vocab\": 11, \"context\": 8, \"layers\": 1, "
                            "\"heads\": 8, \"kv_heads\": 4, \"dim\": 32, \"hidden\": 24}}", "sp-llama.json", NULL,
                            &lp));
    OK(cdp_plan_resolve(lp, &mi));
    for (int i = 0; i < 3; i++) seq_unit_check(tg, size, &lp->model, i);
    cdp_plan_free(lp);
    struct cdp_unit *mine = NULL;
    int m = 0;
    OK(cdp_units_build_tensor(&p->model, size, tg->index, &mine, &m));
    CHECK(cdp_unit_set_sequence_parallel(&mine[0]) == CDP_OK, "%s", cdp_last_error());
    mine[1].in.d[0] = 7; /* a sequence t does not divide */
    mine[1].out.d[0] = 7;
    CHECK(cdp_unit_set_sequence_parallel(&mine[1]) == CDP_ERR_INVALID && strstr(cdp_last_error(), "does not split"),
          "%s", cdp_last_error());
    free(mine);
    cdp_plan_free(p);
}

/* The executor's tensor group (cdp_exec_tensor_group) on a communicator of
 * size ranks: its all-reduce sums, its reduce-scatter leaves rank k part k of
 * the sum (n/size floats in rank order), its all-gather makes every rank's
 * part whole everywhere, and a count size does not divide is refused before
 * any traffic. */
static void tensor_group_checks(cdp_comm_t c, int size)
{
    struct exec e;
    memset(&e, 0, sizeof e);
    e.tpc = c;
    e.timeout = 30;
    const struct cdp_tensor_group tg = cdp_exec_tensor_group(&e);
    const int k = cdp_comm_rank(c);
    CHECK(tg.size == size && tg.index == k && tg.ctx == &e, "size %d index %d, expected %d and %d", tg.size,
          tg.index, size, k);
    CHECK(tg.all_reduce && tg.reduce_scatter && tg.all_gather, "a collective missing");
    const int64_t per = 5, n = per * size;
    float *b = malloc((size_t)(n + 1) * sizeof *b);
    CHECK(b, "memory");
    for (int64_t i = 0; i < n; i++) b[i] = tg_val(k, i);
    OK(tg.all_reduce(tg.ctx, b, n));
    for (int64_t i = 0; i < n; i++) {
        float want = 0;
        for (int j = 0; j < size; j++) want += tg_val(j, i);
        CHECK(b[i] == want, "%d ranks: all-reduce [%lld] = %g, expected %g", size, (long long)i, (double)b[i],
              (double)want);
    }
    for (int64_t i = 0; i < n; i++) b[i] = tg_val(k, i);
    OK(tg.reduce_scatter(tg.ctx, b, n));
    for (int64_t i = k * per; i < (k + 1) * per; i++) {
        float want = 0;
        for (int j = 0; j < size; j++) want += tg_val(j, i);
        CHECK(b[i] == want, "%d ranks: rank %d's part [%lld] = %g after the reduce-scatter, expected %g", size, k,
              (long long)i, (double)b[i], (double)want);
    }
    for (int64_t i = 0; i < n; i++) b[i] = i / per == k ? tg_val(k, i) : -12345.5f;
    OK(tg.all_gather(tg.ctx, b, n));
    for (int64_t i = 0; i < n; i++)
        CHECK(b[i] == tg_val((int)(i / per), i), "%d ranks: all-gather [%lld] = %g, expected rank %lld's %g", size,
              (long long)i, (double)b[i], (long long)(i / per), (double)tg_val((int)(i / per), i));
    if (size > 1) {
        CHECK(tg.reduce_scatter(tg.ctx, b, n + 1) == CDP_ERR_INVALID &&
                  strstr(cdp_last_error(), "not") && strstr(cdp_last_error(), "equal parts"),
              "%s", cdp_last_error());
        CHECK(tg.all_gather(tg.ctx, b, n - 1) == CDP_ERR_INVALID && strstr(cdp_last_error(), "equal parts"), "%s",
              cdp_last_error());
    }
    free(b);
    seq_checks(&tg, size);
    if (size == 2 || size == 4) seq_block_checks(&tg, size); /* the model's 4 heads and 8 positions split */
    /* the group still works after the refusals: nothing was sent */
    float one = 1;
    OK(tg.all_reduce(tg.ctx, &one, 1));
    CHECK(one == (float)size, "sum of ones %g on %d ranks", (double)one, size);
}

/* Tensor groups as the executor splits them (color: the group, key: the
 * index): the whole job, pairs, and single ranks. */
static void scen_tensor_group(void)
{
    const int sizes[] = { N, 2, 1 };
    for (size_t q = 0; q < sizeof sizes / sizeof *sizes; q++) {
        const int size = sizes[q];
        if (size > N || N % size) continue;
        cdp_comm_t c = NULL;
        OK(cdp_comm_split(world, R / size, R % size, &c));
        CHECK(c && cdp_comm_size(c) == size && cdp_comm_rank(c) == R % size, "group of %d", size);
        tensor_group_checks(c, size);
        cdp_comm_free(c);
    }
    OK(cdp_comm_barrier(world, 30));
}

static const struct {
    const char *name;
    void (*run)(void);
} scenarios[] = {
    { "world", scen_world },     { "split", scen_split },     { "allreduce", scen_allreduce },
    { "p2p", scen_p2p },         { "gather", scen_gather },   { "barrier", scen_barrier },
    { "timeout", scen_timeout }, { "errors", scen_errors },   { "bigmsg", scen_bigmsg },
    { "allreduce_timeout", scen_allreduce_timeout },          { "abort", scen_abort },
    { "kill", scen_kill },       { "bcast", scen_bcast },     { "bcast_timeout", scen_bcast_timeout },
    { "nccl_refused", scen_nccl_refused },                    { "nccl", scen_nccl },
    { "nccl_fake", scen_nccl_fake },
    { "nccl_timeout", scen_nccl_timeout },
    { "zero", scen_zero },       { "zero_timeout", scen_zero_timeout },
    { "layout_mismatch", scen_layout_mismatch },
    { "iallreduce", scen_iallreduce },
    { "tensor_group", scen_tensor_group },
    { "bf16", scen_bf16 },
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: comm_probe SCENARIO\n");
        return 2;
    }
    void (*run)(void) = NULL;
    for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++)
        if (!strcmp(argv[1], scenarios[i].name)) run = scenarios[i].run;
    if (!run) {
        fprintf(stderr, "comm_probe: unknown scenario %s\n", argv[1]);
        return 2;
    }
    if (cdp_comm_world(&world)) {
        fprintf(stderr, "comm_probe: %s\n", cdp_last_error());
        return 1;
    }
    R = cdp_comm_rank(world);
    N = cdp_comm_size(world);
    run();
    printf("rank %d/%d: %s ok\n", R, N, argv[1]);
    fflush(stdout);
    cdp_comm_free(world);
    return 0;
}
