/* Training-step speed of a GPT on one GPU, through the same model code as
 * training (forward, loss, backward, AdamW), against the GPU's dense peak:
 *
 *   bench-gpu-step [--preset gpt2] [--batch 8] [--seq 1024] [--precision bf16|fp32]
 *                  [--steps 10] [--warmup 3] [--device N] [--layers N]
 *
 * Prints one JSON line: median ms per step after the warm-ups, tokens/s, the
 * layer table's matrix FLOPs per step (what the kernels issue; causal
 * attention counted as the CPU reference computes it) and MFU, those FLOPs
 * per second over the device's dense peak for the precision (from the
 * topology's table of GPU models). bench/torch_gpt2_step.py prints the same
 * for PyTorch eager; tools/gpu-check.sh puts the two side by side.
 * Without a usable GPU it says why and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/plan.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/optim.h"
#include "partitioner/topology_internal.h"

static int fail(const char *what)
{
    fprintf(stderr, "bench-gpu-step: %s: %s\n", what, cdp_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    const char *preset = "gpt2", *precision = "bf16";
    int batch = 8, seq = 1024, steps = 10, warmup = 3, index = 0, layers = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--preset") && v) preset = argv[++i];
        else if (!strcmp(argv[i], "--precision") && v) precision = argv[++i];
        else if (!strcmp(argv[i], "--batch") && v) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && v) seq = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && v) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && v) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && v) index = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && v) layers = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench-gpu-step [--preset P] [--batch B] [--seq T] [--precision bf16|fp32] "
                            "[--steps N] [--warmup N] [--device N] [--layers N]\n");
            return 2;
        }
    }
    if (batch < 1 || seq < 1 || steps < 1 || steps > 1000 || warmup < 0) {
        fprintf(stderr, "bench-gpu-step: batch, seq and steps must be positive (steps at most 1000)\n");
        return 2;
    }
    char json[512], lay[32] = "";
    if (layers > 0) snprintf(lay, sizeof lay, ", \"layers\": %d", layers);
    snprintf(json, sizeof json, "{\"model\": {\"preset\": \"%s\", \"context\": %d%s}, \"train\": {\"precision\": \"%s\"}}",
             preset, seq, lay, precision);
    struct cdp_plan *p;
    if (cdp_plan_load_string(json, "bench-gpu-step", NULL, &p)) return fail("plan");
    int n = 0;
    if (cdp_device_count(CDP_BACKEND_CUDA, &n)) return fail("no GPU");
    cdp_device_t dev;
    if (cdp_device_open(CDP_BACKEND_CUDA, index, 0, &dev)) return fail("device");
    const struct cdp_ops *ops = cdp_device_ops(dev);
    if (ops->set_precision(cdp_device_kernel_state(dev), p->train.precision)) return fail("precision");
    struct cdp_model *m;
    if (cdp_model_create(&p->model, 0, (int)cdp_plan_model_units(p), batch, 1, 1, dev, &m)) return fail("model");
    struct cdp_optimizer *opt;
    struct cdp_optimizer_desc od = {.type = CDP_OPT_ADAMW, .lr = 3e-4, .weight_decay = 0.1, .beta1 = 0.9,
                                    .beta2 = 0.95, .eps = 1e-8};
    if (cdp_optimizer_create(&od, m, dev, &opt)) return fail("optimizer");
    const int vocab = (int)p->model.vocab, ntok = batch * seq;
    int32_t *tok = malloc((size_t)ntok * 4), *tgt = malloc((size_t)ntok * 4);
    double *t = malloc((size_t)steps * sizeof *t);
    if (!tok || !tgt || !t) {
        fprintf(stderr, "bench-gpu-step: out of memory\n");
        return 1;
    }
    for (int i = 0; i < ntok; i++) {
        tok[i] = (int32_t)((i * 7919u) % (unsigned)vocab);
        tgt[i] = (int32_t)((i * 104729u + 13) % (unsigned)vocab);
    }
    if (cdp_device_write(dev, cdp_model_input(m, 0), tok, (uint64_t)ntok * 4)) return fail("input");
    const float scale = 1.0f / (float)ntok;
    double loss = 0;
    for (int r = 0; r < warmup + steps; r++) {
        uint64_t t0 = cdp_time_ns();
        cdp_model_zero_grad(m);
        if (cdp_model_forward(m, 0) || cdp_model_loss(m, 0, tgt, scale, &loss) ||
            cdp_model_backward(m, 0, NULL, NULL))
            return fail("step");
        cdp_optimizer_step(opt, m, 3e-4f, 1.0f);
        if (cdp_model_error(m) || cdp_device_synchronize(dev)) return fail("step");
        if (r >= warmup) t[r - warmup] = (double)(cdp_time_ns() - t0) / 1e9;
    }
    const double step = cdp_bench_median(t, steps), flops = cdp_model_step_flops(m);
    /* the device's memory in use (NVML: everything on it, this process's context included) */
    double util = 0;
    uint64_t mem = 0;
    if (cdp_device_usage(dev, &util, &mem)) mem = 0;
    const struct cdp_gpu_facts *f = cdp_gpu_facts_find(cdp_device_description(dev));
    double peak = 0;
    if (f) peak = p->train.precision == CDP_PRECISION_BF16 ? f->bf16 : (f->fp32 > 0 ? f->fp32 : f->tf32);
    printf("{\"impl\": \"cdphybrid\", \"device\": \"%s\", \"precision\": \"%s\", \"preset\": \"%s\", "
           "\"batch\": %d, \"seq\": %d, \"ms_per_step\": %.3f, \"tokens_per_s\": %.1f, "
           "\"model_flops_per_step\": %.6g, \"flops_per_s\": %.6g, \"peak_flops\": %.6g, \"mfu\": %.4f, "
           "\"loss\": %.4f, \"device_mem_used_gib\": %.2f}\n",
           cdp_device_description(dev), precision, preset, batch, seq, step * 1e3, ntok / step, flops,
           flops / step, peak, peak > 0 ? flops / step / peak : 0.0, loss * scale, (double)mem / 1073741824.0);
    free(tok);
    free(tgt);
    free(t);
    cdp_optimizer_destroy(opt);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
    return 0;
}
