/* The CUDA backend's entry points (backend.h) in the engine: they load
 * libchorus_engine_cuda.so on first use and call its table (backend_cuda.h says why it is a
 * module). The module is looked for at $CHORUS_CUDA_MODULE, next to the running program
 * (the build tree's bin/, a bundle's bin/), then in ../lib beside it (an installed prefix);
 * no path of the build that made this engine is kept in the binary. A machine without the
 * module or CUDA's libraries has no CUDA backend: the calls fail with CH_E_CUDA, the loader's
 * reason logged. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "workerd/engine/backend_cuda.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const eng_cuda_module_t *module; /* set once by load(), never changed after */

static void *try_open(const char *dir, const char *sub, char *why, size_t whylen)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s%s%s", dir, sub, ENG_CUDA_MODULE_FILE);
    if (n < 0 || (size_t)n >= sizeof path) {
        return NULL;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL && access(path, F_OK) == 0) {
        snprintf(why, whylen, "%s", dlerror()); /* there, but not loadable: the reason */
    }
    return h;
}

static void load(void)
{
    char why[512] = "not found", exe[PATH_MAX], dir[PATH_MAX + 1] = "";
    const char *env = getenv("CHORUS_CUDA_MODULE");
    void *h = NULL;
    if (env != NULL && *env) {
        h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (h == NULL) {
            snprintf(why, sizeof why, "%s", dlerror());
        }
    }
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (h == NULL && n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL) {
            slash[1] = '\0';
            snprintf(dir, sizeof dir, "%s", exe);
            h = try_open(dir, "", why, sizeof why);
            if (h == NULL) {
                h = try_open(dir, "../lib/", why, sizeof why);
            }
        }
    }
    const eng_cuda_module_t *m = h != NULL ? dlsym(h, ENG_CUDA_MODULE_SYMBOL) : NULL;
    if (h != NULL && (m == NULL || m->abi != ENG_CUDA_MODULE_ABI)) {
        snprintf(why, sizeof why, "%s: no %s of ABI %d", ENG_CUDA_MODULE_FILE,
                 ENG_CUDA_MODULE_SYMBOL, ENG_CUDA_MODULE_ABI);
        m = NULL;
    }
    if (m == NULL) {
        CH_LOGE("cuda", "no CUDA backend: %s (%s)", ENG_CUDA_MODULE_FILE, why);
        return; /* the handle stays open: nothing else uses it */
    }
    module = m;
}

static const eng_cuda_module_t *get(void)
{
    pthread_once(&once, load);
    return module;
}

static void log_line(const char *msg)
{
    CH_LOGE("cuda", "%s", msg);
}

int eng_backend_cuda_devices(int *count)
{
    *count = 0;
    const eng_cuda_module_t *m = get();
    return m != NULL ? m->devices(count) : CH_E_CUDA;
}

int eng_backend_cuda_create(int device, eng_backend_t **out)
{
    *out = NULL;
    const eng_cuda_module_t *m = get();
    return m != NULL ? m->create(device, log_line, out) : CH_E_CUDA;
}

/* The functions below take a backend that create made: the module is loaded. */
void eng_backend_cuda_destroy(eng_backend_t *be)
{
    if (be != NULL) {
        module->destroy(be);
    }
}

void eng_backend_cuda_set_tf32(eng_backend_t *be, int on)
{
    module->set_tf32(be, on);
}

void eng_backend_cuda_set_bf16(eng_backend_t *be, int on)
{
    module->set_bf16(be, on);
}

void *eng_backend_cuda_stream(const eng_backend_t *be)
{
    return module->stream(be);
}

int eng_backend_cuda_sync(const eng_backend_t *be)
{
    return module->sync(be);
}

int eng_backend_cuda_reserve(eng_backend_t *be, int B, int T, int C, int NH)
{
    return module->reserve(be, B, T, C, NH);
}
