/* Suite `gpu_ops`: every op of the kernel table (kernels/ops.h) run through a
 * device's table on that device's buffers, read back and compared with the
 * CPU reference (kernels/cpu/ops.h) computed on the host from the same inputs.
 *
 * Every test exists twice, from one body: cpu_<op> runs the CPU table (always
 * runs; it validates this harness and the table's wiring) and cuda_<op> runs
 * CUDA device 0. Where no GPU is usable every cuda_* test skips, saying why
 * (cdp_last_error()), so on a machine without a GPU they can only skip;
 * tools/gpu-check.sh runs them where a GPU is lent. cuda_*_bf16 tests run the
 * matrix-multiply ops under set_precision(CDP_PRECISION_BF16) (CUDA only: the
 * CPU table refuses it, see cpu_set_precision_bf16_unsupported).
 *
 * Inputs come from a fixed seed. Sizes are deliberately not multiples of 32
 * (block and warp tails), with edge cases (one row, T = 1, 1x1 convolution)
 * and one larger case per GEMM-class op. Accumulating outputs (every backward
 * except the losses') are pre-filled with non-zero values to check +=; outputs
 * that must be overwritten are pre-filled with garbage; optional outputs are
 * passed as NULL in at least one case of each op that has them.
 *
 * Shapes: B batch, T tokens, C channels, NH heads, HS = C / NH, V vocabulary,
 * N rows, D features per row, IC/OC input/output features or channels, H/W
 * image height/width, K kernel or window, S stride, P padding.
 *
 * Metric: max|got - ref| / (max|ref| + 1e-30) over an output, the error at the
 * worst element relative to the output's scale. Thresholds (fp32 precision):
 * - exact (0) for copies, selections and single IEEE operations per element,
 *   which every backend computes bit for bit: zero, copy, add, scale, relu,
 *   residual, embedding forward, maxpool forward (values and argmax).
 * - 1e-6 for scatter-adds whose order a parallel backend may change
 *   (embedding and maxpool backward): a few fp32 adds of O(1) terms.
 * - 1e-5 for elementwise ops with transcendental functions (gelu, swiglu, the
 *   rotary embeddings' cosines and sines), the losses, layernorm, rmsnorm, sum_squares (relative) and the optimizer steps: a few ulp per
 *   element or an fp32 row reduction over <= 1001 terms (~1e-6). Two cases
 *   allow 1e-4, each explained where it is: layernorm on rows offset by 100
 *   and cross-entropy on logits near +-1e4.
 * - 5e-5 for fp32 GEMM-class ops (linear, attention, conv2d): an fp32 dot
 *   product of K <= ~520 O(1) terms in another summation order differs by
 *   ~sqrt(K) * 6e-8 of its scale, a few 1e-6 at the worst element, while a
 *   wrong index or mask is O(1) and TF32 (10-bit mantissa operands, which
 *   FP32 precision must not use, cuDNN's default included) is ~5e-4.
 * bf16 precision (CUDA only): the reference is the CPU op on host inputs
 * pre-rounded to bf16 (cdp_f32_to_bf16, round to nearest even, as
 * __float2bfloat16_rn), so operand rounding is not in the error.
 * - linear, conv2d: 1e-3. Every multiplied operand is an input, and a product
 *   of two bf16 values is exact in fp32, so only the fp32 accumulation order
 *   (and tensor cores' truncating accumulation, <= K * 2^-23 ~ 6e-5) remains.
 *   1e-3 still fails results rounded to bf16 (ops.h: fp32 results), whose
 *   worst element is off by up to 2^-9 ~ 2e-3. A separate check asserts that
 *   bf16 took effect at all: the large case must differ from the unrounded
 *   fp32 product by more than 1e-4 (operand rounding gives ~1e-3 there; an
 *   fp32 path ~1e-6). Bias gradients are sums, not products: 5e-5 against
 *   the sum of dout as given or as rounded (ops.h does not say which).
 * - attention: 1e-2. The second product of each pass multiplies an
 *   intermediate (probabilities forward; datt and dscores backward) that the
 *   backend rounds to bf16 and the reference cannot, 2^-9 per term, ~1e-3 of
 *   the output scale; a backend may also fold 1/sqrt(HS) into q before
 *   rounding (HS here is not a power of 4), moving scores by 2^-9 relative.
 *   A CPU emulation of both measured up to 5.6e-3 on these shapes (2.5e-3
 *   without the folded scale). A wrong index or a missing mask is still O(1),
 *   and masked probabilities must be exact zeros under fp32. Under bf16, att
 *   is the backend's own state (ops.h; the fused kernels for head sizes 32
 *   and 64 keep row statistics there), so only out is compared, and the
 *   backward runs on the att of the backend's own forward. The fused kernels
 *   round the unnormalised probabilities (and dS) to bf16 where the general
 *   path rounds the normalised ones: the same 2^-9 per term.
 * - every other op stays fp32 under bf16 (cuda_bf16_leaves_other_ops_fp32). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/device.h"
#include "cdp/plan.h"
#include "cdp/status.h"
#include "cdp/tensor.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "model/layers.h"
#include "partitioner/costs.h"
#include "test_util.h"

#define TOL_EXACT 0.0
#define TOL_SCATTER 1e-6
#define TOL_ELEM 1e-5
#define TOL_ROW 1e-5
#define TOL_GEMM 5e-5
#define TOL_GEMM_BF16 1e-3
#define TOL_ATT_BF16 1e-2
/* the large bf16 GEMM case must differ from the unrounded fp32 result by more */
#define BF16_MIN_EFFECT 1e-4
/* layernorm on rows offset by 100 and cross-entropy on logits near +-1e4: see
 * the cases */
#define TOL_OFFSET 1e-4

/* ---- harness: one device per test (each test is its own process) ------------ */

#define MAX_ALLOCS 256

static struct {
    enum cdp_backend type;
    enum cdp_precision prec;
    cdp_device_t dev;
    const struct cdp_ops *ops;
    void *ks;
    cdp_buffer_t dbuf[MAX_ALLOCS];
    int nd;
    void *hbuf[MAX_ALLOCS];
    int nh;
} G;

static const char *where(void)
{
    return G.dev ? cdp_device_name(G.dev) : cdp_backend_name(G.type);
}

#define CHECK(call)                                                                                   \
    do {                                                                                              \
        cdp_status st_ = (call);                                                                      \
        cr_assert_eq(st_, CDP_OK, "%s: %s failed: %s: %s", where(), #call, cdp_status_str(st_),       \
                     cdp_last_error());                                                               \
    } while (0)

/* Runs one op of the device's table with the device's kernel state. */
#define OP(op, ...) CHECK(G.ops->op(G.ks, __VA_ARGS__))

/* Allocations are released in scopes, so that a test's cases do not pile up. */
struct scope {
    int nd, nh;
};

static struct scope scope_begin(void) { return (struct scope){G.nd, G.nh}; }

static void scope_end(struct scope s)
{
    while (G.nd > s.nd)
        cdp_buffer_destroy(G.dbuf[--G.nd]);
    while (G.nh > s.nh)
        free(G.hbuf[--G.nh]);
}

/* -- host memory -- */

static void *htrack(void *p)
{
    cr_assert(p, "host out of memory");
    cr_assert(G.nh < MAX_ALLOCS, "raise MAX_ALLOCS");
    G.hbuf[G.nh++] = p;
    return p;
}

static float *hzeros(size_t n) { return htrack(calloc(n ? n : 1, sizeof(float))); }
static float *hrand(size_t n, float lo, float hi) { return htrack(randv(n, lo, hi)); }

static float *hdup(const float *x, size_t n)
{
    float *y = hzeros(n);
    memcpy(y, x, n * sizeof *y);
    return y;
}

/* n token ids in [0, V), with 0 and V - 1 among them */
static int32_t *htokens(size_t n, int V)
{
    int32_t *t = htrack(calloc(n ? n : 1, sizeof *t));
    for (size_t i = 0; i < n; i++)
        t[i] = (int32_t)(urand() * V);
    t[0] = 0;
    if (n > 1) t[n - 1] = V - 1;
    return t;
}

/* A matrix-multiply operand as the backend sees it: rounded to bf16 under
 * bf16 precision, unchanged under fp32. */
static const float *operand(const float *x, size_t n)
{
    if (G.prec != CDP_PRECISION_BF16) return x;
    float *y = hzeros(n);
    for (size_t i = 0; i < n; i++)
        y[i] = cdp_bf16_to_f32(cdp_f32_to_bf16(x[i]));
    return y;
}

static double gemm_tol(void) { return G.prec == CDP_PRECISION_BF16 ? TOL_GEMM_BF16 : TOL_GEMM; }
static double att_tol(void) { return G.prec == CDP_PRECISION_BF16 ? TOL_ATT_BF16 : TOL_GEMM; }

/* -- device memory -- */

static void *dnew(size_t bytes)
{
    cdp_buffer_t b = NULL;
    cr_assert(G.nd < MAX_ALLOCS, "raise MAX_ALLOCS");
    CHECK(cdp_buffer_create(G.dev, bytes ? bytes : 1, &b));
    G.dbuf[G.nd++] = b;
    return cdp_buffer_data(b);
}

/* a new device buffer holding a copy of host[bytes] */
static void *dput(const void *host, size_t bytes)
{
    void *p = dnew(bytes);
    CHECK(cdp_buffer_write(G.dbuf[G.nd - 1], 0, host, bytes));
    return p;
}

static float *dputf(const float *host, size_t n) { return dput(host, n * sizeof *host); }

/* The buffer of this test that holds device range [p, p + bytes). */
static cdp_buffer_t owner(const void *p, size_t bytes, uint64_t *off)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < G.nd; i++) {
        uintptr_t base = (uintptr_t)cdp_buffer_data(G.dbuf[i]);
        uint64_t size = cdp_buffer_size(G.dbuf[i]);
        if (a >= base && a - base + bytes <= size) {
            *off = a - base;
            return G.dbuf[i];
        }
    }
    cr_assert_fail("device pointer %p (%zu bytes) is in no buffer of this test", p, bytes);
    return NULL;
}

/* Waits for the device (a failed kernel shows here at the latest) and copies
 * device range [dptr, dptr + bytes) to host. */
static void dget(void *host, const void *dptr, size_t bytes)
{
    uint64_t off = 0;
    cdp_buffer_t b = owner(dptr, bytes, &off);
    CHECK(cdp_device_synchronize(G.dev));
    CHECK(cdp_buffer_read(b, off, host, bytes));
}

static float *dgetf(const float *dptr, size_t n)
{
    float *h = hzeros(n);
    dget(h, dptr, n * sizeof *h);
    return h;
}

/* -- comparison -- */

/* max|got - ref| / (max|ref| + tiny); infinite where one side is NaN and the
 * other is not (NaN at the same place on both sides counts as equal). */
static double max_nerr(const float *got, const float *ref, size_t n, size_t *worst)
{
    double num = 0.0, den = 0.0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        int gn = isnan(got[i]) != 0, rn = isnan(ref[i]) != 0;
        if (gn || rn) {
            if (gn != rn) {
                *worst = i;
                return INFINITY;
            }
            continue;
        }
        double d = fabs((double)got[i] - (double)ref[i]);
        if (d != d) d = INFINITY; /* inf - inf */
        if (d > num) num = d, *worst = i;
        if (fabs((double)ref[i]) > den) den = fabs((double)ref[i]);
    }
    return num / (den + 1e-30);
}

static void expect_close(const float *got, const float *ref, size_t n, double tol, const char *fmt, ...)
    CDP_PRINTF(5, 6);

static void expect_close(const float *got, const float *ref, size_t n, double tol, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t w = 0;
    double e = max_nerr(got, ref, n, &w);
    /* measured errors, for tuning the thresholds where a GPU is lent (--verbose) */
    if (G.type == CDP_BACKEND_CUDA)
        cr_log_info("measured: %s: %s error %.3g (threshold %.3g)", where(), what, e, tol);
    cr_assert(e <= tol,
              "%s: %s: normalised error %.3g > %.3g (worst element %zu: got %.9g, reference %.9g)", where(),
              what, e, tol, w, (double)got[w], (double)ref[w]);
}

/* A bias gradient under bf16: ops.h leaves open whether the column sum reads
 * dout as given or as rounded for the products, so either reference passes,
 * each at the fp32 threshold. `rounded` is computed from the bf16 operands,
 * `exact` from the inputs as given. */
