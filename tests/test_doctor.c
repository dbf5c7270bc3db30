/* Suite doctor: `cdphybrid doctor` through the real binary, on this machine (no
 * GPU, no NVML, mpirun on PATH): each check's message where this machine
 * produces it, the plan verdict and its exit code, and the JSON form. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cdp_config.h"
#include "harness.h"

static struct cdp_run doctor(const char *const *argv)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, argv), 0, "could not start the binary");
    return r;
}

/* The line of report text that starts with status and check name, or NULL. */
static const char *check_line(const char *out, const char *status, const char *name)
{
    char head[64];
    snprintf(head, sizeof head, "%-4s  %-9s ", status, name);
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, head, strlen(head))) return p;
    return NULL;
}

Test(doctor, default_plan_runs_on_cpu_here)
{
    struct cdp_run r = doctor((const char *const[]){"doctor", NULL});
    cr_assert_eq(r.exit_code, 0, "exit %d\n%s%s", r.exit_code, r.out, r.err);
    cr_assert_not_null(check_line(r.out, "OK", "plan"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "(default plan): backend cpu, 1 rank: can run here"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "can run: yes"), "%s", r.out);
    cdp_test_run_free(&r);
}

Test(doctor, no_gpu_here_cuda_check_says_why_with_the_cuda_error)
{
    struct cdp_run r = doctor((const char *const[]){"doctor", NULL});
    const char *cuda = check_line(r.out, "WARN", "cuda");
    cr_assert_not_null(cuda, "%s", r.out);
    /* the CUDA error string that cdp_device_count reports */
    cr_assert_not_null(strstr(cuda, "cudaGetDeviceCount: "), "%s", cuda);
    cr_assert_not_null(strstr(cuda, "(cudaError"), "%s", cuda);
    cr_assert_not_null(strstr(cuda, "runtime 13."), "%s", cuda);
    const char *gpus = check_line(r.out, "WARN", "gpus");
    cr_assert_not_null(gpus, "%s", r.out);
    cr_assert_eq(strncmp(gpus + 16, "0 usable GPUs: ", 15), 0, "%s", gpus);
    cr_assert_not_null(strstr(r.out, "fix: install the NVIDIA driver"), "%s", r.out);
    cdp_test_run_free(&r);
}

Test(doctor, no_nvml_here_says_nvlink_unknown)
{
    struct cdp_run r = doctor((const char *const[]){"doctor", NULL});
    const char *l = check_line(r.out, "WARN", "nvml");
    cr_assert_not_null(l, "%s", r.out);
    cr_assert_not_null(strstr(l, "libnvidia-ml.so.1 not found; NVLink status unknown"), "%s", l);
    cdp_test_run_free(&r);
}

Test(doctor, libraries_and_tools_found_here)
{
    struct cdp_run r = doctor((const char *const[]){"doctor", NULL});
    if (CDP_HAVE_CUDA) {
        cr_assert_not_null(check_line(r.out, "OK", "cublas"), "%s", r.out);
        cr_assert_not_null(strstr(r.out, "libcudnn.so.9: cuDNN 9."), "%s", r.out);
        cr_assert_not_null(strstr(r.out, "libnccl.so.2: NCCL 2."), "%s", r.out);
        /* the version the nccl communicator runs, through the module's table (no GPU needed) */
        if (CDP_HAVE_NCCL) cr_assert_not_null(strstr(r.out, "; the cuda module runs NCCL 2."), "%s", r.out);
        else cr_assert_not_null(strstr(r.out, "built without NCCL"), "%s", r.out);
    }
    if (CDP_HAVE_HWLOC) cr_assert_not_null(strstr(r.out, "OK    hwloc     hwloc API 2."), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "OK    mpi       mpirun (Open MPI)"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "OK    openblas  OpenBLAS "), "%s", r.out);
    cdp_test_run_free(&r);
}

Test(doctor, json_has_every_check)
{
    struct cdp_run r = doctor((const char *const[]){"doctor", "--json", NULL});
    cr_assert_eq(r.exit_code, 0, "%s%s", r.out, r.err);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    cr_assert_not_null(j, "not JSON: %s\n%s", e.text, r.out);
    cr_assert(json_is_true(json_object_get(j, "can_run")));
    json_t *checks = json_object_get(j, "checks");
    static const char *const names[] = {"build", "cuda", "cublas", "cudnn", "nccl", "gpus",
                                        "nvml", "hwloc", "mpi", "openblas", "plan"};
    size_t n = sizeof names / sizeof names[0];
    cr_assert_eq(json_array_size(checks), n, "%s", r.out);
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_array_get(checks, i);
        cr_assert_str_eq(json_string_value(json_object_get(c, "name")), names[i]);
        const char *st = json_string_value(json_object_get(c, "status"));
        cr_assert(st && (!strcmp(st, "OK") || !strcmp(st, "WARN") || !strcmp(st, "FAIL")), "%s", names[i]);
        cr_assert(json_is_string(json_object_get(c, "detail")));
        const char *fix = json_string_value(json_object_get(c, "fix"));
        cr_assert(fix && (!strcmp(st, "OK") || *fix), "%s: a %s without a fix", names[i], st);
    }
    json_decref(j);
    cdp_test_run_free(&r);
}

