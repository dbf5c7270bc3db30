/* `cdphybrid doctor`: checks what this machine and this build offer (CUDA and its
 * libraries, GPUs, NVML, hwloc, MPI, OpenBLAS) and whether a plan can run here,
 * each with a one-line fix. GPU libraries are only dlopen'ed, so that the
 * program keeps no link dependency on CUDA; they are never dlclose'd (their own
 * allocations would otherwise show as leaks under LeakSanitizer). */
#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/plan.h"
#include "cdp_config.h"
#include "cli/commands.h"
#include "comm/comm.h"
#include "comm/nccl.h"
#include "partitioner/planner.h"
#include "pipeline/run/executor.h"

#if CDP_HAVE_HWLOC
#include <hwloc.h>
#endif

enum doctor_status { DOC_OK = 0, DOC_WARN, DOC_FAIL };

#define DOC_MAX_CHECKS 16
#define DOC_TEXT 512
#define MPIRUN_TIMEOUT_S 10

struct doctor_check {
    const char *name;
    enum doctor_status status;
    char detail[DOC_TEXT];
    char fix[DOC_TEXT];
};

struct doctor {
    struct doctor_check checks[DOC_MAX_CHECKS];
    int n;
    int gpus;              /* usable GPUs (cdp_device_count) */
    char no_gpu_why[DOC_TEXT]; /* why none, or "" */
    int have_mpirun;       /* `mpirun --version` ran */
};

static const char *const status_names[] = {"OK", "WARN", "FAIL"};

/* Adds a check; fix may be NULL (nothing to do). */
static void add_check(struct doctor *d, const char *name, enum doctor_status st, const char *fix,
                      const char *fmt, ...)
{
    CDP_ASSERT(d->n < DOC_MAX_CHECKS);
    struct doctor_check *c = &d->checks[d->n++];
    c->name = name;
    c->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->detail, sizeof c->detail, fmt, ap);
    va_end(ap);
    snprintf(c->fix, sizeof c->fix, "%s", fix ? fix : "");
}

static void doctor_usage(FILE *f)
{
    fputs("usage: cdphybrid doctor [--plan FILE] [--json]\n"
          "\n"
          "Checks this machine and this build: build features, CUDA driver and runtime,\n"
          "cuBLAS / cuDNN / NCCL found at run time, GPUs, NVML and NVLink, hwloc, the MPI\n"
          "launcher, OpenBLAS threads, and which backend a plan would use and whether it\n"
          "can run here. Each check is OK, WARN or FAIL with a one-line fix (docs/doctor.md).\n"
          "\n"
          "options:\n"
          "  --plan FILE  the plan to check (default: {\"model\": {\"preset\": \"gpt\"}})\n"
          "  --json       print {\"checks\": [{\"name\", \"status\", \"detail\", \"fix\"}], \"can_run\"}\n"
          "  -h, --help   this text\n"
          "\n"
          "exit codes: 0 the plan can run here, 1 it cannot, 2 bad usage or a bad plan\n",
          f);
}

/* dlopen by soname; never closed (see the top of the file). */
static void *open_lib(const char *soname)
{
    return dlopen(soname, RTLD_NOW | RTLD_LOCAL);
}

static void check_build(struct doctor *d)
{
    int all = CDP_HAVE_CUDA && CDP_HAVE_NCCL && CDP_HAVE_CUDNN && CDP_HAVE_MPI && CDP_HAVE_HWLOC;
    add_check(d, "build", all ? DOC_OK : DOC_WARN,
              all ? NULL : "install what is missing (nvcc, libnccl-dev, libcudnn-dev, libopenmpi-dev, "
                           "libhwloc-dev) and reconfigure: meson setup --reconfigure build",
              "cdphybrid %s: cuda module %s, nccl %s, cudnn %s, mpi %s, hwloc %s", CDP_VERSION,
              CDP_HAVE_CUDA ? "built (" CDP_GPU_ARCH ")" : "not built", CDP_HAVE_NCCL ? "yes" : "no",
              CDP_HAVE_CUDNN ? "yes" : "no", CDP_HAVE_MPI ? "yes" : "no", CDP_HAVE_HWLOC ? "yes" : "no");
}