static void expect_bias_grad(const float *got, const float *rounded, const float *exact, size_t n,
                             const char *what)
{
    size_t w = 0;
    if (G.prec == CDP_PRECISION_BF16 && max_nerr(got, exact, n, &w) <= TOL_GEMM)
        expect_close(got, exact, n, TOL_GEMM, "%s (sum of dout as given)", what);
    else
        expect_close(got, rounded, n, TOL_GEMM, "%s", what);
}

/* -- the two backends -- */

typedef void (*test_body)(void);

static void run_on(enum cdp_backend type, enum cdp_precision prec, test_body body)
{
    memset(&G, 0, sizeof G);
    G.type = type;
    G.prec = prec;
    if (type == CDP_BACKEND_CUDA) {
        int n = 0;
        cdp_status st = cdp_device_count(type, &n);
        if (st != CDP_OK || n == 0)
            cr_skip_test("no usable CUDA device (cdp_device_count: %s, %d devices): %s", cdp_status_str(st), n,
                         cdp_last_error());
    }
    /* a cap keeps the sizes honest: every case here needs a few MB */
    CHECK(cdp_device_open(type, 0, (uint64_t)256 << 20, &G.dev));
    G.ops = cdp_device_ops(G.dev);
    cr_assert_not_null(G.ops, "%s has no kernel table", where());
    cr_assert_eq(G.ops->abi, CDP_OPS_ABI, "%s: kernel table ABI %d, expected %d", where(), G.ops->abi,
                 CDP_OPS_ABI);
    G.ks = cdp_device_kernel_state(G.dev);
    CHECK(G.ops->set_precision(G.ks, prec));
    rng_seed(20240611);
    body();
    scope_end((struct scope){0, 0});
    cdp_device_close(G.dev);
    G.dev = NULL;
}

