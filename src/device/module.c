/* Loads device backends built as modules (libcdphybrid-<name>.so) at run time,
 * so the core and every CPU-only program stay free of the CUDA libraries.
 * Search order: $CDP_MODULE_DIR, the folder of the running program, then the
 * installed module folder. A module is loaded once and never unloaded (CUDA's
 * runtime registers exit handlers inside it). */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdp/log.h"
#include "cdp_config.h"
#include "device/backend.h"
#include "kernels/ops.h"

static void host_log(int level, int subsys, const char *fmt, ...)
{
    if (!cdp_log_enabled((enum cdp_log_level)level, (enum cdp_log_subsys)subsys)) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cdp_log_write((enum cdp_log_level)level, (enum cdp_log_subsys)subsys, "%s", msg);
}

static const struct cdp_module_host cdp_host = {
    .abi = CDP_DEVICE_ABI,
    .fail = cdp_fail,
    .log = host_log,
};

struct module_slot {
    char name[16];
    int tried;
    cdp_status status;
    char error[1024];
    const struct cdp_device_backend *backend;
    void *handle; /* dlopen's, for cdp_device_module_symbol */
};

static struct module_slot cdp_modules[4];
static pthread_mutex_t cdp_modules_lock = PTHREAD_MUTEX_INITIALIZER;

static int exe_dir(char *buf, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0) return -1;
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash) return -1;
    *slash = '\0';
    return 0;
}

static cdp_status try_load(const char *name, const struct cdp_device_backend **out, void **handle)
{
    char dirs[3][PATH_MAX];
    int ndirs = 0;
    const char *env = getenv("CDP_MODULE_DIR");
    if (env && *env) snprintf(dirs[ndirs++], PATH_MAX, "%s", env);
    if (exe_dir(dirs[ndirs], PATH_MAX) == 0) ndirs++;
    snprintf(dirs[ndirs++], PATH_MAX, "%s", CDP_MODULE_DIR);

    char tried[2048] = "";
    size_t used = 0;
    for (int i = 0; i < ndirs; i++) {
        const char *dir = dirs[i];
        char path[PATH_MAX + 64];
        if (snprintf(path, sizeof path, "%s/libcdphybrid-%s.so", dir, name) >= (int)sizeof path)
            continue;
        if (access(path, R_OK) != 0) {
            used += (size_t)snprintf(tried + used, used < sizeof tried ? sizeof tried - used : 0,
                                     "%s%s", used ? ", " : "", path);
            continue;
        }
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) return cdp_fail(CDP_ERR_UNSUPPORTED, "%s backend: cannot load %s: %s", name, path, dlerror());
        cdp_device_module_init_fn init = (cdp_device_module_init_fn)(uintptr_t)dlsym(h, CDP_DEVICE_MODULE_ENTRY);
        if (!init)
            return cdp_fail(CDP_ERR_UNSUPPORTED, "%s backend: %s has no %s", name, path,
                            CDP_DEVICE_MODULE_ENTRY);
        const struct cdp_device_backend *be = NULL;
        cdp_status st = init(&cdp_host, &be);
        if (st) return cdp_error_context(st, "%s backend (%s)", name, path);
        if (!be || be->abi != CDP_DEVICE_ABI)
            return cdp_fail(CDP_ERR_UNSUPPORTED, "%s backend: %s was built for another version "
                            "of cdphybrid (device ABI %d, expected %d)", name, path,
                            be ? be->abi : -1, CDP_DEVICE_ABI);
        if (be->ops && be->ops->abi != CDP_OPS_ABI)
            return cdp_fail(CDP_ERR_UNSUPPORTED, "%s backend: %s was built for another version "
                            "of cdphybrid (kernel table ABI %d, expected %d)", name, path, be->ops->abi,
                            CDP_OPS_ABI);
        CDP_INFO(DEVICE, "loaded the %s backend from %s", name, path);
        *out = be;
        *handle = h;
        return CDP_OK;
    }
    return cdp_fail(CDP_ERR_UNSUPPORTED, "%s backend: not built into this installation (looked for %s)",
                    name, tried);
}

/* The module's slot, loaded on first use; the lock is held. */
static cdp_status load_locked(const char *name, struct module_slot **out)
{
    struct module_slot *slot = NULL;
    for (size_t i = 0; i < sizeof cdp_modules / sizeof cdp_modules[0]; i++) {
        if (cdp_modules[i].tried && strcmp(cdp_modules[i].name, name) == 0) {
            slot = &cdp_modules[i];
            break;
        }
        if (!cdp_modules[i].tried && !slot) slot = &cdp_modules[i];
    }
    if (!slot) return cdp_fail(CDP_ERR_INTERNAL, "too many device modules");
    if (!slot->tried) {
        snprintf(slot->name, sizeof slot->name, "%s", name);
        slot->status = try_load(name, &slot->backend, &slot->handle);
        snprintf(slot->error, sizeof slot->error, "%s", slot->status ? cdp_last_error() : "");
        slot->tried = 1;
    }
    if (slot->status) return cdp_fail(slot->status, "%s", slot->error);
    *out = slot;
    return CDP_OK;
}

cdp_status cdp_device_module_load(const char *name, const struct cdp_device_backend **out)
{
    pthread_mutex_lock(&cdp_modules_lock);
    struct module_slot *slot = NULL;
    cdp_status st = load_locked(name, &slot);
    if (!st) *out = slot->backend;
    pthread_mutex_unlock(&cdp_modules_lock);
    return st;
}

cdp_status cdp_device_module_symbol(const char *name, const char *symbol, const void **out)
{
    pthread_mutex_lock(&cdp_modules_lock);
    struct module_slot *slot = NULL;
    cdp_status st = load_locked(name, &slot);
    if (!st) *out = dlsym(slot->handle, symbol);
    pthread_mutex_unlock(&cdp_modules_lock);
    return st;
}
