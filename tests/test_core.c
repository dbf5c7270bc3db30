/* Suite core: status messages and context, sizes, logging settings, tensors,
 * bf16 rounding. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "cdp/status.h"
#include "cdp/tensor.h"
#include "core/file.h"
#include "harness.h"

static cdp_status inner(void) { return cdp_fail(CDP_ERR_INVALID, "expected %s, got %d", "a positive integer", -2); }
static cdp_status middle(void)
{
    cdp_status st = inner();
    return st ? cdp_error_context(st, "/parallel/stages") : CDP_OK;
}

Test(core, error_context_chains_outward)
{
    cdp_clear_error();
    cr_assert_str_empty(cdp_last_error());
    cdp_status st = middle();
    cr_assert_eq(st, CDP_ERR_INVALID);
    st = cdp_error_context(st, "plan.json");
    cr_assert_eq(st, CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "plan.json: /parallel/stages: expected a positive integer, got -2");
}

/* The message so far as an argument of the next message: formatted whole,
 * once (it was vsnprintf from the buffer into itself, undefined behaviour,
 * and glibc printed the context twice). */
Test(core, a_message_may_quote_the_last_error)
{
    cdp_fail(CDP_ERR_IO, "%s: %s", "kA/w/ck", "Read-only file system");
    cdp_fail(CDP_ERR_IO, "%s: %s: %s", "p.json", "/train/checkpoint/dir", cdp_last_error());
    cr_assert_str_eq(cdp_last_error(), "p.json: /train/checkpoint/dir: kA/w/ck: Read-only file system");
    cdp_fail(CDP_ERR_IO, "%s", "inner");
    cdp_error_context(CDP_ERR_IO, "[%s]", cdp_last_error());
    cr_assert_str_eq(cdp_last_error(), "[inner]: inner");
}

Test(core, context_without_message_uses_status_name)
{
    cdp_clear_error();
    cdp_error_context(CDP_ERR_NOMEM, "cpu:0");
    cr_assert_str_eq(cdp_last_error(), "cpu:0: out of memory");
}

Test(core, status_names_cover_every_status)
{
    for (int s = 0; s < CDP_STATUS_COUNT; s++) {
        cr_assert_not_null(cdp_status_str((cdp_status)s));
        cr_assert_str_neq(cdp_status_str((cdp_status)s), "unknown status");
    }
    cr_assert_str_eq(cdp_status_str((cdp_status)99), "unknown status");
}

