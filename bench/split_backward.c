/* Split backward's two halves against the combined backward, on the CPU, for
 * GPT configurations: what a zero-bubble schedule's T_B and T_W are beside
 * T_F (docs/training.md, "Split backward").
 *
 *   bench-split-backward [--quick]
 *
 * One OpenBLAS thread. For each configuration, one micro-batch, ms (median of
 * 7 after 2 warm-ups) of the forward, the combined backward, B and W, and W's
 * share of the backward's matrix work by the layer table (bwd_weight_flops). */
#include <cblas.h>
#include <stdio.h>
#include <string.h>

#include "bench_util.h"
#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/plan.h"
#include "model/model.h"

struct config {
    const char *name;
    int vocab, context, layers, heads, embed, batch;
};

#define REPS 7

static double ms_since(uint64_t t0) { return (double)(cdp_time_ns() - t0) / 1e6; }

static int bench(const struct config *c)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": %d, \"context\": %d, \"layers\": %d, \"heads\": %d, "
             "\"embed\": %d}}", c->vocab, c->context, c->layers, c->heads, c->embed);
    struct cdp_plan *p;
    cdp_device_t dev;
    struct cdp_model *m;
    if (cdp_plan_load_string(json, "bench", NULL, &p) || cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev) ||
        cdp_model_create(&p->model, 0, (int)cdp_plan_model_units(p), c->batch, 1, 1, dev, &m) ||
        cdp_model_set_split_backward(m, 1)) {
        fprintf(stderr, "bench-split-backward: %s\n", cdp_last_error());
        return 1;
    }
    int32_t *tok = cdp_model_input(m, 0);
    int32_t tgt[1 << 14];
    const int rows = c->batch * c->context;
    for (int i = 0; i < rows; i++) {
        tok[i] = (int32_t)((i * 7919u) % (unsigned)c->vocab);
        tgt[i] = (int32_t)((i * 104729u + 13) % (unsigned)c->vocab);
    }
    double f[REPS], bw[REPS], b[REPS], w[REPS];
    for (int r = 0; r < REPS + 2; r++) {
        double loss;
        const int k = r - 2;
        uint64_t t0 = cdp_time_ns();
        cdp_status st = cdp_model_forward(m, 0);
        if (k >= 0) f[k] = ms_since(t0);
        st = st ? st : cdp_model_loss(m, 0, tgt, 1.0f / (float)rows, &loss);
        t0 = cdp_time_ns();
        st = st ? st : cdp_model_backward(m, 0, NULL, NULL);
        if (k >= 0) bw[k] = ms_since(t0);
        t0 = cdp_time_ns();
        st = st ? st : cdp_model_backward_input(m, 0, 0, NULL, NULL);
        if (k >= 0) b[k] = ms_since(t0);
        t0 = cdp_time_ns();
        st = st ? st : cdp_model_backward_weight(m, 0, 0);
        if (k >= 0) w[k] = ms_since(t0);
        if (st) {
            fprintf(stderr, "bench-split-backward: %s\n", cdp_last_error());
            return 1;
        }
    }
    double bf = 0, wf = 0;
    for (int i = 0; i < cdp_model_unit_count(m); i++) {
        bf += cdp_model_unit(m, i)->bwd_flops;
        wf += cdp_model_unit(m, i)->bwd_weight_flops;
    }
    struct cdp_model_bytes mb;
    cdp_model_memory(m, &mb);
    const double F = cdp_bench_median(f, REPS), BW = cdp_bench_median(bw, REPS), B = cdp_bench_median(b, REPS),
                 W = cdp_bench_median(w, REPS);
    printf("%-20s F %8.1f  backward %8.1f  B %8.1f  W %8.1f ms  B+W/backward %5.2f  W/backward %4.2f "
           "(table %4.2f)  W-state %6.1f MiB\n",
           c->name, F, BW, B, W, (B + W) / BW, W / BW, wf / bf, (double)mb.wstate / 1048576.0);
    fflush(stdout);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
    return 0;
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    static const struct config configs[] = {
        {"gpt v512 T128 C128", 512, 128, 4, 4, 128, 4},
        {"gpt v2048 T256 C256", 2048, 256, 4, 4, 256, 2},
    };
    openblas_set_num_threads(1);
    for (size_t i = 0; i < (quick ? 1 : sizeof configs / sizeof *configs); i++)
        if (bench(&configs[i])) return 1;
    return 0;
}
