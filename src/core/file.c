/* Files written whole or not at all (file.h). */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/log.h"

/* The folder of path ("." for a bare name), malloc'd. */
static char *folder_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return NULL;
    char *dir = strdup(dirname(copy));
    free(copy);
    return dir;
}

static void release(struct cdp_atomic_file *f)
{
    free(f->path);
    free(f->tmp);
    f->path = f->tmp = NULL;
    f->stream = NULL;
}

cdp_status cdp_atomic_open(const char *path, struct cdp_atomic_file *out)
{
    struct cdp_atomic_file f = {0};
    char *copy = strdup(path), *dir = folder_of(path);
    f.path = strdup(path);
    size_t cap = strlen(path) + 32;
    f.tmp = malloc(cap);
    if (!copy || !dir || !f.path || !f.tmp) {
        free(copy);
        free(dir);
        release(&f);
        return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(f.tmp, cap, "%s/.%s.tmp-XXXXXX", dir, basename(copy));
    free(copy);
    int fd = mkostemp(f.tmp, O_CLOEXEC);
    if (fd < 0) {
        cdp_status st = cdp_fail(CDP_ERR_IO, "%s: cannot create a temporary file in %s: %s", path, dir,
                                 strerror(errno));
        free(dir);
        release(&f);
        return st;
    }
    free(dir);
    /* mkstemp makes the file private (0600); an output is an ordinary file */
    if (fchmod(fd, 0644) != 0 || !(f.stream = fdopen(fd, "w"))) {
        cdp_status st = cdp_fail(CDP_ERR_IO, "%s: cannot write %s: %s", path, f.tmp, strerror(errno));
        close(fd);
        unlink(f.tmp);
        release(&f);
        return st;
    }
    *out = f;
    return CDP_OK;
}

cdp_status cdp_atomic_write(struct cdp_atomic_file *f, const void *data, size_t n)
{
    if (n && fwrite(data, 1, n, f->stream) != n)
        return cdp_fail(CDP_ERR_IO, "%s: cannot write %s: %s", f->path, f->tmp, strerror(errno));
    return CDP_OK;
}

cdp_status cdp_atomic_commit(struct cdp_atomic_file *f)
{
    cdp_status st = CDP_OK;
    if (fflush(f->stream) != 0 || ferror(f->stream))
        st = cdp_fail(CDP_ERR_IO, "%s: cannot write %s: %s", f->path, f->tmp, strerror(errno));
    else if (fsync(fileno(f->stream)) != 0)
        st = cdp_fail(CDP_ERR_IO, "%s: cannot sync %s: %s", f->path, f->tmp, strerror(errno));
    if (fclose(f->stream) != 0 && !st)
        st = cdp_fail(CDP_ERR_IO, "%s: cannot close %s: %s", f->path, f->tmp, strerror(errno));
    if (!st && rename(f->tmp, f->path) != 0)
        st = cdp_fail(CDP_ERR_IO, "%s: cannot rename %s into place: %s", f->path, f->tmp, strerror(errno));
    if (st) {
        unlink(f->tmp);
    } else {
        char *dir = folder_of(f->path);
        if (dir) cdp_sync_dir(dir);
        free(dir);
    }
    release(f);
    return st;
}

void cdp_atomic_abort(struct cdp_atomic_file *f)
{
    if (f->stream) fclose(f->stream);
    if (f->tmp) unlink(f->tmp);
    release(f);
}

cdp_status cdp_write_file_atomic(const char *path, const void *data, size_t n)
{
    struct cdp_atomic_file f;
    cdp_status st = cdp_atomic_open(path, &f);
    if (st) return st;
    if ((st = cdp_atomic_write(&f, data, n))) {
        cdp_atomic_abort(&f);
        return st;
    }
    return cdp_atomic_commit(&f);
}

cdp_status cdp_check_writable(const char *path, int is_dir)
{
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (!is_dir && S_ISDIR(sb.st_mode)) return cdp_fail(CDP_ERR_IO, "cannot write %s: it is a folder", path);
        if (is_dir && !S_ISDIR(sb.st_mode)) return cdp_fail(CDP_ERR_IO, "cannot use %s as a folder: it is a file", path);
        if (is_dir) {
            if (access(path, W_OK | X_OK) != 0)
                return cdp_fail(CDP_ERR_IO, "cannot write in %s: %s", path, strerror(errno));
            return CDP_OK;
        }
        if (!S_ISREG(sb.st_mode)) { /* a device such as /dev/null: written in place */
            if (access(path, W_OK) != 0) return cdp_fail(CDP_ERR_IO, "cannot write %s: %s", path, strerror(errno));
            return CDP_OK;
        }
    }
    /* the folder a file goes in (the nearest existing one for a folder) */
    char *copy = strdup(path);
    if (!copy) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    cdp_status st = CDP_OK;
    char *dir = is_dir ? copy : dirname(copy);
    for (;;) {
        if (stat(dir, &sb) == 0) {
            if (!S_ISDIR(sb.st_mode)) st = cdp_fail(CDP_ERR_IO, "cannot write %s: %s is not a folder", path, dir);
            else if (access(dir, W_OK | X_OK) != 0)
                st = cdp_fail(CDP_ERR_IO, "cannot write %s: its folder %s takes no new files: %s", path, dir,
                              strerror(errno));
            break;
        }
        if (!is_dir || !strcmp(dir, "/") || !strcmp(dir, ".")) {
            st = cdp_fail(CDP_ERR_IO, "cannot write %s: its folder %s does not exist", path, dir);
            break;
        }
        dir = dirname(dir);
    }
    free(copy);
    return st;
}

void cdp_sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) CDP_WARN(CORE, "cannot sync the folder %s: %s", dir, strerror(errno));
    if (fd >= 0) close(fd);
}

cdp_status cdp_dir_lock(const char *dir, const char *name, const char *what, int *fd)
{
    char path[4352];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return cdp_fail(CDP_ERR_INVALID, "%s: the path is too long", dir);
    const int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (f < 0) return cdp_fail(CDP_ERR_IO, "%s: cannot lock %s: %s", dir, what, strerror(errno));
    if (flock(f, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        char holder[256] = "";
        const ssize_t got = pread(f, holder, sizeof holder - 1, 0);
        close(f);
        if (got > 0) holder[got] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        if (e == EWOULDBLOCK)
            return cdp_fail(CDP_ERR_INVALID, "%s (%s) is in use by another job: %s (%s is locked); one job at a "
                            "time uses it: wait for that one to end, or give this job another folder", dir, what,
                            holder[0] ? holder : "it did not say who it is", path);
        return cdp_fail(CDP_ERR_IO, "%s: cannot lock %s: %s", dir, what, strerror(e));
    }
    char me[320], host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    const int n = snprintf(me, sizeof me, "pid %ld on %s\n", (long)getpid(), host);
    /* who holds it, for the next one's message; a failure here changes nothing about the lock */
    if (ftruncate(f, 0) == 0 && pwrite(f, me, (size_t)n, 0) != n) CDP_DEBUG(CORE, "%s: cannot write the holder", path);
    *fd = f;
    return CDP_OK;
}
