/* Internal to the checkpoint files of src/model/ (checkpoint_*.c): the names,
 * folders, manifest reading and part cache they share. Not for other layers:
 * the interface is model/checkpoint.h. */
#ifndef CDP_MODEL_CHECKPOINT_INTERNAL_H
#define CDP_MODEL_CHECKPOINT_INTERNAL_H

#include <jansson.h>
#include <stdint.h>

#include "cdp/device.h"
#include "cdp/status.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"

#define MANIFEST "manifest.json"
/* 2: the manifest carries its own checksum (manifest_sha256); 1 (read, with a
 * warning) did not */
#define MANIFEST_VERSION 2
#define PART_SUFFIX ".safetensors"

/* Tensors in memory the host cannot address (a GPU's) go through host memory
 * in pieces of at most this many bytes, so that saving or loading holds one
 * piece on the host, never a copy of the parameters or the state. */
#define STAGE_BYTES ((uint64_t)8 << 20)

/* The run this process's parts and commits belong to (cdp_ckpt_set_run). */
extern char ckpt_run_id[40];

/* ---- paths and folders (checkpoint_folders.c) ---- */

/* A copy of a path without trailing slashes (except a lone "/"). */
char *ckpt_trimmed(const char *p);
/* dir/step-NNNNNNNN and dir/.step-NNNNNNNN.partial (malloc'd). */
char *ckpt_step_folder(const char *dir, int64_t step);
char *ckpt_partial_folder(const char *dir, int64_t step);
/* "step-<digits>" -> step; 0 for any other name. */
int ckpt_parse_step_name(const char *name, int64_t *step);
int ckpt_is_dir(const char *path);
int ckpt_is_file(const char *path);
/* mkdir that accepts an existing folder; mkdir -p. */
cdp_status ckpt_make_dir(const char *path);
cdp_status ckpt_make_dirs(const char *path);

/* A step folder of a checkpoint directory (ckpt_list_steps). */
struct ckpt_step_ent {
    int64_t step;
    int partial;  /* a save not yet committed (.step-N.partial) */
    int complete; /* committed and has its manifest */
    int broken;   /* a symbolic link to nothing (or to no folder) */
    char *path;
};

void ckpt_free_steps(struct ckpt_step_ent *e, int n);
/* The step folders under dir, newest first. A missing dir is an empty list. */
cdp_status ckpt_list_steps(const char *dir, struct ckpt_step_ent **out, int *n_out);
/* Removes a folder and the files in it (renamed aside first). */
void ckpt_remove_folder(const char *path);

/* ---- device memory and parts (checkpoint_write.c) ---- */

/* The device a range's memory is staged from (NULL: host visible, or no
 * optimizer). */
cdp_device_t ckpt_staging_device(struct cdp_optimizer *o);
/* A part name that is a plain file name. */
int ckpt_valid_part_name(const char *part);

/* ---- the manifest (checkpoint_manifest.c) ---- */

/* "layers.<N>.<param>" -> N; -1 otherwise. */
int ckpt_unit_of(const char *name);
const char *ckpt_optimizer_name(enum cdp_optimizer_type t);
/* Reads folder/manifest.json and checks every key and its type, and (version
 * 2) its own checksum; *root on success. */
cdp_status ckpt_read_manifest(const char *folder, json_t **root_out);
/* The manifest's own checksum (SHA-256 of its compact, sorted JSON without
 * manifest_sha256); nonzero when out of memory. */
int ckpt_manifest_sum(const json_t *root, char hex[65]);
/* Writes text to folder/name atomically (core/file.h). */
cdp_status ckpt_write_atomic(const char *folder, const char *name, const char *text);
/* Every part the manifest names has its size and checksum. */
cdp_status ckpt_verify_files(const char *folder, json_t *root);

/* ---- the parts of a checkpoint folder (checkpoint_load.c) ---- */

/* The parts of a checkpoint folder, opened on first use. */
struct ckpt_part_cache {
    const char *folder;
    int n;
    const char **names;
    struct cdp_safetensors_file **files;
    int64_t step; /* the manifest's */
};

cdp_status ckpt_part_cache_init(struct ckpt_part_cache *c, const char *folder, json_t *root);
void ckpt_part_cache_free(struct ckpt_part_cache *c);
/* The open part of that name; its path (for messages) goes to buf. */
cdp_status ckpt_part_get(struct ckpt_part_cache *c, const char *name, struct cdp_safetensors_file **out, char *buf,
                         size_t cap);

#endif