/* 13000 -> "13.0" */
static void cuda_version_str(int v, char *buf, size_t n)
{
    snprintf(buf, n, "%d.%d", v / 1000, (v % 1000) / 10);
}

static void check_cuda(struct doctor *d)
{
    /* versions straight from the runtime library, whatever the module says */
    char versions[256] = "libcudart.so.13 not found";
    int runtime = 0, driver = 0, have_rt = 0;
    void *rt = open_lib("libcudart.so.13");
    if (rt) {
        int (*rt_version)(int *) = (int (*)(int *))dlsym(rt, "cudaRuntimeGetVersion");
        int (*drv_version)(int *) = (int (*)(int *))dlsym(rt, "cudaDriverGetVersion");
        if (rt_version && !rt_version(&runtime)) have_rt = 1;
        if (drv_version && drv_version(&driver)) driver = 0;
        char r[32], dv[32];
        cuda_version_str(runtime, r, sizeof r);
        cuda_version_str(driver, dv, sizeof dv);
        snprintf(versions, sizeof versions, "runtime %s, driver %s", have_rt ? r : "unknown",
                 driver ? dv : "none");
    }

    int n = 0;
    cdp_status st = cdp_device_count(CDP_BACKEND_CUDA, &n);
    d->gpus = st ? 0 : n;
    if (st) snprintf(d->no_gpu_why, sizeof d->no_gpu_why, "%s", cdp_last_error());

    if (!CDP_HAVE_CUDA) {
        add_check(d, "cuda", DOC_WARN, "install the CUDA toolkit (nvcc) and reconfigure with -Dcuda=enabled",
                  "cuda module not built; %s", versions);
    } else if (!rt) {
        add_check(d, "cuda", DOC_FAIL, "install the CUDA 13 runtime (libcudart.so.13) or add its folder to "
                  "LD_LIBRARY_PATH", "libcudart.so.13 not found: %s", dlerror());
    } else if (!driver) {
        add_check(d, "cuda", DOC_WARN, "install the NVIDIA driver (nvidia-smi should list the GPUs); the "
                  "cpu backend works without it", "%s: %s", versions,
                  st ? d->no_gpu_why : "no CUDA driver");
    } else if (driver < runtime) {
        add_check(d, "cuda", DOC_FAIL, "update the NVIDIA driver to one that supports the CUDA runtime",
                  "%s: the driver is older than the runtime%s%s", versions, st ? "; " : "",
                  st ? d->no_gpu_why : "");
    } else if (st) {
        add_check(d, "cuda", DOC_WARN, "check nvidia-smi, CUDA_VISIBLE_DEVICES and the cdphybrid-cuda module "
                  "(CDP_MODULE_DIR)", "%s (match); %s", versions, d->no_gpu_why);
    } else {
        add_check(d, "cuda", DOC_OK, NULL, "%s (driver supports the runtime)", versions);
    }
}

static void check_cublas(struct doctor *d)
{
    if (open_lib("libcublas.so.13"))
        add_check(d, "cublas", DOC_OK, NULL, "libcublas.so.13 found");
    else
        add_check(d, "cublas", DOC_WARN, "install libcublas 13 (CUDA toolkit) or add its folder to LD_LIBRARY_PATH",
                  "libcublas.so.13 not found");
}

