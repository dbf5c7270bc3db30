/* Suite device: the CPU backend through the device API (caps, copies, ranges,
 * events), and the CUDA module's behaviour on a machine with or without a GPU. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/device.h"
#include "cdp/tensor.h"
#include "cdp_config.h"

static cdp_device_t open_cpu(uint64_t cap)
{
    cdp_device_t d = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, cap, &d), CDP_OK, "%s", cdp_last_error());
    return d;
}

Test(device, cpu_counts_one_host_device)
{
    int n = 0;
    cr_assert_eq(cdp_device_count(CDP_BACKEND_CPU, &n), CDP_OK);
    cr_assert_eq(n, 1);
    cdp_device_t d = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 1, 0, &d), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "cpu:1"), "%s", cdp_last_error());
    cr_assert_null(d);
}

Test(device, allocation_within_cap_is_accounted)
{
    cdp_device_t d = open_cpu(1 << 20);
    cr_assert_str_eq(cdp_device_name(d), "cpu:0");
    cr_assert_eq(cdp_device_mem_cap(d), 1 << 20);
    cdp_buffer_t a, b;
    cr_assert_eq(cdp_buffer_create(d, 600000, &a), CDP_OK);
    cr_assert_eq(cdp_buffer_create(d, 1048576 - 600000, &b), CDP_OK, "exactly the cap must fit");
    cr_assert_eq(cdp_device_mem_in_use(d), 1 << 20);
    cr_assert_eq((uintptr_t)cdp_buffer_data(a) % 64, 0, "64-byte alignment");
    cdp_buffer_destroy(a);
    cr_assert_eq(cdp_device_mem_in_use(d), 1048576 - 600000);
    cr_assert_eq(cdp_device_mem_peak(d), 1 << 20);
    cdp_buffer_destroy(b);
    cr_assert_eq(cdp_device_mem_in_use(d), 0);
    cdp_device_close(d);
}

Test(device, allocation_over_cap_names_device_request_use_and_cap)
{
    cdp_device_t d = open_cpu(4u << 20);
    cdp_buffer_t a, b = NULL;
    cr_assert_eq(cdp_buffer_create(d, 3u << 20, &a), CDP_OK);
    cr_assert_eq(cdp_buffer_create(d, 2u << 20, &b), CDP_ERR_NOMEM);
    cr_assert_null(b, "the out-parameter is written only on success");
    const char *msg = cdp_last_error();
    cr_assert(strstr(msg, "cpu:0"), "%s", msg);
    cr_assert(strstr(msg, "2097152 bytes"), "asked: %s", msg);
    cr_assert(strstr(msg, "3145728 bytes"), "in use: %s", msg);
    cr_assert(strstr(msg, "4194304 bytes"), "cap: %s", msg);
    cr_assert_eq(cdp_device_mem_in_use(d), 3u << 20, "a failed allocation leaves no trace");
    cdp_buffer_destroy(a);
    cdp_device_close(d);
}

Test(device, default_cap_is_physical_memory_and_huge_requests_fail_cleanly)
{
    cdp_device_t d = open_cpu(0);
    cr_assert_gt(cdp_device_mem_cap(d), 1u << 20);
    cr_assert_eq(cdp_device_mem_cap(d), cdp_device_mem_total(d));
    cdp_buffer_t b = NULL;
    cr_assert_eq(cdp_buffer_create(d, UINT64_MAX, &b), CDP_ERR_NOMEM);
    cr_assert(strstr(cdp_last_error(), "cannot allocate"), "%s", cdp_last_error());
    cr_assert_eq(cdp_buffer_create(d, UINT64_MAX / 2, &b), CDP_ERR_NOMEM);
    cr_assert_null(b);
    cr_assert_eq(cdp_device_mem_in_use(d), 0);
    cdp_device_close(d);
}

Test(device, zero_size_buffers_work)
{
    cdp_device_t d = open_cpu(0);
    cdp_buffer_t z;
    cr_assert_eq(cdp_buffer_create(d, 0, &z), CDP_OK);
    cr_assert_eq(cdp_buffer_size(z), 0);
    cr_assert_eq(cdp_buffer_write(z, 0, "", 0), CDP_OK);
    cr_assert_eq(cdp_buffer_read(z, 0, NULL, 0), CDP_OK);
    cr_assert_eq(cdp_buffer_memset(z, 0, 1, 0), CDP_OK);
    cr_assert_eq(cdp_buffer_write(z, 0, "x", 1), CDP_ERR_INVALID);
    cdp_buffer_destroy(z);
    cdp_buffer_destroy(NULL);
    cdp_device_close(d);
    cdp_device_close(NULL);
}

Test(device, copies_round_trip_and_respect_offsets)
{
    cdp_device_t d = open_cpu(0);
    enum { N = 100003 };
    unsigned char *src = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++) src[i] = (unsigned char)(i * 7 + 3);
    cdp_buffer_t a, b;
    cr_assert_eq(cdp_buffer_create(d, N, &a), CDP_OK);
    cr_assert_eq(cdp_buffer_create(d, N, &b), CDP_OK);
    cr_assert_eq(cdp_buffer_write(a, 0, src, N), CDP_OK);
    cr_assert_eq(cdp_buffer_memset(b, 0, 0xAB, N), CDP_OK);
    cr_assert_eq(cdp_buffer_copy(b, 10, a, 20, 1000), CDP_OK);
    cr_assert_eq(cdp_buffer_read(b, 0, back, N), CDP_OK);
    for (int i = 0; i < 10; i++) cr_assert_eq(back[i], 0xAB);
    for (int i = 0; i < 1000; i++) cr_assert_eq(back[10 + i], src[20 + i], "byte %d", i);
    cr_assert_eq(back[1010], 0xAB);
    cr_assert_eq(cdp_buffer_read(a, 0, back, N), CDP_OK);
    cr_assert_arr_eq(back, src, N);
    cdp_buffer_destroy(a);
    cdp_buffer_destroy(b);
    free(src);
    free(back);
    cdp_device_close(d);
}

Test(device, copies_between_two_devices_stage_through_host)
{
    cdp_device_t d0 = open_cpu(0), d1 = open_cpu(0);
    enum { N = (9 << 20) + 5 }; /* more than one staging piece */
    unsigned char *src = malloc(N), *back = calloc(1, N);
    for (int i = 0; i < N; i++) src[i] = (unsigned char)(i ^ (i >> 8));
    cdp_buffer_t a, b;
    cr_assert_eq(cdp_buffer_create(d0, N, &a), CDP_OK);
    cr_assert_eq(cdp_buffer_create(d1, N, &b), CDP_OK);
    cr_assert_eq(cdp_buffer_write(a, 0, src, N), CDP_OK);
    cr_assert_eq(cdp_buffer_copy(b, 0, a, 0, N), CDP_OK);
    cr_assert_eq(cdp_buffer_read(b, 0, back, N), CDP_OK);
    cr_assert_arr_eq(back, src, N);
    cdp_buffer_destroy(a);
    cdp_buffer_destroy(b);
    free(src);
    free(back);
    cdp_device_close(d0);
    cdp_device_close(d1);
}

