/* The CUDA device backend, built as a module (libcdphybrid-cuda.so) that the
 * core loads at run time. One stream per device; copies from and to host
 * memory return when the host side may be used; events time the stream. */
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cdp/log.h"
#include "device/backend.h"
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/ops_cuda.h"

const struct cdp_module_host *cdp_cuda_host;
#define host cdp_cuda_host

/* the kernels' per-device state is the device's state */
#define cuda_device cdp_cuda_state

#define CUDA_TRY CDP_CUDA_TRY

/* ---- usage: NVML, opened on first use (the driver's library; not linked) ---- */

typedef struct nvml_device *nvml_device_t;
struct nvml_util {
    unsigned gpu, memory;
};
struct nvml_mem {
    unsigned long long total, free, used;
};
static struct {
    int tried, ok;
    int (*init)(void);
    int (*by_bus_id)(const char *, nvml_device_t *);
    int (*utilization)(nvml_device_t, struct nvml_util *);
    int (*memory)(nvml_device_t, struct nvml_mem *);
} nvml;

static void nvml_open(void)
{
    if (nvml.tried) return;
    nvml.tried = 1;
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    *(void **)&nvml.init = dlsym(h, "nvmlInit_v2");
    *(void **)&nvml.by_bus_id = dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
    *(void **)&nvml.utilization = dlsym(h, "nvmlDeviceGetUtilizationRates");
    *(void **)&nvml.memory = dlsym(h, "nvmlDeviceGetMemoryInfo");
    nvml.ok = nvml.init && nvml.by_bus_id && nvml.utilization && nvml.memory && nvml.init() == 0;
}

/* NVML's utilisation and memory of the device, by its PCI bus id; without
 * NVML, memory in use from the runtime and no utilisation. */
static cdp_status cuda_usage(void *state, double *util, uint64_t *mem_used)
{
    struct cdp_cuda_state *d = (struct cdp_cuda_state *)state;
    char bus[32];
    nvml_device_t nd;
    struct nvml_util u;
    struct nvml_mem m;
    *util = -1;
    *mem_used = 0;
    nvml_open();
    if (nvml.ok && cudaDeviceGetPCIBusId(bus, sizeof bus, d->index) == cudaSuccess && nvml.by_bus_id(bus, &nd) == 0) {
        if (nvml.utilization(nd, &u) == 0) *util = u.gpu / 100.0;
        if (nvml.memory(nd, &m) == 0) *mem_used = m.used;
    }
    if (*mem_used == 0) {
        size_t free_b = 0, total_b = 0;
        CUDA_TRY(cudaSetDevice(d->index));
        CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
        *mem_used = total_b - free_b;
    }
    return CDP_OK;
}

static cdp_status cuda_count(int *out)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        *out = 0;
        return host->fail(CDP_ERR_UNSUPPORTED, "no usable GPU: cudaGetDeviceCount: %s (%s)",
                          cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (n == 0) {
        *out = 0;
        return host->fail(CDP_ERR_UNSUPPORTED, "no usable GPU: the CUDA runtime sees no device");
    }
    *out = n;
    return CDP_OK;
}

static cdp_status cuda_open(int index, void **state, struct cdp_device_info *info)
{
    cudaDeviceProp prop;
    CUDA_TRY(cudaSetDevice(index));
    CUDA_TRY(cudaGetDeviceProperties(&prop, index));
    struct cuda_device *d = (struct cuda_device *)calloc(1, sizeof *d);
    if (!d) return host->fail(CDP_ERR_NOMEM, "out of host memory");
    d->index = index;
    cudaError_t e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(d);
        return host->fail(CDP_ERR_DEVICE, "cudaStreamCreateWithFlags: %s (%s)",
                          cudaGetErrorString(e), cudaGetErrorName(e));
    }
    info->total_memory = (uint64_t)prop.totalGlobalMem;
    snprintf(info->description, sizeof info->description, "%.200s, sm_%d%d, %.1f GiB", prop.name,
             prop.major, prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    host->log(CDP_LOG_INFO, CDP_SUBSYS_DEVICE, "cuda:%d is %s", index, info->description);
    *state = d;
    return CDP_OK;
}

static void cuda_close(void *state)
{
    struct cuda_device *d = (struct cuda_device *)state;
    if (!d) return;
    cudaSetDevice(d->index);
    cudaStreamSynchronize(d->stream);
    cdp_cuda_state_release(d);
    cudaStreamDestroy(d->stream);
    free(d);
}

