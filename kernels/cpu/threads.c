/* The BLAS thread pool of the CPU kernels (ops.h: cdp_cpu_set_threads). */
#include <cblas.h>
#include <stdlib.h>

#include "kernels/cpu/ops.h"

int cdp_cpu_threads(void) { return openblas_get_num_threads(); }

int cdp_cpu_set_threads(int n)
{
    const char *a = getenv("OPENBLAS_NUM_THREADS"), *b = getenv("OMP_NUM_THREADS");
    if (n >= 1 && !(a && *a) && !(b && *b)) openblas_set_num_threads(n);
    return openblas_get_num_threads();
}