Test(device, out_of_range_access_is_rejected)
{
    cdp_device_t d = open_cpu(0);
    cdp_buffer_t a;
    char tmp[64] = {0};
    cr_assert_eq(cdp_buffer_create(d, 32, &a), CDP_OK);
    cr_assert_eq(cdp_buffer_write(a, 16, tmp, 17), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "outside the 32-byte buffer"), "%s", cdp_last_error());
    cr_assert_eq(cdp_buffer_read(a, 33, tmp, 0), CDP_ERR_INVALID);
    cr_assert_eq(cdp_buffer_memset(a, UINT64_MAX, 0, 2), CDP_ERR_INVALID, "offset overflow");
    cr_assert_eq(cdp_buffer_copy(a, 0, a, 16, 17), CDP_ERR_INVALID);
    cr_assert_eq(cdp_buffer_write(a, 16, tmp, 16), CDP_OK);
    cdp_buffer_destroy(a);
    cdp_device_close(d);
}

Test(device, tensor_view_of_buffer_checks_size)
{
    cdp_device_t d = open_cpu(0);
    cdp_buffer_t a;
    cr_assert_eq(cdp_buffer_create(d, 4 * 64, &a), CDP_OK);
    struct cdp_tensor t;
    int64_t ok[2] = {8, 8}, big[2] = {8, 9};
    cr_assert_eq(cdp_tensor_from_buffer(&t, CDP_DTYPE_F32, 2, ok, a), CDP_OK);
    cr_assert_eq(t.device, d);
    cr_assert_eq(cdp_tensor_from_buffer(&t, CDP_DTYPE_F32, 2, big, a), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "f32[8, 9]"), "%s", cdp_last_error());
    cdp_buffer_destroy(a);
    cdp_device_close(d);
}

Test(device, events_time_host_work)
{
    cdp_device_t d = open_cpu(0);
    cdp_event_t s, e, never;
    cr_assert_eq(cdp_event_create(d, &s), CDP_OK);
    cr_assert_eq(cdp_event_create(d, &e), CDP_OK);
    cr_assert_eq(cdp_event_create(d, &never), CDP_OK);
    cr_assert_eq(cdp_event_record(s), CDP_OK);
    volatile double x = 0;
    for (int i = 0; i < 2000000; i++) x += i * 0.5;
    cr_assert_eq(cdp_event_record(e), CDP_OK);
    double ms = -1;
    cr_assert_eq(cdp_event_elapsed_ms(s, e, &ms), CDP_OK);
    cr_assert_gt(ms, 0.0);
    cr_assert_eq(cdp_event_elapsed_ms(s, never, &ms), CDP_ERR_INVALID);
    cr_assert_eq(cdp_device_synchronize(d), CDP_OK);
    cdp_event_destroy(s);
    cdp_event_destroy(e);
    cdp_event_destroy(never);
    cdp_device_close(d);
}

