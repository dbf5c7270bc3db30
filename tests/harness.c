/* Test helpers: running the binary with captured output, temporary files. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct growbuf {
    char *p;
    size_t n, cap;
};

static void growbuf_add(struct growbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

int cdp_test_run(struct cdp_run *r, const char *const *argv)
{
    const char *bin = getenv("CDP_BIN");
    int outp[2], errp[2];
    memset(r, 0, sizeof *r);
    if (!bin) {
        fprintf(stderr, "CDP_BIN is not set (run the tests through meson test)\n");
        return -1;
    }
    if (pipe(outp) || pipe(errp)) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(outp[1], 1);
        dup2(errp[1], 2);
        close(outp[0]);
        close(errp[0]);
        size_t n = 0;
        while (argv[n]) n++;
        char **args = calloc(n + 2, sizeof *args);
        args[0] = (char *)bin;
        for (size_t i = 0; i < n; i++) args[i + 1] = (char *)argv[i];
        execv(bin, args);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    close(outp[1]);
    close(errp[1]);
    struct growbuf out = {0}, err = {0};
    growbuf_add(&out, "", 0);
    growbuf_add(&err, "", 0);
    struct pollfd fds[2] = {{.fd = outp[0], .events = POLLIN}, {.fd = errp[0], .events = POLLIN}};
    int open_fds = 2;
    time_t deadline = time(NULL) + 60;
    while (open_fds > 0) {
        int rc = poll(fds, 2, 1000);
        if (rc < 0 && errno != EINTR) break;
        if (time(NULL) > deadline) {
            kill(pid, SIGKILL);
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char buf[4096];
            ssize_t k = read(fds[i].fd, buf, sizeof buf);
            if (k <= 0) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            } else {
                growbuf_add(i == 0 ? &out : &err, buf, (size_t)k);
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0) close(fds[i].fd);
    int status = 0;
    waitpid(pid, &status, 0);
    r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r->out = out.p;
    r->err = err.p;
    return 0;
}

void cdp_test_run_free(struct cdp_run *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* The folders this process made, removed when it exits (each Criterion test
 * runs in a process of its own) unless CDP_TEST_KEEP is set, for a look at
 * what a failed test left. A child made by fork inherits the list but not the
 * duty: only the process that made a folder removes it. */
static struct {
    pid_t pid;
    int n;
    char path[64][4096];
} made;

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void remove_made(void)
{
    if (made.pid != getpid()) return;
    for (int i = 0; i < made.n; i++) nftw(made.path[i], remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *cdp_test_tmpdir(void)
{
    static char path[4096];
    const char *base = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/cdp-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(path)) {
        perror("mkdtemp");
        abort();
    }
    const char *keep = getenv("CDP_TEST_KEEP");
    if (!(keep && *keep)) {
        if (made.pid != getpid()) {
            if (made.pid == 0) atexit(remove_made);
            made.pid = getpid();
            made.n = 0;
        }
        if (made.n < (int)(sizeof made.path / sizeof made.path[0])) snprintf(made.path[made.n++], 4096, "%s", path);
    }
    return path;
}

const char *cdp_test_write_file(const char *dir, const char *name, const char *text)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        abort();
    }
    fputs(text, f);
    fclose(f);
    return path;
}

const char *cdp_test_source_path(const char *rel)
{
    static char path[4096];
    const char *root = getenv("CDP_SOURCE_ROOT");
    snprintf(path, sizeof path, "%s/%s", root ? root : ".", rel);
    return path;
}

char *cdp_test_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct growbuf b = {0};
    growbuf_add(&b, "", 0);
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) growbuf_add(&b, buf, k);
    fclose(f);
    return b.p;
}

long cdp_test_files_differ(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    long n = 0, at = 0;
    if (fa && fb)
        for (;; n++) {
            int x = fgetc(fa), y = fgetc(fb);
            if (x != y) {
                at = n;
                break;
            }
            if (x == EOF) {
                at = n > 0 ? -1 : 0;
                break;
            }
        }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return at;
}
