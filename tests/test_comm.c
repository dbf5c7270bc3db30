/* Suite comm: the self communicator in process, and the mpi communicator
 * through tests/comm_probe.c run under `mpirun -np N` (1, 2, 3 and 4 ranks on
 * two cores, so 4 is oversubscribed), including a rank that aborts the job
 * and a rank that is killed; ZeRO's reduce-scatter and all-gather against the
 * all-reduce. The nccl communicator: its refusals (no GPU, a
 * CPU device, no module) and its front's whole life cycle (through the
 * stand-in module of tests/fake-cuda) everywhere; NCCL itself in the tests
 * named `..._needs_gpu`, which skip where no GPU is lent. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp_config.h"
#include "comm/comm.h"
#include "comm/nccl.h"
#include "device/backend.h"
#include "fake-cuda/fake_stats.h"

static double now_s(void) { return (double)cdp_time_ns() * 1e-9; }

/* ---- self ------------------------------------------------------------------- */

static cdp_comm_t self_comm(void)
{
    cdp_comm_t c = NULL;
    cr_assert_eq(cdp_comm_self(&c), CDP_OK, "%s", cdp_last_error());
    return c;
}

/* fn, in a child process, ends it with SIGABRT and an assertion's line
 * holding `want` on stderr (kept out of the suite's own log, where a
 * programmer error that is expected would read as a real one). */
static void expect_assertion(void (*fn)(void), const char *want)
{
    char path[] = "/tmp/cdp-comm-abort-XXXXXX";
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    unlink(path);
    fflush(stderr);
    const pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(fd, 2);
        fn();
        _exit(0);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    char err[2048] = "";
    const ssize_t n = pread(fd, err, sizeof err - 1, 0);
    if (n > 0) err[n] = '\0';
    close(fd);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status %#x: %s", status, err);
    cr_assert(strstr(err, "cdphybrid: assertion failed at ") && strstr(err, want), "%s", err);
}

Test(comm, self_is_one_rank)
{
    cdp_comm_t c = self_comm();
    cr_assert_str_eq(cdp_comm_name(c), "self");
    cr_assert_eq(cdp_comm_rank(c), 0);
    cr_assert_eq(cdp_comm_size(c), 1);
    cr_assert_eq(cdp_comm_barrier(c, 1), CDP_OK);
    cdp_comm_free(c);
    cdp_comm_free(NULL);
}