static cdp_status cuda_alloc(void *state, uint64_t bytes, void **out)
{
    struct cuda_device *d = (struct cuda_device *)state;
    void *p = NULL;
    CUDA_TRY(cudaSetDevice(d->index));
    CUDA_TRY(cudaMalloc(&p, (size_t)bytes));
    *out = p;
    return CDP_OK;
}

static void cuda_free(void *state, void *p)
{
    struct cuda_device *d = (struct cuda_device *)state;
    cudaSetDevice(d->index);
    /* Work queued on the buffer must finish before the memory is reused. */
    cudaStreamSynchronize(d->stream);
    cudaError_t e = cudaFree(p);
    if (e != cudaSuccess)
        host->log(CDP_LOG_WARN, CDP_SUBSYS_DEVICE, "cuda:%d: cudaFree: %s", d->index,
                  cudaGetErrorString(e));
}

static cdp_status cuda_copy(void *state, void *dst, const void *src, uint64_t n, enum cdp_copy_kind k)
{
    struct cuda_device *d = (struct cuda_device *)state;
    static const cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                           cudaMemcpyDeviceToDevice};
    CUDA_TRY(cudaSetDevice(d->index));
    CUDA_TRY(cudaMemcpyAsync(dst, src, (size_t)n, kinds[k], d->stream));
    /* Host memory may be pageable and is the caller's again on return. */
    if (k != CDP_COPY_D2D) CUDA_TRY(cudaStreamSynchronize(d->stream));
    return CDP_OK;
}

static cdp_status cuda_memset(void *state, void *p, int value, uint64_t n)
{
    struct cuda_device *d = (struct cuda_device *)state;
    CUDA_TRY(cudaSetDevice(d->index));
    CUDA_TRY(cudaMemsetAsync(p, value, (size_t)n, d->stream));
    return CDP_OK;
}

static cdp_status cuda_synchronize(void *state)
{
    struct cuda_device *d = (struct cuda_device *)state;
    CUDA_TRY(cudaSetDevice(d->index));
    CUDA_TRY(cudaStreamSynchronize(d->stream));
    return CDP_OK;
}

static cdp_status cuda_event_create(void *state, void **ev)
{
    struct cuda_device *d = (struct cuda_device *)state;
    cudaEvent_t e;
    CUDA_TRY(cudaSetDevice(d->index));
    CUDA_TRY(cudaEventCreate(&e));
    *ev = (void *)e;
    return CDP_OK;
}

static cdp_status cuda_event_record(void *state, void *ev)
{
    struct cuda_device *d = (struct cuda_device *)state;
    CUDA_TRY(cudaSetDevice(d->index));
    CUDA_TRY(cudaEventRecord((cudaEvent_t)ev, d->stream));
    return CDP_OK;
}

static cdp_status cuda_event_elapsed_ms(void *state, void *start, void *end, double *ms)
{
    struct cuda_device *d = (struct cuda_device *)state;
    float f = 0.0f;
    CUDA_TRY(cudaSetDevice(d->index));
    CUDA_TRY(cudaEventSynchronize((cudaEvent_t)end));
    CUDA_TRY(cudaEventElapsedTime(&f, (cudaEvent_t)start, (cudaEvent_t)end));
    *ms = (double)f;
    return CDP_OK;
}

static void cuda_event_destroy(void *state, void *ev)
{
    (void)state;
    cudaEventDestroy((cudaEvent_t)ev);
}

static const struct cdp_device_backend cdp_cuda_backend = {
    CDP_DEVICE_ABI,
    "cuda",
    cuda_count,
    cuda_open,
    cuda_close,
    cuda_alloc,
    cuda_free,
    cuda_copy,
    cuda_memset,
    cuda_synchronize,
    cuda_event_create,
    cuda_event_record,
    cuda_event_elapsed_ms,
    cuda_event_destroy,
    &cdp_cuda_ops,
    cuda_usage,
};

extern "C" __attribute__((visibility("default"))) cdp_status
cdp_device_module_init(const struct cdp_module_host *h, const struct cdp_device_backend **out)
{
    if (!h || h->abi != CDP_DEVICE_ABI) return CDP_ERR_UNSUPPORTED;
    host = h;
    *out = &cdp_cuda_backend;
    return CDP_OK;
}