static void check_cudnn(struct doctor *d)
{
    void *h = open_lib("libcudnn.so.9");
    size_t (*version)(void) = h ? (size_t (*)(void))dlsym(h, "cudnnGetVersion") : NULL;
    if (!version) {
        add_check(d, "cudnn", DOC_WARN, "install cuDNN 9 (libcudnn9) or add its folder to LD_LIBRARY_PATH",
                  "libcudnn.so.9 not found");
        return;
    }
    size_t v = version();
    add_check(d, "cudnn", DOC_OK, NULL, "libcudnn.so.9: cuDNN %zu.%zu.%zu", v / 10000, (v % 10000) / 100, v % 100);
}

static void check_nccl(struct doctor *d)
{
    /* the NCCL the nccl communicator would run: the one the CUDA module links */
    char module[DOC_TEXT / 2];
    int mv = 0;
    if (!CDP_HAVE_CUDA)
        snprintf(module, sizeof module, "no cuda module in this build");
    else if (cdp_nccl_version(&mv) == CDP_OK)
        snprintf(module, sizeof module, "the cuda module runs NCCL %d.%d.%d", mv / 10000, (mv % 10000) / 100,
                 mv % 100);
    else
        snprintf(module, sizeof module, "%s", cdp_last_error());
    void *h = open_lib("libnccl.so.2");
    int (*version)(int *) = h ? (int (*)(int *))dlsym(h, "ncclGetVersion") : NULL;
    int v = 0;
    if (!version || version(&v)) {
        add_check(d, "nccl", DOC_WARN, "install NCCL 2 (libnccl2) or add its folder to LD_LIBRARY_PATH",
                  "libnccl.so.2 not found; %s", module);
        return;
    }
    /* NCCL >= 2.9 encodes major*10000 + minor*100 + patch */
    add_check(d, "nccl", DOC_OK, NULL, "libnccl.so.2: NCCL %d.%d.%d; %s", v / 10000, (v % 10000) / 100, v % 100,
              module);
}

static void check_gpus(struct doctor *d)
{
    if (!d->gpus) {
        add_check(d, "gpus", DOC_WARN, "plans with \"backend\": \"cuda\" need a GPU; use the cpu backend here",
                  "0 usable GPUs: %s", d->no_gpu_why[0] ? d->no_gpu_why : "no CUDA device");
        return;
    }
    char list[DOC_TEXT] = "";
    size_t used = 0;
    for (int i = 0; i < d->gpus && used < sizeof list; i++) {
        cdp_device_t dev = NULL;
        const char *desc = "cannot open";
        if (!cdp_device_open(CDP_BACKEND_CUDA, i, 0, &dev)) desc = cdp_device_description(dev);
        int w = snprintf(list + used, sizeof list - used, "%s%d: %s", i ? "; " : "", i, desc);
        cdp_device_close(dev);
        if (w < 0) break;
        used += (size_t)w;
    }
    add_check(d, "gpus", DOC_OK, NULL, "%d usable GPU%s: %s", d->gpus, d->gpus == 1 ? "" : "s", list);
}

/* NVML's types, as the library's ABI has them. */
typedef struct nvml_device *nvml_device_t;
#define NVML_MAX_LINKS 18

