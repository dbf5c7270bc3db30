/* Copy bandwidth of a device through the device API (host->device, device->host,
 * device->device), for sizes from 64 KiB to 256 MiB. The CPU figures feed the
 * memory-copy bandwidth of the CPU topology model.
 * usage: bench-device-copy [cpu|cuda] [max MiB] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cdp/core.h"
#include "cdp/device.h"

int main(int argc, char **argv)
{
    enum cdp_backend type = CDP_BACKEND_CPU;
    if (argc > 1 && !strcmp(argv[1], "cuda")) type = CDP_BACKEND_CUDA;
    uint64_t max_bytes = (uint64_t)(argc > 2 ? atoi(argv[2]) : 256) << 20;
    cdp_device_t dev;
    if (cdp_device_open(type, 0, 0, &dev)) {
        fprintf(stderr, "bench-device-copy: %s\n", cdp_last_error());
        return 1;
    }
    printf("device %s (%s)\n", cdp_device_name(dev), cdp_device_description(dev));
    printf("%12s %12s %12s %12s\n", "bytes", "H2D GB/s", "D2H GB/s", "D2D GB/s");
    for (uint64_t n = 64u << 10; n <= max_bytes; n *= 4) {
        cdp_buffer_t a, b;
        char *host = malloc(n);
        if (!host || cdp_buffer_create(dev, n, &a) || cdp_buffer_create(dev, n, &b)) {
            fprintf(stderr, "bench-device-copy: %s\n", cdp_last_error());
            return 1;
        }
        for (uint64_t i = 0; i < n; i++) host[i] = (char)(i * 131u);
        int reps = (int)((1u << 30) / n);
        if (reps < 5) reps = 5;
        if (reps > 200) reps = 200;
        double gbs[3];
        for (int kind = 0; kind < 3; kind++) {
            double t[15];
            for (int r = 0; r < 15; r++) {
                uint64_t t0 = cdp_time_ns();
                for (int k = 0; k < reps; k++) {
                    cdp_status st = kind == 0 ? cdp_buffer_write(a, 0, host, n)
                                  : kind == 1 ? cdp_buffer_read(a, 0, host, n)
                                              : cdp_buffer_copy(b, 0, a, 0, n);
                    if (st) {
                        fprintf(stderr, "bench-device-copy: %s\n", cdp_last_error());
                        return 1;
                    }
                }
                cdp_device_synchronize(dev);
                t[r] = (double)(cdp_time_ns() - t0) / reps;
            }
            gbs[kind] = (double)n / cdp_bench_median(t, 15);
        }
        printf("%12llu %12.2f %12.2f %12.2f\n", (unsigned long long)n, gbs[0], gbs[1], gbs[2]);
        cdp_buffer_destroy(a);
        cdp_buffer_destroy(b);
        free(host);
    }
    cdp_device_close(dev);
    return 0;
}
