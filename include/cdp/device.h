/* Devices and the buffers they own. One API over every backend: the CPU backend
 * is always built in; the CUDA backend is a module loaded at run time, so
 * programs that never touch a GPU do not load the CUDA libraries.
 * Every device has a memory cap; allocations past it fail with a message that
 * names the device, the bytes asked for, the bytes in use and the cap. */
#ifndef CDP_DEVICE_H
#define CDP_DEVICE_H

#include "cdp/api.h"

#include <stdint.h>

#include "cdp/core.h" /* enum cdp_backend */
#include "cdp/plan_types.h" /* enum cdp_precision */
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cdp_device *cdp_device_t;
typedef struct cdp_buffer *cdp_buffer_t;
typedef struct cdp_event *cdp_event_t;
struct cdp_ops;

/* How many devices of a type are usable. CPU: 1 (the host; ranks share it).
 * CUDA: loads the CUDA module on first use; when it is missing or no GPU is
 * usable, *out is 0 and the status says why (CDP_ERR_UNSUPPORTED, with the
 * CUDA error string in cdp_last_error()). */
CDP_API cdp_status cdp_device_count(enum cdp_backend type, int *out);

/* Opens device `index` of a type. mem_cap is the most bytes its buffers may hold
 * at once; 0 means the device's own memory (CPU: physical memory). On success
 * *out is a new device; close it after every buffer made on it is destroyed. */
CDP_API cdp_status cdp_device_open(enum cdp_backend type, int index, uint64_t mem_cap,
                           cdp_device_t *out);
/* Closes a device; NULL is a no-op. Buffers still alive are a programmer error. */
CDP_API void cdp_device_close(cdp_device_t dev);

CDP_API enum cdp_backend cdp_device_backend_of(cdp_device_t dev);
/* "cpu:0", "cuda:1" */
CDP_API const char *cdp_device_name(cdp_device_t dev);
/* What the backend says about the device ("NVIDIA H200, sm_90, 139.8 GiB"). */
CDP_API const char *cdp_device_description(cdp_device_t dev);
CDP_API uint64_t cdp_device_mem_cap(cdp_device_t dev);
CDP_API uint64_t cdp_device_mem_in_use(cdp_device_t dev);
CDP_API uint64_t cdp_device_mem_peak(cdp_device_t dev);
/* Total memory of the device as the backend reports it. */
CDP_API uint64_t cdp_device_mem_total(cdp_device_t dev);

/* The device's kernel table (kernels/ops.h; NULL if the backend has none) and
 * the state its ops take as their first argument. */
CDP_API const struct cdp_ops *cdp_device_ops(cdp_device_t dev);
CDP_API void *cdp_device_kernel_state(cdp_device_t dev);

/* The precision its matrix-multiply kernels run in (kernels/ops.h,
 * set_precision): CDP_ERR_UNSUPPORTED where the backend has no kernels or not
 * that precision. */
CDP_API cdp_status cdp_device_set_precision(cdp_device_t dev, enum cdp_precision p);

/* Waits for all work queued on the device. */
CDP_API cdp_status cdp_device_synchronize(cdp_device_t dev);

/* Allocates `bytes` on the device (64-byte aligned at least). Zero bytes is
 * allowed and gives an empty buffer. Fails with CDP_ERR_NOMEM past the cap or
 * when the backend is out of memory. */
CDP_API cdp_status cdp_buffer_create(cdp_device_t dev, uint64_t bytes, cdp_buffer_t *out);
/* Frees a buffer; NULL is a no-op. */
CDP_API void cdp_buffer_destroy(cdp_buffer_t buf);
/* Device pointer (may be NULL for an empty buffer); not owned. */
CDP_API void *cdp_buffer_data(cdp_buffer_t buf);
CDP_API uint64_t cdp_buffer_size(cdp_buffer_t buf);
CDP_API cdp_device_t cdp_buffer_device(cdp_buffer_t buf);

/* Host -> buffer, buffer -> host, buffer -> buffer (any devices), byte fill.
 * Ranges are checked against the buffers' sizes (CDP_ERR_INVALID when outside).
 * write and read return when the host memory may be reused / read. */
CDP_API cdp_status cdp_buffer_write(cdp_buffer_t dst, uint64_t offset, const void *src, uint64_t n);
CDP_API cdp_status cdp_buffer_read(cdp_buffer_t src, uint64_t offset, void *dst, uint64_t n);
CDP_API cdp_status cdp_buffer_copy(cdp_buffer_t dst, uint64_t dst_offset, cdp_buffer_t src,
                           uint64_t src_offset, uint64_t n);
CDP_API cdp_status cdp_buffer_memset(cdp_buffer_t buf, uint64_t offset, int value, uint64_t n);

/* Host -> device memory and device -> host memory at raw device pointers
 * (inside some buffer of dev; the caller answers for the range), for code
 * that holds pointers rather than buffers (the executor's activations). They
 * return when the host memory may be reused / read. */
CDP_API cdp_status cdp_device_write(cdp_device_t dev, void *dst, const void *src, uint64_t n);
CDP_API cdp_status cdp_device_read(cdp_device_t dev, void *dst, const void *src, uint64_t n);
/* How busy a GPU has been over the driver's last sampling period (0..1, NVML;
 * -1 when unknown) and the memory in use on it by every process (0 when
 * unknown). CDP_ERR_UNSUPPORTED for backends without the figures (cpu). */
CDP_API cdp_status cdp_device_usage(cdp_device_t dev, double *util, uint64_t *mem_used);
/* 1 when the host may read and write the device's memory directly (cpu). */
CDP_API int cdp_device_host_visible(cdp_device_t dev);

/* Events mark points in a device's work queue, for timing. */
CDP_API cdp_status cdp_event_create(cdp_device_t dev, cdp_event_t *out);
CDP_API void cdp_event_destroy(cdp_event_t ev);
CDP_API cdp_status cdp_event_record(cdp_event_t ev);
/* Milliseconds between two recorded events of one device (waits for `end`). */
CDP_API cdp_status cdp_event_elapsed_ms(cdp_event_t start, cdp_event_t end, double *ms);

#ifdef __cplusplus
}
#endif

#endif
