/* Speed of the mpi communicator against plain MPI calls on the same ranks:
 * ping-pong latency and bandwidth (8 B .. 64 MiB, ranks 0 and 1), the cost of
 * the deadline loop's sleeping when a reply comes late (latency added, CPU the
 * waiter burns), and all-reduce bandwidth (1 KiB .. 256 MiB of floats, every
 * rank). Times are medians over repetitions, the slowest rank's.
 * usage: mpirun -np 2 bench-comm [pingpong|late|allreduce|all] [max MiB for all-reduce] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cdp/core.h"
#include "comm/comm.h"

static cdp_comm_t world;
static int R, N;

static void die(const char *what)
{
    fprintf(stderr, "bench-comm rank %d: %s: %s\n", R, what, cdp_last_error());
    cdp_comm_abort(world, 1);
}

/* The slowest rank's value. */
static double slowest(double t)
{
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void spin_for(double s)
{
    uint64_t t0 = cdp_time_ns();
    while ((double)(cdp_time_ns() - t0) * 1e-9 < s) {
    }
}

/* One round trip of n bytes between ranks 0 and 1, through cdp or plain MPI. */
static void round_trip(int use_cdp, char *buf, size_t n, double delay_s)
{
    int peer = 1 - R;
    if (use_cdp) {
        cdp_request_t q;
        if (R == 0) {
            if (cdp_comm_isend(world, buf, n, peer, 1, &q) || cdp_comm_wait(q, 60)) die("send");
            if (cdp_comm_irecv(world, buf, n, peer, 2, &q) || cdp_comm_wait(q, 60)) die("receive");
        } else {
            if (cdp_comm_irecv(world, buf, n, peer, 1, &q) || cdp_comm_wait(q, 60)) die("receive");
            if (delay_s > 0) spin_for(delay_s);
            if (cdp_comm_isend(world, buf, n, peer, 2, &q) || cdp_comm_wait(q, 60)) die("send");
        }
    } else {
        if (R == 0) {
            MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (delay_s > 0) spin_for(delay_s);
            MPI_Send(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
        }
    }
}

/* Median one-way time (half a round trip) in seconds. */
static double pingpong_time(int use_cdp, char *buf, size_t n)
{
    int reps = n <= 65536 ? 1000 : n <= (1u << 22) ? 50 : 8;
    double t[7];
    for (int w = 0; w < reps / 10 + 1; w++) round_trip(use_cdp, buf, n, 0);
    for (int k = 0; k < 7; k++) {
        uint64_t t0 = cdp_time_ns();
        for (int i = 0; i < reps; i++) round_trip(use_cdp, buf, n, 0);
        t[k] = (double)(cdp_time_ns() - t0) * 1e-9 / reps / 2;
    }
    return cdp_bench_median(t, 7);
}

static void bench_pingpong(void)
{
    if (N < 2) return;
    size_t max = (size_t)64 << 20;
    char *buf = calloc(1, max);
    if (!buf) die("memory");
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, R < 2 ? 0 : MPI_UNDEFINED, R, &pair);
    if (R == 0) {
        printf("\nping-pong, ranks 0 and 1 (one-way time = half the round trip)\n");
        printf("%10s  %12s %10s  %12s %10s\n", "bytes", "cdp us", "cdp GB/s", "MPI us", "MPI GB/s");
    }
    if (R < 2)
        for (size_t n = 8; n <= max; n *= 2) {
            double a = pingpong_time(1, buf, n), b = pingpong_time(0, buf, n);
            MPI_Allreduce(MPI_IN_PLACE, &a, 1, MPI_DOUBLE, MPI_MAX, pair);
            MPI_Allreduce(MPI_IN_PLACE, &b, 1, MPI_DOUBLE, MPI_MAX, pair);
            if (R == 0)
                printf("%10zu  %12.2f %10.3f  %12.2f %10.3f\n", n, a * 1e6, (double)n / a * 1e-9, b * 1e6,
                       (double)n / b * 1e-9);
            fflush(stdout);
        }
    if (pair != MPI_COMM_NULL) MPI_Comm_free(&pair);
    MPI_Barrier(MPI_COMM_WORLD);
    free(buf);
}

/* A reply that comes `delay` late: what the waiting rank pays in latency on
 * top of the delay, and how much of its core it burns meanwhile. */
static void bench_late(void)
{
    if (N < 2) return;
    static const double delays[] = { 20e-6, 100e-6, 1e-3, 5e-3, 20e-3 };
    char buf[64] = { 0 };
    if (R == 0) {
        printf("\nlate reply (64 B, rank 1 answers after a delay): added latency and waiter CPU\n");
        printf("%10s  %14s %10s  %14s %10s\n", "delay us", "cdp added us", "cdp CPU%", "MPI added us", "MPI CPU%");
    }
    if (R < 2) {
        double base[2] = { pingpong_time(1, buf, 64) * 2, pingpong_time(0, buf, 64) * 2 };
        for (size_t d = 0; d < sizeof delays / sizeof *delays; d++) {
            double added[2], cpu[2];
            int reps = delays[d] < 1e-3 ? 200 : delays[d] < 10e-3 ? 40 : 10;
            for (int m = 0; m < 2; m++) {
                int use_cdp = m == 0;
                double t[9], c[9];
                for (int k = 0; k < 9; k++) {
                    double c0 = cpu_s();
                    uint64_t t0 = cdp_time_ns();
                    for (int i = 0; i < reps; i++) round_trip(use_cdp, buf, sizeof buf, delays[d]);
                    t[k] = (double)(cdp_time_ns() - t0) * 1e-9 / reps;
                    c[k] = (cpu_s() - c0) / reps;
                }
                double tm = cdp_bench_median(t, 9), cm = cdp_bench_median(c, 9);
                added[m] = (tm - delays[d] - base[m]) * 1e6;
                cpu[m] = 100.0 * cm / tm;
            }
            if (R == 0)
                printf("%10.0f  %14.1f %10.1f  %14.1f %10.1f\n", delays[d] * 1e6, added[0], cpu[0], added[1], cpu[1]);
            fflush(stdout);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void bench_allreduce(size_t max_bytes)
{
    float *buf = calloc(1, max_bytes);
    if (!buf) die("memory");
    if (R == 0) {
        printf("\nall-reduce (sum, floats, in place) on %d ranks: algorithm bandwidth = bytes / time\n", N);
        printf("%12s  %10s %10s  %10s %10s  %10s %10s\n", "bytes", "cdp ms", "cdp GB/s", "Iallr ms", "Iallr GB/s",
               "Allred ms", "Allr GB/s");
    }
    for (size_t n = 1024; n <= max_bytes; n *= 4) {
        size_t count = n / sizeof(float);
        int reps = n <= (1u << 16) ? 200 : n <= (1u << 22) ? 20 : n <= (1u << 26) ? 5 : 3;
        double res[3];
        for (int m = 0; m < 3; m++) {
            double t[5];
            for (int k = -1; k < 5; k++) {
                MPI_Barrier(MPI_COMM_WORLD);
                uint64_t t0 = cdp_time_ns();
                for (int i = 0; i < reps; i++) {
                    if (m == 0) {
                        if (cdp_comm_allreduce_f32(world, buf, count, CDP_REDUCE_SUM, 120)) die("all-reduce");
                    } else if (m == 1) {
                        MPI_Request q;
                        MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
                        MPI_Wait(&q, MPI_STATUS_IGNORE);
                    } else {
                        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                    }
                }
                if (k >= 0) t[k] = slowest((double)(cdp_time_ns() - t0) * 1e-9 / reps);
            }
            res[m] = cdp_bench_median(t, 5);
        }
        if (R == 0)
            printf("%12zu  %10.3f %10.3f  %10.3f %10.3f  %10.3f %10.3f\n", n, res[0] * 1e3, (double)n / res[0] * 1e-9,
                   res[1] * 1e3, (double)n / res[1] * 1e-9, res[2] * 1e3, (double)n / res[2] * 1e-9);
        fflush(stdout);
    }
    free(buf);
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "all";
    size_t max_mib = argc > 2 ? (size_t)atoi(argv[2]) : 256;
    if (cdp_comm_world(&world)) {
        fprintf(stderr, "bench-comm: %s\n", cdp_last_error());
        return 1;
    }
    if (strcmp(cdp_comm_name(world), "mpi")) {
        fprintf(stderr, "bench-comm: run under mpirun (e.g. mpirun -np 2 bench-comm)\n");
        cdp_comm_free(world);
        return 2;
    }
    R = cdp_comm_rank(world);
    N = cdp_comm_size(world);
    if (R == 0) printf("bench-comm: %d ranks\n", N);
    if (!strcmp(what, "pingpong") || !strcmp(what, "all")) bench_pingpong();
    if (!strcmp(what, "late") || !strcmp(what, "all")) bench_late();
    if (!strcmp(what, "allreduce") || !strcmp(what, "all")) bench_allreduce(max_mib << 20);
    cdp_comm_free(world);
    return 0;
}