Test(comm, world_without_a_launcher_is_self)
{
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMIX_RANK");
    unsetenv("PMI_SIZE");
    cr_assert_not(cdp_comm_launched_by_mpi());
    cdp_comm_t w = NULL;
    cr_assert_eq(cdp_comm_world(&w), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(cdp_comm_name(w), "self");
    cr_assert_eq(cdp_comm_size(w), 1);
    cdp_comm_free(w);
    setenv("PMI_SIZE", "1", 1);
    cr_assert_not(cdp_comm_launched_by_mpi(), "a world of one under PMI is no launch");
    setenv("PMI_SIZE", "4", 1);
    cr_assert(cdp_comm_launched_by_mpi());
    unsetenv("PMI_SIZE");
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    cr_assert(cdp_comm_launched_by_mpi());
}

Test(comm, world_under_a_launcher_without_mpi_is_self_and_says_launched)
{
    if (cdp_comm_have_mpi()) cr_skip_test("this build has MPI; the probe tests cover the launched world");
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    cr_assert(cdp_comm_launched_by_mpi(), "the caller can refuse a multi-rank launch");
    cdp_comm_t w = NULL;
    cr_assert_eq(cdp_comm_world(&w), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(cdp_comm_name(w), "self");
    cdp_comm_free(w);
}

Test(comm, self_split_gives_self_or_null)
{
    cdp_comm_t c = self_comm(), a = NULL, b = (cdp_comm_t)&b;
    cr_assert_eq(cdp_comm_split(c, 3, 7, &a), CDP_OK);
    cr_assert_not_null(a);
    cr_assert_neq(a, c, "a new communicator");
    cr_assert_str_eq(cdp_comm_name(a), "self");
    cr_assert_eq(cdp_comm_size(a), 1);
    cr_assert_eq(cdp_comm_split(c, -1, 0, &b), CDP_OK);
    cr_assert_null(b, "color < 0: not a member");
    cdp_comm_free(a);
    cdp_comm_free(c);
}

Test(comm, self_allreduce_leaves_the_values)
{
    cdp_comm_t c = self_comm();
    float f[3] = { 1.5f, -2.0f, 3.25f };
    double d[2] = { 1e300, -7.0 };
    for (int op = 0; op < CDP_REDUCE_OP_COUNT; op++) {
        cr_assert_eq(cdp_comm_allreduce_f32(c, f, 3, (enum cdp_reduce_op)op, 1), CDP_OK);
        cr_assert_eq(cdp_comm_allreduce_f64(c, d, 2, (enum cdp_reduce_op)op, 1), CDP_OK);
    }
    cr_assert(f[0] == 1.5f && f[1] == -2.0f && f[2] == 3.25f);
    cr_assert(d[0] == 1e300 && d[1] == -7.0);
    cr_assert_eq(cdp_comm_allreduce_f32(c, f, 3, CDP_REDUCE_OP_COUNT, 1), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "reduce op"), "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_allreduce_f32(c, NULL, 3, CDP_REDUCE_SUM, 1), CDP_ERR_INVALID);
    cr_assert_eq(cdp_comm_allreduce_f32(c, NULL, 0, CDP_REDUCE_SUM, 1), CDP_OK);
    cdp_comm_free(c);
}

/* The rule against its statement, by brute force: R contiguous shards in
 * rank order that cover n, the first n % R one longer. */
Test(comm, shards_cover_the_buffer_in_rank_order)
{
    for (int R = 1; R <= 9; R++) {
        for (size_t n = 0; n <= 60; n++) {
            size_t next = 0;
            for (int r = 0; r < R; r++) {
                size_t off = 7, len = 7;
                cdp_comm_shard(n, R, r, &off, &len);
                cr_assert_eq(off, next, "n %zu, R %d: shard %d starts at %zu, expected %zu", n, R, r, off, next);
                size_t want = n / (size_t)R + ((size_t)r < n % (size_t)R ? 1 : 0);
                cr_assert_eq(len, want, "n %zu, R %d: shard %d has %zu, expected %zu", n, R, r, len, want);
                next += len;
            }
            cr_assert_eq(next, n, "n %zu, R %d: the shards cover %zu", n, R, next);
        }
    }
    size_t off = 0, len = 0, big = (size_t)-1; /* no overflow at the top of size_t */
    cdp_comm_shard(big, 3, 2, &off, &len);
    cr_assert_eq(off + len, big);
    cr_assert_eq(len, big / 3);
}

static void shard_outside(void)
{
    size_t off, len;
    cdp_comm_shard(10, 2, 2, &off, &len);
}

Test(comm, shard_of_a_rank_outside_the_group_is_a_programmer_error)
{
    expect_assertion(shard_outside, "r < R");
}

Test(comm, self_reduce_scatter_and_allgather_leave_the_values)
{
    cdp_comm_t c = self_comm();
    float f[3] = { 1.5f, -2.0f, 3.25f };
    for (int op = 0; op < CDP_REDUCE_OP_COUNT; op++)
        cr_assert_eq(cdp_comm_reduce_scatter_f32(c, f, 3, (enum cdp_reduce_op)op, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_allgather_f32(c, f, 3, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert(f[0] == 1.5f && f[1] == -2.0f && f[2] == 3.25f);
    cr_assert_eq(cdp_comm_reduce_scatter_f32(c, NULL, 0, CDP_REDUCE_SUM, 1), CDP_OK);
    cr_assert_eq(cdp_comm_allgather_f32(c, NULL, 0, 1), CDP_OK);
    cr_assert_eq(cdp_comm_reduce_scatter_f32(c, f, 3, CDP_REDUCE_OP_COUNT, 1), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "self rank 0/1: reduce-scatter: unknown reduce op 3"), "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_reduce_scatter_f32(c, NULL, 3, CDP_REDUCE_AVG, 1), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "self rank 0/1: reduce-scatter of 3 floats: buffer is NULL"), "%s",
              cdp_last_error());
    cr_assert_eq(cdp_comm_allgather_f32(c, NULL, 3, 1), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "self rank 0/1: all-gather of 3 floats: buffer is NULL"), "%s",
              cdp_last_error());
    cr_assert_eq(cdp_comm_reduce_scatter_f32(NULL, f, 3, CDP_REDUCE_SUM, 1), CDP_ERR_INVALID);
    cr_assert_eq(cdp_comm_reduce_scatter_window_f32(c, f + 1, 3, 1, 2, CDP_REDUCE_SUM, 1), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert_eq(cdp_comm_reduce_scatter_window_f32(c, f, 3, 1, 3, CDP_REDUCE_SUM, 1), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "reduce-scatter of floats [1, 4) of a 3-float buffer"), "%s",
              cdp_last_error());
    cr_assert_eq(cdp_comm_allgather_f32(NULL, f, 3, 1), CDP_ERR_INVALID);
    cdp_comm_free(c);
}

/* The bf16 wire's sum, pair by pair against values worked out by hand
 * (bf16 of 1.0 is 0x3F80 and its ulp there 2^-7): exact sums, ties to even
 * (up and down), nearest otherwise, signs, and infinities and NaN passing
 * through as fp32's sum gives them. */
Test(comm, bf16_sum_rounds_to_nearest_even)
{
    static const struct {
        uint16_t a, b, want;
        const char *what;
    } cases[] = {
        {0x3F80, 0x3F80, 0x4000, "1 + 1 = 2, exact"},
        {0x3F80, 0x3C00, 0x3F81, "1 + 2^-7 = 1.0078125, exact"},
        {0x3F80, 0x3B80, 0x3F80, "1 + 2^-8: a tie, to the even 1.0"},
        {0x3F80, 0x3C40, 0x3F82, "1 + 1.5 x 2^-7: a tie, to the even 1.015625"},
        {0x3F80, 0x3C20, 0x3F81, "1 + 1.25 x 2^-7: nearest is 1.0078125"},
        {0x3F80, 0x3C60, 0x3F82, "1 + 1.75 x 2^-7: nearest is 1.015625"},
        {0xBF80, 0xBB80, 0xBF80, "-1 - 2^-8: a tie, to the even -1.0"},
        {0xBF80, 0xBC40, 0xBF82, "-1 - 1.5 x 2^-7: a tie, to the even -1.015625"},
        {0xBF80, 0x3F00, 0xBF00, "-1 + 0.5 = -0.5"},
        {0x3F80, 0xBF80, 0x0000, "1 - 1 = +0"},
        {0x7F7F, 0x7F7F, 0x7F80, "the largest finite twice overflows to +inf"},
        {0x7F80, 0x3F80, 0x7F80, "+inf + 1 = +inf"},
        {0xFF80, 0xBF80, 0xFF80, "-inf - 1 = -inf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t in = cases[i].a, inout = cases[i].b;
        cdp_comm_bf16_sum(&in, &inout, 1);
        cr_assert_eq(inout, cases[i].want, "%s: got 0x%04X, expected 0x%04X", cases[i].what, inout, cases[i].want);
        in = cases[i].b, inout = cases[i].a; /* commutative: a ring's or a tree's partners agree */
        cdp_comm_bf16_sum(&in, &inout, 1);
        cr_assert_eq(inout, cases[i].want, "%s (the other way round): got 0x%04X", cases[i].what, inout);
    }
    /* NaN: +inf + -inf makes one; a NaN in stays NaN (exponent all ones, a mantissa bit set) */
    const uint16_t nan_in[][2] = {{0x7F80, 0xFF80}, {0x7FC0, 0x3F80}, {0x3F80, 0xFFC1}};
    for (size_t i = 0; i < 3; i++) {
        uint16_t in = nan_in[i][0], inout = nan_in[i][1];
        cdp_comm_bf16_sum(&in, &inout, 1);
        cr_assert((inout & 0x7F80) == 0x7F80 && (inout & 0x007F), "case %zu: 0x%04X is not a NaN", i, inout);
    }
    /* many at once: element by element */
    uint16_t in[4] = {0x3F80, 0x3F80, 0xBF80, 0x7F80}, io[4] = {0x3F80, 0x3B80, 0xBB80, 0x3F80};
    cdp_comm_bf16_sum(in, io, 4);
    cr_assert(io[0] == 0x4000 && io[1] == 0x3F80 && io[2] == 0xBF80 && io[3] == 0x7F80);
    cr_assert_str_eq(cdp_comm_wire_name(CDP_COMM_WIRE_F32), "fp32");
    cr_assert_str_eq(cdp_comm_wire_name(CDP_COMM_WIRE_BF16), "bf16");
}

/* A group of one moves nothing, so the bf16 wire rounds nothing there; a
 * max is refused on it as anywhere (bf16 carries sums), and an unknown wire
 * is bad input. */
Test(comm, self_bf16_wire_leaves_the_values_and_refuses_a_max)
{
    cdp_comm_t c = self_comm();
    float f[3] = {1.00390625f, -2.0f, 3.1415927f};
    const enum cdp_comm_wire w = CDP_COMM_WIRE_BF16;
    cr_assert_eq(cdp_comm_allreduce_wire(c, f, 3, CDP_REDUCE_SUM, w, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_allreduce_wire(c, f, 3, CDP_REDUCE_AVG, w, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_reduce_scatter_window_wire(c, f, 3, 0, 3, CDP_REDUCE_SUM, w, 1), CDP_OK);
    cr_assert_eq(cdp_comm_allgather_wire(c, f, 3, w, 1), CDP_OK);
    cdp_request_t r = NULL;
    cr_assert_eq(cdp_comm_iallreduce_wire(c, f, 3, CDP_REDUCE_SUM, w, 1, &r), CDP_OK);
    cr_assert_eq(cdp_comm_wait(r, 1), CDP_OK);
    cr_assert_eq(cdp_comm_ireduce_scatter_window_wire(c, f + 1, 3, 1, 2, CDP_REDUCE_SUM, w, 1, &r), CDP_OK);
    cr_assert_eq(cdp_comm_wait(r, 1), CDP_OK);
    cr_assert(f[0] == 1.00390625f && f[1] == -2.0f && f[2] == 3.1415927f, "%.9g %.9g %.9g", (double)f[0],
              (double)f[1], (double)f[2]);
    cr_assert_eq(cdp_comm_allreduce_wire(c, f, 3, CDP_REDUCE_MAX, w, 1), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "bf16 on the wire carries sums and averages, not a max"), "%s",
              cdp_last_error());
    cr_assert_eq(cdp_comm_allreduce_wire(c, f, 3, CDP_REDUCE_SUM, CDP_COMM_WIRE_COUNT, 1), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "unknown wire dtype"), "%s", cdp_last_error());
    cdp_comm_free(c);
}

Test(comm, self_send_matches_receive_posted_before_or_after)
{
    cdp_comm_t c = self_comm();
    char a[8] = "abcdefg", b[8] = "0123456", ra[8] = { 0 }, rb[8] = { 0 };
    cdp_request_t s1, s2, r1, r2;
    /* receive first on tag 1; send first on tag 2; completed out of order */
    cr_assert_eq(cdp_comm_irecv(c, ra, 8, 0, 1, &r1), CDP_OK);
    cr_assert_eq(cdp_comm_isend(c, b, 8, 0, 2, &s2), CDP_OK);
    cr_assert_eq(cdp_comm_isend(c, a, 8, 0, 1, &s1), CDP_OK);
    cr_assert_eq(cdp_comm_irecv(c, rb, 8, 0, 2, &r2), CDP_OK);
    cr_assert_eq(cdp_comm_test(r2), 1);
    cr_assert_eq(cdp_comm_wait(s1, 1), CDP_OK);
    cr_assert_eq(cdp_comm_wait(r1, 1), CDP_OK);
    cr_assert_eq(cdp_comm_test(s2), 1);
    cr_assert_str_eq(ra, "abcdefg");
    cr_assert_str_eq(rb, "0123456");
    cdp_comm_free(c);
}

Test(comm, self_same_tag_matches_in_posting_order)
{
    cdp_comm_t c = self_comm();
    int v[3] = { 10, 20, 30 }, w[3] = { 0, 0, 0 };
    cdp_request_t s[3], r[3];
    for (int i = 0; i < 3; i++) cr_assert_eq(cdp_comm_isend(c, &v[i], sizeof v[i], 0, 4, &s[i]), CDP_OK);
    for (int i = 0; i < 3; i++) cr_assert_eq(cdp_comm_irecv(c, &w[i], sizeof w[i], 0, 4, &r[i]), CDP_OK);
    for (int i = 2; i >= 0; i--) {
        cr_assert_eq(cdp_comm_wait(r[i], 1), CDP_OK);
        cr_assert_eq(cdp_comm_wait(s[i], 1), CDP_OK);
    }
    cr_assert(w[0] == 10 && w[1] == 20 && w[2] == 30);
    cdp_comm_free(c);
}

Test(comm, self_size_mismatch_fails_the_receive)
{
    cdp_comm_t c = self_comm();
    char a[16] = { 0 }, b[32];
    cdp_request_t s, r;
    cr_assert_eq(cdp_comm_isend(c, a, 16, 0, 0, &s), CDP_OK);
    cr_assert_eq(cdp_comm_irecv(c, b, 32, 0, 0, &r), CDP_OK);
    cr_assert_eq(cdp_comm_wait(s, 1), CDP_OK);
    cr_assert_eq(cdp_comm_test(r), -1, "an error completes the request");
    const char *m = cdp_last_error();
    cr_assert(strstr(m, "expected 32 bytes") && strstr(m, "16") && strstr(m, "receive from rank 0"), "%s", m);
    cdp_comm_free(c);
}

Test(comm, self_unmatched_receive_times_out_with_the_message, .timeout = 30)
{
    cdp_comm_t c = self_comm();
    char buf[4];
    cdp_request_t r;
    cr_assert_eq(cdp_comm_irecv(c, buf, 4, 0, 9, &r), CDP_OK);
    cr_assert_eq(cdp_comm_test(r), 0, "nothing sent yet");
    double t0 = now_s();
    cdp_status st = cdp_comm_wait(r, 0.3);
    double el = now_s() - t0;
    cr_assert_eq(st, CDP_ERR_COMM);
    const char *m = cdp_last_error();
    cr_assert(strstr(m, "timed out after 0.3 s"), "%s", m);
    cr_assert(strstr(m, "self rank 0/1: receive from rank 0 (tag 9, 4 bytes)"), "%s", m);
    cr_assert(el >= 0.3, "waited %.3f s: the deadline fired early", el); /* upper bound: the test's timeout */
    /* the timed-out receive is gone: a later send does not match it */
    cdp_request_t s;
    cr_assert_eq(cdp_comm_isend(c, buf, 4, 0, 9, &s), CDP_OK);
    cr_assert_eq(cdp_comm_wait(s, 0.05), CDP_ERR_COMM, "a send to self completes only with its receive");
    cdp_comm_free(c);
}

Test(comm, self_rejects_bad_peer_tag_and_buffer)
{
    cdp_comm_t c = self_comm();
    char b[4];
    cdp_request_t r = NULL;
    cr_assert_eq(cdp_comm_isend(c, b, 4, 1, 0, &r), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "no such rank"), "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_irecv(c, b, 4, -1, 0, &r), CDP_ERR_INVALID);
    cr_assert_eq(cdp_comm_irecv(c, b, 4, 0, 1 << 20, &r), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "tag 1048576"), "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_irecv(c, b, 4, 0, -1, &r), CDP_ERR_INVALID);
    cr_assert_eq(cdp_comm_irecv(c, NULL, 4, 0, 0, &r), CDP_ERR_INVALID);
    cr_assert_null(r);
    /* zero bytes with no buffer is fine */
    cdp_request_t s;
    cr_assert_eq(cdp_comm_irecv(c, NULL, 0, 0, (1 << 20) - 1, &r), CDP_OK);
    cr_assert_eq(cdp_comm_isend(c, NULL, 0, 0, (1 << 20) - 1, &s), CDP_OK);
    cr_assert_eq(cdp_comm_wait(r, 1), CDP_OK);
    cr_assert_eq(cdp_comm_wait(s, 1), CDP_OK);
    cdp_comm_free(c);
}

Test(comm, self_gather_returns_own_bytes)
{
    cdp_comm_t c = self_comm();
    void *out = NULL;
    size_t *lens = NULL;
    cr_assert_eq(cdp_comm_gather_bytes(c, "hello", 5, &out, &lens, 1), CDP_OK);
    cr_assert_eq(lens[0], 5);
    cr_assert_eq(memcmp(out, "hello", 5), 0);
    free(out);
    free(lens);
    cr_assert_eq(cdp_comm_gather_bytes(c, NULL, 0, &out, &lens, 1), CDP_OK);
    cr_assert_eq(lens[0], 0);
    free(out);
    free(lens);
    cdp_comm_free(c);
}

Test(comm, self_bcast_keeps_the_bytes_and_checks_arguments)
{
    cdp_comm_t c = self_comm();
    char b[6] = "hello";
    cr_assert_eq(cdp_comm_bcast_bytes(c, b, 6, 0, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(b, "hello");
    cr_assert_eq(cdp_comm_bcast_bytes(c, NULL, 0, 0, 1), CDP_OK);
    cr_assert_eq(cdp_comm_bcast_bytes(c, b, 6, 1, 1), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "self rank 0/1: broadcast from rank 1: no such rank (0..0)"), "%s",
              cdp_last_error());
    cr_assert_eq(cdp_comm_bcast_bytes(c, b, 6, -1, 1), CDP_ERR_INVALID);
    cr_assert_eq(cdp_comm_bcast_bytes(c, NULL, 6, 0, 1), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "buffer is NULL"), "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_bcast_bytes(NULL, b, 6, 0, 1), CDP_ERR_INVALID);
    cdp_comm_free(c);
}

static void free_with_a_request(void)
{
    cdp_comm_t c = NULL;
    char b[4];
    cdp_request_t r;
    if (cdp_comm_self(&c) || cdp_comm_irecv(c, b, 4, 0, 0, &r)) _exit(9);
    cdp_comm_free(c);
}

Test(comm, freeing_with_a_pending_request_is_a_programmer_error)
{
    expect_assertion(free_with_a_request, "c->pending == 0");
}

Test(comm, self_abort_ends_the_process_with_the_code, .exit_code = 5)
{
    cdp_comm_t c = self_comm();
    cdp_comm_abort(c, 5);
}

/* ---- the one front: non-blocking collectives, batches, the staging adapter ---------- */

/* Every argument is checked in the front, once for every backend, with the
 * communicator, the rank and the operation in the message. */
Test(comm, nonblocking_collectives_and_batches_check_their_arguments)
{
    cdp_comm_t c = self_comm();
    float f[4] = {1, 2, 3, 4};
    cdp_request_t r = (cdp_request_t)&r;
    cr_assert_eq(cdp_comm_iallreduce_f32(c, f, 4, CDP_REDUCE_SUM, 1, NULL), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "non-blocking all-reduce: request is NULL");
    cr_assert_eq(cdp_comm_iallreduce_f32(NULL, f, 4, CDP_REDUCE_SUM, 1, &r), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "all-reduce: NULL communicator");
    cr_assert_eq(cdp_comm_iallreduce_f32(c, f, 4, CDP_REDUCE_OP_COUNT, 1, &r), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: all-reduce: unknown reduce op 3");
    cr_assert_eq(cdp_comm_iallreduce_f32(c, NULL, 4, CDP_REDUCE_SUM, 1, &r), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: all-reduce of 4 floats: buffer is NULL");
    cr_assert_eq(cdp_comm_ireduce_scatter_window_f32(c, f, 4, 3, 2, CDP_REDUCE_SUM, 1, &r), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: reduce-scatter of floats [3, 5) of a 4-float buffer");
    cr_assert_eq(cdp_comm_iallgather_f32(c, NULL, 2, 1, &r), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: all-gather of 2 floats: buffer is NULL");
    cr_assert_eq(r, (cdp_request_t)&r, "no request on a refusal");
    /* the blocking calls share the checks */
    cr_assert_eq(cdp_comm_allreduce_f64(c, NULL, 1, CDP_REDUCE_MAX, 1), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: all-reduce of 1 doubles: buffer is NULL");
    cr_assert_eq(cdp_comm_reduce_scatter_window_f32(c, f, 4, 5, 0, CDP_REDUCE_SUM, 1), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: reduce-scatter of floats [5, 5) of a 4-float buffer");
    /* batches */
    cr_assert_eq(cdp_comm_group(NULL, NULL, 0, 1), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "send/receive group: NULL communicator");
    cr_assert_eq(cdp_comm_group(c, NULL, -1, 1), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: send/receive group of -1 operations: negative count");
    cr_assert_eq(cdp_comm_group(c, NULL, 2, 1), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: send/receive group of 2 operations: ops is NULL");
    struct cdp_comm_p2p bad_peer[] = {{1, 1, f, 4}}, no_buf[] = {{0, 0, NULL, 8}};
    cr_assert_eq(cdp_comm_group(c, bad_peer, 1, 1), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: send to rank 1: no such rank (0..0)");
    cr_assert_eq(cdp_comm_group(c, no_buf, 1, 1), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: receive from rank 0 (8 bytes): buffer is NULL");
    cr_assert_eq(cdp_comm_group(c, NULL, 0, 1), CDP_OK);
    /* the same words for a single transfer, with its tag */
    cdp_request_t q = NULL;
    cr_assert_eq(cdp_comm_irecv(c, NULL, 8, 0, 5, &q), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: receive from rank 0 (tag 5, 8 bytes): buffer is NULL");
    cr_assert_eq(cdp_comm_isend(c, f, 4, 0, -1, &q), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: send to rank 0: tag -1 is outside 0..1048575");
    cr_assert_eq(cdp_comm_memory(c), CDP_COMM_HOST_MEMORY);
    cr_assert_eq(cdp_comm_host(c), c, "a host communicator is its own host group");
    cr_assert_eq(cdp_comm_p2p_grouped(c), 0);
    cr_assert_eq(cdp_comm_collectives_async(c), 0, "one rank: collectives complete at once");
    cdp_comm_free(c);
}

/* On self the non-blocking collectives come back completed, leave the data
 * as it is (the reduction of one rank) and free with wait or test; a batch
 * delivers its send to its receive whatever their order. */
Test(comm, nonblocking_collectives_and_a_batch_on_self)
{
    cdp_comm_t c = self_comm();
    float f[4] = {1, 2, 3, 4};
    cdp_request_t a = NULL, b = NULL, g = NULL;
    cr_assert_eq(cdp_comm_iallreduce_f32(c, f, 4, CDP_REDUCE_AVG, 1, &a), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_ireduce_scatter_window_f32(c, f + 1, 4, 1, 2, CDP_REDUCE_SUM, 1, &b), CDP_OK);
    cr_assert_eq(cdp_comm_iallgather_f32(c, f, 4, 1, &g), CDP_OK);
    cr_assert_eq(cdp_comm_test(a), 1);
    cr_assert_eq(cdp_comm_wait(b, 1), CDP_OK);
    cr_assert_eq(cdp_comm_wait(g, 1), CDP_OK);
    cr_assert(f[0] == 1 && f[1] == 2 && f[2] == 3 && f[3] == 4);
    char in[16] = "batched message", out[16] = "";
    struct cdp_comm_p2p ops[] = {{0, 0, out, sizeof out}, {1, 0, in, sizeof in}};
    cr_assert_eq(cdp_comm_group(c, ops, 2, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(out, "batched message");
    struct cdp_comm_p2p lone[] = {{0, 0, out, sizeof out}};
    cr_assert_eq(cdp_comm_group(c, lone, 1, 0.05), CDP_ERR_COMM, "a receive without its send");
    cr_assert(strstr(cdp_last_error(), "self rank 0/1: send/receive group (receive from 0 (16 bytes)): timed out "
                                       "after 0.05 s"), "%s", cdp_last_error());
    cdp_comm_free(c);
}

/* Which communicator carries a device's memory: on a CPU the host
 * communicator's own group. */
Test(comm, the_cpu_device_is_carried_by_the_host_communicator)
{
    cdp_comm_t c = self_comm(), dc = NULL;
    cdp_device_t cpu = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &cpu), CDP_OK, "%s", cdp_last_error());
    char why[128];
    cr_assert_eq(cdp_comm_for_device(c, cpu, 0, 5, &dc, why, sizeof why), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_memory(dc), CDP_COMM_HOST_MEMORY);
    cr_assert_str_eq(why, "self on host memory");
    cr_assert_eq(cdp_comm_for_device(NULL, cpu, 0, 5, &dc, NULL, 0), CDP_ERR_INVALID);
    cdp_comm_free(dc);
    cdp_device_close(cpu);
    cdp_comm_free(c);
}

/* ---- nccl, in process: what this machine and build allow ----------------------------- */

/* The refusal the module, the build and the machine give: NULL when NCCL is
 * usable here (a GPU is lent). */
static const char *nccl_refusal(void)
{
    static char why[1024];
    if (cdp_nccl_available() == CDP_OK) return NULL;
    snprintf(why, sizeof why, "%s", cdp_last_error());
    return why;
}

Test(comm, nccl_world_on_a_cpu_device_is_refused_with_why)
{
    cdp_comm_t c = self_comm();
    cdp_device_t cpu = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &cpu), CDP_OK);
    cdp_nccl_t n = (cdp_nccl_t)&n;
    cr_assert_eq(cdp_nccl_world(c, cpu, 5, &n), CDP_ERR_UNSUPPORTED);
    cr_assert(strstr(cdp_last_error(), "nccl: needs a CUDA device, got cpu:0"), "%s", cdp_last_error());
    cr_assert_eq(n, (cdp_nccl_t)&n, "out is written only on success");
    cdp_device_close(cpu);
    cdp_comm_free(c);
}

/* Not a skip: on this machine (no GPU) it checks the refusal names what is
 * missing; where a GPU is lent it checks the missing device is named. */
Test(comm, nccl_world_without_nccl_here_says_why)
{
    cdp_comm_t c = self_comm();
    cdp_nccl_t n = NULL;
    const char *why = nccl_refusal();
    cdp_status st = cdp_nccl_world(c, NULL, 5, &n);
    const char *m = cdp_last_error();
    cr_assert_null(n);
    if (!why) {
        cr_assert_eq(st, CDP_ERR_INVALID, "%s", m);
        cr_assert(strstr(m, "no device given"), "%s", m);
    } else {
        cr_log_info("nccl here: %s", why);
        cr_assert_eq(st, CDP_ERR_UNSUPPORTED, "%s", m);
        cr_assert_str_eq(m, why, "the world gives the same reason as cdp_nccl_available");
        cr_assert(!strncmp(m, "nccl: unavailable: ", 19), "%s", m);
        if (!CDP_HAVE_CUDA) cr_assert(strstr(m, "cuda backend: not built into this installation"), "%s", m);
        else if (!CDP_HAVE_NCCL) cr_assert(strstr(m, "the cuda module was built without NCCL"), "%s", m);
        else cr_assert(strstr(m, "no usable GPU"), "%s", m);
    }
    cdp_comm_free(c);
}

Test(comm, nccl_without_the_module_names_the_module)
{
    char dir[] = "/tmp/cdp-no-module-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    setenv("CDP_MODULE_DIR", dir, 1);
    cr_assert_eq(cdp_nccl_available(), CDP_ERR_UNSUPPORTED);
    const char *m = cdp_last_error();
    cr_assert(strstr(m, "nccl: unavailable: cuda backend: not built into this installation"), "%s", m);
    cr_assert(strstr(m, dir), "names where it looked: %s", m);
    int v = 0;
    cr_assert_eq(cdp_nccl_version(&v), CDP_ERR_UNSUPPORTED);
    cr_assert_eq(v, 0);
    rmdir(dir);
}

/* The real module, without a GPU (one test: loading it is slow under the
 * sanitizers): its NCCL version, and a table whose ZeRO slots are filled
 * (they run only where a GPU is lent: mpi_nccl_np1_needs_gpu). */
Test(comm, nccl_version_and_table_come_from_the_module_without_a_gpu)
{
    int v = -1;
    cdp_status st = cdp_nccl_version(&v);
    if (CDP_HAVE_CUDA && CDP_HAVE_NCCL) {
        cr_assert_eq(st, CDP_OK, "%s", cdp_last_error());
        cr_assert(v >= 21800 && v < 30000, "NCCL 2.18 or later: %d", v);
        const void *sym = NULL;
        cr_assert_eq(cdp_device_module_symbol("cuda", CDP_NCCL_MODULE_SYMBOL, &sym), CDP_OK, "%s", cdp_last_error());
        const struct cdp_nccl_ops *ops = sym;
        cr_assert_not_null(ops, "the module exports %s", CDP_NCCL_MODULE_SYMBOL);
        cr_assert(ops->reduce_scatter && ops->all_gather, "the ZeRO slots are filled");
        cr_assert(ops->allreduce && ops->p2p && ops->abort && ops->destroy, "and the slots around them");
    } else {
        cr_assert_eq(st, CDP_ERR_UNSUPPORTED);
        cr_assert_eq(v, -1);
    }
    cr_assert_eq(cdp_nccl_version(NULL), CDP_ERR_INVALID);
}

Test(comm, nccl_calls_check_their_arguments)
{
    cdp_comm_t c = self_comm();
    cdp_nccl_t n = NULL;
    cr_assert_eq(cdp_nccl_world(NULL, NULL, 1, &n), CDP_ERR_INVALID);
    cr_assert_eq(cdp_nccl_world(c, NULL, 1, NULL), CDP_ERR_INVALID);
    cr_assert_eq(cdp_nccl_split(NULL, 0, 0, &n), CDP_ERR_INVALID);
    float f = 0;
    cr_assert_eq(cdp_nccl_allreduce_f32(NULL, &f, 1, CDP_REDUCE_SUM, 1), CDP_ERR_INVALID);
    cr_assert_eq(cdp_nccl_reduce_scatter_f32(NULL, &f, 1, CDP_REDUCE_SUM, 1), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "nccl reduce-scatter: NULL communicator"), "%s", cdp_last_error());
    cr_assert_eq(cdp_nccl_allgather_f32(NULL, &f, 1, 1), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "nccl all-gather: NULL communicator"), "%s", cdp_last_error());
    cr_assert_eq(cdp_nccl_sendrecv(NULL, NULL, 0, 1), CDP_ERR_INVALID);
    cr_assert_eq(cdp_nccl_rank(NULL), 0);
    cr_assert_eq(cdp_nccl_size(NULL), 0);
    cdp_nccl_free(NULL);
    cdp_nccl_abort_all(); /* nothing to abort */
    cdp_comm_free(c);
}

/* ---- nccl's front, through the stand-in module (tests/fake-cuda) ------------------- */

/* Loads the stand-in CUDA module in place of the real one and returns its counters. */
static struct fake_stats *use_fake_module(void)
{
    const char *dir = getenv("CDP_FAKE_CUDA_DIR");
    cr_assert_not_null(dir, "run through meson test (CDP_FAKE_CUDA_DIR)");
    setenv("CDP_MODULE_DIR", dir, 1);
    int v = 0;
    cr_assert_eq(cdp_nccl_version(&v), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(v, 21800, "the stand-in module is the one loaded");
    char path[4096];
    snprintf(path, sizeof path, "%s/libcdphybrid-cuda.so", dir);
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(h, "%s", dlerror());
    struct fake_stats *s = dlsym(h, "cdp_fake_nccl_stats");
    cr_assert_not_null(s);
    return s;
}

static cdp_device_t open_fake_gpu(void)
{
    cdp_device_t d = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CUDA, 0, 0, &d), CDP_OK, "%s", cdp_last_error());
    return d;
}

static cdp_buffer_t dev_floats(cdp_device_t d, const float *v, size_t n)
{
    cdp_buffer_t b = NULL;
    cr_assert_eq(cdp_buffer_create(d, n * sizeof *v, &b), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_buffer_write(b, 0, v, n * sizeof *v), CDP_OK, "%s", cdp_last_error());
    return b;
}

/* The host-staging adapter over self on the stand-in GPU: device memory
 * goes to the host and back for a transfer, a batch and the collectives;
 * it says it takes device memory and its host group is the inner one. */
Test(comm, the_staging_adapter_moves_device_memory_through_the_host)
{
    use_fake_module();
    cdp_device_t d = open_fake_gpu();
    cdp_comm_t inner = self_comm(), s = NULL, t = NULL;
    cr_assert_eq(cdp_comm_staged(inner, d, &s), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_memory(s), CDP_COMM_DEVICE_MEMORY);
    cr_assert_eq(cdp_comm_host(s), inner);
    cr_assert_str_eq(cdp_comm_name(s), "self", "messages name the communicator the bytes travel on");
    cr_assert_eq(cdp_comm_split(s, 0, 0, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_memory(t), CDP_COMM_DEVICE_MEMORY);
    cdp_buffer_t src = dev_floats(d, (float[4]){1, 2, 3, 4}, 4), dst = dev_floats(d, (float[4]){0, 0, 0, 0}, 4);
    cdp_request_t rs = NULL, rr = NULL;
    cr_assert_eq(cdp_comm_irecv(t, cdp_buffer_data(dst), 16, 0, 7, &rr), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_isend(t, cdp_buffer_data(src), 16, 0, 7, &rs), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_wait(rs, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_wait(rr, 1), CDP_OK, "%s", cdp_last_error());
    float h[4] = {0};
    cr_assert_eq(cdp_buffer_read(dst, 0, h, sizeof h), CDP_OK);
    cr_assert(h[0] == 1 && h[1] == 2 && h[2] == 3 && h[3] == 4, "%g %g %g %g", h[0], h[1], h[2], h[3]);
    cdp_buffer_t z = dev_floats(d, (float[4]){0, 0, 0, 0}, 4);
    struct cdp_comm_p2p ops[] = {{1, 0, cdp_buffer_data(src), 8}, {0, 0, cdp_buffer_data(z), 8}};
    cr_assert_eq(cdp_comm_group(t, ops, 2, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_buffer_read(z, 0, h, sizeof h), CDP_OK);
    cr_assert(h[0] == 1 && h[1] == 2 && h[2] == 0, "a batch moves its 8 bytes: %g %g %g", h[0], h[1], h[2]);
    cdp_request_t q = NULL;
    cr_assert_eq(cdp_comm_iallreduce_f32(t, cdp_buffer_data(src), 4, CDP_REDUCE_SUM, 1, &q), CDP_OK);
    cr_assert_eq(cdp_comm_wait(q, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_allgather_f32(t, cdp_buffer_data(src), 4, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_reduce_scatter_window_f32(t, (float *)cdp_buffer_data(src) + 1, 4, 1, 2, CDP_REDUCE_MAX, 1),
                 CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_buffer_read(src, 0, h, sizeof h), CDP_OK);
    cr_assert(h[0] == 1 && h[1] == 2 && h[2] == 3 && h[3] == 4, "one rank's reductions are its values");
    cr_assert_eq(cdp_comm_iallreduce_f32(t, NULL, 4, CDP_REDUCE_SUM, 1, &q), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "self rank 0/1: all-reduce of 4 floats: buffer is NULL");
    cr_assert_eq(cdp_comm_staged(NULL, d, &t), CDP_ERR_INVALID);
    cdp_comm_t again = self_comm(), nested = NULL;
    cr_assert_eq(cdp_comm_staged(again, d, &nested), CDP_OK);
    cdp_comm_t twice = NULL;
    cr_assert_eq(cdp_comm_staged(nested, d, &twice), CDP_ERR_INVALID, "an adapter over device memory");
    cr_assert(strstr(cdp_last_error(), "does not take host memory"), "%s", cdp_last_error());
    cdp_buffer_destroy(src);
    cdp_buffer_destroy(dst);
    cdp_buffer_destroy(z);
    cdp_comm_free(t);
    cdp_comm_free(s); /* frees inner */
    cdp_device_close(d);
}

Test(comm, nccl_front_world_split_and_free_through_a_stand_in_module)
{
    struct fake_stats *fs = use_fake_module();
    cdp_comm_t c = self_comm();
    cdp_device_t d = open_fake_gpu();
    cdp_nccl_t w = NULL, a = NULL, none = (cdp_nccl_t)&none;
    cr_assert_eq(cdp_nccl_world(c, d, 5, &w), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_nccl_rank(w), 0);
    cr_assert_eq(cdp_nccl_size(w), 1);
    cr_assert_eq(fs->inits, 1);
    unsigned char zero[CDP_NCCL_ID_BYTES] = { 0 };
    cr_assert_neq(memcmp(fs->last_id, zero, sizeof zero), 0, "rank 0 made an id and init got it");

    float v[4] = { 1, 2, 3, 4 };
    cdp_buffer_t b = dev_floats(d, v, 4);
    cr_assert_eq(cdp_nccl_allreduce_f32(w, cdp_buffer_data(b), 4, CDP_REDUCE_AVG, 5), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_nccl_allreduce_f32(w, cdp_buffer_data(b), 4, CDP_REDUCE_OP_COUNT, 5), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "nccl rank 0/1: all-reduce: unknown reduce op"), "%s", cdp_last_error());
    cr_assert_eq(cdp_nccl_allreduce_f64(w, NULL, 2, CDP_REDUCE_SUM, 5), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "all-reduce of 2 doubles: buffer is NULL"), "%s", cdp_last_error());

    /* a receive listed before its send, to self: one group */
    cdp_buffer_t r = dev_floats(d, (float[4]){ 0 }, 4);
    struct cdp_nccl_p2p ops[] = { { 0, 0, cdp_buffer_data(r), 16 }, { 1, 0, cdp_buffer_data(b), 16 } };
    cr_assert_eq(cdp_nccl_sendrecv(w, ops, 2, 5), CDP_OK, "%s", cdp_last_error());
    float got[4];
    cr_assert_eq(cdp_buffer_read(r, 0, got, sizeof got), CDP_OK);
    cr_assert_arr_eq(got, v, sizeof v);
    struct cdp_nccl_p2p bad[] = { { 1, 1, cdp_buffer_data(b), 16 } };
    cr_assert_eq(cdp_nccl_sendrecv(w, bad, 1, 5), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "nccl rank 0/1: send to rank 1: no such rank (0..0)"), "%s", cdp_last_error());
    struct cdp_nccl_p2p nobuf[] = { { 0, 0, NULL, 16 } };
    cr_assert_eq(cdp_nccl_sendrecv(w, nobuf, 1, 5), CDP_ERR_INVALID);
    cr_assert_eq(cdp_nccl_sendrecv(w, NULL, 0, 5), CDP_OK);

    cr_assert_eq(cdp_nccl_split(w, 3, 0, &a), CDP_OK, "%s", cdp_last_error());
    cr_assert_not_null(a);
    cr_assert_eq(cdp_nccl_split(w, -1, 0, &none), CDP_OK, "%s", cdp_last_error());
    cr_assert_null(none, "color < 0: not a member");
    cr_assert_eq(fs->splits, 2, "a non-member still takes part in the split");
    cr_assert_eq(fs->live, 2);
    cdp_nccl_free(a);
    cdp_nccl_free(w);
    cr_assert_eq(fs->destroys, 2, "healthy communicators are finalised, not aborted");
    cr_assert_eq(fs->aborts, 0);
    cr_assert_eq(fs->live, 0);
    cdp_nccl_abort_all(); /* nothing left to abort */
    cr_assert_eq(fs->aborts, 0);
    cdp_buffer_destroy(b);
    cdp_buffer_destroy(r);
    cdp_device_close(d);
    cdp_comm_free(c);
}

Test(comm, nccl_front_reduce_scatter_and_allgather_through_a_stand_in_module)
{
    struct fake_stats *fs = use_fake_module();
    cdp_comm_t c = self_comm();
    cdp_device_t d = open_fake_gpu();
    cdp_nccl_t w = NULL;
    cr_assert_eq(cdp_nccl_world(c, d, 5, &w), CDP_OK, "%s", cdp_last_error());
    float v[5] = { 1, 2, 3, 4, 5 };
    cdp_buffer_t b = dev_floats(d, v, 5);
    for (int op = 0; op < CDP_REDUCE_OP_COUNT; op++)
        cr_assert_eq(cdp_nccl_reduce_scatter_f32(w, cdp_buffer_data(b), 5, (enum cdp_reduce_op)op, 5), CDP_OK, "%s",
                     cdp_last_error());
    cr_assert_eq(cdp_nccl_allgather_f32(w, cdp_buffer_data(b), 5, 5), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(fs->sharded, 4);
    cr_assert(fs->shard_off == 0 && fs->shard_len == 5, "one rank: one shard, the whole buffer (%zu, %zu)",
              fs->shard_off, fs->shard_len);
    float got[5];
    cr_assert_eq(cdp_buffer_read(b, 0, got, sizeof got), CDP_OK);
    cr_assert_arr_eq(got, v, sizeof v);

    cr_assert_eq(cdp_nccl_reduce_scatter_f32(w, NULL, 0, CDP_REDUCE_SUM, 5), CDP_OK);
    cr_assert_eq(cdp_nccl_allgather_f32(w, NULL, 0, 5), CDP_OK);
    cr_assert_eq(fs->sharded, 4, "n == 0 reaches no module");
    cr_assert_eq(cdp_nccl_reduce_scatter_f32(w, cdp_buffer_data(b), 5, CDP_REDUCE_OP_COUNT, 5), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "nccl rank 0/1: reduce-scatter: unknown reduce op 3"), "%s", cdp_last_error());
    cr_assert_eq(cdp_nccl_reduce_scatter_f32(w, NULL, 2, CDP_REDUCE_SUM, 5), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "nccl rank 0/1: reduce-scatter of 2 floats: buffer is NULL"), "%s",
              cdp_last_error());
    cr_assert_eq(cdp_nccl_allgather_f32(w, NULL, 2, 5), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "nccl rank 0/1: all-gather of 2 floats: buffer is NULL"), "%s",
              cdp_last_error());
    cr_assert_eq(cdp_nccl_reduce_scatter_f32(w, cdp_buffer_data(b), 5, CDP_REDUCE_SUM, 5), CDP_OK,
                 "argument errors leave the communicator usable: %s", cdp_last_error());
    /* a window: the module sees the window's own coordinates */
    const int before = fs->sharded;
    cr_assert_eq(cdp_nccl_reduce_scatter_window_f32(w, (float *)cdp_buffer_data(b) + 1, 5, 1, 3, CDP_REDUCE_SUM, 5),
                 CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(fs->sharded, before + 1);
    cr_assert(fs->shard_off == 0 && fs->shard_len == 3, "one rank: the whole window (%zu, %zu)", fs->shard_off,
              fs->shard_len);
    cr_assert_eq(cdp_nccl_reduce_scatter_window_f32(w, cdp_buffer_data(b), 5, 4, 2, CDP_REDUCE_SUM, 5),
                 CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "reduce-scatter of floats [4, 6) of a 5-float buffer"), "%s",
              cdp_last_error());
    cdp_nccl_free(w);
    cr_assert_eq(fs->live, 0);
    cdp_buffer_destroy(b);
    cdp_device_close(d);
    cdp_comm_free(c);
}

/* The non-blocking collectives on nccl: started on the communicator's own
 * stream (the stand-in completes one at its second test), tested until
 * done, the compute stream made to wait once each completed; the blocking
 * calls go the same way; past the deadline the wait names the operation and
 * NCCL's call, and the communicator refuses what follows. */
Test(comm, nccl_nonblocking_collectives_complete_on_their_own_stream_through_a_stand_in_module)
{
    struct fake_stats *fs = use_fake_module();
    cdp_comm_t c = self_comm();
    cdp_device_t d = open_fake_gpu();
    cdp_nccl_t w = NULL;
    cr_assert_eq(cdp_nccl_world(c, d, 5, &w), CDP_OK, "%s", cdp_last_error());
    float v[5] = { 1, 2, 3, 4, 5 };
    cdp_buffer_t b = dev_floats(d, v, 5);
    float *p = cdp_buffer_data(b);
    cdp_request_t ra = NULL, rs = NULL, rg = NULL;
    cr_assert_eq(cdp_comm_iallreduce_f32(w, p, 5, CDP_REDUCE_SUM, 5, &ra), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_ireduce_scatter_window_f32(w, p + 1, 5, 1, 3, CDP_REDUCE_AVG, 5, &rs), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert(fs->shard_off == 0 && fs->shard_len == 3, "the window's shards reach the module (%zu, %zu)",
              fs->shard_off, fs->shard_len);
    cr_assert_eq(cdp_comm_iallgather_f32(w, p, 5, 5, &rg), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(fs->starts, 3);
    cr_assert_eq(fs->in_flight, 3, "nothing completes within the call that starts it");
    cr_assert_eq(fs->compute_waits, 0);
    cr_assert_eq(cdp_comm_test(ra), 0, "the first test finds the all-reduce running");
    cr_assert_eq(cdp_comm_test(ra), 1, "%s", cdp_last_error());
    cr_assert_eq(fs->compute_waits, 1, "the compute stream waits on the completed all-reduce");
    cr_assert_eq(cdp_comm_wait(rs, 5), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_wait(rg, 5), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(fs->compute_waits, 3);
    cr_assert_eq(fs->in_flight, 0);
    /* a blocking call: the same start, completed within it */
    cr_assert_eq(cdp_nccl_allreduce_f32(w, p, 5, CDP_REDUCE_MAX, 5), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(fs->starts, 4);
    cr_assert_eq(fs->compute_waits, 4);
    float got[5];
    cr_assert_eq(cdp_buffer_read(b, 0, got, sizeof got), CDP_OK);
    cr_assert_arr_eq(got, v, sizeof v, "one rank's reduction leaves the data as it is");
    cr_assert_eq(cdp_comm_collectives_async(w), 0, "one rank: no overlap to be had");

    /* past the deadline */
    setenv("CDP_FAKE_NCCL", "hang", 1);
    cr_assert_eq(cdp_comm_iallreduce_f32(w, p, 5, CDP_REDUCE_SUM, 0.1, &ra), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_comm_test(ra), 0);
    double t0 = now_s();
    cr_assert_eq(cdp_comm_wait(ra, 0.1), CDP_ERR_COMM);
    cr_assert_geq(now_s() - t0, 0.1);
    cr_assert_str_eq(cdp_last_error(), "nccl rank 0/1: all-reduce (sum) of 5 floats: timed out after 0.1 s (ncclAllReduce)");
    cr_assert_eq(fs->in_flight, 0, "the request was released");
    cr_assert_eq(cdp_comm_iallgather_f32(w, p, 5, 5, &rg), CDP_ERR_COMM);
    cr_assert(strstr(cdp_last_error(), "nccl rank 0/1: all-gather of 5 floats: this communicator is unusable after an "
                                       "earlier operation failed or timed out"),
              "%s", cdp_last_error());
    cr_assert_eq(fs->starts, 5, "a broken communicator starts nothing");
    unsetenv("CDP_FAKE_NCCL");
    cdp_nccl_free(w);
    cr_assert_eq(fs->aborts, 1, "the broken communicator is aborted, not finalised");
    cr_assert_eq(fs->live, 0);
    cdp_buffer_destroy(b);
    cdp_device_close(d);
    cdp_comm_free(c);
}

Test(comm, nccl_reduce_scatter_and_allgather_deadlines_name_the_operation)
{
    use_fake_module();
    setenv("CDP_FAKE_NCCL", "hang", 1);
    cdp_comm_t c = self_comm();
    cdp_device_t d = open_fake_gpu();
    cdp_nccl_t w = NULL, s = NULL;
    cr_assert_eq(cdp_nccl_world(c, d, 5, &w), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_nccl_split(w, 0, 0, &s), CDP_OK, "%s", cdp_last_error());
    cdp_buffer_t b = dev_floats(d, (float[3]){ 1, 2, 3 }, 3);
    double t0 = now_s();
    cr_assert_eq(cdp_nccl_reduce_scatter_f32(w, cdp_buffer_data(b), 3, CDP_REDUCE_AVG, 0.1), CDP_ERR_COMM);
    cr_assert_geq(now_s() - t0, 0.1);
    cr_assert_str_eq(cdp_last_error(),
                     "nccl rank 0/1: reduce-scatter (average) of 3 floats: timed out after 0.1 s (ncclReduceScatter)");
    cr_assert_eq(cdp_nccl_allgather_f32(w, cdp_buffer_data(b), 3, 0.1), CDP_ERR_COMM);
    cr_assert(strstr(cdp_last_error(), "unusable after an earlier operation failed or timed out"), "%s",
              cdp_last_error());
    cr_assert_eq(cdp_nccl_allgather_f32(s, cdp_buffer_data(b), 3, 0.1), CDP_ERR_COMM);
    cr_assert_str_eq(cdp_last_error(),
                     "nccl[color 0] rank 0/1: all-gather of 3 floats: timed out after 0.1 s (ncclAllGather)");
    cdp_nccl_abort_all();
    cdp_nccl_free(s);
    cdp_nccl_free(w);
    cdp_buffer_destroy(b);
    cdp_device_close(d);
    cdp_comm_free(c);
}

Test(comm, nccl_deadline_breaks_the_communicator_and_abort_all_ends_every_one)
{
    struct fake_stats *fs = use_fake_module();
    setenv("CDP_FAKE_NCCL", "hang", 1);
    cdp_comm_t c = self_comm();
    cdp_device_t d = open_fake_gpu();
    cdp_nccl_t w = NULL, s = NULL;
    cr_assert_eq(cdp_nccl_world(c, d, 5, &w), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_nccl_split(w, 0, 0, &s), CDP_OK, "%s", cdp_last_error());
    cdp_buffer_t b = dev_floats(d, (float[4]){ 1, 2, 3, 4 }, 4);

    double t0 = now_s();
    cr_assert_eq(cdp_nccl_allreduce_f32(w, cdp_buffer_data(b), 4, CDP_REDUCE_SUM, 0.2), CDP_ERR_COMM);
    cr_assert_geq(now_s() - t0, 0.2);
    cr_assert_str_eq(cdp_last_error(), "nccl rank 0/1: all-reduce (sum) of 4 floats: timed out after 0.2 s (ncclAllReduce)");
    cr_assert_eq(cdp_nccl_allreduce_f32(w, cdp_buffer_data(b), 4, CDP_REDUCE_SUM, 0.2), CDP_ERR_COMM);
    cr_assert(strstr(cdp_last_error(), "unusable after an earlier operation failed or timed out"), "%s",
              cdp_last_error());
    cr_assert_eq(cdp_nccl_split(w, 0, 0, &s), CDP_ERR_COMM, "a broken communicator splits no more");

    struct cdp_nccl_p2p ops[] = { { 0, 0, cdp_buffer_data(b), 8 }, { 1, 0, cdp_buffer_data(b), 8 } };
    cr_assert_eq(cdp_nccl_sendrecv(s, ops, 2, 0.1), CDP_ERR_COMM);
    cr_assert(strstr(cdp_last_error(), "nccl[color 0] rank 0/1: send/receive group (receive from 0 (8 bytes), "
                                       "send to 0 (8 bytes)): timed out after 0.1 s"),
              "%s", cdp_last_error());

    cdp_nccl_abort_all();
    cr_assert_eq(fs->aborts, 2, "the world and its split");
    cr_assert_eq(fs->live, 0);
    cr_assert_eq(cdp_nccl_allreduce_f32(w, cdp_buffer_data(b), 4, CDP_REDUCE_SUM, 1), CDP_ERR_COMM);
    cr_assert(strstr(cdp_last_error(), "aborted"), "%s", cdp_last_error());
    cdp_nccl_abort_all();
    cr_assert_eq(fs->aborts, 2, "each communicator is aborted once");
    cdp_nccl_free(s);
    cdp_nccl_free(w);
    cr_assert_eq(fs->aborts, 2);
    cr_assert_eq(fs->destroys, 0);
    cdp_buffer_destroy(b);
    cdp_device_close(d);
    cdp_comm_free(c);
}

Test(comm, nccl_free_aborts_a_broken_communicator)
{
    struct fake_stats *fs = use_fake_module();
    setenv("CDP_FAKE_NCCL", "hang", 1);
    cdp_comm_t c = self_comm();
    cdp_device_t d = open_fake_gpu();
    cdp_nccl_t w = NULL;
    cr_assert_eq(cdp_nccl_world(c, d, 5, &w), CDP_OK, "%s", cdp_last_error());
    cdp_buffer_t b = dev_floats(d, (float[1]){ 1 }, 1);
    cr_assert_eq(cdp_nccl_allreduce_f32(w, cdp_buffer_data(b), 1, CDP_REDUCE_MAX, 0.05), CDP_ERR_COMM);
    cdp_nccl_free(w);
    cr_assert_eq(fs->aborts, 1, "what may still run is aborted, not finalised");
    cr_assert_eq(fs->destroys, 0);
    cdp_buffer_destroy(b);
    cdp_device_close(d);
    cdp_comm_free(c);
}

Test(comm, nccl_world_whose_init_fails_says_which_rank_and_why)
{
    struct fake_stats *fs = use_fake_module();
    setenv("CDP_FAKE_NCCL", "fail_init:0", 1);
    cdp_comm_t c = self_comm();
    cdp_device_t d = open_fake_gpu();
    cdp_nccl_t w = (cdp_nccl_t)&w;
    cr_assert_eq(cdp_nccl_world(c, d, 5, &w), CDP_ERR_COMM);
    cr_assert_str_eq(cdp_last_error(), "nccl rank 0/1 on cuda:0: creating the world communicator: "
                                       "ncclCommInitRankConfig: fake failure of rank 0");
    cr_assert_eq(w, (cdp_nccl_t)&w);
    cr_assert_eq(fs->live, 0);
    cdp_device_close(d);
    cdp_comm_free(c);
}

/* ---- mpi, through the probe --------------------------------------------------- */

struct job {
    int code;      /* exit status, or 128 + signal */
    int timed_out; /* killed by us at the limit */
    double secs;
    char *out;     /* stdout and stderr together */
};

static void skip_without_mpi(void)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI (-Dmpi=disabled)");
    cr_assert_not_null(getenv("CDP_COMM_PROBE"), "run through meson test (CDP_COMM_PROBE)");
}

/* Runs `mpirun -np np comm_probe scenario` with extra VAR=value settings. */
static void run_probe(struct job *j, int np, const char *scenario, const char *setting, double limit_s)
{
    char path[] = "/tmp/cdp-comm-probe-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    unlink(path);
    char nps[16];
    snprintf(nps, sizeof nps, "%d", np);
    const char *argv[16];
    int k = 0;
    argv[k++] = "mpirun";
    argv[k++] = "--oversubscribe";
    argv[k++] = "-np";
    argv[k++] = nps;
    char name[64] = "";
    if (setting) {
        snprintf(name, sizeof name, "%.*s", (int)strcspn(setting, "="), setting);
        argv[k++] = "-x";
        argv[k++] = name;
    }
    argv[k++] = getenv("CDP_COMM_PROBE");
    argv[k++] = scenario;
    argv[k] = NULL;
    double t0 = now_s();
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        if (setting) putenv((char *)setting);
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execvp("mpirun", (char *const *)argv);
        fprintf(stderr, "exec mpirun: %s\n", strerror(errno));
        _exit(127);
    }
    memset(j, 0, sizeof *j);
    int status = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (now_s() - t0 > limit_s) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            j->timed_out = 1;
            break;
        }
        struct timespec ts = { 0, 10000000 };
        nanosleep(&ts, NULL);
    }
    j->secs = now_s() - t0;
    j->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    off_t n = lseek(fd, 0, SEEK_END);
    j->out = calloc(1, (size_t)n + 1);
    if (n > 0 && pread(fd, j->out, (size_t)n, 0) != n) j->out[0] = '\0';
    close(fd);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* The scenario passed on every rank. */
static void expect_ok(int np, const char *scenario, const char *setting)
{
    skip_without_mpi();
    struct job j;
    run_probe(&j, np, scenario, setting, 120);
    cr_assert_not(j.timed_out, "mpirun -np %d %s ran past 120 s:\n%s", np, scenario, j.out);
    cr_assert_eq(j.code, 0, "mpirun -np %d %s exited %d:\n%s", np, scenario, j.code, j.out);
    char line[64];
    snprintf(line, sizeof line, ": %s ok", scenario);
    cr_assert_eq(count(j.out, line), np, "%d ranks said ok:\n%s", count(j.out, line), j.out);
    free(j.out);
}

#define PROBE_TESTS(scen)                                                                         \
    Test(comm, mpi_##scen##_np1) { expect_ok(1, #scen, NULL); }                                  \
    Test(comm, mpi_##scen##_np2) { expect_ok(2, #scen, NULL); }                                  \
    Test(comm, mpi_##scen##_np4_oversubscribed) { expect_ok(4, #scen, NULL); }

PROBE_TESTS(world)
PROBE_TESTS(split)
PROBE_TESTS(allreduce)
PROBE_TESTS(p2p)
PROBE_TESTS(gather)
PROBE_TESTS(barrier)
PROBE_TESTS(timeout)
PROBE_TESTS(errors)

PROBE_TESTS(bcast)
PROBE_TESTS(nccl_refused)

PROBE_TESTS(nccl_fake)

Test(comm, mpi_nccl_fake_init_failure_of_one_rank_fails_all_np3)
{
    expect_ok(3, "nccl_fake", "CDP_FAKE_NCCL=fail_init:1");
}

/* Ranks of one job given different layouts fail together, naming the rank. */
Test(comm, mpi_ranks_with_different_layouts_fail_before_training_np2) { expect_ok(2, "layout_mismatch", NULL); }
Test(comm, mpi_ranks_with_different_layouts_fail_before_training_np3) { expect_ok(3, "layout_mismatch", NULL); }
Test(comm, mpi_bcast_np3) { expect_ok(3, "bcast", NULL); }
Test(comm, mpi_chunked_bcast_np3) { expect_ok(3, "bcast", "CDP_COMM_CHUNK_BYTES=4096"); }
Test(comm, mpi_allreduce_np3) { expect_ok(3, "allreduce", NULL); }
Test(comm, mpi_p2p_np3) { expect_ok(3, "p2p", NULL); }
Test(comm, mpi_gather_np3) { expect_ok(3, "gather", NULL); }

Test(comm, mpi_chunked_messages_allreduce_and_gather_np3)
{
    expect_ok(3, "bigmsg", "CDP_COMM_CHUNK_BYTES=4096");
}

/* ZeRO's reduce-scatter and all-gather on 4, 3, 2 and 1 ranks (split off one
 * job), bit-identical to the all-reduce. In pieces of 100 floats: n <= 7
 * travels as one piece over every shard, as any buffer below the default
 * 1 GiB does, and n = 1000, 1001 as pieces whose edges fall inside shards. */
Test(comm, mpi_chunked_zero_np4_oversubscribed) { expect_ok(4, "zero", "CDP_COMM_CHUNK_BYTES=400"); }

/* The executor's tensor group (model/tensor_group.h): all-reduce, and
 * sequence parallelism's reduce-scatter and all-gather over equal parts in
 * rank order, on groups of 4, 2 and 1 ranks split off one job. */
Test(comm, mpi_tensor_group_collectives_np2) { expect_ok(2, "tensor_group", NULL); }
Test(comm, mpi_tensor_group_collectives_np4_oversubscribed) { expect_ok(4, "tensor_group", NULL); }

/* bf16 on the wire (/parallel/comm_dtype) on groups of 4 .. 1 ranks split
 * off one job: every rank gets the same bits, bf16 values within the bound of
 * bf16 rounding of the fp32 sum, the exact pairwise rounding on 2 ranks, the
 * reduce-scatter's shard equal to the all-reduce's, the all-gather's rounded
 * shards, non-blocking equal to blocking, and fp32 untouched. Once in pieces
 * of 50 bf16 (CDP_COMM_CHUNK_BYTES=100) so that pieces end inside shards. */
Test(comm, mpi_bf16_wire_np2) { expect_ok(2, "bf16", NULL); }
Test(comm, mpi_bf16_wire_chunked_np4_oversubscribed) { expect_ok(4, "bf16", "CDP_COMM_CHUNK_BYTES=100"); }

Test(comm, mpi_zero_deadlines_then_abort_np2, .timeout = 60)
{
    skip_without_mpi();
    struct job j;
    run_probe(&j, 2, "zero_timeout", NULL, 60);
    cr_assert_not(j.timed_out, "%s", j.out);
    cr_assert_eq(count(j.out, "zero_timeout ok"), 1, "rank 0 saw both timeouts:\n%s", j.out);
    cr_assert_eq(j.code, 42, "mpirun exits with the abort code, got %d:\n%s", j.code, j.out);
    cr_log_info("took %.1f s", j.secs); /* the upper bound is the test's timeout */
    free(j.out);
}

Test(comm, mpi_message_above_int_max_bytes_np2, .timeout = 240)
{
    expect_ok(2, "bigmsg", NULL);
}

Test(comm, mpi_allreduce_deadline_then_abort_np2, .timeout = 60)
{
    skip_without_mpi();
    struct job j;
    run_probe(&j, 2, "allreduce_timeout", NULL, 60);
    cr_assert_not(j.timed_out, "%s", j.out);
    cr_assert_eq(count(j.out, "allreduce_timeout ok"), 1, "rank 0 saw the timeout:\n%s", j.out);
    cr_assert_eq(j.code, 42, "mpirun exits with the abort code, got %d:\n%s", j.code, j.out);
    cr_log_info("took %.1f s", j.secs); /* the upper bound is the test's timeout */
    free(j.out);
}

/* Non-blocking collectives over MPI (issue 17): in flight together, tested to
 * completion, equal to the blocking ones; a wait past its deadline names the
 * operation and breaks the communicator, and the job ends with the abort. */
Test(comm, mpi_iallreduce_np1) { expect_ok(1, "iallreduce", NULL); }

static void iallreduce_deadline(int np)
{
    skip_without_mpi();
    struct job j;
    run_probe(&j, np, "iallreduce", NULL, 60);
    cr_assert_not(j.timed_out, "%s", j.out);
    cr_assert_eq(count(j.out, "iallreduce ok"), 1, "rank 0 saw the timeout:\n%s", j.out);
    cr_assert_eq(j.code, 42, "mpirun exits with the abort code, got %d:\n%s", j.code, j.out);
    free(j.out);
}

Test(comm, mpi_iallreduce_then_deadline_np2, .timeout = 60) { iallreduce_deadline(2); }
Test(comm, mpi_iallreduce_then_deadline_np3_oversubscribed, .timeout = 60) { iallreduce_deadline(3); }

Test(comm, mpi_bcast_deadline_then_abort_np2, .timeout = 60)
{
    skip_without_mpi();
    struct job j;
    run_probe(&j, 2, "bcast_timeout", NULL, 60);
    cr_assert_not(j.timed_out, "%s", j.out);
    cr_assert_eq(count(j.out, "bcast_timeout ok"), 1, "rank 1 saw the timeout:\n%s", j.out);
    cr_assert_eq(j.code, 42, "mpirun exits with the abort code, got %d:\n%s", j.code, j.out);
    cr_log_info("took %.1f s", j.secs); /* the upper bound is the test's timeout */
    free(j.out);
}

/* nccl on GPUs, one per rank: skipped where this process sees fewer. */
static void skip_without_gpus(int want)
{
    skip_without_mpi();
    const char *why = nccl_refusal();
    if (why) cr_skip_test("needs %d GPU%s with NCCL: %s", want, want == 1 ? "" : "s", why);
    int n = 0;
    if (cdp_device_count(CDP_BACKEND_CUDA, &n) || n < want)
        cr_skip_test("needs %d GPUs, %d here", want, n);
}

Test(comm, mpi_nccl_np1_needs_gpu)
{
    skip_without_gpus(1);
    expect_ok(1, "nccl", NULL);
}

Test(comm, mpi_nccl_np2_needs_2_gpus)
{
    skip_without_gpus(2);
    expect_ok(2, "nccl", NULL);
}

Test(comm, mpi_nccl_deadline_then_abort_np2_needs_2_gpus)
{
    skip_without_gpus(2);
    struct job j;
    run_probe(&j, 2, "nccl_timeout", NULL, 90);
    cr_assert_not(j.timed_out, "%s", j.out);
    cr_assert_eq(count(j.out, "nccl_timeout ok"), 1, "rank 1 saw the timeout:\n%s", j.out);
    cr_assert_eq(j.code, 42, "mpirun exits with the abort code, got %d:\n%s", j.code, j.out);
    free(j.out);
}

/* The pids the probe's ranks printed ("pid R PID"). */
static int probe_pids(const char *out, int *pids, int max)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, "pid ")) && n < max; p += 4) {
        int r, pid;
        if (sscanf(p, "pid %d %d", &r, &pid) == 2) pids[n++] = pid;
    }
    return n;
}

static int alive(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

static void expect_job_ends(int np, const char *scenario, int want_code)
{
    skip_without_mpi();
    struct job j;
    run_probe(&j, np, scenario, NULL, 90);
    int pids[16], n = probe_pids(j.out, pids, 16);
    /* a rank may still be on its way out when mpirun returns: give it 5 s */
    int left = 0;
    double t0 = now_s();
    do {
        left = 0;
        for (int i = 0; i < n; i++) left += alive(pids[i]);
        if (left) {
            struct timespec ts = { 0, 20000000 };
            nanosleep(&ts, NULL);
        }
    } while (left && now_s() - t0 < 5);
    for (int i = 0; i < n; i++)
        if (alive(pids[i])) kill(pids[i], SIGKILL);
    cr_assert_not(j.timed_out, "mpirun -np %d %s still running after 90 s:\n%s", np, scenario, j.out);
    cr_assert_eq(n, np, "every rank printed its pid:\n%s", j.out);
    cr_assert_eq(left, 0, "%d rank processes outlived mpirun by 5 s", left);
    cr_assert_neq(j.code, 0, "the job fails:\n%s", j.out);
    if (want_code) cr_assert_eq(j.code, want_code, "exit code %d:\n%s", j.code, j.out);
    /* the upper bound is the test's timeout */
    cr_log_info("the job ended after %.1f s", j.secs);
    cr_assert_eq(count(j.out, "FAIL"), 0, "%s", j.out);
    free(j.out);
}

Test(comm, mpi_abort_from_one_rank_ends_the_job_np1, .timeout = 60) { expect_job_ends(1, "abort", 7); }
Test(comm, mpi_abort_from_one_rank_ends_the_job_np2, .timeout = 60) { expect_job_ends(2, "abort", 7); }
Test(comm, mpi_abort_from_one_rank_ends_the_job_np4, .timeout = 60) { expect_job_ends(4, "abort", 7); }
Test(comm, mpi_killed_rank_ends_the_job_np2, .timeout = 60) { expect_job_ends(2, "kill", 0); }
Test(comm, mpi_killed_rank_ends_the_job_np4, .timeout = 60) { expect_job_ends(4, "kill", 0); }