/* cpu_<name> and cuda_<name> from one body, at fp32 precision */
#define GPU_OPS_TEST(name)                                                                   \
    static void body_##name(void);                                                           \
    Test(gpu_ops, cpu_##name) { run_on(CDP_BACKEND_CPU, CDP_PRECISION_FP32, body_##name); }   \
    Test(gpu_ops, cuda_##name) { run_on(CDP_BACKEND_CUDA, CDP_PRECISION_FP32, body_##name); } \
    static void body_##name(void)

/* cuda_<name> only, at bf16 precision (the CPU table computes in fp32 only) */
#define GPU_OPS_TEST_BF16(name)                                                              \
    static void body_##name(void);                                                           \
    Test(gpu_ops, cuda_##name) { run_on(CDP_BACKEND_CUDA, CDP_PRECISION_BF16, body_##name); } \
    static void body_##name(void)

/* ---- the table itself ---------------------------------------------------------- */

GPU_OPS_TEST(table_complete)
{
    const struct cdp_ops *o = G.ops;
    cr_assert_str_eq(o->name, cdp_backend_name(G.type));
#define NEED(f) cr_assert(o->f != NULL, "%s table: op " #f " is NULL", o->name)
    NEED(set_precision);
    NEED(zero);
    NEED(copy);
    NEED(add);
    NEED(scale);
    NEED(sum_squares);
    NEED(linear_fwd);
    NEED(linear_bwd);
    NEED(relu_fwd);
    NEED(relu_bwd);
    NEED(gelu_fwd);
    NEED(gelu_bwd);
    NEED(layernorm_fwd);
    NEED(layernorm_bwd);
    NEED(residual_fwd);
    NEED(residual_bwd);
    NEED(embedding_fwd);
    NEED(embedding_bwd);
    NEED(attention_fwd);
    NEED(attention_bwd);
    NEED(crossentropy_fwd);
    NEED(crossentropy_bwd);
    NEED(mse_fwd);
    NEED(mse_bwd);
    NEED(conv2d_fwd);
    NEED(conv2d_bwd);
    NEED(maxpool2d_fwd);
    NEED(maxpool2d_bwd);
    NEED(adamw_step);
    NEED(sgd_step);
    NEED(rmsnorm_fwd);
    NEED(rmsnorm_bwd);
    NEED(rope_fwd);
    NEED(rope_bwd);
    NEED(swiglu_fwd);
    NEED(swiglu_bwd);
    if (G.type == CDP_BACKEND_CUDA) { /* optional ops (ops.h) that the CUDA table has */
        NEED(linear_gelu_bwd);
    } else { /* and those the CPU table has */
        NEED(silu_fwd);
        NEED(silu_bwd);
        NEED(embedding_vp_fwd);
        NEED(embedding_vp_bwd);
        NEED(crossentropy_vp_stats);
        NEED(crossentropy_vp_fwd);
        NEED(crossentropy_vp_bwd);
    }
#undef NEED
}

static void body_cpu_precision(void)
{
    cdp_clear_error();
    cdp_status st = G.ops->set_precision(G.ks, CDP_PRECISION_BF16);
    cr_assert_eq(st, CDP_ERR_UNSUPPORTED, "cpu set_precision(BF16) returned %s, expected %s", cdp_status_str(st),
                 cdp_status_str(CDP_ERR_UNSUPPORTED));
    cr_assert(strstr(cdp_last_error(), "fp32"), "message: %s", cdp_last_error());
    st = G.ops->set_precision(G.ks, CDP_PRECISION_FP32);
    cr_assert_eq(st, CDP_OK, "cpu set_precision(FP32): %s: %s", cdp_status_str(st), cdp_last_error());
}

Test(gpu_ops, cpu_set_precision_bf16_unsupported)
{
    run_on(CDP_BACKEND_CPU, CDP_PRECISION_FP32, body_cpu_precision);
}

/* ---- memory and vector ops ------------------------------------------------------ */

/* index of the first differing byte, or n */
static size_t first_diff(const unsigned char *a, const unsigned char *b, size_t n)
{
    size_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

GPU_OPS_TEST(zero)
{
    size_t n = 1037, off = 7, bytes = 4 * 1000 + 3; /* unaligned start and length */
    float *h = hrand(n, -1, 1);
    unsigned char *d = (unsigned char *)dputf(h, n);
    OP(zero, d + off, bytes);
    unsigned char *want = (unsigned char *)hdup(h, n), *got = (unsigned char *)dgetf((float *)d, n);
    memset(want + off, 0, bytes);
    size_t i = first_diff(got, want, n * sizeof(float));
    if (i < n * sizeof(float))
        cr_assert_fail("%s: zero: byte %zu is %u, want %u (zeroed [%zu, %zu))", where(), i, got[i], want[i], off,
                       off + bytes);
}

GPU_OPS_TEST(copy)
{
    size_t n = 1037, doff = 5, soff = 3, bytes = 4 * 1000 + 1;
    float *hs = hrand(n, -1, 1), *hd = hrand(n, 2, 3);
    unsigned char *ds = (unsigned char *)dputf(hs, n), *dd = (unsigned char *)dputf(hd, n);
    OP(copy, dd + doff, ds + soff, bytes);
    unsigned char *want = (unsigned char *)hdup(hd, n), *got = (unsigned char *)dgetf((float *)dd, n);
    memcpy(want + doff, (unsigned char *)hs + soff, bytes);
    size_t i = first_diff(got, want, n * sizeof(float));
    if (i < n * sizeof(float))
        cr_assert_fail("%s: copy: byte %zu is %u, want %u (copied %zu bytes to offset %zu from offset %zu)", where(),
                       i, got[i], want[i], bytes, doff, soff);
}

GPU_OPS_TEST(add)
{
    size_t sizes[] = {1, 1037, 70001};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        struct scope sc = scope_begin();
        size_t n = sizes[k];
        float *dst = hrand(n, -1, 1), *src = hrand(n, -1, 1), *ref = hdup(dst, n);
        for (size_t i = 0; i < n; i++)
            ref[i] += src[i];
        float *d_dst = dputf(dst, n), *d_src = dputf(src, n);
        OP(add, d_dst, d_src, n);
        expect_close(dgetf(d_dst, n), ref, n, TOL_EXACT, "add n=%zu", n);
        scope_end(sc);
    }
}

GPU_OPS_TEST(scale)
{
    size_t sizes[] = {1, 1037, 70001};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        struct scope sc = scope_begin();
        size_t n = sizes[k];
        float *x = hrand(n, -3, 3), *ref = hdup(x, n);
        cdp_cpu_scale(ref, n, -0.37f);
        float *d = dputf(x, n);
        OP(scale, d, n, -0.37f);
        expect_close(dgetf(d, n), ref, n, TOL_EXACT, "scale n=%zu", n);
        scope_end(sc);
    }
}

GPU_OPS_TEST(sum_squares)
{
    size_t sizes[] = {1, 1037, ((size_t)1 << 20) + 17};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        struct scope sc = scope_begin();
        size_t n = sizes[k];
        float *x = hrand(n, -2, 2);
        double ref = cdp_cpu_sum_squares(x, n), got = -1.0;
        OP(sum_squares, dputf(x, n), n, &got);
        double e = fabs(got - ref) / ref;
        if (G.type == CDP_BACKEND_CUDA) cr_log_info("measured: sum_squares n=%zu relative error %.3g", n, e);
        cr_assert(e <= TOL_ROW, "%s: sum_squares n=%zu: %.17g, reference %.17g (relative error %.3g)", where(),
                  n, got, ref, e);
        scope_end(sc);
    }
}

/* ---- elementwise ---------------------------------------------------------------- */

static const size_t elem_sizes[] = {1037, 70001};
#define N_ELEM_SIZES (sizeof elem_sizes / sizeof *elem_sizes)

/* inputs in [-6, 6] with zeros, signed zero, saturation and tiny values */
static float *elem_input(size_t n)
{
    float *x = hrand(n, -6, 6);
    float special[] = {0.0f, -0.0f, 30.0f, -30.0f, 1e-6f, -1e-6f, 9.0f, -9.0f};
    for (size_t i = 0; i < sizeof special / sizeof *special && i < n; i++)
        x[i * 7 % n] = special[i];
    return x;
}

GPU_OPS_TEST(relu_fwd)
{
    for (size_t k = 0; k < N_ELEM_SIZES; k++) {
        struct scope sc = scope_begin();
        size_t n = elem_sizes[k];
        float *x = elem_input(n), *ref = hzeros(n);
        cdp_cpu_relu_fwd(ref, x, n);
        float *dx = dputf(x, n), *dout = dputf(hrand(n, 5, 6), n);
        OP(relu_fwd, dout, dx, n);
        expect_close(dgetf(dout, n), ref, n, TOL_EXACT, "relu_fwd n=%zu", n);
        OP(relu_fwd, dx, dx, n); /* in place, as ops.h allows */
        expect_close(dgetf(dx, n), ref, n, TOL_EXACT, "relu_fwd in place n=%zu", n);
        scope_end(sc);
    }
}

GPU_OPS_TEST(relu_bwd)
{
    for (size_t k = 0; k < N_ELEM_SIZES; k++) {
        struct scope sc = scope_begin();
        size_t n = elem_sizes[k];
        float *x = elem_input(n), *dy = hrand(n, -1, 1), *din = hrand(n, -1, 1), *ref = hdup(din, n);
        cdp_cpu_relu_bwd(ref, dy, x, n);
        float *d_din = dputf(din, n);
        OP(relu_bwd, d_din, dputf(dy, n), dputf(x, n), n);
        expect_close(dgetf(d_din, n), ref, n, TOL_EXACT, "relu_bwd n=%zu", n);
        scope_end(sc);
    }
}

GPU_OPS_TEST(gelu_fwd)
{
    for (size_t k = 0; k < N_ELEM_SIZES; k++) {
        struct scope sc = scope_begin();
        size_t n = elem_sizes[k];
        float *x = elem_input(n), *ref = hzeros(n);
        cdp_cpu_gelu_fwd(ref, x, n);
        float *dx = dputf(x, n), *dout = dputf(hrand(n, 5, 6), n);
        OP(gelu_fwd, dout, dx, n);
        expect_close(dgetf(dout, n), ref, n, TOL_ELEM, "gelu_fwd n=%zu", n);
        OP(gelu_fwd, dx, dx, n);
        expect_close(dgetf(dx, n), ref, n, TOL_ELEM, "gelu_fwd in place n=%zu", n);
        scope_end(sc);
    }
}

GPU_OPS_TEST(gelu_bwd)
{
    for (size_t k = 0; k < N_ELEM_SIZES; k++) {
        struct scope sc = scope_begin();
        size_t n = elem_sizes[k];
        float *x = elem_input(n), *dy = hrand(n, -1, 1), *din = hrand(n, -1, 1), *ref = hdup(din, n);
        cdp_cpu_gelu_bwd(ref, dy, x, n);
        float *d_din = dputf(din, n);
        OP(gelu_bwd, d_din, dputf(dy, n), dputf(x, n), n);
        expect_close(dgetf(d_din, n), ref, n, TOL_ELEM, "gelu_bwd n=%zu", n);
        scope_end(sc);
    }
}

/* silu is optional (ops.h): a table without it (the CUDA table, until its
 * kernels are checked on a GPU) skips these, saying so */
static void need_silu(void)
{
    if (!G.ops->silu_fwd || !G.ops->silu_bwd) cr_skip_test("the %s table has no silu kernels yet", G.ops->name);
}

GPU_OPS_TEST(silu_fwd)
{
    need_silu();
    for (size_t k = 0; k < N_ELEM_SIZES; k++) {
        struct scope sc = scope_begin();
        size_t n = elem_sizes[k];
        float *x = elem_input(n), *ref = hzeros(n);
        cdp_cpu_silu_fwd(ref, x, n);
        float *dx = dputf(x, n), *dout = dputf(hrand(n, 5, 6), n);
        OP(silu_fwd, dout, dx, n);
        expect_close(dgetf(dout, n), ref, n, TOL_ELEM, "silu_fwd n=%zu", n);
        OP(silu_fwd, dx, dx, n);
        expect_close(dgetf(dx, n), ref, n, TOL_ELEM, "silu_fwd in place n=%zu", n);
        scope_end(sc);
    }
}

GPU_OPS_TEST(silu_bwd)
{
    need_silu();
    for (size_t k = 0; k < N_ELEM_SIZES; k++) {
        struct scope sc = scope_begin();
        size_t n = elem_sizes[k];
        float *x = elem_input(n), *dy = hrand(n, -1, 1), *din = hrand(n, -1, 1), *ref = hdup(din, n);
        cdp_cpu_silu_bwd(ref, dy, x, n);
        float *d_din = dputf(din, n);
        OP(silu_bwd, d_din, dputf(dy, n), dputf(x, n), n);
        expect_close(dgetf(d_din, n), ref, n, TOL_ELEM, "silu_bwd n=%zu", n);
        scope_end(sc);
    }
}

GPU_OPS_TEST(residual_fwd)
{
    for (size_t k = 0; k < N_ELEM_SIZES; k++) {
        struct scope sc = scope_begin();
        size_t n = elem_sizes[k];
        float *a = hrand(n, -3, 3), *b = hrand(n, -3, 3), *ref = hzeros(n);
        cdp_cpu_residual_fwd(ref, a, b, n);
        float *da = dputf(a, n), *db = dputf(b, n), *dout = dputf(hrand(n, 5, 6), n);
        OP(residual_fwd, dout, da, db, n);
        expect_close(dgetf(dout, n), ref, n, TOL_EXACT, "residual_fwd n=%zu", n);
        OP(residual_fwd, da, da, db, n);
        expect_close(dgetf(da, n), ref, n, TOL_EXACT, "residual_fwd in place n=%zu", n);
        scope_end(sc);
    }
}

GPU_OPS_TEST(residual_bwd)
{
    for (size_t k = 0; k < N_ELEM_SIZES; k++) {
        struct scope sc = scope_begin();
        size_t n = elem_sizes[k];
        float *dy = hrand(n, -1, 1), *da = hrand(n, -1, 1), *db = hrand(n, -1, 1);
        float *ra = hdup(da, n), *rb = hdup(db, n);
        cdp_cpu_residual_bwd(ra, rb, dy, n);
        float *d_da = dputf(da, n), *d_db = dputf(db, n);
        OP(residual_bwd, d_da, d_db, dputf(dy, n), n);
        expect_close(dgetf(d_da, n), ra, n, TOL_EXACT, "residual_bwd da n=%zu", n);
        expect_close(dgetf(d_db, n), rb, n, TOL_EXACT, "residual_bwd db n=%zu", n);
        scope_end(sc);
    }
}

/* ---- linear ----------------------------------------------------------------- */

struct linear_shape {
    int N, IC, OC;
};

/* widths off multiples of 8 (the CUDA table's zero-padded bf16 path), then
 * two on them (its cuBLASLt path with the bias epilogue); the last is the
 * large case of the bf16 rounding check */
static const struct linear_shape linear_shapes[] = {{37, 45, 53}, {1, 7, 3},    {5, 64, 33},
                                                    {37, 64, 96}, {64, 128, 384}, {300, 517, 389}};
#define N_LINEAR (sizeof linear_shapes / sizeof *linear_shapes)

static void linear_fwd_case(struct linear_shape s, int bias, int large)
{
    struct scope sc = scope_begin();
    size_t nin = (size_t)s.N * s.IC, nw = (size_t)s.OC * s.IC, nout = (size_t)s.N * s.OC;
    float *in = hrand(nin, -1, 1), *w = hrand(nw, -1, 1), *b = bias ? hrand(s.OC, -1, 1) : NULL;
    float *ref = hzeros(nout);
    cdp_cpu_linear_fwd(ref, operand(in, nin), operand(w, nw), b, s.N, s.IC, s.OC);
    float *dout = dputf(hrand(nout, 5, 6), nout); /* garbage: forward overwrites */
    OP(linear_fwd, dout, dputf(in, nin), dputf(w, nw), b ? dputf(b, s.OC) : NULL, s.N, s.IC, s.OC);
    float *got = dgetf(dout, nout);
    expect_close(got, ref, nout, gemm_tol(), "linear_fwd N=%d IC=%d OC=%d bias=%d", s.N, s.IC, s.OC, bias);
    if (G.prec == CDP_PRECISION_BF16 && large) {
        float *ref32 = hzeros(nout);
        size_t w_ = 0;
        cdp_cpu_linear_fwd(ref32, in, w, b, s.N, s.IC, s.OC);
        double e = max_nerr(got, ref32, nout, &w_);
        cr_log_info("measured: linear_fwd bf16 vs unrounded fp32: %.3g", e);
        cr_assert(e > BF16_MIN_EFFECT,
                  "linear_fwd under bf16 matches the unrounded fp32 product to %.3g: operands not rounded?", e);
    }
    scope_end(sc);
}

static void body_linear_fwd(void)
{
    for (size_t k = 0; k < N_LINEAR; k++)
        for (int bias = 0; bias < 2; bias++)
            linear_fwd_case(linear_shapes[k], bias, k == N_LINEAR - 1);
}

/* which of din, dw, db are wanted (1) or NULL (0) */
struct grads3 {
    int a, b, c;
};

static void linear_bwd_case(struct linear_shape s, struct grads3 g)
{
    struct scope sc = scope_begin();
    size_t nin = (size_t)s.N * s.IC, nw = (size_t)s.OC * s.IC, nout = (size_t)s.N * s.OC;
    float *in = hrand(nin, -1, 1), *w = hrand(nw, -1, 1), *dy = hrand(nout, -1, 1);
    float *din = hrand(nin, -1, 1), *dw = hrand(nw, -1, 1), *db = hrand(s.OC, -1, 1);
    float *rin = hdup(din, nin), *rw = hdup(dw, nw), *rb = hdup(db, s.OC);
    cdp_cpu_linear_bwd(g.a ? rin : NULL, g.b ? rw : NULL, g.c ? rb : NULL, operand(dy, nout), operand(in, nin),
                       operand(w, nw), s.N, s.IC, s.OC);
    float *d_din = dputf(din, nin), *d_dw = dputf(dw, nw), *d_db = dputf(db, s.OC);
    OP(linear_bwd, g.a ? d_din : NULL, g.b ? d_dw : NULL, g.c ? d_db : NULL, dputf(dy, nout), dputf(in, nin),
       dputf(w, nw), s.N, s.IC, s.OC);
    /* an output passed as NULL must be untouched: its reference is its old value */
    expect_close(dgetf(d_din, nin), rin, nin, gemm_tol(), "linear_bwd din N=%d IC=%d OC=%d (wanted %d)", s.N,
                 s.IC, s.OC, g.a);
    expect_close(dgetf(d_dw, nw), rw, nw, gemm_tol(), "linear_bwd dw N=%d IC=%d OC=%d (wanted %d)", s.N, s.IC,
                 s.OC, g.b);
    /* db is a column sum, not a product: fp32 thresholds under either precision */
    float *rb32 = hdup(db, s.OC);
    if (g.c) cdp_cpu_linear_bwd(NULL, NULL, rb32, dy, in, w, s.N, s.IC, s.OC);
    char what[128];
    snprintf(what, sizeof what, "linear_bwd db N=%d IC=%d OC=%d (wanted %d)", s.N, s.IC, s.OC, g.c);
    expect_bias_grad(dgetf(d_db, s.OC), rb, rb32, s.OC, what);
    scope_end(sc);
}

static void body_linear_bwd(void)
{
    const struct grads3 all = {1, 1, 1};
    for (size_t k = 0; k < N_LINEAR; k++)
        linear_bwd_case(linear_shapes[k], all);
    linear_bwd_case(linear_shapes[0], (struct grads3){0, 1, 1});
    linear_bwd_case(linear_shapes[0], (struct grads3){1, 0, 0});
    linear_bwd_case(linear_shapes[2], (struct grads3){0, 0, 1});
}

GPU_OPS_TEST(linear_fwd_fp32) { body_linear_fwd(); }
GPU_OPS_TEST(linear_bwd_fp32) { body_linear_bwd(); }
GPU_OPS_TEST_BF16(linear_fwd_bf16) { body_linear_fwd(); }
GPU_OPS_TEST_BF16(linear_bwd_bf16) { body_linear_bwd(); }

/* ---- the backward through linear then GELU, fused (an optional op) ------------ */

/* the reference is the CPU's composition: linear_bwd into zeros, then
 * gelu_bwd (ops.h) */
static void linear_gelu_bwd_case(struct linear_shape s, struct grads3 g)
{
    struct scope sc = scope_begin();
    size_t nin = (size_t)s.N * s.IC, nw = (size_t)s.OC * s.IC, nout = (size_t)s.N * s.OC;
    float *act = hrand(nin, -1, 1), *pre = hrand(nin, -3, 3), *w = hrand(nw, -1, 1), *dy = hrand(nout, -1, 1);
    float *dw = hrand(nw, -1, 1), *db = hrand(s.OC, -1, 1);
    float *rw = hdup(dw, nw), *rb = hdup(db, s.OC), *rtmp = hzeros(nin), *rpre = hzeros(nin);
    cdp_cpu_linear_bwd(rtmp, g.b ? rw : NULL, g.c ? rb : NULL, operand(dy, nout), operand(act, nin),
                       operand(w, nw), s.N, s.IC, s.OC);
    cdp_cpu_gelu_bwd(rpre, rtmp, pre, nin);
    float *d_dpre = dputf(hrand(nin, 5, 6), nin); /* garbage: dpre is overwritten */
    float *d_dw = dputf(dw, nw), *d_db = dputf(db, s.OC);
    OP(linear_gelu_bwd, d_dpre, g.b ? d_dw : NULL, g.c ? d_db : NULL, dputf(dy, nout), dputf(act, nin),
       dputf(pre, nin), dputf(w, nw), s.N, s.IC, s.OC);
    expect_close(dgetf(d_dpre, nin), rpre, nin, gemm_tol(), "linear_gelu_bwd dpre N=%d IC=%d OC=%d", s.N, s.IC,
                 s.OC);
    expect_close(dgetf(d_dw, nw), rw, nw, gemm_tol(), "linear_gelu_bwd dw N=%d IC=%d OC=%d (wanted %d)", s.N, s.IC,
                 s.OC, g.b);
    float *rb32 = hdup(db, s.OC);
    if (g.c) cdp_cpu_linear_bwd(NULL, NULL, rb32, dy, act, w, s.N, s.IC, s.OC);
    char what[128];
    snprintf(what, sizeof what, "linear_gelu_bwd db N=%d IC=%d OC=%d (wanted %d)", s.N, s.IC, s.OC, g.c);
    expect_bias_grad(dgetf(d_db, s.OC), rb, rb32, s.OC, what);
    scope_end(sc);
}

static void body_linear_gelu(void)
{
    cr_assert(G.ops->linear_gelu_bwd, "%s: no fused linear + GELU backward", where());
    for (size_t k = 0; k < N_LINEAR; k++)
        linear_gelu_bwd_case(linear_shapes[k], (struct grads3){1, 1, 1});
    linear_gelu_bwd_case(linear_shapes[3], (struct grads3){1, 0, 0});
    linear_gelu_bwd_case(linear_shapes[0], (struct grads3){1, 1, 0});
}

/* the CPU table has no fused ops (its composition above is the reference) */
Test(gpu_ops, cuda_linear_gelu_fp32) { run_on(CDP_BACKEND_CUDA, CDP_PRECISION_FP32, body_linear_gelu); }
GPU_OPS_TEST_BF16(linear_gelu_bf16) { body_linear_gelu(); }

/* ---- layernorm ---------------------------------------------------------------- */

static void layernorm_fwd_case(int N, int C, float offset)
{
    struct scope sc = scope_begin();
    size_t n = (size_t)N * C;
    float *in = hrand(n, -2, 2), *w = hrand(C, 0.5f, 1.5f), *b = hrand(C, -1, 1);
    for (size_t i = 0; i < n; i++)
        in[i] += offset;
    float *ref = hzeros(n), *rm = hzeros(N), *rs = hzeros(N);
    cdp_cpu_layernorm_fwd(ref, rm, rs, in, w, b, N, C, 1e-5f);
    float *dout = dputf(hrand(n, 5, 6), n), *dm = dputf(hrand(N, 5, 6), N), *ds = dputf(hrand(N, 5, 6), N);
    OP(layernorm_fwd, dout, dm, ds, dputf(in, n), dputf(w, C), dputf(b, C), N, C, 1e-5f);
    /* Rows offset by 100: a spread of ~1 on top of 100 needs a two-pass (or
     * Welford) variance as the reference uses; E[x^2] - E[x]^2 in fp32 is off
     * by ~1e-2 there, far above TOL_OFFSET. */
    double tol = offset != 0.0f ? TOL_OFFSET : TOL_ROW;
    expect_close(dgetf(dout, n), ref, n, tol, "layernorm_fwd out N=%d C=%d offset=%g", N, C, offset);
    expect_close(dgetf(dm, N), rm, N, TOL_ROW, "layernorm_fwd mean N=%d C=%d offset=%g", N, C, offset);
    expect_close(dgetf(ds, N), rs, N, tol, "layernorm_fwd rstd N=%d C=%d offset=%g", N, C, offset);
    scope_end(sc);
}

GPU_OPS_TEST(layernorm_fwd)
{
    layernorm_fwd_case(37, 45, 0.0f);
    layernorm_fwd_case(1, 7, 0.0f);
    layernorm_fwd_case(64, 1001, 0.0f);
    layernorm_fwd_case(16, 300, 100.0f);
}

static void layernorm_bwd_case(int N, int C, struct grads3 g)
{
    struct scope sc = scope_begin();
    size_t n = (size_t)N * C;
    float *in = hrand(n, -2, 2), *w = hrand(C, 0.5f, 1.5f), *b = hrand(C, -1, 1), *dy = hrand(n, -1, 1);
    float *y = hzeros(n), *mean = hzeros(N), *rstd = hzeros(N);
    cdp_cpu_layernorm_fwd(y, mean, rstd, in, w, b, N, C, 1e-5f);
    float *din = hrand(n, -1, 1), *dw = hrand(C, -1, 1), *db = hrand(C, -1, 1);
    float *rin = hdup(din, n), *rw = hdup(dw, C), *rb = hdup(db, C);
    cdp_cpu_layernorm_bwd(g.a ? rin : NULL, g.b ? rw : NULL, g.c ? rb : NULL, dy, in, w, mean, rstd, N, C);
    float *d_din = dputf(din, n), *d_dw = dputf(dw, C), *d_db = dputf(db, C);
    OP(layernorm_bwd, g.a ? d_din : NULL, g.b ? d_dw : NULL, g.c ? d_db : NULL, dputf(dy, n), dputf(in, n),
       dputf(w, C), dputf(mean, N), dputf(rstd, N), N, C);
    expect_close(dgetf(d_din, n), rin, n, TOL_ROW, "layernorm_bwd din N=%d C=%d (wanted %d)", N, C, g.a);
    expect_close(dgetf(d_dw, C), rw, C, TOL_ROW, "layernorm_bwd dweight N=%d C=%d (wanted %d)", N, C, g.b);
    expect_close(dgetf(d_db, C), rb, C, TOL_ROW, "layernorm_bwd dbias N=%d C=%d (wanted %d)", N, C, g.c);
    scope_end(sc);
}

GPU_OPS_TEST(layernorm_bwd)
{
    const struct grads3 all = {1, 1, 1};
    layernorm_bwd_case(37, 45, all);
    layernorm_bwd_case(1, 7, all);
    layernorm_bwd_case(64, 1001, all);
    layernorm_bwd_case(37, 45, (struct grads3){0, 1, 1});
    layernorm_bwd_case(37, 45, (struct grads3){1, 0, 0});
}

/* ---- the Llama ops: rmsnorm, rope, swiglu ---------------------------------------- */

static void rmsnorm_fwd_case(int N, int C)
{
    struct scope sc = scope_begin();
    size_t n = (size_t)N * C;
    float *in = hrand(n, -2, 2), *w = hrand(C, 0.5f, 1.5f);
    float *ref = hzeros(n), *rs = hzeros(N);
    cdp_cpu_rmsnorm_fwd(ref, rs, in, w, N, C, 1e-5f);
    float *dout = dputf(hrand(n, 5, 6), n), *ds = dputf(hrand(N, 5, 6), N);
    OP(rmsnorm_fwd, dout, ds, dputf(in, n), dputf(w, C), N, C, 1e-5f);
    expect_close(dgetf(dout, n), ref, n, TOL_ROW, "rmsnorm_fwd out N=%d C=%d", N, C);
    expect_close(dgetf(ds, N), rs, N, TOL_ROW, "rmsnorm_fwd rstd N=%d C=%d", N, C);
    scope_end(sc);
}

GPU_OPS_TEST(rmsnorm_fwd)
{
    rmsnorm_fwd_case(37, 45);
    rmsnorm_fwd_case(1, 7);
    rmsnorm_fwd_case(64, 1001);
}

static void rmsnorm_bwd_case(int N, int C, int want_din, int want_dw)
{
    struct scope sc = scope_begin();
    size_t n = (size_t)N * C;
    float *in = hrand(n, -2, 2), *w = hrand(C, 0.5f, 1.5f), *dy = hrand(n, -1, 1);
    float *y = hzeros(n), *rstd = hzeros(N);
    cdp_cpu_rmsnorm_fwd(y, rstd, in, w, N, C, 1e-5f);
    float *din = hrand(n, -1, 1), *dw = hrand(C, -1, 1);
    float *rin = hdup(din, n), *rw = hdup(dw, C);
    cdp_cpu_rmsnorm_bwd(want_din ? rin : NULL, want_dw ? rw : NULL, dy, in, w, rstd, N, C);
    float *d_din = dputf(din, n), *d_dw = dputf(dw, C);
    OP(rmsnorm_bwd, want_din ? d_din : NULL, want_dw ? d_dw : NULL, dputf(dy, n), dputf(in, n), dputf(w, C),
       dputf(rstd, N), N, C);
    expect_close(dgetf(d_din, n), rin, n, TOL_ROW, "rmsnorm_bwd din N=%d C=%d (wanted %d)", N, C, want_din);
    expect_close(dgetf(d_dw, C), rw, C, TOL_ROW, "rmsnorm_bwd dweight N=%d C=%d (wanted %d)", N, C, want_dw);
    scope_end(sc);
}

GPU_OPS_TEST(rmsnorm_bwd)
{
    rmsnorm_bwd_case(37, 45, 1, 1);
    rmsnorm_bwd_case(1, 7, 1, 1);
    rmsnorm_bwd_case(300, 1001, 1, 1); /* more rows than one weight-gradient chunk */
    rmsnorm_bwd_case(37, 45, 0, 1);
    rmsnorm_bwd_case(37, 45, 1, 0);
}

struct rope_shape {
    int B, T, NH, NKV, HD, pos0;
};

static const struct cdp_rope rope_plain = {.theta = 10000.0};
static const struct cdp_rope rope_llama3 = {.theta = 500000.0, .factor = 8, .low_freq_factor = 1,
                                            .high_freq_factor = 4, .original_context = 64};

static void rope_fwd_case(struct rope_shape s, struct cdp_rope r)
{
    struct scope sc = scope_begin();
    const size_t N = (size_t)s.B * s.T, nq = N * s.NH * s.HD, nk = N * s.NKV * s.HD;
    float *q = hrand(nq, -1, 1), *k = hrand(nk, -1, 1), *v = hrand(nk, -1, 1), *ref = hzeros(3 * nq);
    cdp_cpu_rope_fwd(ref, q, k, v, s.B, s.T, s.NH, s.NKV, s.HD, s.pos0, &r);
    float *dqkv = dputf(hrand(3 * nq, 5, 6), 3 * nq);
    OP(rope_fwd, dqkv, dputf(q, nq), dputf(k, nk), dputf(v, nk), s.B, s.T, s.NH, s.NKV, s.HD, s.pos0, r);
    expect_close(dgetf(dqkv, 3 * nq), ref, 3 * nq, TOL_ELEM, "rope_fwd B=%d T=%d NH=%d NKV=%d HD=%d pos0=%d factor=%g",
                 s.B, s.T, s.NH, s.NKV, s.HD, s.pos0, r.factor);
    scope_end(sc);
}

GPU_OPS_TEST(rope_fwd)
{
    rope_fwd_case((struct rope_shape){2, 37, 4, 2, 8, 0}, rope_plain);
    rope_fwd_case((struct rope_shape){1, 1, 1, 1, 2, 0}, rope_plain);
    rope_fwd_case((struct rope_shape){3, 45, 6, 1, 64, 0}, rope_llama3);
    rope_fwd_case((struct rope_shape){1, 5, 8, 8, 128, 1000}, rope_llama3);
}

static void rope_bwd_case(struct rope_shape s, struct cdp_rope r)
{
    struct scope sc = scope_begin();
    const size_t N = (size_t)s.B * s.T, nq = N * s.NH * s.HD, nk = N * s.NKV * s.HD;
    float *dy = hrand(3 * nq, -1, 1), *dq = hrand(nq, -1, 1), *dk = hrand(nk, -1, 1), *dv = hrand(nk, -1, 1);
    float *rq = hdup(dq, nq), *rk = hdup(dk, nk), *rv = hdup(dv, nk);
    cdp_cpu_rope_bwd(rq, rk, rv, dy, s.B, s.T, s.NH, s.NKV, s.HD, s.pos0, &r);
    float *d_q = dputf(dq, nq), *d_k = dputf(dk, nk), *d_v = dputf(dv, nk);
    OP(rope_bwd, d_q, d_k, d_v, dputf(dy, 3 * nq), s.B, s.T, s.NH, s.NKV, s.HD, s.pos0, r);
    expect_close(dgetf(d_q, nq), rq, nq, TOL_ELEM, "rope_bwd dq B=%d T=%d NH=%d NKV=%d HD=%d", s.B, s.T, s.NH, s.NKV,
                 s.HD);
    expect_close(dgetf(d_k, nk), rk, nk, TOL_ELEM, "rope_bwd dk B=%d T=%d NH=%d NKV=%d HD=%d", s.B, s.T, s.NH, s.NKV,
                 s.HD);
    expect_close(dgetf(d_v, nk), rv, nk, TOL_ELEM, "rope_bwd dv B=%d T=%d NH=%d NKV=%d HD=%d", s.B, s.T, s.NH, s.NKV,
                 s.HD);
    scope_end(sc);
}

GPU_OPS_TEST(rope_bwd)
{
    rope_bwd_case((struct rope_shape){2, 37, 4, 2, 8, 0}, rope_plain);
    rope_bwd_case((struct rope_shape){1, 1, 1, 1, 2, 0}, rope_plain);
    rope_bwd_case((struct rope_shape){3, 45, 6, 1, 64, 0}, rope_llama3);
    rope_bwd_case((struct rope_shape){1, 5, 8, 8, 128, 1000}, rope_llama3);
}

GPU_OPS_TEST(swiglu_fwd)
{
    const size_t sizes[] = {1, 1000, 100003};
    for (size_t c = 0; c < sizeof sizes / sizeof *sizes; c++) {
        struct scope sc = scope_begin();
        const size_t n = sizes[c];
        float *g = hrand(n, -8, 8), *u = hrand(n, -2, 2), *ref = hzeros(n);
        cdp_cpu_swiglu_fwd(ref, g, u, n);
        float *dout = dputf(hrand(n, 5, 6), n), *dg = dputf(g, n);
        OP(swiglu_fwd, dout, dg, dputf(u, n), n);
        expect_close(dgetf(dout, n), ref, n, TOL_ELEM, "swiglu_fwd n=%zu", n);
        OP(swiglu_fwd, dg, dg, dputf(u, n), n);
        expect_close(dgetf(dg, n), ref, n, TOL_ELEM, "swiglu_fwd in place n=%zu", n);
        scope_end(sc);
    }
}

GPU_OPS_TEST(swiglu_bwd)
{
    const size_t sizes[] = {1, 1000, 100003};
    for (size_t c = 0; c < sizeof sizes / sizeof *sizes; c++)
        for (int want = 1; want <= 3; want++) { /* bit 0: dgate, bit 1: dup */
            struct scope sc = scope_begin();
            const size_t n = sizes[c];
            float *g = hrand(n, -8, 8), *u = hrand(n, -2, 2), *dy = hrand(n, -1, 1);
            float *dg = hrand(n, -1, 1), *du = hrand(n, -1, 1), *rg = hdup(dg, n), *ru = hdup(du, n);
            cdp_cpu_swiglu_bwd(want & 1 ? rg : NULL, want & 2 ? ru : NULL, dy, g, u, n);
            float *d_g = dputf(dg, n), *d_u = dputf(du, n);
            OP(swiglu_bwd, want & 1 ? d_g : NULL, want & 2 ? d_u : NULL, dputf(dy, n), dputf(g, n), dputf(u, n), n);
            expect_close(dgetf(d_g, n), rg, n, TOL_ELEM, "swiglu_bwd dgate n=%zu (wanted %d)", n, want & 1);
            expect_close(dgetf(d_u, n), ru, n, TOL_ELEM, "swiglu_bwd dup n=%zu (wanted %d)", n, want >> 1);
            scope_end(sc);
        }
}

/* ---- embedding ------------------------------------------------------------------ */

static void embedding_fwd_case(int B, int T, int C, int V, int pos)
{
    struct scope sc = scope_begin();
    size_t n = (size_t)B * T * C;
    int32_t *tok = htokens((size_t)B * T, V);
    float *wte = hrand((size_t)V * C, -1, 1), *wpe = pos ? hrand((size_t)T * C, -1, 1) : NULL;
    float *ref = hzeros(n);
    cdp_cpu_embedding_fwd(ref, tok, wte, wpe, B, T, C);
    float *dout = dputf(hrand(n, 5, 6), n);
    OP(embedding_fwd, dout, dput(tok, (size_t)B * T * sizeof *tok), dputf(wte, (size_t)V * C),
       pos ? dputf(wpe, (size_t)T * C) : NULL, B, T, C);
    expect_close(dgetf(dout, n), ref, n, TOL_EXACT, "embedding_fwd B=%d T=%d C=%d V=%d wpe=%d", B, T, C, V, pos);
    scope_end(sc);
}

GPU_OPS_TEST(embedding_fwd)
{
    embedding_fwd_case(3, 37, 45, 53, 1);
    embedding_fwd_case(3, 37, 45, 53, 0);
    embedding_fwd_case(1, 1, 7, 2, 1);
}

static void embedding_bwd_case(int B, int T, int C, int V, int want_wte, int want_wpe)
{
    struct scope sc = scope_begin();
    size_t n = (size_t)B * T * C, nte = (size_t)V * C, npe = (size_t)T * C;
    int32_t *tok = htokens((size_t)B * T, V);
    float *dy = hrand(n, -1, 1), *dwte = hrand(nte, -1, 1), *dwpe = hrand(npe, -1, 1);
    float *rte = hdup(dwte, nte), *rpe = hdup(dwpe, npe);
    cdp_cpu_embedding_bwd(want_wte ? rte : NULL, want_wpe ? rpe : NULL, dy, tok, B, T, C);
    float *d_te = dputf(dwte, nte), *d_pe = dputf(dwpe, npe);
    OP(embedding_bwd, want_wte ? d_te : NULL, want_wpe ? d_pe : NULL, dputf(dy, n),
       dput(tok, (size_t)B * T * sizeof *tok), B, T, C);
    expect_close(dgetf(d_te, nte), rte, nte, TOL_SCATTER, "embedding_bwd dwte B=%d T=%d C=%d V=%d (wanted %d)", B,
                 T, C, V, want_wte);
    expect_close(dgetf(d_pe, npe), rpe, npe, TOL_SCATTER, "embedding_bwd dwpe B=%d T=%d C=%d V=%d (wanted %d)", B,
                 T, C, V, want_wpe);
    scope_end(sc);
}

GPU_OPS_TEST(embedding_bwd)
{
    embedding_bwd_case(3, 37, 45, 53, 1, 1);
    embedding_bwd_case(3, 37, 45, 53, 1, 0);
    embedding_bwd_case(3, 37, 45, 53, 0, 1);
    /* few tokens, many rows: many adds into each dwte row */
    embedding_bwd_case(4, 129, 100, 7, 1, 1);
}

/* ---- attention ------------------------------------------------------------------ */

struct attention_shape {
    int B, T, C, NH;
};

/* HS = 20, 7, 11 and (the larger case, T across several 64-row blocks) 44;
 * then the head sizes the CUDA table's fused bf16 kernels take (64 and 32),
 * with T across 64-row tiles and a partial last tile, and (T = 128) whole
 * tiles only */
static const struct attention_shape attention_shapes[] = {
    {2, 37, 60, 3}, {1, 1, 7, 1}, {1, 19, 33, 3}, {2, 161, 132, 3}, {2, 130, 128, 2}, {1, 97, 96, 3},
    {1, 128, 128, 2}};
#define N_ATTENTION (sizeof attention_shapes / sizeof *attention_shapes)

/* CDP_CUDA_ATTENTION=materialized turns the CUDA table's fused attention off
 * (docs/gpu.md), for comparisons */
static int fused_attention_on(void)
{
    const char *e = getenv("CDP_CUDA_ATTENTION");
    return !(e && strcmp(e, "materialized") == 0);
}

/* The floats of att this table's attention uses (ops.h: attention_state_floats,
 * or all B*NH*T*T); the tests give att exactly that many. Under fp32 every
 * table keeps the probabilities; under bf16 the CUDA table's fused kernels
 * (head size 32 or 64, T above it) keep B*T*(NH + C). */
static size_t att_state_floats(int B, int T, int C, int NH)
{
    const size_t full = (size_t)B * NH * T * T;
    if (!G.ops->attention_state_floats) return full;
    const size_t n = G.ops->attention_state_floats(G.ks, B, T, C, NH);
    cr_assert(n <= full, "%s: attention_state_floats %zu > B*NH*T*T = %zu", where(), n, full);
    if (G.prec == CDP_PRECISION_FP32)
        cr_assert_eq(n, full, "%s: attention_state_floats %zu under fp32, want %zu", where(), n, full);
    const int HS = C / NH;
    if (G.type == CDP_BACKEND_CUDA && G.prec == CDP_PRECISION_BF16 && (HS == 32 || HS == 64) && T > HS &&
        fused_attention_on())
        cr_assert_eq(n, (size_t)B * T * (NH + C), "%s: fused attention state %zu, want B*T*(NH + C) = %zu", where(),
                     n, (size_t)B * T * (NH + C));
    return n;
}

static void attention_fwd_case(struct attention_shape s, int causal)
{
    struct scope sc = scope_begin();
    int B = s.B, T = s.T, C = s.C, NH = s.NH;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = hrand(nq, -2, 2), *ref = hzeros(no), *ratt = hzeros(na);
    cdp_cpu_attention_fwd(ref, ratt, operand(qkv, nq), B, T, C, NH, causal);
    const size_t nst = att_state_floats(B, T, C, NH);
    float *dout = dputf(hrand(no, 5, 6), no), *datt = dputf(hrand(nst, 5, 6), nst);
    OP(attention_fwd, dout, datt, dputf(qkv, nq), B, T, C, NH, causal);
    expect_close(dgetf(dout, no), ref, no, att_tol(), "attention_fwd out B=%d T=%d C=%d NH=%d causal=%d", B, T, C,
                 NH, causal);
    /* under bf16, att is the backend's own saved state for its backward
     * (ops.h): the fused kernels keep row statistics there, not probabilities;
     * the backward test checks that state through the gradients */
    if (G.prec == CDP_PRECISION_BF16) {
        scope_end(sc);
        return;
    }
    float *att = dgetf(datt, na);
    expect_close(att, ratt, na, att_tol(), "attention_fwd att B=%d T=%d C=%d NH=%d causal=%d", B, T, C, NH,
                 causal);
    if (causal) /* backward relies on exact zeros above the diagonal */
        for (size_t bh = 0; bh < (size_t)B * NH; bh++)
            for (int i = 0; i < T; i++)
                for (int j = i + 1; j < T; j++) {
                    float a = att[(bh * T + i) * T + j];
                    cr_assert(a == 0.0f, "%s: attention_fwd causal att[%zu][%d][%d] = %g, want 0", where(), bh, i,
                              j, a);
                }
    scope_end(sc);
}

static void attention_bwd_case(struct attention_shape s, int causal)
{
    struct scope sc = scope_begin();
    int B = s.B, T = s.T, C = s.C, NH = s.NH;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    size_t nt = (size_t)T * T;
    float *qkv = hrand(nq, -2, 2), *dy = hrand(no, -1, 1), *dqkv = hrand(nq, -1, 1);
    const float *rq = operand(qkv, nq);
    float *out = hzeros(no), *att = hzeros(na), *ref = hdup(dqkv, nq);
    cdp_cpu_attention_fwd(out, att, rq, B, T, C, NH, causal);
    cdp_cpu_attention_bwd(ref, operand(dy, no), rq, att, hzeros(nt), B, T, C, NH, causal);
    float *d_dqkv = dputf(dqkv, nq), *d_qkv = dputf(qkv, nq);
    /* the backward reads what this table's forward left in att (ops.h);
     * both start as garbage */
    const size_t nst = att_state_floats(B, T, C, NH);
    float *d_out = dputf(hrand(no, 5, 6), no), *d_att = dputf(hrand(nst, 5, 6), nst);
    OP(attention_fwd, d_out, d_att, d_qkv, B, T, C, NH, causal);
    /* scratch of exactly the documented T*T floats, garbage on entry */
    float *d_scratch = dputf(hrand(nt, 5, 6), nt);
    OP(attention_bwd, d_dqkv, dputf(dy, no), d_qkv, d_att, d_scratch, B, T, C, NH, causal);
    expect_close(dgetf(d_dqkv, nq), ref, nq, att_tol(), "attention_bwd dqkv B=%d T=%d C=%d NH=%d causal=%d", B, T,
                 C, NH, causal);
    scope_end(sc);
}

static void body_attention_fwd_causal(void)
{
    for (size_t k = 0; k < N_ATTENTION; k++)
        attention_fwd_case(attention_shapes[k], 1);
}
static void body_attention_fwd_full(void)
{
    for (size_t k = 0; k < N_ATTENTION; k++)
        attention_fwd_case(attention_shapes[k], 0);
}
static void body_attention_bwd_causal(void)
{
    for (size_t k = 0; k < N_ATTENTION; k++)
        attention_bwd_case(attention_shapes[k], 1);
}
static void body_attention_bwd_full(void)
{
    for (size_t k = 0; k < N_ATTENTION; k++)
        attention_bwd_case(attention_shapes[k], 0);
}

/* The planner's memory model (cdp_cost_att_floats) counts what the table's
 * attention keeps, per sample, for a plan on this backend and precision. */
static void body_attention_state_planner(void)
{
    if (G.prec == CDP_PRECISION_BF16 && !fused_attention_on())
        cr_skip_test("CDP_CUDA_ATTENTION=materialized: the planner models the fused kernels");
    struct cdp_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.cluster.backend = G.type == CDP_BACKEND_CUDA ? CDP_BACKEND_CUDA : CDP_BACKEND_CPU;
    plan.train.precision = G.prec;
    for (size_t k = 0; k < N_ATTENTION; k++) {
        const struct attention_shape sh = attention_shapes[k];
        struct cdp_unit u;
        memset(&u, 0, sizeof u);
        u.desc.type = CDP_LAYER_ATTENTION;
        u.in = (struct cdp_shape){2, {sh.T, sh.C}};
        u.desc.heads = sh.NH;
        u.att_floats = (int64_t)sh.NH * sh.T * sh.T;
        const size_t n = att_state_floats(sh.B, sh.T, sh.C, sh.NH);
        cr_assert_eq((int64_t)(n / (size_t)sh.B), cdp_cost_att_floats(&plan, &u),
                     "%s: B=%d T=%d C=%d NH=%d: the table keeps %zu floats, the planner counts %lld per sample",
                     where(), sh.B, sh.T, sh.C, sh.NH, n, (long long)cdp_cost_att_floats(&plan, &u));
        if (sh.NH % 2) continue;
        /* split by heads over 2 ranks: the rank's heads and width, as cdp_unit_fit_kernels asks the table */
        u.tp_size = 2;
        u.att_floats /= 2;
        const size_t n2 = att_state_floats(sh.B, sh.T, sh.C / 2, sh.NH / 2);
        cr_assert_eq((int64_t)(n2 / (size_t)sh.B), cdp_cost_att_floats(&plan, &u),
                     "%s: B=%d T=%d C=%d NH=%d at t = 2: the table keeps %zu floats, the planner counts %lld per "
                     "sample", where(), sh.B, sh.T, sh.C, sh.NH, n2, (long long)cdp_cost_att_floats(&plan, &u));
    }
}

GPU_OPS_TEST(attention_state_matches_the_planner_fp32) { body_attention_state_planner(); }
GPU_OPS_TEST_BF16(attention_state_matches_the_planner_bf16) { body_attention_state_planner(); }
GPU_OPS_TEST(attention_fwd_causal_fp32) { body_attention_fwd_causal(); }
GPU_OPS_TEST(attention_fwd_full_fp32) { body_attention_fwd_full(); }
GPU_OPS_TEST(attention_bwd_causal_fp32) { body_attention_bwd_causal(); }
GPU_OPS_TEST(attention_bwd_full_fp32) { body_attention_bwd_full(); }
GPU_OPS_TEST_BF16(attention_fwd_causal_bf16) { body_attention_fwd_causal(); }
GPU_OPS_TEST_BF16(attention_fwd_full_bf16) { body_attention_fwd_full(); }
GPU_OPS_TEST_BF16(attention_bwd_causal_bf16) { body_attention_bwd_causal(); }
GPU_OPS_TEST_BF16(attention_bwd_full_bf16) { body_attention_bwd_full(); }

/* ---- losses ----------------------------------------------------------------------- */

/* logits in [-4, 4] plus offset */
static void crossentropy_case(int N, int V, float offset, double tol_fwd)
{
    struct scope sc = scope_begin();
    size_t n = (size_t)N * V;
    float *logits = hrand(n, -4, 4);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < V; j++)
            logits[(size_t)i * V + j] += i % 2 ? -offset : offset;
    int32_t *tgt = htokens(N, V);
    float scale = 1.0f / (float)N;
    float *rl = hzeros(N), *rd = hzeros(n);
    cdp_cpu_crossentropy_fwd(rl, logits, tgt, N, V);
    cdp_cpu_crossentropy_bwd(rd, logits, tgt, N, V, scale);
    float *d_logits = dputf(logits, n), *d_losses = dputf(hrand(N, 5, 6), N);
    int32_t *d_tgt = dput(tgt, (size_t)N * sizeof *tgt);
    OP(crossentropy_fwd, d_losses, d_logits, d_tgt, N, V);
    expect_close(dgetf(d_losses, N), rl, N, tol_fwd, "crossentropy_fwd N=%d V=%d offset=%g", N, V, offset);
    /* backward overwrites: garbage in dlogits must not survive */
    float *d_dl = dputf(hrand(n, 5, 6), n);
    OP(crossentropy_bwd, d_dl, d_logits, d_tgt, N, V, scale);
    expect_close(dgetf(d_dl, n), rd, n, TOL_ROW, "crossentropy_bwd N=%d V=%d offset=%g", N, V, offset);
    scope_end(sc);
}

