/* Sanitizer builds only (tests/meson.build preloads it into every process a
 * test starts): dlclose does nothing, so the shared objects Open MPI loads as
 * plugins (and unloads in MPI_Finalize) are still mapped when LeakSanitizer
 * reports at exit. Their leaks then name their module (".../openmpi3/mca_*.so"),
 * which tests/lsan.supp suppresses, and the sanitizers can keep their cheap
 * frame-pointer unwinding on every malloc instead of a full unwind (ten times
 * the run time of a multi-rank test) to reach an Open MPI frame. Nothing in
 * cdphybrid relies on a module being unmapped: the CUDA module is loaded once
 * per process. */
int dlclose(void *handle);

int dlclose(void *handle)
{
    (void)handle;
    return 0;
}