Test(core, long_messages_are_cut_not_overrun)
{
    char big[10000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cdp_fail(CDP_ERR_IO, "%s", big);
    cdp_error_context(CDP_ERR_IO, "%s", big);
    cr_assert_lt(strlen(cdp_last_error()), 4096);
}

struct size_case {
    char text[32];
    unsigned long long want;
};

ParameterizedTestParameters(core, sizes_parse)
{
    static struct size_case cases[] = {
        {"0", 0},
        {"1234", 1234},
        {"512MB", 512000000ull},
        {"16GiB", 17179869184ull},
        {"16 GiB", 17179869184ull},
        {"1.5GiB", 1610612736ull},
        {"64kib", 65536},
        {"2TB", 2000000000000ull},
        {"3B", 3},
        {"0.5KiB", 512},
    };
    return cr_make_param_array(struct size_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct size_case *c, core, sizes_parse)
{
    uint64_t v = 0;
    cr_assert_eq(cdp_parse_size(c->text, &v), CDP_OK, "%s: %s", c->text, cdp_last_error());
    cr_assert_eq(v, c->want, "%s gave %llu", c->text, (unsigned long long)v);
}

struct bad_size {
    char text[40];
    char word[24];
};

ParameterizedTestParameters(core, bad_sizes_fail)
{
    static struct bad_size cases[] = {
        {"", "expected a size"},         {"GiB", "expected a size"},
        {"16 GB s", "unit"},             {"-5", "expected a size"},
        {"12parsecs", "unit"},           {"1.5", "needs a unit"},
        {"99999999999999999999", "too large"}, {"20000000TiB", "too large"},
    };
    return cr_make_param_array(struct bad_size, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct bad_size *c, core, bad_sizes_fail)
{
    uint64_t v = 77;
    cr_assert_eq(cdp_parse_size(c->text, &v), CDP_ERR_INVALID, "\"%s\" was accepted", c->text);
    cr_assert_eq(v, 77, "the output was written on failure");
    cr_assert(strstr(cdp_last_error(), c->word), "\"%s\": %s", c->text, cdp_last_error());
}

Test(core, format_bytes)
{
    char buf[32];
    cr_assert_str_eq(cdp_format_bytes(512, buf, sizeof buf), "512 B");
    cr_assert_str_eq(cdp_format_bytes(1536, buf, sizeof buf), "1.50 KiB");
    cr_assert_str_eq(cdp_format_bytes(16ull << 30, buf, sizeof buf), "16.00 GiB");
    cr_assert_str_eq(cdp_format_bytes(UINT64_MAX, buf, sizeof buf), "16 EiB or more", "a saturated size");
}

Test(core, saturating_sizes)
{
    cr_assert_eq(cdp_sat_add(1, 2), 3);
    cr_assert_eq(cdp_sat_add(UINT64_MAX - 1, 1), UINT64_MAX);
    cr_assert_eq(cdp_sat_add(UINT64_MAX - 1, 2), UINT64_MAX, "saturates, does not wrap to 0");
    cr_assert_eq(cdp_sat_mul(1ull << 31, 1ull << 32), 1ull << 63);
    cr_assert_eq(cdp_sat_mul(1ull << 32, 1ull << 32), UINT64_MAX, "saturates, does not wrap to 0");
    cr_assert_eq(cdp_sat_add(cdp_sat_mul(1ull << 40, 1ull << 30), cdp_sat_mul(1ull << 40, 1ull << 30)), UINT64_MAX);
}

Test(core, closest_word)
{
    static const char *const keys[] = {"steps", "global_batch", "micro_batch", "optimizer", NULL};
    cr_assert_str_eq(cdp_closest_word("setps", keys), "steps");
    cr_assert_str_eq(cdp_closest_word("optimiser", keys), "optimizer");
    cr_assert_str_eq(cdp_closest_word("global", keys), "global_batch");
    cr_assert_null(cdp_closest_word("zebra", keys));
    cr_assert_eq(cdp_edit_distance("kitten", "sitting"), 3);
    cr_assert_eq(cdp_edit_distance("", "abc"), 3);
}

Test(core, time_is_monotonic)
{
    uint64_t a = cdp_time_ns(), b = cdp_time_ns();
    cr_assert_geq(b, a);
}

Test(core, log_levels_and_subsystems)
{
    enum cdp_log_level lv;
    cr_assert_eq(cdp_log_parse_level("DEBUG", &lv), CDP_OK);
    cr_assert_eq(lv, CDP_LOG_DEBUG);
    cr_assert_eq(cdp_log_parse_level("loud", &lv), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "loud"));

    cdp_log_set_level(CDP_LOG_INFO);
    cr_assert_eq(cdp_log_set_subsystems("comm,exec"), CDP_OK);
    cr_assert(cdp_log_enabled(CDP_LOG_INFO, CDP_SUBSYS_COMM));
    cr_assert(!cdp_log_enabled(CDP_LOG_INFO, CDP_SUBSYS_PLAN));
    cr_assert(!cdp_log_enabled(CDP_LOG_DEBUG, CDP_SUBSYS_COMM));
    cr_assert(cdp_log_enabled(CDP_LOG_ERROR, CDP_SUBSYS_PLAN), "errors always print");
    cr_assert_eq(cdp_log_set_subsystems("comm,bogus"), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "bogus"));
    cr_assert_eq(cdp_log_set_subsystems(NULL), CDP_OK);
    cr_assert(cdp_log_enabled(CDP_LOG_INFO, CDP_SUBSYS_PLAN));
}

Test(core, log_env_rejects_unknown_level)
{
    setenv("CDP_LOG", "chatty", 1);
    cr_assert_eq(cdp_log_init_from_env(), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "CDP_LOG"), "%s", cdp_last_error());
    setenv("CDP_LOG", "debug", 1);
    setenv("CDP_LOG_SUBSYS", "plan", 1);
    cr_assert_eq(cdp_log_init_from_env(), CDP_OK);
    cr_assert_eq(cdp_log_get_level(), CDP_LOG_DEBUG);
    cr_assert(!cdp_log_enabled(CDP_LOG_DEBUG, CDP_SUBSYS_COMM));
}