Test(doctor, cuda_plan_cannot_run_without_gpu)
{
    const char *plan = cdp_test_write_file(cdp_test_tmpdir(), "cuda.json",
                                           "{\"model\": {\"preset\": \"gpt\"}, \"cluster\": {\"backend\": \"cuda\"}}");
    struct cdp_run r = doctor((const char *const[]){"doctor", "--plan", plan, NULL});
    cr_assert_eq(r.exit_code, 1, "exit %d\n%s%s", r.exit_code, r.out, r.err);
    const char *l = check_line(r.out, "FAIL", "plan");
    cr_assert_not_null(l, "%s", r.out);
    cr_assert_not_null(strstr(l, "backend cuda cannot run here"), "%s", l);
    cr_assert_not_null(strstr(l, "(cudaError"), "%s", l);
    cr_assert_not_null(strstr(r.out, "fix: run it where a GPU is visible"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "can run: no"), "%s", r.out);
    cdp_test_run_free(&r);

    r = doctor((const char *const[]){"doctor", "--json", "--plan", plan, NULL});
    cr_assert_eq(r.exit_code, 1);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, "%s", r.out);
    cr_assert(json_is_false(json_object_get(j, "can_run")));
    json_decref(j);
    cdp_test_run_free(&r);
}

Test(doctor, multi_rank_plan_runs_with_mpirun)
{
    const char *plan = cdp_test_write_file(cdp_test_tmpdir(), "two.json",
                                           "{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 2}}");
    struct cdp_run r = doctor((const char *const[]){"doctor", "--plan", plan, NULL});
    cr_assert_eq(r.exit_code, CDP_HAVE_MPI ? 0 : 1, "exit %d\n%s%s", r.exit_code, r.out, r.err);
    cdp_test_run_free(&r);
}

Test(doctor, multi_rank_plan_without_mpirun_fails)
{
    const char *plan = cdp_test_write_file(cdp_test_tmpdir(), "two.json",
                                           "{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 2}}");
    /* the child inherits this PATH: mpirun cannot be found */
    setenv("PATH", "/nonexistent", 1);
    struct cdp_run r = doctor((const char *const[]){"doctor", "--plan", plan, NULL});
    cr_assert_eq(r.exit_code, 1, "exit %d\n%s%s", r.exit_code, r.out, r.err);
    const char *mpi = check_line(r.out, CDP_HAVE_MPI ? "FAIL" : "WARN", "mpi");
    cr_assert_not_null(mpi, "%s", r.out);
    cr_assert_not_null(strstr(mpi, "mpirun does not run here: cannot start mpirun: No such file or directory"), "%s", mpi);
    if (CDP_HAVE_MPI) {
        const char *l = check_line(r.out, "FAIL", "plan");
        cr_assert_not_null(l, "%s", r.out);
        cr_assert_not_null(strstr(l, "backend cpu, 2 ranks, but mpirun does not run here"), "%s", l);
        cr_assert_not_null(strstr(r.out, "fix: install openmpi-bin"), "%s", r.out);
    }
    cdp_test_run_free(&r);
}

Test(doctor, bad_plan_and_bad_usage_exit_2)
{
    const char *plan = cdp_test_write_file(cdp_test_tmpdir(), "bad.json", "{\"model\": {\"presett\": \"gpt\"}}");
    struct cdp_run r = doctor((const char *const[]){"doctor", "--plan", plan, NULL});
    cr_assert_eq(r.exit_code, 2, "exit %d\n%s%s", r.exit_code, r.out, r.err);
    cr_assert_not_null(strstr(r.err, "cdphybrid doctor: "), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "bad.json: /model"), "%s", r.err);
    cdp_test_run_free(&r);

    r = doctor((const char *const[]){"doctor", "--plna", "x", NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert_not_null(strstr(r.err, "did you mean --plan?"), "%s", r.err);
    cdp_test_run_free(&r);

    r = doctor((const char *const[]){"doctor", "--plan", NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert_not_null(strstr(r.err, "--plan needs a file name"), "%s", r.err);
    cdp_test_run_free(&r);
}

Test(doctor, help_and_main_usage)
{
    struct cdp_run r = doctor((const char *const[]){"doctor", "--help", NULL});
    cr_assert_eq(r.exit_code, 0);
    cr_assert_not_null(strstr(r.out, "usage: cdphybrid doctor [--plan FILE] [--json]"), "%s", r.out);
    cdp_test_run_free(&r);
    r = doctor((const char *const[]){"--help", NULL});
    cr_assert_not_null(strstr(r.out, "cdphybrid doctor [--plan FILE] [--json]"), "%s", r.out);
    cdp_test_run_free(&r);
}