GPU_OPS_TEST(crossentropy)
{
    crossentropy_case(37, 1001, 0.0f, TOL_ROW);
    crossentropy_case(3, 5, 0.0f, TOL_ROW);
    crossentropy_case(1, 1, 0.0f, TOL_ROW);
}

/* Logits near +-1e4 must stay finite (the maximum is subtracted before exp).
 * TOL_OFFSET: the reference subtracts x[target] from the maximum before adding
 * log(sum), exact here; the order log(sum) + max - x[target] rounds once at
 * 1e4's scale (ulp 1e-3 against losses ~10), which this still accepts. */
GPU_OPS_TEST(crossentropy_large_logits) { crossentropy_case(8, 1001, 1e4f, TOL_OFFSET); }

/* The vocab-parallel cross-entropy (ops.h, crossentropy_vp_*): the vocabulary
 * V split over t ranks of ceil(V / t) columns each (the last ones padded
 * with logits that must be left out), each rank's statistics summed over
 * the ranks as the group's all-reduce would: the losses and each slice's
 * gradient are the whole vocabulary's (the CPU reference of
 * crossentropy_fwd and crossentropy_bwd), padding columns 0. */
static void need_vocab_parallel(void)
{
    if (!G.ops->crossentropy_vp_stats || !G.ops->crossentropy_vp_fwd || !G.ops->crossentropy_vp_bwd ||
        !G.ops->embedding_vp_fwd || !G.ops->embedding_vp_bwd)
        cr_skip_test("the %s table has no vocab-parallel kernels yet", G.ops->name);
}

