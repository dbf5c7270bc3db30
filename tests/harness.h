/* Test helpers: run the cdphybrid binary and capture what it prints, write
 * temporary plan files, find files of the source tree. */
#ifndef CDP_TEST_HARNESS_H
#define CDP_TEST_HARNESS_H

#include <stddef.h>

struct cdp_run {
    int exit_code;   /* the exit status, or 128 + signal when killed by one */
    char *out;       /* everything written to stdout (owned, NUL-terminated) */
    char *err;       /* everything written to stderr (owned, NUL-terminated) */
};

/* 1 in an AddressSanitizer build (gcc and clang say so differently). */
#if defined(__SANITIZE_ADDRESS__)
#define CDP_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CDP_TEST_ASAN 1
#endif
#endif
#ifndef CDP_TEST_ASAN
#define CDP_TEST_ASAN 0
#endif

/* How long one run of the binary may take before the harness kills it: 60 s,
 * and 110 s under AddressSanitizer, where an 8-rank run on a loaded 2-core
 * machine was measured at 54-61 s (still below the 120 s a test is given). */
#define CDP_TEST_RUN_LIMIT_S (CDP_TEST_ASAN ? 110 : 60)

/* Runs $CDP_BIN with the given arguments (NULL-terminated), with no stdin and a
 * CDP_TEST_RUN_LIMIT_S limit (past it the run is killed, exit_code is 137 and
 * err ends with a line saying so); captures stdout and stderr. Returns 0 on success (the run itself
 * may still have failed: see exit_code), -1 if it could not be started. */
int cdp_test_run(struct cdp_run *r, const char *const *argv);
void cdp_test_run_free(struct cdp_run *r);

/* A fresh temporary folder (mkdtemp under $TMPDIR or /tmp). The returned string
 * is static storage reused by the next call of this function in the process. */
const char *cdp_test_tmpdir(void);

/* Writes text to dir/name and returns the full path (static storage, reused). */
const char *cdp_test_write_file(const char *dir, const char *name, const char *text);

/* Path of a file in the source tree ($CDP_SOURCE_ROOT/rel); static storage, reused. */
const char *cdp_test_source_path(const char *rel);

/* Compares two files byte for byte: -1 when they are equal and not empty,
 * else the offset of the first byte that differs (0 when one cannot be read
 * or both are empty). */
long cdp_test_files_differ(const char *a, const char *b);

/* cdp_test_files_differ for two checkpoint parts of different runs: the value
 * of their "run" metadata (the id of the run that wrote each, the same length
 * in both) is not compared; every other byte is. */
long cdp_test_parts_differ(const char *a, const char *b);

/* The grid stride of this run: $CDP_TEST_SAMPLE (an integer >= 1), else 1.
 * CI's sanitizer pass sets it so that each parameterized grid runs every
 * stride-th cell (the first always among them); the plain pass runs every
 * cell. */
int cdp_test_sample(void);

/* Keeps every cdp_test_sample()-th of the n cells of size bytes at cells
 * (cells 0, k, 2k, ...), moved to the front; returns how many remain. */
size_t cdp_test_sample_cells(void *cells, size_t n, size_t size);

/* For a test that crosses two features each of which another test runs
 * alone (a ZeRO checkpoint killed before a part is written: the ZeRO kill and
 * the part kill): when grids are sampled (cdp_test_sample() above 1, CI's
 * sanitizer pass), it skips, naming the tests that run its paths there. The
 * plain pass runs it. For Criterion tests (cr_skip_test). */
#define CDP_TEST_SKIP_WHEN_SAMPLED(covered_by)                                                             \
    do {                                                                                                    \
        if (cdp_test_sample() > 1)                                                                          \
            cr_skip_test("CDP_TEST_SAMPLE=%d: a cross of what %s run alone", cdp_test_sample(), covered_by); \
    } while (0)

/* Reads a whole file; NULL if it cannot. Caller frees. */
char *cdp_test_read_file(const char *path);

/* A run of the binary in the background, as a shell starts a job: in a
 * process group of its own, stdout and stderr into files of a fresh folder,
 * and every process it starts marked with CDP_TEST_TAG=tag (its environment),
 * so that a test can find what is left of it (cdp_test_tagged). Whatever of
 * it is alive when the test's process exits (a test that failed half way) is
 * killed then. */
struct cdp_job {
    int pid;
    char tag[40];
    char out[4200], err[4200];
};

/* What the child gets before exec: limits (0: as it is), its CPUs ("" or NULL:
 * as it is; "1": CPU 1 only), variables to take out of its environment
 * (NULL-terminated, or NULL). */
struct cdp_job_opts {
    unsigned long long as_bytes, fsize_bytes, nofile;
    const char *cpus;
    const char *const *unset;
    const char *const *set; /* "NAME=VALUE" strings put into its environment (NULL-terminated), or NULL */
};

/* Starts $CDP_BIN with argv (NULL-terminated); opts may be NULL. 0 or -1. */
int cdp_test_start(struct cdp_job *j, const char *const *argv, const struct cdp_job_opts *opts);
/* Waits up to timeout_s for it to end (then kills its group with SIGKILL and
 * says so in r->err); r gets the exit code and what it wrote. */
void cdp_test_finish(struct cdp_job *j, int timeout_s, struct cdp_run *r);
/* Waits up to timeout_s until the file holds text; 1 when it does. */
int cdp_test_wait_for(const char *path, const char *text, int timeout_s);
/* Processes alive (not zombies) whose environment holds CDP_TEST_TAG=tag;
 * their pids go to pids (up to cap) when it is not NULL. */
int cdp_test_tagged(const char *tag, int *pids, int cap);
/* The pid of a live process of the job that is rank `rank` of its MPI job
 * (OMPI_COMM_WORLD_RANK in its environment), or -1. */
int cdp_test_rank_pid(const char *tag, int rank);

#endif
