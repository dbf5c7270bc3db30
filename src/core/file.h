/* Files that appear whole or not at all: every output of cdphybrid (weights,
 * checkpoints, traces, cost tables, exported topologies, planned.json) is
 * written to a temporary file in the target's folder (".NAME.tmp-XXXXXX",
 * mode 0644), synced, and renamed over the target, then the folder is synced;
 * a failure at any point removes the temporary and leaves the target as it
 * was. Every message names the target. */
#ifndef CDP_CORE_FILE_H
#define CDP_CORE_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A file being written. stream takes fprintf and friends; errors on it are
 * found at commit. */
struct cdp_atomic_file {
    FILE *stream;
    char *path; /* the target (owned) */
    char *tmp;  /* the temporary (owned) */
};

/* Creates the temporary for path. CDP_ERR_IO naming path when the folder
 * takes no new file. */
cdp_status cdp_atomic_open(const char *path, struct cdp_atomic_file *out);
/* Writes n bytes (any size); CDP_ERR_IO naming the target on failure. */
cdp_status cdp_atomic_write(struct cdp_atomic_file *f, const void *data, size_t n);
/* Flushes, syncs, closes and renames the temporary over the target, then
 * syncs the folder (a folder that cannot be synced is a warning: the file is
 * complete and in place). On failure the temporary is removed. Frees f in
 * every case. */
cdp_status cdp_atomic_commit(struct cdp_atomic_file *f);
/* Closes and removes the temporary, for a writer that failed; frees f. */
void cdp_atomic_abort(struct cdp_atomic_file *f);

/* All of data as the file path, atomically (the four steps above). */
cdp_status cdp_write_file_atomic(const char *path, const void *data, size_t n);

/* Whether path can be written before anything is run: a file (is_dir 0)
 * must not be a folder and its folder must exist and take new files (the
 * atomic writes above make their temporary there); a folder (is_dir 1, made
 * with mkdir -p when missing) must be one, or its nearest existing ancestor
 * must take new entries. CDP_ERR_IO naming path and what is wrong. */
cdp_status cdp_check_writable(const char *path, int is_dir);

/* An exclusive lock on a folder for as long as a job uses it: the file
 * dir/name (made when missing; the folder must exist), locked with flock and
 * holding "pid PID on HOST" of the holder, so that a second job is refused
 * with who holds it. *fd gets the open file (keep it open for the lock's
 * life; closing it, or the process's end, releases it; it is close-on-exec).
 * CDP_ERR_INVALID "DIR is in use by pid PID on HOST (DIR/NAME is locked)"
 * when another open file holds it (`what` names the folder's use: "the
 * output folder"); CDP_ERR_IO when the file cannot be made. */
cdp_status cdp_dir_lock(const char *dir, const char *name, const char *what, int *fd);

/* fsync of a folder, so that entries made in it survive a power loss; a
 * warning when it cannot be done. */
void cdp_sync_dir(const char *dir);

#ifdef __cplusplus
}
#endif

#endif
