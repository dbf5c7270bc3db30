/* Suite comm: the self communicator in process, and the mpi communicator
 * through tests/comm_probe.c run under `mpirun -np N` (1, 2, 3 and 4 ranks on
 * two cores, so 4 is oversubscribed), including a rank that aborts the job
 * and a rank that is killed. */
#include <criterion/criterion.h>
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
#include "comm/comm.h"

static double now_s(void) { return (double)cdp_time_ns() * 1e-9; }

/* ---- self ------------------------------------------------------------------- */

static cdp_comm_t self_comm(void)
{
    cdp_comm_t c = NULL;
    cr_assert_eq(cdp_comm_self(&c), CDP_OK, "%s", cdp_last_error());
    return c;
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

Test(comm, self_unmatched_receive_times_out_with_the_message)
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
    cr_assert(el >= 0.3 && el < 1.3, "waited %.3f s", el);
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

Test(comm, freeing_with_a_pending_request_is_a_programmer_error, .signal = SIGABRT)
{
    cdp_comm_t c = self_comm();
    char b[4];
    cdp_request_t r;
    cr_assert_eq(cdp_comm_irecv(c, b, 4, 0, 0, &r), CDP_OK);
    cdp_comm_free(c);
}

Test(comm, self_abort_ends_the_process_with_the_code, .exit_code = 5)
{
    cdp_comm_t c = self_comm();
    cdp_comm_abort(c, 5);
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
    /* sanitizer builds: the suppressions of Open MPI's leaks need whole stacks */
    static char lsan[1024];
    const char *lo = getenv("LSAN_OPTIONS");
    if (lo) {
        snprintf(lsan, sizeof lsan, "LSAN_OPTIONS=%s:fast_unwind_on_malloc=0", lo);
        argv[k++] = "-x";
        argv[k++] = "LSAN_OPTIONS";
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
        if (lo) putenv(lsan);
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

Test(comm, mpi_allreduce_np3) { expect_ok(3, "allreduce", NULL); }
Test(comm, mpi_p2p_np3) { expect_ok(3, "p2p", NULL); }
Test(comm, mpi_gather_np3) { expect_ok(3, "gather", NULL); }

Test(comm, mpi_chunked_messages_allreduce_and_gather_np3)
{
    expect_ok(3, "bigmsg", "CDP_COMM_CHUNK_BYTES=4096");
}

Test(comm, mpi_message_above_int_max_bytes_np2, .timeout = 240)
{
    expect_ok(2, "bigmsg", NULL);
}

Test(comm, mpi_allreduce_deadline_then_abort_np2)
{
    skip_without_mpi();
    struct job j;
    run_probe(&j, 2, "allreduce_timeout", NULL, 60);
    cr_assert_not(j.timed_out, "%s", j.out);
    cr_assert_eq(count(j.out, "allreduce_timeout ok"), 1, "rank 0 saw the timeout:\n%s", j.out);
    cr_assert_eq(j.code, 42, "mpirun exits with the abort code, got %d:\n%s", j.code, j.out);
    cr_assert_lt(j.secs, 15, "took %.1f s", j.secs);
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

static void expect_job_ends(int np, const char *scenario, int want_code, double within_s)
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
    cr_assert_lt(j.secs, within_s, "the job took %.1f s to end:\n%s", j.secs, j.out);
    cr_assert_eq(count(j.out, "FAIL"), 0, "%s", j.out);
    free(j.out);
}

Test(comm, mpi_abort_from_one_rank_ends_the_job_np1) { expect_job_ends(1, "abort", 7, 10); }
Test(comm, mpi_abort_from_one_rank_ends_the_job_np2) { expect_job_ends(2, "abort", 7, 10); }
Test(comm, mpi_abort_from_one_rank_ends_the_job_np4) { expect_job_ends(4, "abort", 7, 10); }
Test(comm, mpi_killed_rank_ends_the_job_np2) { expect_job_ends(2, "kill", 0, 30); }
Test(comm, mpi_killed_rank_ends_the_job_np4) { expect_job_ends(4, "kill", 0, 30); }