/* On a machine without a GPU this checks that the CUDA backend explains why it is
 * unusable; on a lent GPU machine it exercises the same paths as the CPU tests. */
Test(device, gpu_cuda_backend_works_or_says_why)
{
    int n = -1;
    cdp_status st = cdp_device_count(CDP_BACKEND_CUDA, &n);
    if (!CDP_HAVE_CUDA) {
        cr_assert_eq(st, CDP_ERR_UNSUPPORTED);
        cr_assert(strstr(cdp_last_error(), "not built"), "%s", cdp_last_error());
        return;
    }
    if (st) {
        cr_assert_eq(st, CDP_ERR_UNSUPPORTED);
        cr_assert_eq(n, 0);
        cr_assert(strstr(cdp_last_error(), "no usable GPU"), "%s", cdp_last_error());
        cr_assert(strstr(cdp_last_error(), "cuda") || strstr(cdp_last_error(), "CUDA"), "%s",
                  cdp_last_error());
        cdp_device_t d = NULL;
        cr_assert_neq(cdp_device_open(CDP_BACKEND_CUDA, 0, 0, &d), CDP_OK);
        cr_assert_null(d);
        cr_log_info("no GPU here: %s", cdp_last_error());
        return;
    }
    cr_assert_gt(n, 0);
    cdp_device_t g = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CUDA, 0, 64u << 20, &g), CDP_OK, "%s", cdp_last_error());
    enum { N = 1 << 20 };
    unsigned char *src = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++) src[i] = (unsigned char)(i * 13 + 1);
    cdp_buffer_t a, b, c = NULL;
    cr_assert_eq(cdp_buffer_create(g, N, &a), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_buffer_create(g, N, &b), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_buffer_create(g, 63u << 20, &c), CDP_ERR_NOMEM, "the cap applies on GPUs too");
    cr_assert(strstr(cdp_last_error(), "cuda:0"), "%s", cdp_last_error());
    cdp_event_t e0, e1;
    cr_assert_eq(cdp_event_create(g, &e0), CDP_OK);
    cr_assert_eq(cdp_event_create(g, &e1), CDP_OK);
    cr_assert_eq(cdp_event_record(e0), CDP_OK);
    cr_assert_eq(cdp_buffer_write(a, 0, src, N), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_buffer_memset(b, 0, 0x5A, N), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_buffer_copy(b, 100, a, 0, N / 2), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_event_record(e1), CDP_OK);
    cr_assert_eq(cdp_device_synchronize(g), CDP_OK);
    cr_assert_eq(cdp_buffer_read(b, 0, back, N), CDP_OK, "%s", cdp_last_error());
    for (int i = 0; i < 100; i++) cr_assert_eq(back[i], 0x5A);
    for (int i = 0; i < N / 2; i++) cr_assert_eq(back[100 + i], src[i], "byte %d", i);
    double ms = -1;
    cr_assert_eq(cdp_event_elapsed_ms(e0, e1, &ms), CDP_OK, "%s", cdp_last_error());
    cr_assert_geq(ms, 0.0);
    /* A copy from the GPU to a CPU device stages through the host. */
    cdp_device_t h = open_cpu(0);
    cdp_buffer_t hb;
    cr_assert_eq(cdp_buffer_create(h, N, &hb), CDP_OK);
    cr_assert_eq(cdp_buffer_copy(hb, 0, a, 0, N), CDP_OK, "%s", cdp_last_error());
    cr_assert_arr_eq(cdp_buffer_data(hb), src, N);
    cdp_buffer_destroy(hb);
    cdp_device_close(h);
    cdp_event_destroy(e0);
    cdp_event_destroy(e1);
    cdp_buffer_destroy(a);
    cdp_buffer_destroy(b);
    cdp_device_close(g);
    free(src);
    free(back);
}

/* Usage figures are the GPU backends' (NVML); the cpu device says it has none,
 * and the monitor reads the process's own figures instead. */
Test(device, cpu_has_no_usage_figures)
{
    cdp_device_t d;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &d), CDP_OK, "%s", cdp_last_error());
    double util = 0.5;
    uint64_t used = 7;
    cr_assert_eq(cdp_device_usage(d, &util, &used), CDP_ERR_UNSUPPORTED);
    cr_assert(strstr(cdp_last_error(), "cpu:0: no usage figures"), "%s", cdp_last_error());
    cr_assert_eq(util, -1.0);
    cr_assert_eq(used, 0);
    cr_assert_eq(cdp_device_host_visible(d), 1);
    cdp_device_close(d);
}