static void check_nvml(struct doctor *d)
{
    void *h = open_lib("libnvidia-ml.so.1");
    if (!h) {
        add_check(d, "nvml", DOC_WARN, "install the NVIDIA driver (it ships libnvidia-ml.so.1); without NVML "
                  "topology discovery cannot see NVLinks", "libnvidia-ml.so.1 not found; NVLink status unknown");
        return;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
    int (*handle)(unsigned, nvml_device_t *) = (int (*)(unsigned, nvml_device_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*link_state)(nvml_device_t, unsigned, int *) =
        (int (*)(nvml_device_t, unsigned, int *))dlsym(h, "nvmlDeviceGetNvLinkState");
    const char *(*err_str)(int) = (const char *(*)(int))dlsym(h, "nvmlErrorString");
    int (*shutdown)(void) = (int (*)(void))dlsym(h, "nvmlShutdown");
    int r;
    if (!init || !count || !handle || !link_state || !shutdown) {
        add_check(d, "nvml", DOC_WARN, "update the NVIDIA driver", "libnvidia-ml.so.1 found but lacks the "
                  "functions cdphybrid uses");
        return;
    }
    if ((r = init())) {
        add_check(d, "nvml", DOC_WARN, "check that the NVIDIA driver is loaded (nvidia-smi)",
                  "libnvidia-ml.so.1 found; nvmlInit: %s", err_str ? err_str(r) : "error");
        return;
    }
    unsigned n = 0;
    if (count(&n)) n = 0;
    int active = 0;
    for (unsigned i = 0; i < n; i++) {
        nvml_device_t dev = NULL;
        if (handle(i, &dev)) continue;
        for (unsigned l = 0; l < NVML_MAX_LINKS; l++) {
            int on = 0;
            if (!link_state(dev, l, &on) && on) active++;
        }
    }
    shutdown();
    add_check(d, "nvml", DOC_OK, NULL, "libnvidia-ml.so.1: %u GPU%s, %d active NVLink%s%s", n, n == 1 ? "" : "s",
              active, active == 1 ? "" : "s", active ? "" : " (GPUs talk over PCIe)");
}

static void check_hwloc(struct doctor *d)
{
#if CDP_HAVE_HWLOC
    unsigned v = hwloc_get_api_version();
    add_check(d, "hwloc", DOC_OK, NULL, "hwloc API %u.%u.%u (built against %u.%u.%u)", v >> 16, (v >> 8) & 0xff,
              v & 0xff, HWLOC_API_VERSION >> 16, (HWLOC_API_VERSION >> 8) & 0xff, HWLOC_API_VERSION & 0xff);
#else
    add_check(d, "hwloc", DOC_WARN, "install libhwloc-dev and reconfigure with -Dhwloc=enabled",
              "not built with hwloc: topology discovery sees no PCIe tree or NUMA nodes");
#endif
}

/* Runs `mpirun --version` with a deadline; the first line of its output in line.
 * Returns 0 when it ran and exited 0, else -1 with why in line. */
static int run_mpirun(char *line, size_t n)
{
    int fd[2];
    if (pipe(fd)) {
        snprintf(line, n, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(line, n, "fork: %s", strerror(errno));
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        execlp("mpirun", "mpirun", "--version", (char *)NULL);
        dprintf(2, "cannot start mpirun: %s\n", strerror(errno));
        _exit(127);
    }
    close(fd[1]);
    char buf[4096];
    size_t got = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int timed_out = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        double left = MPIRUN_TIMEOUT_S - ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p = {.fd = fd[0], .events = POLLIN};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        ssize_t k = read(fd[0], buf + got, sizeof buf - 1 - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
        if (got == sizeof buf - 1) break;
    }
    close(fd[0]);
    if (timed_out) kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    buf[got] = '\0';
    char *nl = strchr(buf, '\n');
    if (nl) *nl = '\0';
    if (timed_out) {
        snprintf(line, n, "mpirun --version did not finish within %d s", MPIRUN_TIMEOUT_S);
        return -1;
    }
    snprintf(line, n, "%.300s", buf);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    if (!buf[0]) snprintf(line, n, "mpirun --version failed");
    return -1;
}

static void check_mpi(struct doctor *d)
{
    char line[DOC_TEXT];
    d->have_mpirun = run_mpirun(line, sizeof line) == 0;
    if (!d->have_mpirun)
        add_check(d, "mpi", cdp_comm_have_mpi() ? DOC_FAIL : DOC_WARN,
                  "install openmpi-bin (mpirun) and put it on PATH; plans with several ranks need it",
                  "mpirun does not run here: %s", line);
    else if (!cdp_comm_have_mpi())
        add_check(d, "mpi", DOC_WARN, "install libopenmpi-dev and reconfigure with -Dmpi=enabled",
                  "%s; but this build has no MPI communicator", line);
    else
        add_check(d, "mpi", DOC_OK, NULL, "%s", line);
}

static void check_openblas(struct doctor *d)
{
    int t = openblas_get_num_threads();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 1 && t == 1 && !getenv("OPENBLAS_NUM_THREADS") && !getenv("OMP_NUM_THREADS"))
        add_check(d, "openblas", DOC_WARN, "unset OPENBLAS_NUM_THREADS, or set it to the cores per rank",
                  "%s: 1 thread on %ld cores", openblas_get_config(), cores);
    else
        add_check(d, "openblas", DOC_OK, NULL, "%s: %d thread%s on %ld core%s", openblas_get_config(), t,
                  t == 1 ? "" : "s", cores, cores == 1 ? "" : "s");
}

/* Loads and resolves the plan (default: a GPT on whatever is here) and says
 * whether it can run. Returns 0/1 for can run / cannot, 2 for a bad plan. */
static int check_plan(struct doctor *d, const char *path)
{
    struct cdp_plan *plan = NULL;
    cdp_status st = path ? cdp_plan_load(path, &plan)
                         : cdp_plan_load_string("{\"model\": {\"preset\": \"gpt\"}}", "(default plan)", NULL, &plan);
    if (st) {
        fprintf(stderr, "cdphybrid doctor: %s\n", cdp_last_error());
        return EXIT_USAGE;
    }
    const char *src = plan->source;
    const int asked_cuda = !plan->cluster.backend_auto && plan->cluster.backend == CDP_BACKEND_CUDA;
    struct cdp_machine_info m = {.gpus = d->gpus, .no_gpu_why = d->no_gpu_why[0] ? d->no_gpu_why : NULL};
    st = cdp_plan_resolve(plan, &m);
    if (st && asked_cuda && !d->gpus) {
        add_check(d, "plan", DOC_FAIL, "run it where a GPU is visible, or set \"cluster\": {\"backend\": \"cpu\"}",
                  "%s: backend cuda cannot run here: %s", src, cdp_last_error());
        cdp_plan_free(plan);
        return EXIT_RUN_FAILED;
    }
    if (st) {
        int code = st == CDP_ERR_INVALID || st == CDP_ERR_UNSUPPORTED ? EXIT_USAGE : EXIT_RUN_FAILED;
        add_check(d, "plan", DOC_FAIL, "fix the plan (cdphybrid --plan FILE --dry-run says more)", "%s",
                  cdp_last_error());
        cdp_plan_free(plan);
        return code;
    }
    const char *backend = cdp_backend_name(plan->cluster.backend);
    /* the layout the planner would run, for its number of ranks */
    struct cdp_topology *topo = NULL;
    struct cdp_planner_result pr = {0};
    char note[512];
    int ranks = 0;
    if ((st = cdp_planner_topology(plan, d->gpus, &topo, note, sizeof note)) || (st = cdp_planner_run(plan, topo, NULL, 0, &pr))) {
        add_check(d, "plan", DOC_FAIL, "fix the plan (cdphybrid --plan FILE --dry-run says more)", "%s: %s", src,
                  cdp_last_error());
        cdp_topology_free(topo);
        cdp_plan_free(plan);
        return st == CDP_ERR_INVALID || st == CDP_ERR_UNSUPPORTED ? EXIT_USAGE : EXIT_RUN_FAILED;
    }
    ranks = pr.layout->n_ranks;
    cdp_planner_result_clear(&pr);
    cdp_topology_free(topo);
    int code = 0;
    if (plan->cluster.backend == CDP_BACKEND_CUDA && !d->gpus) {
        add_check(d, "plan", DOC_FAIL, "run it where a GPU is visible, or set \"cluster\": {\"backend\": \"cpu\"}",
                  "%s: backend cuda cannot run here: %s", src, d->no_gpu_why[0] ? d->no_gpu_why : "no usable GPU");
        code = EXIT_RUN_FAILED;
    } else if (ranks > 1 && !cdp_comm_have_mpi()) {
        add_check(d, "plan", DOC_FAIL, "reconfigure with -Dmpi=enabled after installing libopenmpi-dev",
                  "%s: backend %s, %d ranks, but this build has no MPI", src, backend, ranks);
        code = EXIT_RUN_FAILED;
    } else if (ranks > 1 && !d->have_mpirun) {
        add_check(d, "plan", DOC_FAIL, "install openmpi-bin and put mpirun on PATH, or use stages = replicas = 1",
                  "%s: backend %s, %d ranks, but mpirun does not run here", src, backend, ranks);
        code = EXIT_RUN_FAILED;
    } else {
        add_check(d, "plan", DOC_OK, NULL, "%s: backend %s, %d rank%s: can run here", src, backend, ranks,
                  ranks == 1 ? "" : "s");
    }
    cdp_plan_free(plan);
    return code;
}

static int print_json(const struct doctor *d, int can_run)
{
    json_t *root = json_object(), *arr = json_array();
    if (!root || !arr) goto nomem;
    json_object_set_new(root, "checks", arr);
    for (int i = 0; i < d->n; i++) {
        const struct doctor_check *c = &d->checks[i];
        json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "name", c->name, "status", status_names[c->status],
                              "detail", c->detail, "fix", c->fix);
        if (!o || json_array_append_new(arr, o)) goto nomem;
    }
    json_object_set_new(root, "can_run", json_boolean(can_run));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) goto nomem_text;
    puts(text);
    free(text);
    return 0;
nomem:
    json_decref(root);
    if (!root) json_decref(arr);
nomem_text:
    fprintf(stderr, "cdphybrid doctor: out of memory writing JSON\n");
    return -1;
}

