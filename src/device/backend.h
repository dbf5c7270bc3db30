/* The device backend table, shared by the core and the backends, including the
 * CUDA module (.cu): keep it valid C and CUDA C++. A backend works on its own
 * opaque per-device state; the core does the memory accounting and checks. */
#ifndef CDP_DEVICE_BACKEND_H
#define CDP_DEVICE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "cdp/log.h"
#include "cdp/status.h"

struct cdp_ops;
struct cdp_device;

#ifdef __cplusplus
extern "C" {
#endif

#define CDP_DEVICE_ABI 7

enum cdp_copy_kind { CDP_COPY_H2D = 0, CDP_COPY_D2H, CDP_COPY_D2D };

struct cdp_device_info {
    uint64_t total_memory;
    char description[320];
};

/* NULL in an optional slot means "not supported" (synchronize: "synchronous"). */
struct cdp_device_backend {
    int abi;
    const char *name;
    cdp_status (*count)(int *out);
    cdp_status (*open)(int index, void **state, struct cdp_device_info *info);
    void (*close)(void *state);
    cdp_status (*alloc)(void *state, uint64_t bytes, void **out);
    void (*free)(void *state, void *ptr);
    cdp_status (*copy)(void *state, void *dst, const void *src, uint64_t n, enum cdp_copy_kind kind);
    cdp_status (*memset)(void *state, void *ptr, int value, uint64_t n);
    cdp_status (*synchronize)(void *state);
    cdp_status (*event_create)(void *state, void **ev);
    cdp_status (*event_record)(void *state, void *ev);
    cdp_status (*event_elapsed_ms)(void *state, void *start, void *end, double *ms);
    void (*event_destroy)(void *state, void *ev);
    /* The backend's kernels (kernels/ops.h), called with `state`; NULL when the
     * backend has none. */
    const struct cdp_ops *ops;
    /* How busy the device has been lately (0..1, the driver's sampling
     * period; < 0 when unknown) and the bytes in use on it by every process
     * (0 when unknown). NULL: not supported. Added in ABI 4 (ABI 5 moved
     * NCCL's table out of this one: cdp_device_module_symbol; ABI 6 added
     * reduce_scatter and all_gather to that table, comm/nccl_module.h). */
    cdp_status (*usage)(void *state, double *util, uint64_t *mem_used);
};

/* The one symbol a device module exports. */
#define CDP_DEVICE_MODULE_ENTRY "cdp_device_module_init"
typedef cdp_status (*cdp_device_module_init_fn)(const struct cdp_module_host *host,
                                                const struct cdp_device_backend **out);

/* In the core: the built-in CPU backend, and the loader of module backends. */
extern const struct cdp_device_backend cdp_cpu_backend;
cdp_status cdp_device_module_load(const char *name, const struct cdp_device_backend **out);
/* Another table a module exports (a layer above the devices looks up its own,
 * e.g. the nccl communicator's "cdp_nccl_module_ops"): *out is the symbol's
 * address, or NULL when the module does not export it. Fails as
 * cdp_device_module_load does when the module cannot be loaded. */
cdp_status cdp_device_module_symbol(const char *name, const char *symbol, const void **out);

#ifdef __cplusplus
}
#endif

#endif