static void crossentropy_vp_case(int N, int V, int t, float offset)
{
    struct scope sc = scope_begin();
    const int Vl = (V + t - 1) / t, w = 2 * t + 1;
    float *logits = hrand((size_t)N * V, -4, 4);
    for (size_t i = 0; i < (size_t)N * V; i++) logits[i] += offset;
    int32_t *tgt = htokens(N, V);
    for (int i = 0; i < N; i += 3) tgt[i] = V - 1; /* the last slice's targets among them */
    const float scale = 1.0f / (float)N;
    float *rl = hzeros(N), *rd = hzeros((size_t)N * V), *sum = hzeros((size_t)N * w);
    cdp_cpu_crossentropy_fwd(rl, logits, tgt, N, V);
    cdp_cpu_crossentropy_bwd(rd, logits, tgt, N, V, scale);
    int32_t *d_tgt = dput(tgt, (size_t)N * sizeof *tgt);
    float *slices[8];
    for (int k = 0; k < t; k++) {
        const int off = k * Vl, valid = V - off < 0 ? 0 : V - off < Vl ? V - off : Vl;
        float *x = hrand((size_t)N * Vl, 40, 50); /* padding: larger than every real logit */
        for (int i = 0; i < N; i++)
            for (int j = 0; j < valid; j++) x[(size_t)i * Vl + j] = logits[(size_t)i * V + off + j];
        slices[k] = dputf(x, (size_t)N * Vl);
        float *d_st = dputf(hrand((size_t)N * w, 5, 6), (size_t)N * w); /* overwritten */
        OP(crossentropy_vp_stats, d_st, slices[k], d_tgt, N, Vl, valid, off, k, t);
        const float *st = dgetf(d_st, (size_t)N * w);
        for (size_t i = 0; i < (size_t)N * w; i++) sum[i] += st[i];
    }
    float *d_sum = dputf(sum, (size_t)N * w), *d_l = dputf(hrand(N, 5, 6), N);
    OP(crossentropy_vp_fwd, d_l, d_sum, N, t);
    expect_close(dgetf(d_l, N), rl, N, offset ? TOL_OFFSET : TOL_ROW, "crossentropy_vp_fwd N=%d V=%d t=%d", N, V, t);
    for (int k = 0; k < t; k++) {
        const int off = k * Vl, valid = V - off < 0 ? 0 : V - off < Vl ? V - off : Vl;
        float *d_dl = dputf(hrand((size_t)N * Vl, 5, 6), (size_t)N * Vl); /* overwritten */
        OP(crossentropy_vp_bwd, d_dl, slices[k], d_tgt, d_sum, N, Vl, valid, off, t, scale);
        const float *got = dgetf(d_dl, (size_t)N * Vl);
        float *want = hzeros((size_t)N * Vl);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < valid; j++) want[(size_t)i * Vl + j] = rd[(size_t)i * V + off + j];
        expect_close(got, want, (size_t)N * Vl, TOL_ROW, "crossentropy_vp_bwd N=%d V=%d t=%d rank %d", N, V, t, k);
        for (int i = 0; i < N; i++)
            for (int j = valid; j < Vl; j++)
                cr_assert_eq(got[(size_t)i * Vl + j], 0.0f, "%s: padding column %d of rank %d", where(), j, k);
    }
    scope_end(sc);
}