static void print_text(const struct doctor *d)
{
    for (int i = 0; i < d->n; i++) {
        const struct doctor_check *c = &d->checks[i];
        printf("%-4s  %-9s %s\n", status_names[c->status], c->name, c->detail);
        if (c->fix[0] && c->status != DOC_OK) printf("      %-9s fix: %s\n", "", c->fix);
    }
}

int cdp_cli_doctor(int argc, char **argv)
{
    const char *plan = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            doctor_usage(stdout);
            return 0;
        } else if (!strcmp(s, "--plan")) {
            if (i + 1 >= argc || !*argv[i + 1]) return cdp_cli_usage_error("doctor", "%s needs a file name", s);
            plan = argv[++i];
        } else if (!strncmp(s, "--plan=", 7)) {
            plan = s + 7;
            if (!*plan) return cdp_cli_usage_error("doctor", "%s needs a file name", "--plan");
        } else if (!strcmp(s, "--json")) {
            json = 1;
        } else if (s[0] == '-') {
            static const char *const known[] = {"--plan", "--json", "--help", NULL};
            return cdp_cli_unknown_option("doctor", s, known);
        } else {
            return cdp_cli_usage_error("doctor", "unexpected argument \"%s\"", s);
        }
    }

    struct doctor *d = calloc(1, sizeof *d);
    if (!d) {
        fprintf(stderr, "cdphybrid doctor: out of memory\n");
        return EXIT_RUN_FAILED;
    }
    check_build(d);
    check_cuda(d);
    check_cublas(d);
    check_cudnn(d);
    check_nccl(d);
    check_gpus(d);
    check_nvml(d);
    check_hwloc(d);
    check_mpi(d);
    check_openblas(d);
    const int before = d->n;
    int code = check_plan(d, plan);
    /* a plan that does not load is reported alone, on stderr */
    if (d->n > before) {
        if (json) {
            if (print_json(d, code == 0)) code = EXIT_RUN_FAILED;
        } else {
            print_text(d);
            printf("%s\n", code == 0 ? "can run: yes" : "can run: no");
        }
    }
    free(d);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "cdphybrid doctor: cannot write to standard output\n");
        return EXIT_RUN_FAILED;
    }
    return code;
}
