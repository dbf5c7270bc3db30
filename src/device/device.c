/* The device front: picks a backend, keeps each device's memory accounting and
 * cap, checks buffer ranges, and turns backend failures into messages that
 * name the device. */
#include "cdp/device.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "device/backend.h"
#include "kernels/ops.h"

struct cdp_device {
    const struct cdp_device_backend *be;
    void *state;
    enum cdp_backend type;
    int index;
    char name[32];
    struct cdp_device_info info;
    uint64_t cap, in_use, peak;
    uint64_t live_buffers;
    pthread_mutex_t lock;
};

struct cdp_buffer {
    struct cdp_device *dev;
    void *ptr;
    uint64_t size;
};

struct cdp_event {
    struct cdp_device *dev;
    void *ev;
    int recorded;
};

static cdp_status backend_for(enum cdp_backend type, const struct cdp_device_backend **out)
{
    switch (type) {
    case CDP_BACKEND_CPU:
        *out = &cdp_cpu_backend;
        return CDP_OK;
    case CDP_BACKEND_CUDA:
        return cdp_device_module_load("cuda", out);
    case CDP_BACKEND_COUNT:
        break;
    }
    return cdp_fail(CDP_ERR_INVALID, "unknown device type %d", (int)type);
}

cdp_status cdp_device_count(enum cdp_backend type, int *out)
{
    const struct cdp_device_backend *be;
    cdp_status st;
    *out = 0;
    if ((st = backend_for(type, &be))) return st;
    int n = 0;
    if ((st = be->count(&n))) return st;
    *out = n;
    return CDP_OK;
}

cdp_status cdp_device_open(enum cdp_backend type, int index, uint64_t mem_cap,
                           cdp_device_t *out)
{
    const struct cdp_device_backend *be;
    cdp_status st;
    int n = 0;
    if ((st = backend_for(type, &be))) return st;
    if ((st = be->count(&n))) return st;
    if (index < 0 || index >= n)
        return cdp_fail(CDP_ERR_INVALID, "device %s:%d does not exist (%d %s device%s usable)",
                        cdp_backend_name(type), index, n, cdp_backend_name(type),
                        n == 1 ? "" : "s");
    struct cdp_device *d = calloc(1, sizeof *d);
    if (!d) return cdp_fail(CDP_ERR_NOMEM, "out of memory opening a device");
    d->be = be;
    d->type = type;
    d->index = index;
    snprintf(d->name, sizeof d->name, "%s:%d", cdp_backend_name(type), index);
    if ((st = be->open(index, &d->state, &d->info))) {
        free(d);
        return cdp_error_context(st, "device %s:%d", cdp_backend_name(type), index);
    }
    d->cap = mem_cap ? mem_cap : d->info.total_memory;
    pthread_mutex_init(&d->lock, NULL);
    CDP_DEBUG(DEVICE, "opened %s (%s), memory cap %" PRIu64 " bytes", d->name, d->info.description,
              d->cap);
    *out = d;
    return CDP_OK;
}

