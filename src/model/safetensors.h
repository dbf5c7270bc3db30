/* safetensors files: an 8-byte little-endian header length, a JSON header
 * {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}
 * and the raw little-endian tensor bytes. Used for weights, optimizer state and
 * checkpoints; readable by the Hugging Face tools. */
#ifndef CDP_MODEL_SAFETENSORS_H
#define CDP_MODEL_SAFETENSORS_H

#include <stdint.h>

#include "cdp/status.h"
#include "cdp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_safetensors_tensor {
    const char *name;      /* owned by the file/writer it comes from */
    enum cdp_dtype dtype;  /* F32, BF16, I32; CDP_DTYPE_COUNT for the file's other dtypes */
    const char *dtype_name; /* as written in the file ("F32", "F16", ...); writing: NULL =
                               from dtype, else one of the names below (wins over dtype) */
    int ndim;
    int64_t shape[CDP_MAX_DIMS];
    const void *data;      /* reading: points into the mapped file (aligned only when the
                              writer padded its header, as ours does); writing: the caller's */
    uint64_t nbytes;
};

struct cdp_safetensors_file;

/* Opens and validates a file: header length within the file and at most 100 MB,
 * JSON well formed without duplicate keys, every tensor an object with exactly
 * dtype, shape and data_offsets, its dtype known (F64 F32 F16 BF16 I64 I32 I16 I8
 * U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2), at most CDP_MAX_DIMS dimensions, shape
 * times element size equal to its byte range, ranges inside the data section,
 * not overlapping, covering it; __metadata__ an object of strings. Errors
 * (CDP_ERR_INVALID; CDP_ERR_IO when the file cannot be read) name the file and the
 * tensor. The data is memory-mapped read-only until cdp_safetensors_close. Tensors keep
 * the header's order. */
cdp_status cdp_safetensors_open(const char *path, struct cdp_safetensors_file **out);
void cdp_safetensors_close(struct cdp_safetensors_file *f);

int cdp_safetensors_count(const struct cdp_safetensors_file *f);
const struct cdp_safetensors_tensor *cdp_safetensors_at(const struct cdp_safetensors_file *f, int i);
/* NULL when absent. */
const struct cdp_safetensors_tensor *cdp_safetensors_find(const struct cdp_safetensors_file *f, const char *name);
/* A "__metadata__" string value, or NULL. */
const char *cdp_safetensors_metadata(const struct cdp_safetensors_file *f, const char *key);

/* Reads a tensor as float32 into dst: F32 copied, BF16 and F16 widened. With
 * shape != NULL the tensor's shape must equal shape[0..ndim) (so dst holds their
 * product); with shape == NULL any shape is read whole (ndim is ignored; size dst
 * from cdp_safetensors_find). Fails with CDP_ERR_INVALID, naming the file and tensor, when
 * the tensor is absent, its shape differs, or its dtype is not a float one. */
cdp_status cdp_safetensors_read_f32(const struct cdp_safetensors_file *f, const char *name, int ndim,
                                    const int64_t *shape, float *dst);

/* Elements [first, first + count) of a float tensor (F32, BF16 or F16), in its
 * row-major order, as float32 into dst (count floats): a tensor read piece by
 * piece, as when it is staged to device memory. CDP_ERR_INVALID, naming the
 * file and tensor, when it is absent, not a float one, or the range runs past
 * its end. */
cdp_status cdp_safetensors_read_f32_range(const struct cdp_safetensors_file *f, const char *name, uint64_t first,
                                          uint64_t count, float *dst);

/* Writes tensors (data from the caller) with optional metadata key/value pairs
 * (n_meta pairs in meta[2*i], meta[2*i+1]) to path atomically: a temporary file
 * in the same folder, fsync, rename, fsync of the folder. On any failure nothing
 * is left at path that was not there before, and the temporary is removed.
 * Tensor names must be unique, non-empty and not "__metadata__"; nbytes must equal
 * the shape's element count times the dtype's size. Tensors are packed without
 * holes in the order given, the header lists __metadata__ first and then the
 * tensors in that order, and is padded with spaces so that the data starts on an
 * 8-byte boundary, as the format asks. The file gets mode 0644. Bad arguments give
 * CDP_ERR_INVALID before anything is created; system failures CDP_ERR_IO. A folder
 * that cannot be fsynced after the rename is only a warning (the file is complete). */
cdp_status cdp_safetensors_write(const char *path, const struct cdp_safetensors_tensor *tensors, int n,
                                 const char *const *meta, int n_meta);

/* How cdp_safetensors_write_staged gets the bytes of a tensor whose data the host cannot
 * read in place (device memory): copies bytes [offset, offset + n) of t (its
 * data is the caller's handle) into the host buffer dst. */
typedef cdp_status (*cdp_safetensors_fetch_fn)(void *ctx, const struct cdp_safetensors_tensor *t, uint64_t offset,
                                               void *dst, uint64_t n);

/* cdp_safetensors_write, for tensors whose data the host cannot read: each tensor's
 * bytes are fetched into one host buffer and written from there, at most
 * `chunk` bytes at a time (the buffer is min(chunk, the largest tensor); the
 * data pointers are only handed to fetch). A failing fetch fails the write as
 * an I/O failure does (its status, the file and tensor named; the temporary
 * is removed, nothing is left at path). */
cdp_status cdp_safetensors_write_staged(const char *path, const struct cdp_safetensors_tensor *tensors, int n,
                                        const char *const *meta, int n_meta, cdp_safetensors_fetch_fn fetch, void *ctx,
                                        uint64_t chunk);

#ifdef __cplusplus
}
#endif

#endif