GPU_OPS_TEST(crossentropy_vocab_parallel)
{
    need_vocab_parallel();
    crossentropy_vp_case(37, 1001, 2, 0.0f);
    crossentropy_vp_case(37, 1001, 4, 0.0f); /* 251 columns a rank, 248 of the last real */
    crossentropy_vp_case(5, 3, 4, 0.0f);     /* a rank with no column of the vocabulary */
    crossentropy_vp_case(8, 1001, 8, 1e4f);  /* large logits stay finite */
}

/* The vocab-parallel embedding: the ranks' outputs summed are embedding_fwd's
 * (the positions added by one rank), each rank's dwte its rows of
 * embedding_bwd's, dwpe embedding_bwd's on every rank. */
static void embedding_vp_case(int Bn, int T, int C, int V, int t)
{
    struct scope sc = scope_begin();
    const int Vl = (V + t - 1) / t;
    const size_t n = (size_t)Bn * T * C;
    int32_t *tok = htokens((size_t)Bn * T, V);
    float *wte = hrand((size_t)V * C, -1, 1), *wpe = hrand((size_t)T * C, -1, 1), *dy = hrand(n, -1, 1);
    float *ref = hzeros(n), *rte = hzeros((size_t)V * C), *rpe = hzeros((size_t)T * C), *sum = hzeros(n);
    cdp_cpu_embedding_fwd(ref, tok, wte, wpe, Bn, T, C);
    cdp_cpu_embedding_bwd(rte, rpe, dy, tok, Bn, T, C);
    int32_t *d_tok = dput(tok, (size_t)Bn * T * sizeof *tok);
    float *d_wpe = dputf(wpe, (size_t)T * C), *d_dy = dputf(dy, n);
    for (int k = 0; k < t; k++) {
        const int off = k * Vl, rows = V - off < 0 ? 0 : V - off < Vl ? V - off : Vl;
        float *slice = hzeros((size_t)Vl * C);
        memcpy(slice, wte + (size_t)off * C, (size_t)rows * C * sizeof *slice);
        float *d_out = dputf(hrand(n, 5, 6), n);
        OP(embedding_vp_fwd, d_out, d_tok, dputf(slice, (size_t)Vl * C), k == 0 ? d_wpe : NULL, Bn, T, C, off, rows);
        const float *got = dgetf(d_out, n);
        for (size_t i = 0; i < n; i++) sum[i] += got[i];
        float *d_te = dputf(hzeros((size_t)Vl * C), (size_t)Vl * C), *d_pe = dputf(hzeros((size_t)T * C), (size_t)T * C);
        OP(embedding_vp_bwd, d_te, d_pe, d_dy, d_tok, Bn, T, C, off, rows);
        float *want = hzeros((size_t)Vl * C);
        memcpy(want, rte + (size_t)off * C, (size_t)rows * C * sizeof *want);
        expect_close(dgetf(d_te, (size_t)Vl * C), want, (size_t)Vl * C, TOL_SCATTER,
                     "embedding_vp_bwd dwte V=%d t=%d rank %d", V, t, k);
        expect_close(dgetf(d_pe, (size_t)T * C), rpe, (size_t)T * C, TOL_SCATTER, "embedding_vp_bwd dwpe rank %d", k);
    }
    expect_close(sum, ref, n, TOL_EXACT, "embedding_vp_fwd summed over %d ranks, V=%d", t, V);
    scope_end(sc);
}

GPU_OPS_TEST(embedding_vocab_parallel)
{
    need_vocab_parallel();
    embedding_vp_case(3, 37, 45, 53, 2);
    embedding_vp_case(3, 37, 45, 53, 4);
    embedding_vp_case(2, 5, 7, 3, 4); /* a rank with no row */
}

static void mse_case(int N, int D)
{
    struct scope sc = scope_begin();
    size_t n = (size_t)N * D;
    float *pred = hrand(n, -2, 2), *tgt = hrand(n, -2, 2);
    float scale = 1.0f / (float)N;
    float *rl = hzeros(N), *rd = hzeros(n);
    cdp_cpu_mse_fwd(rl, pred, tgt, N, D);
    cdp_cpu_mse_bwd(rd, pred, tgt, N, D, scale);
    float *d_pred = dputf(pred, n), *d_tgt = dputf(tgt, n), *d_l = dputf(hrand(N, 5, 6), N);
    OP(mse_fwd, d_l, d_pred, d_tgt, N, D);
    expect_close(dgetf(d_l, N), rl, N, TOL_ROW, "mse_fwd N=%d D=%d", N, D);
    float *d_dp = dputf(hrand(n, 5, 6), n);
    OP(mse_bwd, d_dp, d_pred, d_tgt, N, D, scale);
    expect_close(dgetf(d_dp, n), rd, n, TOL_ELEM, "mse_bwd N=%d D=%d", N, D);
    scope_end(sc);
}

