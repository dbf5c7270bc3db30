/* The CPU backend: host memory, synchronous copies, host clock events.
 * It is always built and is the device every rank can fall back to. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdp/core.h"
#include "device/backend.h"
#include "kernels/ops.h"

#define CPU_ALIGN 64u

static cdp_status cpu_count(int *out)
{
    *out = 1;
    return CDP_OK;
}

static cdp_status cpu_open(int index, void **state, struct cdp_device_info *info)
{
    (void)index;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    info->total_memory = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
    char mem[32];
    snprintf(info->description, sizeof info->description, "host CPU, %ld core%s, %s", cores,
             cores == 1 ? "" : "s", cdp_format_bytes(info->total_memory, mem, sizeof mem));
    *state = NULL;
    return CDP_OK;
}

static void cpu_close(void *state) { (void)state; }

/* MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read. */
static uint64_t host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    fclose(f);
    return (uint64_t)kib * 1024;
}

static cdp_status cpu_alloc(void *state, uint64_t bytes, void **out)
{
    (void)state;
    if (bytes > SIZE_MAX - CPU_ALIGN)
        return cdp_fail(CDP_ERR_NOMEM, "host allocation of %llu bytes is too large",
                        (unsigned long long)bytes);
    /* Linux hands out memory it does not have and kills the process when it is
     * touched; a request larger than what the host has available now fails
     * here, with a message, instead. Buffers are touched when filled, so the
     * next request sees them as used. */
    uint64_t avail = host_available();
    if (avail && bytes > avail) {
        char want[32], have[32];
        return cdp_fail(CDP_ERR_NOMEM, "the host has %s available, and %s more were asked for",
                        cdp_format_bytes(avail, have, sizeof have), cdp_format_bytes(bytes, want, sizeof want));
    }
    size_t rounded = ((size_t)bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    void *p = aligned_alloc(CPU_ALIGN, rounded);
    if (!p)
        return cdp_fail(CDP_ERR_NOMEM, "host out of memory (aligned_alloc of %zu bytes failed)",
                        rounded);
    *out = p;
    return CDP_OK;
}

static void cpu_free(void *state, void *p)
{
    (void)state;
    free(p);
}

static cdp_status cpu_copy(void *state, void *dst, const void *src, uint64_t n, enum cdp_copy_kind k)
{
    (void)state;
    (void)k;
    memmove(dst, src, (size_t)n);
    return CDP_OK;
}

static cdp_status cpu_memset(void *state, void *p, int value, uint64_t n)
{
    (void)state;
    memset(p, value, (size_t)n);
    return CDP_OK;
}

static cdp_status cpu_event_create(void *state, void **ev)
{
    (void)state;
    uint64_t *t = calloc(1, sizeof *t);
    if (!t) return cdp_fail(CDP_ERR_NOMEM, "out of memory for an event");
    *ev = t;
    return CDP_OK;
}

static cdp_status cpu_event_record(void *state, void *ev)
{
    (void)state;
    *(uint64_t *)ev = cdp_time_ns();
    return CDP_OK;
}

static cdp_status cpu_event_elapsed_ms(void *state, void *start, void *end, double *ms)
{
    (void)state;
    *ms = ((double)*(uint64_t *)end - (double)*(uint64_t *)start) / 1e6;
    return CDP_OK;
}

static void cpu_event_destroy(void *state, void *ev)
{
    (void)state;
    free(ev);
}

const struct cdp_device_backend cdp_cpu_backend = {
    .abi = CDP_DEVICE_ABI,
    .name = "cpu",
    .count = cpu_count,
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset = cpu_memset,
    .synchronize = NULL, /* every CPU operation is synchronous */
    .event_create = cpu_event_create,
    .event_record = cpu_event_record,
    .event_elapsed_ms = cpu_event_elapsed_ms,
    .event_destroy = cpu_event_destroy,
    .ops = &cdp_cpu_ops,
    .usage = NULL, /* the monitor reads the process's own figures */
};