void cdp_device_close(cdp_device_t d)
{
    if (!d) return;
    CDP_ASSERT(d->live_buffers == 0 && "a device must outlive its buffers");
    d->be->close(d->state);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

enum cdp_backend cdp_device_backend_of(cdp_device_t d) { return d->type; }
const char *cdp_device_name(cdp_device_t d) { return d->name; }
const char *cdp_device_description(cdp_device_t d) { return d->info.description; }
uint64_t cdp_device_mem_cap(cdp_device_t d) { return d->cap; }
const struct cdp_ops *cdp_device_ops(cdp_device_t d) { return d->be->ops; }
void *cdp_device_kernel_state(cdp_device_t d) { return d->state; }

cdp_status cdp_device_set_precision(cdp_device_t d, enum cdp_precision p)
{
    const struct cdp_ops *ops = cdp_device_ops(d);
    if (!ops) return cdp_fail(CDP_ERR_UNSUPPORTED, "%s has no kernels", cdp_device_name(d));
    return ops->set_precision(d->state, p);
}
uint64_t cdp_device_mem_total(cdp_device_t d) { return d->info.total_memory; }

uint64_t cdp_device_mem_in_use(cdp_device_t d)
{
    pthread_mutex_lock(&d->lock);
    uint64_t v = d->in_use;
    pthread_mutex_unlock(&d->lock);
    return v;
}

uint64_t cdp_device_mem_peak(cdp_device_t d)
{
    pthread_mutex_lock(&d->lock);
    uint64_t v = d->peak;
    pthread_mutex_unlock(&d->lock);
    return v;
}

cdp_status cdp_device_synchronize(cdp_device_t d)
{
    if (!d->be->synchronize) return CDP_OK;
    cdp_status st = d->be->synchronize(d->state);
    return st ? cdp_error_context(st, "%s: synchronize", d->name) : CDP_OK;
}

/* Reserves bytes against the cap; the message names everything a user needs. */
static cdp_status reserve(struct cdp_device *d, uint64_t bytes)
{
    pthread_mutex_lock(&d->lock);
    uint64_t in_use = d->in_use;
    if (bytes > d->cap || in_use > d->cap - bytes) {
        pthread_mutex_unlock(&d->lock);
        char want[32], used[32], cap[32];
        return cdp_fail(CDP_ERR_NOMEM,
                        "%s: cannot allocate %s (%" PRIu64 " bytes): %s (%" PRIu64
                        " bytes) in use, memory cap %s (%" PRIu64 " bytes)",
                        d->name, cdp_format_bytes(bytes, want, sizeof want), bytes,
                        cdp_format_bytes(in_use, used, sizeof used), in_use,
                        cdp_format_bytes(d->cap, cap, sizeof cap), d->cap);
    }
    d->in_use += bytes;
    if (d->in_use > d->peak) d->peak = d->in_use;
    d->live_buffers++;
    pthread_mutex_unlock(&d->lock);
    return CDP_OK;
}

static void unreserve(struct cdp_device *d, uint64_t bytes)
{
    pthread_mutex_lock(&d->lock);
    d->in_use -= bytes;
    d->live_buffers--;
    pthread_mutex_unlock(&d->lock);
}

cdp_status cdp_buffer_create(cdp_device_t d, uint64_t bytes, cdp_buffer_t *out)
{
    cdp_status st;
    struct cdp_buffer *b = calloc(1, sizeof *b);
    if (!b) return cdp_fail(CDP_ERR_NOMEM, "%s: out of host memory for a buffer handle", d->name);
    if ((st = reserve(d, bytes))) {
        free(b);
        return st;
    }
    b->dev = d;
    b->size = bytes;
    if (bytes > 0 && (st = d->be->alloc(d->state, bytes, &b->ptr))) {
        unreserve(d, bytes);
        free(b);
        char want[32];
        return cdp_error_context(st, "%s: allocating %s (%" PRIu64 " bytes)", d->name,
                                 cdp_format_bytes(bytes, want, sizeof want), bytes);
    }
    *out = b;
    return CDP_OK;
}

void cdp_buffer_destroy(cdp_buffer_t b)
{
    if (!b) return;
    if (b->ptr) b->dev->be->free(b->dev->state, b->ptr);
    unreserve(b->dev, b->size);
    free(b);
}

void *cdp_buffer_data(cdp_buffer_t b) { return b->ptr; }
uint64_t cdp_buffer_size(cdp_buffer_t b) { return b->size; }
cdp_device_t cdp_buffer_device(cdp_buffer_t b) { return b->dev; }

static cdp_status check_range(cdp_buffer_t b, uint64_t offset, uint64_t n, const char *what)
{
    if (offset > b->size || n > b->size - offset)
        return cdp_fail(CDP_ERR_INVALID,
                        "%s: %s of %" PRIu64 " bytes at offset %" PRIu64
                        " is outside the %" PRIu64 "-byte buffer",
                        b->dev->name, what, n, offset, b->size);
    return CDP_OK;
}

static cdp_status backend_copy(struct cdp_device *d, void *dst, const void *src, uint64_t n,
                               enum cdp_copy_kind kind)
{
    cdp_status st = d->be->copy(d->state, dst, src, n, kind);
    return st ? cdp_error_context(st, "%s: copy of %" PRIu64 " bytes", d->name, n) : CDP_OK;
}

cdp_status cdp_buffer_write(cdp_buffer_t dst, uint64_t offset, const void *src, uint64_t n)
{
    cdp_status st = check_range(dst, offset, n, "write");
    if (st || n == 0) return st;
    return backend_copy(dst->dev, (char *)dst->ptr + offset, src, n, CDP_COPY_H2D);
}

cdp_status cdp_buffer_read(cdp_buffer_t src, uint64_t offset, void *dst, uint64_t n)
{
    cdp_status st = check_range(src, offset, n, "read");
    if (st || n == 0) return st;
    return backend_copy(src->dev, dst, (const char *)src->ptr + offset, n, CDP_COPY_D2H);
}

cdp_status cdp_device_write(cdp_device_t dev, void *dst, const void *src, uint64_t n)
{
    return n ? backend_copy(dev, dst, src, n, CDP_COPY_H2D) : CDP_OK;
}

cdp_status cdp_device_read(cdp_device_t dev, void *dst, const void *src, uint64_t n)
{
    return n ? backend_copy(dev, dst, src, n, CDP_COPY_D2H) : CDP_OK;
}

int cdp_device_host_visible(cdp_device_t dev) { return dev->type == CDP_BACKEND_CPU; }

cdp_status cdp_device_usage(cdp_device_t dev, double *util, uint64_t *mem_used)
{
    *util = -1;
    *mem_used = 0;
    if (!dev->be->usage) return cdp_fail(CDP_ERR_UNSUPPORTED, "%s: no usage figures", dev->name);
    return dev->be->usage(dev->state, util, mem_used);
}

cdp_status cdp_buffer_copy(cdp_buffer_t dst, uint64_t dst_offset, cdp_buffer_t src,
                           uint64_t src_offset, uint64_t n)
{
    cdp_status st;
    if ((st = check_range(dst, dst_offset, n, "copy destination"))) return st;
    if ((st = check_range(src, src_offset, n, "copy source"))) return st;
    if (n == 0) return CDP_OK;
    if (dst->dev == src->dev)
        return backend_copy(dst->dev, (char *)dst->ptr + dst_offset,
                            (const char *)src->ptr + src_offset, n, CDP_COPY_D2D);
    /* Across devices the data is staged through host memory in bounded pieces;
     * peer-to-peer paths belong to the communicators. */
    const uint64_t chunk = 8u << 20;
    char *stage = malloc(n < chunk ? n : chunk);
    if (!stage) return cdp_fail(CDP_ERR_NOMEM, "out of host memory staging a copy");
    for (uint64_t done = 0; done < n && !st; done += chunk) {
        uint64_t k = n - done < chunk ? n - done : chunk;
        st = cdp_buffer_read(src, src_offset + done, stage, k);
        if (!st) st = cdp_buffer_write(dst, dst_offset + done, stage, k);
    }
    free(stage);
    return st;
}

cdp_status cdp_buffer_memset(cdp_buffer_t b, uint64_t offset, int value, uint64_t n)
{
    cdp_status st = check_range(b, offset, n, "memset");
    if (st || n == 0) return st;
    st = b->dev->be->memset(b->dev->state, (char *)b->ptr + offset, value, n);
    return st ? cdp_error_context(st, "%s: memset of %" PRIu64 " bytes", b->dev->name, n) : CDP_OK;
}

cdp_status cdp_event_create(cdp_device_t d, cdp_event_t *out)
{
    struct cdp_event *e = calloc(1, sizeof *e);
    if (!e) return cdp_fail(CDP_ERR_NOMEM, "out of memory for an event");
    e->dev = d;
    cdp_status st = d->be->event_create(d->state, &e->ev);
    if (st) {
        free(e);
        return cdp_error_context(st, "%s: creating an event", d->name);
    }
    *out = e;
    return CDP_OK;
}

void cdp_event_destroy(cdp_event_t e)
{
    if (!e) return;
    e->dev->be->event_destroy(e->dev->state, e->ev);
    free(e);
}

cdp_status cdp_event_record(cdp_event_t e)
{
    cdp_status st = e->dev->be->event_record(e->dev->state, e->ev);
    if (st) return cdp_error_context(st, "%s: recording an event", e->dev->name);
    e->recorded = 1;
    return CDP_OK;
}

cdp_status cdp_event_elapsed_ms(cdp_event_t start, cdp_event_t end, double *ms)
{
    if (start->dev != end->dev)
        return cdp_fail(CDP_ERR_INVALID, "events of %s and %s cannot be compared",
                        start->dev->name, end->dev->name);
    if (!start->recorded || !end->recorded)
        return cdp_fail(CDP_ERR_INVALID, "%s: elapsed time asked of an event never recorded",
                        start->dev->name);
    cdp_status st = start->dev->be->event_elapsed_ms(start->dev->state, start->ev, end->ev, ms);
    return st ? cdp_error_context(st, "%s: event timing", start->dev->name) : CDP_OK;
}