GPU_OPS_TEST(mse)
{
    mse_case(37, 45);
    mse_case(1, 1);
    mse_case(3, 1001);
}

/* ---- conv2d --------------------------------------------------------------------- */

struct conv_shape {
    int B, IC, H, W, OC, K, S, P;
};

/* padded, strided unpadded, 1x1 (no im2col), and the larger case */
static const struct conv_shape conv_shapes[] = {
    {2, 3, 13, 11, 5, 3, 1, 1}, {1, 4, 9, 10, 6, 3, 2, 0}, {2, 7, 5, 6, 9, 1, 1, 0}, {2, 19, 29, 31, 37, 5, 2, 2}};
#define N_CONV (sizeof conv_shapes / sizeof *conv_shapes)

static int conv_oh(struct conv_shape s) { return (s.H + 2 * s.P - s.K) / s.S + 1; }
static int conv_ow(struct conv_shape s) { return (s.W + 2 * s.P - s.K) / s.S + 1; }

static void conv2d_fwd_case(struct conv_shape s, int bias, int large)
{
    struct scope sc = scope_begin();
    int OH = conv_oh(s), OW = conv_ow(s);
    size_t nin = (size_t)s.B * s.IC * s.H * s.W, nw = (size_t)s.OC * s.IC * s.K * s.K;
    size_t nout = (size_t)s.B * s.OC * OH * OW, ncol = (size_t)s.IC * s.K * s.K * OH * OW;
    float *in = hrand(nin, -1, 1), *w = hrand(nw, -1, 1), *b = bias ? hrand(s.OC, -1, 1) : NULL;
    float *ref = hzeros(nout);
    cdp_cpu_conv2d_fwd(ref, hzeros(ncol), operand(in, nin), operand(w, nw), b, s.B, s.IC, s.H, s.W, s.OC, s.K,
                       s.S, s.P);
    float *dout = dputf(hrand(nout, 5, 6), nout), *dcol = dputf(hrand(ncol, 5, 6), ncol);
    OP(conv2d_fwd, dout, dcol, dputf(in, nin), dputf(w, nw), b ? dputf(b, s.OC) : NULL, s.B, s.IC, s.H, s.W,
       s.OC, s.K, s.S, s.P);
    float *got = dgetf(dout, nout);
    expect_close(got, ref, nout, gemm_tol(), "conv2d_fwd B=%d IC=%d H=%d W=%d OC=%d K=%d S=%d P=%d bias=%d", s.B,
                 s.IC, s.H, s.W, s.OC, s.K, s.S, s.P, bias);
    if (G.prec == CDP_PRECISION_BF16 && large) {
        float *ref32 = hzeros(nout);
        size_t w_ = 0;
        cdp_cpu_conv2d_fwd(ref32, hzeros(ncol), in, w, b, s.B, s.IC, s.H, s.W, s.OC, s.K, s.S, s.P);
        double e = max_nerr(got, ref32, nout, &w_);
        cr_log_info("measured: conv2d_fwd bf16 vs unrounded fp32: %.3g", e);
        cr_assert(e > BF16_MIN_EFFECT,
                  "conv2d_fwd under bf16 matches the unrounded fp32 product to %.3g: operands not rounded?", e);
    }
    scope_end(sc);
}

static void body_conv2d_fwd(void)
{
    for (size_t k = 0; k < N_CONV; k++)
        conv2d_fwd_case(conv_shapes[k], 1, k == N_CONV - 1);
    conv2d_fwd_case(conv_shapes[0], 0, 0);
    conv2d_fwd_case(conv_shapes[2], 0, 0);
}

static void conv2d_bwd_case(struct conv_shape s, struct grads3 g)
{
    struct scope sc = scope_begin();
    int OH = conv_oh(s), OW = conv_ow(s);
    size_t nin = (size_t)s.B * s.IC * s.H * s.W, nw = (size_t)s.OC * s.IC * s.K * s.K;
    size_t nout = (size_t)s.B * s.OC * OH * OW, ncol = (size_t)s.IC * s.K * s.K * OH * OW;
    float *in = hrand(nin, -1, 1), *w = hrand(nw, -1, 1), *dy = hrand(nout, -1, 1);
    float *din = hrand(nin, -1, 1), *dw = hrand(nw, -1, 1), *db = hrand(s.OC, -1, 1);
    float *rin = hdup(din, nin), *rw = hdup(dw, nw), *rb = hdup(db, s.OC);
    cdp_cpu_conv2d_bwd(g.a ? rin : NULL, g.b ? rw : NULL, g.c ? rb : NULL, hzeros(ncol), operand(dy, nout),
                       operand(in, nin), operand(w, nw), s.B, s.IC, s.H, s.W, s.OC, s.K, s.S, s.P);
    float *d_din = dputf(din, nin), *d_dw = dputf(dw, nw), *d_db = dputf(db, s.OC);
    float *dcol = dputf(hrand(ncol, 5, 6), ncol);
    OP(conv2d_bwd, g.a ? d_din : NULL, g.b ? d_dw : NULL, g.c ? d_db : NULL, dcol, dputf(dy, nout),
       dputf(in, nin), dputf(w, nw), s.B, s.IC, s.H, s.W, s.OC, s.K, s.S, s.P);
    expect_close(dgetf(d_din, nin), rin, nin, gemm_tol(),
                 "conv2d_bwd din B=%d IC=%d H=%d W=%d OC=%d K=%d S=%d P=%d (wanted %d)", s.B, s.IC, s.H, s.W,
                 s.OC, s.K, s.S, s.P, g.a);
    expect_close(dgetf(d_dw, nw), rw, nw, gemm_tol(),
                 "conv2d_bwd dw B=%d IC=%d H=%d W=%d OC=%d K=%d S=%d P=%d (wanted %d)", s.B, s.IC, s.H, s.W, s.OC,
                 s.K, s.S, s.P, g.b);
    /* db sums dout: fp32 thresholds under either precision */
    float *rb32 = hdup(db, s.OC);
    if (g.c)
        cdp_cpu_conv2d_bwd(NULL, NULL, rb32, hzeros(ncol), dy, in, w, s.B, s.IC, s.H, s.W, s.OC, s.K, s.S, s.P);
    char what[160];
    snprintf(what, sizeof what, "conv2d_bwd db B=%d IC=%d H=%d W=%d OC=%d K=%d S=%d P=%d (wanted %d)", s.B, s.IC,
             s.H, s.W, s.OC, s.K, s.S, s.P, g.c);
    expect_bias_grad(dgetf(d_db, s.OC), rb, rb32, s.OC, what);
    scope_end(sc);
}

static void body_conv2d_bwd(void)
{
    const struct grads3 all = {1, 1, 1};
    for (size_t k = 0; k < N_CONV; k++)
        conv2d_bwd_case(conv_shapes[k], all);
    conv2d_bwd_case(conv_shapes[0], (struct grads3){0, 1, 1});
    conv2d_bwd_case(conv_shapes[1], (struct grads3){1, 0, 0});
    conv2d_bwd_case(conv_shapes[2], (struct grads3){1, 1, 0});
}

GPU_OPS_TEST(conv2d_fwd_fp32) { body_conv2d_fwd(); }
GPU_OPS_TEST(conv2d_bwd_fp32) { body_conv2d_bwd(); }
GPU_OPS_TEST_BF16(conv2d_fwd_bf16) { body_conv2d_fwd(); }
GPU_OPS_TEST_BF16(conv2d_bwd_bf16) { body_conv2d_bwd(); }

/* ---- maxpool2d ------------------------------------------------------------------ */

struct pool_shape {
    int B, C, H, W, K, S;
};

/* overlapping windows, a dropped last row, one window per plane, larger */
static const struct pool_shape pool_shapes[] = {
    {2, 3, 13, 11, 3, 2}, {1, 5, 13, 9, 2, 2}, {2, 3, 7, 7, 7, 1}, {4, 16, 33, 35, 3, 2}};
#define N_POOL (sizeof pool_shapes / sizeof *pool_shapes)

/* ties = 0: distinct values; 1: values in {0, 1, 2} (ties everywhere) and a
 * few NaNs, which win as in PyTorch */
static void maxpool2d_fwd_case(struct pool_shape s, int ties)
{
    struct scope sc = scope_begin();
    int OH = (s.H - s.K) / s.S + 1, OW = (s.W - s.K) / s.S + 1;
    size_t nin = (size_t)s.B * s.C * s.H * s.W, nout = (size_t)s.B * s.C * OH * OW;
    float *in = hrand(nin, -3, 3);
    if (ties) {
        for (size_t i = 0; i < nin; i++)
            in[i] = floorf((in[i] + 3.0f) / 2.0f);
        in[0] = NAN, in[nin / 2] = NAN, in[nin - 1] = NAN;
    }
    float *ref = hzeros(nout);
    int32_t *ridx = htrack(calloc(nout, sizeof *ridx)), *got_idx = htrack(calloc(nout, sizeof *got_idx));
    cdp_cpu_maxpool2d_fwd(ref, ridx, in, s.B, s.C, s.H, s.W, s.K, s.S);
    for (size_t i = 0; i < nout; i++)
        got_idx[i] = -7; /* garbage */
    float *dout = dputf(hrand(nout, 5, 6), nout);
    int32_t *didx = dput(got_idx, nout * sizeof *got_idx);
    OP(maxpool2d_fwd, dout, didx, dputf(in, nin), s.B, s.C, s.H, s.W, s.K, s.S);
    expect_close(dgetf(dout, nout), ref, nout, TOL_EXACT, "maxpool2d_fwd B=%d C=%d H=%d W=%d K=%d S=%d ties=%d",
                 s.B, s.C, s.H, s.W, s.K, s.S, ties);
    dget(got_idx, didx, nout * sizeof *got_idx);
    for (size_t i = 0; i < nout; i++)
        cr_assert_eq(got_idx[i], ridx[i],
                     "%s: maxpool2d_fwd B=%d C=%d H=%d W=%d K=%d S=%d ties=%d: argmax[%zu] = %d, reference %d "
                     "(first maximum in row-major window order; NaN wins)",
                     where(), s.B, s.C, s.H, s.W, s.K, s.S, ties, i, got_idx[i], ridx[i]);
    scope_end(sc);
}

GPU_OPS_TEST(maxpool2d_fwd)
{
    for (size_t k = 0; k < N_POOL; k++)
        maxpool2d_fwd_case(pool_shapes[k], 0);
}

GPU_OPS_TEST(maxpool2d_fwd_ties_nan)
{
    for (size_t k = 0; k < N_POOL; k++)
        maxpool2d_fwd_case(pool_shapes[k], 1);
}

static void maxpool2d_bwd_case(struct pool_shape s)
{
    struct scope sc = scope_begin();
    int OH = (s.H - s.K) / s.S + 1, OW = (s.W - s.K) / s.S + 1;
    size_t nin = (size_t)s.B * s.C * s.H * s.W, nout = (size_t)s.B * s.C * OH * OW;
    float *in = hrand(nin, -3, 3), *out = hzeros(nout), *dy = hrand(nout, -1, 1), *din = hrand(nin, -1, 1);
    int32_t *idx = htrack(calloc(nout, sizeof *idx));
    cdp_cpu_maxpool2d_fwd(out, idx, in, s.B, s.C, s.H, s.W, s.K, s.S);
    float *ref = hdup(din, nin);
    cdp_cpu_maxpool2d_bwd(ref, dy, idx, s.B, s.C, OH, OW);
    float *d_din = dputf(din, nin);
    OP(maxpool2d_bwd, d_din, dputf(dy, nout), dput(idx, nout * sizeof *idx), s.B, s.C, OH, OW);
    /* overlapping windows (K > S) may pick one input twice: order-dependent adds */
    expect_close(dgetf(d_din, nin), ref, nin, TOL_SCATTER, "maxpool2d_bwd B=%d C=%d H=%d W=%d K=%d S=%d", s.B, s.C,
                 s.H, s.W, s.K, s.S);
    scope_end(sc);
}

GPU_OPS_TEST(maxpool2d_bwd)
{
    for (size_t k = 0; k < N_POOL; k++)
        maxpool2d_bwd_case(pool_shapes[k]);
}

