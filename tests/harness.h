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

/* Runs $CDP_BIN with the given arguments (NULL-terminated), with no stdin and a
 * 60 s limit; captures stdout and stderr. Returns 0 on success (the run itself
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

/* Reads a whole file; NULL if it cannot. Caller frees. */
char *cdp_test_read_file(const char *path);

#endif