Test(core, tensor_views)
{
    struct cdp_tensor t;
    float data[24];
    int64_t shape[3] = {2, 3, 4};
    cr_assert_eq(cdp_tensor_init(&t, CDP_DTYPE_F32, 3, shape, data, NULL), CDP_OK);
    cr_assert_eq(cdp_tensor_numel(&t), 24);
    cr_assert_eq(cdp_tensor_nbytes(&t), 96);
    cr_assert_eq(t.strides[0], 12);
    cr_assert_eq(t.strides[2], 1);
    cr_assert(cdp_tensor_is_contiguous(&t));
    cr_assert_eq(cdp_tensor_transpose(&t, 1, 2), CDP_OK);
    cr_assert(!cdp_tensor_is_contiguous(&t));
    cr_assert_eq(t.shape[1], 4);
    char d[64];
    cr_assert_str_eq(cdp_tensor_describe(&t, d, sizeof d), "f32[2, 4, 3]");
    cr_assert_eq(cdp_tensor_transpose(&t, 0, 3), CDP_ERR_INVALID);
    int64_t bad[2] = {2, -1};
    cr_assert_eq(cdp_tensor_init(&t, CDP_DTYPE_I32, 2, bad, data, NULL), CDP_ERR_INVALID);
    cr_assert_eq(cdp_tensor_init(&t, CDP_DTYPE_I32, 7, shape, data, NULL), CDP_ERR_INVALID);
    cr_assert_eq(cdp_dtype_size(CDP_DTYPE_BF16), 2);
    cr_assert_str_eq(cdp_dtype_name(CDP_DTYPE_I32), "i32");
}

Test(core, bf16_rounds_to_nearest_even)
{
    cr_assert_eq(cdp_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(cdp_bf16_to_f32(0x3f80), 1.0f);
    /* 1 + 2^-8 lies halfway between two bf16 values: ties go to the even one (1.0). */
    cr_assert_eq(cdp_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    /* 1 + 3*2^-8 ties upward to the even neighbour 1 + 2^-6. */
    cr_assert_eq(cdp_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    cr_assert(isnan(cdp_bf16_to_f32(cdp_f32_to_bf16(NAN))));
    cr_assert(isinf(cdp_bf16_to_f32(cdp_f32_to_bf16(INFINITY))));
    for (int i = -1000; i <= 1000; i++) {
        float x = (float)i * 0.37f;
        float y = cdp_bf16_to_f32(cdp_f32_to_bf16(x));
        cr_assert_leq(fabsf(y - x), fabsf(x) * 0x1p-8f + 1e-30f, "%g -> %g", x, y);
    }
}

/* A shard's overlap with a window, in the window's coordinates: 10 floats in
 * 3 shards are [0, 4), [4, 7), [7, 10). */
Test(core, shard_in_window)
{
    uint64_t at, len;
    cdp_shard_in_window(10, 3, 0, 2, 5, &at, &len); /* [2, 7) meets [0, 4) at [2, 4) */
    cr_assert(at == 0 && len == 2, "%llu %llu", (unsigned long long)at, (unsigned long long)len);
    cdp_shard_in_window(10, 3, 1, 2, 5, &at, &len); /* and [4, 7) whole */
    cr_assert(at == 2 && len == 3, "%llu %llu", (unsigned long long)at, (unsigned long long)len);
    cdp_shard_in_window(10, 3, 2, 2, 5, &at, &len); /* not [7, 10) */
    cr_assert(at == 0 && len == 0, "%llu %llu", (unsigned long long)at, (unsigned long long)len);
    uint64_t sum = 0;
    for (int r = 0; r < 4; r++) {
        cdp_shard_in_window(7, 4, r, 1, 5, &at, &len);
        sum += len;
    }
    cr_assert_eq(sum, 5, "the overlaps cover the window once");
}

/* What cdp_exec_check asks of each output before the first step. */
Test(core, check_writable_names_what_is_wrong)
{
    const char *dir = cdp_test_tmpdir();
    const char *file = cdp_test_write_file(dir, "f.txt", "x");
    char path[4300];
    cr_assert_eq(cdp_check_writable(file, 0), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_check_writable(dir, 0), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "it is a folder"), "%s", cdp_last_error());
    snprintf(path, sizeof path, "%s/f.txt/out.json", dir);
    cr_assert_eq(cdp_check_writable(path, 0), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "f.txt is not a folder"), "%s", cdp_last_error());
    snprintf(path, sizeof path, "%s/none/out.json", dir);
    cr_assert_eq(cdp_check_writable(path, 0), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "none does not exist"), "%s", cdp_last_error());
    snprintf(path, sizeof path, "%s/a/b/ckpt", dir); /* a folder made with mkdir -p */
    cr_assert_eq(cdp_check_writable(path, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_check_writable(file, 1), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "it is a file"), "%s", cdp_last_error());
    snprintf(path, sizeof path, "%s/f.txt/ckpt", dir);
    cr_assert_eq(cdp_check_writable(path, 1), CDP_ERR_IO);
    cr_assert(strstr(cdp_last_error(), "is not a folder"), "%s", cdp_last_error());
    cr_assert_eq(cdp_check_writable("/dev/null", 0), CDP_OK, "a device is written in place: %s", cdp_last_error());
}