/* ---- optimizers: three steps each ------------------------------------------------ */

static void adamw_case(size_t n)
{
    struct scope sc = scope_begin();
    float *p = hrand(n, -1, 1), *m = hzeros(n), *v = hzeros(n);
    float *dp = dputf(p, n), *dm = dputf(m, n), *dv = dputf(v, n);
    for (int t = 1; t <= 3; t++) {
        float *g = hrand(n, -1, 1);
        g[0] = 0.0f;
        cdp_cpu_adamw_step(p, g, m, v, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, t);
        OP(adamw_step, dp, dputf(g, n), dm, dv, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, t);
    }
    expect_close(dgetf(dp, n), p, n, TOL_ELEM, "adamw_step param n=%zu after 3 steps", n);
    expect_close(dgetf(dm, n), m, n, TOL_ELEM, "adamw_step m n=%zu after 3 steps", n);
    expect_close(dgetf(dv, n), v, n, TOL_ELEM, "adamw_step v n=%zu after 3 steps", n);
    scope_end(sc);
}

GPU_OPS_TEST(adamw_step)
{
    adamw_case(1);
    adamw_case(1037);
    adamw_case(70001);
}

static void sgd_case(size_t n, float momentum, int with_velocity)
{
    struct scope sc = scope_begin();
    float *p = hrand(n, -1, 1);
    /* garbage velocity: step 1 must set it to the gradient, not blend it */
    float *vel = with_velocity ? hrand(n, 5, 6) : NULL;
    float *dp = dputf(p, n), *dvel = with_velocity ? dputf(vel, n) : NULL;
    for (int t = 1; t <= 3; t++) {
        float *g = hrand(n, -1, 1);
        cdp_cpu_sgd_step(p, g, vel, n, 0.05f, momentum, 1e-2f, t);
        OP(sgd_step, dp, dputf(g, n), dvel, n, 0.05f, momentum, 1e-2f, t);
    }
    expect_close(dgetf(dp, n), p, n, TOL_ELEM, "sgd_step param n=%zu momentum=%g velocity=%d after 3 steps", n,
                 momentum, with_velocity);
    if (with_velocity)
        expect_close(dgetf(dvel, n), vel, n, TOL_ELEM, "sgd_step velocity n=%zu momentum=%g after 3 steps", n,
                     momentum);
    scope_end(sc);
}

GPU_OPS_TEST(sgd_step)
{
    sgd_case(1037, 0.9f, 1);
    sgd_case(70001, 0.9f, 1);
    sgd_case(1037, 0.0f, 0); /* no momentum: velocity NULL */
}

/* ---- bf16 precision leaves the other ops alone ------------------------------------ */

/* ops.h: under bf16 only the matrix-multiply ops round; the rest stay fp32,
 * so the fp32 thresholds apply unchanged. */
GPU_OPS_TEST_BF16(bf16_leaves_other_ops_fp32)
{
    layernorm_fwd_case(37, 45, 0.0f);
    layernorm_bwd_case(37, 45, (struct grads3){1, 1, 1});
    crossentropy_case(37, 1001, 0.0f, TOL_ROW);
    mse_case(37, 45);
    adamw_case(1037);
    sgd_case(1037, 0.9f, 1);
    embedding_bwd_case(3, 37, 45, 53, 1, 1);
    maxpool2d_fwd_case(pool_shapes[0], 1);
}

/* ---- split backward: B and W as two calls of the same op -------------------------- */

/* The bits of n floats at device pointer got against host want. */
static void expect_bits(const float *got_dev, const float *want, size_t n, const char *what)
{
    float *got = dgetf(got_dev, n);
    size_t i = first_diff((const unsigned char *)got, (const unsigned char *)want, n * sizeof(float));
    if (i < n * sizeof(float))
        cr_assert_fail("%s: %s: float %zu is %.9g, the combined call's %.9g (not the same bits)", where(), what,
                       i / sizeof(float), got[i / sizeof(float)], want[i / sizeof(float)]);
}

/* ops.h: B calls an op with the weight outputs NULL, W with din NULL; each
 * output must be the bits of the call asking for all three. */
static void split_linear_case(struct linear_shape s)
{
    struct scope sc = scope_begin();
    size_t nin = (size_t)s.N * s.IC, nw = (size_t)s.OC * s.IC, nout = (size_t)s.N * s.OC;
    float *in = dputf(hrand(nin, -1, 1), nin), *w = dputf(hrand(nw, -1, 1), nw), *dy = dputf(hrand(nout, -1, 1), nout);
    float *din0 = hrand(nin, -1, 1), *dw0 = hrand(nw, -1, 1), *db0 = hrand(s.OC, -1, 1);
    float *a_in = dputf(din0, nin), *a_w = dputf(dw0, nw), *a_b = dputf(db0, s.OC);
    OP(linear_bwd, a_in, a_w, a_b, dy, in, w, s.N, s.IC, s.OC);
    float *r_in = dgetf(a_in, nin), *r_w = dgetf(a_w, nw), *r_b = dgetf(a_b, s.OC);
    float *b_in = dputf(din0, nin), *w_w = dputf(dw0, nw), *w_b = dputf(db0, s.OC);
    OP(linear_bwd, b_in, NULL, NULL, dy, in, w, s.N, s.IC, s.OC);
    OP(linear_bwd, NULL, w_w, w_b, dy, in, w, s.N, s.IC, s.OC);
    char what[96];
    snprintf(what, sizeof what, "linear_bwd N=%d IC=%d OC=%d: B's din", s.N, s.IC, s.OC);
    expect_bits(b_in, r_in, nin, what);
    snprintf(what, sizeof what, "linear_bwd N=%d IC=%d OC=%d: W's dw", s.N, s.IC, s.OC);
    expect_bits(w_w, r_w, nw, what);
    snprintf(what, sizeof what, "linear_bwd N=%d IC=%d OC=%d: W's db", s.N, s.IC, s.OC);
    expect_bits(w_b, r_b, s.OC, what);
    if (G.ops->linear_gelu_bwd) {
        /* the fused op in the combined backward; B asks it for dpre only, W asks linear_bwd for dw and db */
        float *pre = dputf(hrand(nin, -3, 3), nin), *dpre = dputf(hzeros(nin), nin);
        float *f_w = dputf(dw0, nw), *f_b = dputf(db0, s.OC);
        OP(linear_gelu_bwd, dpre, f_w, f_b, dy, in, pre, w, s.N, s.IC, s.OC);
        float *r_pre = dgetf(dpre, nin), *r_fw = dgetf(f_w, nw), *r_fb = dgetf(f_b, s.OC);
        float *b_pre = dputf(hzeros(nin), nin), *g_w = dputf(dw0, nw), *g_b = dputf(db0, s.OC);
        OP(linear_gelu_bwd, b_pre, NULL, NULL, dy, in, pre, w, s.N, s.IC, s.OC);
        OP(linear_bwd, NULL, g_w, g_b, dy, in, w, s.N, s.IC, s.OC);
        snprintf(what, sizeof what, "linear_gelu_bwd N=%d IC=%d OC=%d: B's dpre", s.N, s.IC, s.OC);
        expect_bits(b_pre, r_pre, nin, what);
        snprintf(what, sizeof what, "linear_gelu_bwd N=%d IC=%d OC=%d: W's dw (linear_bwd)", s.N, s.IC, s.OC);
        expect_bits(g_w, r_fw, nw, what);
        snprintf(what, sizeof what, "linear_gelu_bwd N=%d IC=%d OC=%d: W's db (linear_bwd)", s.N, s.IC, s.OC);
        expect_bits(g_b, r_fb, s.OC, what);
    }
    scope_end(sc);
}

static void split_layernorm_case(int N, int C)
{
    struct scope sc = scope_begin();
    size_t n = (size_t)N * C;
    float *hin = hrand(n, -2, 2), *hw = hrand(C, 0.5f, 1.5f), *hb = hrand(C, -1, 1);
    float *y = hzeros(n), *hmean = hzeros(N), *hrstd = hzeros(N);
    cdp_cpu_layernorm_fwd(y, hmean, hrstd, hin, hw, hb, N, C, 1e-5f);
    float *in = dputf(hin, n), *w = dputf(hw, C), *mean = dputf(hmean, N), *rstd = dputf(hrstd, N);
    float *dy = dputf(hrand(n, -1, 1), n);
    float *din0 = hrand(n, -1, 1), *dw0 = hrand(C, -1, 1), *db0 = hrand(C, -1, 1);
    float *a_in = dputf(din0, n), *a_w = dputf(dw0, C), *a_b = dputf(db0, C);
    OP(layernorm_bwd, a_in, a_w, a_b, dy, in, w, mean, rstd, N, C);
    float *b_in = dputf(din0, n), *w_w = dputf(dw0, C), *w_b = dputf(db0, C);
    OP(layernorm_bwd, b_in, NULL, NULL, dy, in, w, mean, rstd, N, C);
    OP(layernorm_bwd, NULL, w_w, w_b, dy, in, w, mean, rstd, N, C);
    char what[96];
    snprintf(what, sizeof what, "layernorm_bwd N=%d C=%d: B's din", N, C);
    expect_bits(b_in, dgetf(a_in, n), n, what);
    snprintf(what, sizeof what, "layernorm_bwd N=%d C=%d: W's dweight", N, C);
    expect_bits(w_w, dgetf(a_w, C), C, what);
    snprintf(what, sizeof what, "layernorm_bwd N=%d C=%d: W's dbias", N, C);
    expect_bits(w_b, dgetf(a_b, C), C, what);
    scope_end(sc);
}

static void split_conv2d_case(struct conv_shape s)
{
    struct scope sc = scope_begin();
    int OH = conv_oh(s), OW = conv_ow(s);
    size_t nin = (size_t)s.B * s.IC * s.H * s.W, nw = (size_t)s.OC * s.IC * s.K * s.K;
    size_t nout = (size_t)s.B * s.OC * OH * OW, ncol = (size_t)s.IC * s.K * s.K * OH * OW;
    float *in = dputf(hrand(nin, -1, 1), nin), *w = dputf(hrand(nw, -1, 1), nw), *dy = dputf(hrand(nout, -1, 1), nout);
    float *col = dputf(hzeros(ncol), ncol);
    float *din0 = hrand(nin, -1, 1), *dw0 = hrand(nw, -1, 1), *db0 = hrand(s.OC, -1, 1);
    float *a_in = dputf(din0, nin), *a_w = dputf(dw0, nw), *a_b = dputf(db0, s.OC);
    OP(conv2d_bwd, a_in, a_w, a_b, col, dy, in, w, s.B, s.IC, s.H, s.W, s.OC, s.K, s.S, s.P);
    float *b_in = dputf(din0, nin), *w_w = dputf(dw0, nw), *w_b = dputf(db0, s.OC);
    OP(conv2d_bwd, b_in, NULL, NULL, col, dy, in, w, s.B, s.IC, s.H, s.W, s.OC, s.K, s.S, s.P);
    OP(conv2d_bwd, NULL, w_w, w_b, col, dy, in, w, s.B, s.IC, s.H, s.W, s.OC, s.K, s.S, s.P);
    char what[128];
    snprintf(what, sizeof what, "conv2d_bwd B=%d IC=%d OC=%d K=%d S=%d P=%d: B's din", s.B, s.IC, s.OC, s.K, s.S,
             s.P);
    expect_bits(b_in, dgetf(a_in, nin), nin, what);
    snprintf(what, sizeof what, "conv2d_bwd B=%d IC=%d OC=%d K=%d S=%d P=%d: W's dw", s.B, s.IC, s.OC, s.K, s.S, s.P);
    expect_bits(w_w, dgetf(a_w, nw), nw, what);
    snprintf(what, sizeof what, "conv2d_bwd B=%d IC=%d OC=%d K=%d S=%d P=%d: W's db", s.B, s.IC, s.OC, s.K, s.S, s.P);
    expect_bits(w_b, dgetf(a_b, s.OC), s.OC, what);
    scope_end(sc);
}

static void body_split_backward(void)
{
    for (size_t k = 0; k < N_LINEAR; k++)
        split_linear_case(linear_shapes[k]);
    split_layernorm_case(37, 45);
    split_layernorm_case(64, 1001);
    for (size_t k = 0; k < N_CONV; k++)
        split_conv2d_case(conv_shapes[k]);
}

GPU_OPS_TEST(split_backward_is_the_combined_calls_bits_fp32) { body_split_backward(); }
GPU_OPS_TEST_BF16(split_backward_is_the_combined_calls_bits_bf16) { body_split_backward(); }
