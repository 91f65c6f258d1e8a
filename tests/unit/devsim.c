/* devsim (devsim.h): the CPU backend's kernels behind device pointers a host access faults on.
 *
 * Theory of operation: in poison mode alloc makes a memfd of the size rounded up to pages and
 * maps it twice, read/write (the host view) and PROT_NONE (the device view, whose address the
 * caller gets). The live allocations sit in an array sorted by device address; every entry
 * looks each pointer argument up by binary search (the last allocation starting at or below
 * it) and hands the CPU backend the same offset in the host view. A pointer in no allocation
 * is a host pointer where the contract wants backend memory: abort, naming entry and argument.
 * Plain mode hands out posix_memalign memory and translates nothing; both keep the registry
 * (so free checks its pointer) and the counters. */
#include "devsim.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/util.h"
#include "kernels/bf16.h"

typedef struct region {
    uintptr_t dev; /* the address alloc handed out */
    char *host;    /* the read/write view (the same memory as dev in plain mode) */
    size_t size;   /* bytes asked for */
    size_t map;    /* bytes mapped (poison mode) */
} region_t;

typedef struct devsim {
    eng_backend_t table; /* what devsim_create hands out; ud points back here */
    const eng_backend_t *cpu;
    int poison;
    pthread_mutex_t mu; /* the registry and the counters */
    region_t *r;        /* live allocations, sorted by dev */
    size_t n, cap;
    devsim_stats_t st;
    uint64_t timer_at[ENG_TIMER_KINDS];  /* host clock at the open interval's start */
    uint64_t timer_sum[ENG_TIMER_KINDS]; /* closed intervals since the last read, ns */
    /* bf16_weights: w16[0..wn) is w32[0..wn) in bf16 (backend memory); the matmuls read a
     * weight inside w32's range from w16, widened into wtmp (host), as CUDA's bf16 GEMMs do
     * (kernels/cuda.h's kn_cuda_set_weights16) */
    const float *w32;
    const kn_bf16_t *w16;
    size_t wn;
    float *wtmp;
    size_t wtmp_cap;
} devsim_t;

static devsim_t *ds(const eng_backend_t *be)
{
    return be->ud;
}

static _Noreturn void die(const char *entry, const char *arg, const void *p, const char *why)
{
    fprintf(stderr, "devsim: %s: %s = %p %s\n", entry, arg, p, why);
    fflush(stderr);
    abort();
}

// ----------------------------------------------------------------------------
// the registry (callers hold mu)

/* index of the first region whose dev is above p */
static size_t upper(const devsim_t *d, uintptr_t p)
{
    size_t lo = 0, hi = d->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->r[mid].dev <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* the live allocation holding p (its end included), or NULL */
static const region_t *lookup(const devsim_t *d, uintptr_t p)
{
    size_t i = upper(d, p);
    if (i == 0 || p > d->r[i - 1].dev + d->r[i - 1].size)
        return NULL;
    return &d->r[i - 1];
}

/* p's host view; bytes > 0: [p, p + bytes) must lie in p's allocation too. In plain mode p. */
static void *span(devsim_t *d, const void *p, size_t bytes, const char *entry, const char *arg)
{
    if (!d->poison)
        return (void *)p;
    uintptr_t u = (uintptr_t)p;
    pthread_mutex_lock(&d->mu);
    const region_t *r = lookup(d, u);
    char *host = r ? r->host + (u - r->dev) : NULL;
    int over = r && bytes > r->dev + r->size - u;
    pthread_mutex_unlock(&d->mu);
    if (r == NULL)
        die(entry, arg, p, "is not in any live allocation of this backend");
    if (over)
        die(entry, arg, p, "runs past the end of its allocation");
    return host;
}

/* a pointer argument that must be backend memory, and one the contract lets be NULL */
#define DEV(p) span(d, (p), 0, __func__, #p)
#define OPT(p) ((p) != NULL ? DEV(p) : NULL)

// ----------------------------------------------------------------------------
// memory

static int map_views(devsim_t *d, size_t bytes, region_t *r)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes > SIZE_MAX - page)
        return -ENOMEM;
    r->size = bytes;
    if (!d->poison) {
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0)
            return -ENOMEM;
        r->host = p;
        r->dev = (uintptr_t)p;
        return 0;
    }
    r->map = bytes ? (bytes + page - 1) / page * page : page;
    int rc = -ENOMEM;
    void *host = MAP_FAILED, *dev = MAP_FAILED;
    int fd = memfd_create("devsim", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)r->map) == 0)
        host = mmap(NULL, r->map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (host != MAP_FAILED)
        dev = mmap(NULL, r->map, PROT_NONE, MAP_SHARED, fd, 0);
    if (dev != MAP_FAILED) {
        r->host = host;
        r->dev = (uintptr_t)dev;
        rc = 0;
    } else if (host != MAP_FAILED) {
        munmap(host, r->map);
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

static void unmap_views(const devsim_t *d, const region_t *r)
{
    if (!d->poison) {
        free(r->host);
        return;
    }
    munmap(r->host, r->map);
    munmap((void *)r->dev, r->map);
}

static int sim_alloc(const eng_backend_t *be, size_t bytes, void **out)
{
    devsim_t *d = ds(be);
    region_t r = {0};
    *out = NULL;
    int rc = map_views(d, bytes, &r);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&d->mu);
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 64;
        region_t *grown = realloc(d->r, cap * sizeof *grown);
        if (grown != NULL) {
            d->r = grown;
            d->cap = cap;
        }
    }
    if (d->n < d->cap) {
        size_t i = upper(d, r.dev);
        memmove(&d->r[i + 1], &d->r[i], (d->n - i) * sizeof *d->r);
        d->r[i] = r;
        d->n++;
        d->st.allocs++;
        *out = (void *)r.dev;
    }
    pthread_mutex_unlock(&d->mu);
    if (*out == NULL) {
        unmap_views(d, &r);
        return -ENOMEM;
    }
    return 0;
}

static void sim_free(const eng_backend_t *be, void *p)
{
    devsim_t *d = ds(be);
    if (p == NULL)
        return;
    pthread_mutex_lock(&d->mu);
    size_t i = upper(d, (uintptr_t)p);
    int found = i > 0 && d->r[i - 1].dev == (uintptr_t)p;
    region_t r = {0};
    if (found) {
        r = d->r[i - 1];
        memmove(&d->r[i - 1], &d->r[i], (d->n - i) * sizeof *d->r);
        d->n--;
    }
    pthread_mutex_unlock(&d->mu);
    if (!found)
        die(__func__, "p", p, "was never handed out by alloc (or is freed already)");
    unmap_views(d, &r);
}

static int sim_copy(const eng_backend_t *be, void *dst, const void *src, size_t bytes,
                    eng_copy_dir_t dir)
{
    devsim_t *d = ds(be);
    if (dir != ENG_COPY_H2D && dir != ENG_COPY_D2H && dir != ENG_COPY_D2D)
        return -EINVAL;
    pthread_mutex_lock(&d->mu);
    d->st.h2d += dir == ENG_COPY_H2D;
    d->st.d2h += dir == ENG_COPY_D2H;
    d->st.d2d += dir == ENG_COPY_D2D;
    d->st.h2d_bytes += dir == ENG_COPY_H2D ? bytes : 0;
    d->st.d2h_bytes += dir == ENG_COPY_D2H ? bytes : 0;
    pthread_mutex_unlock(&d->mu);
    if (bytes == 0)
        return 0;
    void *hd = dir == ENG_COPY_D2H ? dst : span(d, dst, bytes, __func__, "dst");
    const void *hs = dir == ENG_COPY_H2D ? src : span(d, src, bytes, __func__, "src");
    return d->cpu->copy(d->cpu, hd, hs, bytes, dir);
}

static int sim_memset(const eng_backend_t *be, void *p, int value, size_t bytes)
{
    devsim_t *d = ds(be);
    if (bytes == 0)
        return 0;
    return d->cpu->memset(d->cpu, span(d, p, bytes, __func__, "p"), value, bytes);
}

static int sim_sync(const eng_backend_t *be)
{
    devsim_t *d = ds(be);
    pthread_mutex_lock(&d->mu);
    d->st.syncs++;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* Timers on host clocks: devsim's kernels are done when their call returns, so the host's
 * time between two marks is the device's (what CUDA's events measure). */
static void sim_timer_mark(const eng_backend_t *be, int kind, int begin)
{
    devsim_t *d = ds(be);
    uint64_t now = ch_now_ns();
    pthread_mutex_lock(&d->mu);
    d->st.timer_marks++;
    if (begin)
        d->timer_at[kind] = now;
    else
        d->timer_sum[kind] += now - d->timer_at[kind];
    pthread_mutex_unlock(&d->mu);
}

static void sim_timer_read(const eng_backend_t *be, double *ms)
{
    devsim_t *d = ds(be);
    pthread_mutex_lock(&d->mu);
    for (int k = 0; k < ENG_TIMER_KINDS; k++) {
        ms[k] = (double)d->timer_sum[k] * 1e-6;
        d->timer_sum[k] = 0;
    }
    pthread_mutex_unlock(&d->mu);
}

// ----------------------------------------------------------------------------
// kernels: the CPU's on the host views. Nullable per kernels/*.h: matmul's bias and dbias,
// lmhead_fwd's lse, losses and targets, lmhead_fwdbwd's losses, tp_embed_fwd's wpe. Elementwise
// entries with n = 0 do nothing, whatever their pointers.

static void sim_encoder_fwd(const eng_backend_t *be, float *out, const int32_t *inp,
                            const float *wte, const float *wpe, int B, int T, int C)
{
    devsim_t *d = ds(be);
    d->cpu->encoder_fwd(d->cpu, DEV(out), DEV(inp), DEV(wte), DEV(wpe), B, T, C);
}

static void sim_encoder_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                            const int32_t *inp, int B, int T, int C)
{
    devsim_t *d = ds(be);
    d->cpu->encoder_bwd(d->cpu, DEV(dwte), DEV(dwpe), DEV(dout), DEV(inp), B, T, C);
}

static void sim_layernorm_fwd(const eng_backend_t *be, float *out, float *mean, float *rstd,
                              const float *inp, const float *weight, const float *bias, int N,
                              int C)
{
    devsim_t *d = ds(be);
    d->cpu->layernorm_fwd(d->cpu, DEV(out), DEV(mean), DEV(rstd), DEV(inp), DEV(weight), DEV(bias),
                          N, C);
}

static void sim_layernorm_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight,
                              const float *mean, const float *rstd, int N, int C)
{
    devsim_t *d = ds(be);
    /* a split backward's half (ZB-H1, backend.h): the weight pass (dinp NULL) reads no weight,
     * handed on as NULL so that a read would fault, as a GPU kernel's would be wrong */
    d->cpu->layernorm_bwd(d->cpu, OPT(dinp), OPT(dweight), OPT(dbias), DEV(dout), DEV(inp),
                          dinp != NULL ? DEV(weight) : NULL, DEV(mean), DEV(rstd), N, C);
}

/* A matmul's weight w[0..n) as the GEMM reads it: from the working copy when it lies in one
 * (widened from w16's host view; a weight the copy misses is read as it is, a bug the
 * bits then show), else w's host view (a misuse named after entry, the calling matmul). */
static const float *gemm_weight(devsim_t *d, const float *w, size_t n, const char *entry)
{
    uintptr_t p = (uintptr_t)w, b = (uintptr_t)d->w32;
    if (d->wn == 0 || p < b || (p - b) / sizeof(float) + n > d->wn)
        return span(d, w, 0, entry, "weight");
    if (n > d->wtmp_cap) {
        float *q = realloc(d->wtmp, n * sizeof *q);
        if (q == NULL)
            die(__func__, "wtmp", w, "cannot grow");
        d->wtmp = q;
        d->wtmp_cap = n;
    }
    const kn_bf16_t *w16 = d->w16 + (p - b) / sizeof(float);
    kn_bf16_unpack(d->wtmp, span(d, w16, n * sizeof *w16, __func__, "w16"), n);
    pthread_mutex_lock(&d->mu);
    d->st.w16_reads += n;
    pthread_mutex_unlock(&d->mu);
    return d->wtmp;
}

static void sim_matmul_fwd(const eng_backend_t *be, float *out, const float *inp,
                           const float *weight, const float *bias, int N, int C, int OC)
{
    devsim_t *d = ds(be);
    d->cpu->matmul_fwd(d->cpu, DEV(out), DEV(inp), gemm_weight(d, weight, (size_t)C * OC, __func__),
                       OPT(bias), N, C, OC);
}

static void sim_matmul_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp, const float *weight, int N, int C,
                           int OC)
{
    devsim_t *d = ds(be);
    /* either half alone (ZB-H1): the input pass reads no inp, the weight pass no weight */
    d->cpu->matmul_bwd(
        d->cpu, OPT(dinp), OPT(dweight), OPT(dbias), DEV(dout), dweight != NULL ? DEV(inp) : NULL,
        dinp != NULL ? gemm_weight(d, weight, (size_t)C * OC, __func__) : NULL, N, C, OC);
}

/* att NULL: nothing kept (selective recomputation), scratch then used */
static void sim_attention_fwd(const eng_backend_t *be, float *out, float *att, float *scratch,
                              const float *qkv, int B, int T, int C, int NH)
{
    devsim_t *d = ds(be);
    d->cpu->attention_fwd(d->cpu, DEV(out), OPT(att), OPT(scratch), DEV(qkv), B, T, C, NH);
}

static void sim_attention_bwd(const eng_backend_t *be, float *dqkv, float *scratch,
                              const float *dout, const float *qkv, const float *att, int B, int T,
                              int C, int NH)
{
    devsim_t *d = ds(be);
    d->cpu->attention_bwd(d->cpu, DEV(dqkv), DEV(scratch), DEV(dout), DEV(qkv), OPT(att), B, T, C,
                          NH);
}

static void sim_gelu_fwd(const eng_backend_t *be, float *out, const float *inp, size_t n)
{
    devsim_t *d = ds(be);
    if (n > 0)
        d->cpu->gelu_fwd(d->cpu, DEV(out), DEV(inp), n);
}

static void sim_gelu_bwd(const eng_backend_t *be, float *dinp, const float *inp, const float *dout,
                         size_t n)
{
    devsim_t *d = ds(be);
    if (n > 0)
        d->cpu->gelu_bwd(d->cpu, DEV(dinp), DEV(inp), DEV(dout), n);
}

static void sim_residual_fwd(const eng_backend_t *be, float *out, const float *a, const float *b,
                             size_t n)
{
    devsim_t *d = ds(be);
    if (n > 0)
        d->cpu->residual_fwd(d->cpu, DEV(out), DEV(a), DEV(b), n);
}

static void sim_lmhead_fwd(const eng_backend_t *be, float *logits, float *lse, float *losses,
                           const float *x, const float *wte, const int32_t *targets, int N, int C,
                           int V, int Vp)
{
    devsim_t *d = ds(be);
    d->cpu->lmhead_fwd(d->cpu, DEV(logits), OPT(lse), OPT(losses), DEV(x), DEV(wte), OPT(targets),
                       N, C, V, Vp);
}

static void sim_lmhead_bwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                           const float *lse, const float *x, const float *wte,
                           const int32_t *targets, float scale, int N, int C, int V, int Vp)
{
    devsim_t *d = ds(be);
    /* a split backward's halves: dwte NULL (x unread), dx NULL (lse, wte, targets unread) */
    d->cpu->lmhead_bwd(d->cpu, OPT(dx), OPT(dwte), DEV(logits), OPT(lse), OPT(x), OPT(wte),
                       OPT(targets), scale, N, C, V, Vp);
}

static void sim_lmhead_fwdbwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                              float *lse, float *losses, const float *x, const float *wte,
                              const int32_t *targets, int acc, int N, int C, int V, int Vp)
{
    devsim_t *d = ds(be);
    d->cpu->lmhead_fwdbwd(d->cpu, DEV(dx), DEV(dwte), DEV(logits), DEV(lse), OPT(losses), DEV(x),
                          DEV(wte), DEV(targets), acc, N, C, V, Vp);
}

static void sim_axpy(const eng_backend_t *be, float *y, const float *x, size_t n, float a)
{
    devsim_t *d = ds(be);
    if (n > 0)
        d->cpu->axpy(d->cpu, DEV(y), DEV(x), n, a);
}

static void sim_adamw(const eng_backend_t *be, float *p, const float *g, float *m, float *v,
                      size_t n, double lr, double beta1, double beta2, double eps, double wd,
                      uint64_t t)
{
    devsim_t *d = ds(be);
    if (n > 0)
        d->cpu->adamw(d->cpu, DEV(p), DEV(g), DEV(m), DEV(v), n, lr, beta1, beta2, eps, wd, t);
}

static void sim_adamw_fused(const eng_backend_t *be, float *p, float *g, float *m, float *v,
                            size_t n, double lr, double beta1, double beta2, double eps, double wd,
                            uint64_t t, float gscale, int zero_g)
{
    devsim_t *d = ds(be);
    if (n > 0)
        d->cpu->adamw_fused(d->cpu, DEV(p), DEV(g), DEV(m), DEV(v), n, lr, beta1, beta2, eps, wd, t,
                            gscale, zero_g);
}

static double sim_sumsq(const eng_backend_t *be, const float *x, size_t n)
{
    devsim_t *d = ds(be);
    pthread_mutex_lock(&d->mu);
    d->st.sumsq++;
    pthread_mutex_unlock(&d->mu);
    return n > 0 ? d->cpu->sumsq(d->cpu, DEV(x), n) : 0.0;
}

static void sim_sumsq_to(const eng_backend_t *be, double *out, const float *x, size_t n)
{
    devsim_t *d = ds(be);
    double *o = span(d, out, sizeof *out, __func__, "out");
    *o = n > 0 ? d->cpu->sumsq(d->cpu, DEV(x), n) : 0.0;
}

static void sim_loss_acc(const eng_backend_t *be, double *acc, const float *losses, size_t n)
{
    devsim_t *d = ds(be);
    d->cpu->loss_acc(d->cpu, span(d, acc, sizeof *acc, __func__, "acc"), DEV(losses), n);
}

static void sim_scale(const eng_backend_t *be, float *x, size_t n, float c)
{
    devsim_t *d = ds(be);
    if (n > 0)
        d->cpu->scale(d->cpu, DEV(x), n, c);
}

/* the vocab-parallel entries (counted): tp_embed_fwd's wpe may be NULL (ranks that add no
 * positions); the others' pointers are all backend memory. N = 0 rows does nothing. */
static void count_tp(devsim_t *d)
{
    pthread_mutex_lock(&d->mu);
    d->st.tp_kernels++;
    pthread_mutex_unlock(&d->mu);
}

static void sim_tp_embed_fwd(const eng_backend_t *be, float *out, const int32_t *inp,
                             const float *wte, const float *wpe, int v0, int Vl, int B, int T,
                             int C)
{
    devsim_t *d = ds(be);
    count_tp(d);
    d->cpu->tp_embed_fwd(d->cpu, DEV(out), DEV(inp), DEV(wte), OPT(wpe), v0, Vl, B, T, C);
}

static void sim_tp_embed_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                             const int32_t *inp, int v0, int Vl, int B, int T, int C)
{
    devsim_t *d = ds(be);
    count_tp(d);
    d->cpu->tp_embed_bwd(d->cpu, DEV(dwte), DEV(dwpe), DEV(dout), DEV(inp), v0, Vl, B, T, C);
}

static void sim_tp_xent_max(const eng_backend_t *be, float *mx, const float *logits, int N, int Vl,
                            int valid)
{
    devsim_t *d = ds(be);
    count_tp(d);
    if (N > 0)
        d->cpu->tp_xent_max(d->cpu, DEV(mx), DEV(logits), N, Vl, valid);
}

static void sim_tp_xent_sums(const eng_backend_t *be, float *sum, float *tl, const float *logits,
                             const float *mx, const int32_t *targets, int v0, int N, int Vl,
                             int valid)
{
    devsim_t *d = ds(be);
    count_tp(d);
    if (N > 0)
        d->cpu->tp_xent_sums(d->cpu, DEV(sum), DEV(tl), DEV(logits), DEV(mx), DEV(targets), v0, N,
                             Vl, valid);
}

static void sim_tp_xent_finish(const eng_backend_t *be, float *lse, float *losses, const float *mx,
                               const float *sum, const float *tl, int N)
{
    devsim_t *d = ds(be);
    count_tp(d);
    if (N > 0)
        d->cpu->tp_xent_finish(d->cpu, DEV(lse), DEV(losses), DEV(mx), DEV(sum), DEV(tl), N);
}

static void sim_tp_xent_bwd(const eng_backend_t *be, float *logits, const float *lse,
                            const int32_t *targets, float scale, int v0, int N, int Vl, int valid)
{
    devsim_t *d = ds(be);
    count_tp(d);
    if (N > 0)
        d->cpu->tp_xent_bwd(d->cpu, DEV(logits), DEV(lse), DEV(targets), scale, v0, N, Vl, valid);
}

static void sim_bf16_weights(const eng_backend_t *be, const float *base, const void *w16, size_t n)
{
    devsim_t *d = ds(be);
    if (n > 0) { /* both whole spans of backend memory */
        span(d, base, n * sizeof(float), __func__, "base");
        span(d, w16, n * sizeof(kn_bf16_t), __func__, "w16");
    }
    d->w32 = n ? base : NULL;
    d->w16 = n ? w16 : NULL;
    d->wn = n;
}

/* bf16 messages' casts (backend.h's bf16_cast): both sides backend memory, whole spans */
static void sim_bf16_cast(const eng_backend_t *be, void *dst, const void *src, size_t n,
                          int to_bf16)
{
    devsim_t *d = ds(be);
    if (n == 0)
        return;
    size_t db = n * (to_bf16 ? sizeof(kn_bf16_t) : sizeof(float));
    size_t sb = n * (to_bf16 ? sizeof(float) : sizeof(kn_bf16_t));
    d->cpu->bf16_cast(d->cpu, span(d, dst, db, __func__, "dst"), span(d, src, sb, __func__, "src"),
                      n, to_bf16);
}

// ----------------------------------------------------------------------------
// the object

int devsim_create(int poison, eng_backend_t **out)
{
    *out = NULL;
    devsim_t *d = calloc(1, sizeof *d);
    if (d == NULL)
        return -ENOMEM;
    d->cpu = eng_backend_cpu();
    d->poison = poison != 0;
    pthread_mutex_init(&d->mu, NULL);
    d->table = (eng_backend_t){
        .name = "devsim",
        .host_memory = 0,
        .ud = d,
        .alloc = sim_alloc,
        .free = sim_free,
        .copy = sim_copy,
        .memset = sim_memset,
        .encoder_fwd = sim_encoder_fwd,
        .encoder_bwd = sim_encoder_bwd,
        .layernorm_fwd = sim_layernorm_fwd,
        .layernorm_bwd = sim_layernorm_bwd,
        .matmul_fwd = sim_matmul_fwd,
        .matmul_bwd = sim_matmul_bwd,
        .attention_fwd = sim_attention_fwd,
        .attention_bwd = sim_attention_bwd,
        .gelu_fwd = sim_gelu_fwd,
        .gelu_bwd = sim_gelu_bwd,
        .residual_fwd = sim_residual_fwd,
        .lmhead_fwd = sim_lmhead_fwd,
        .lmhead_bwd = sim_lmhead_bwd,
        .lmhead_fwdbwd = sim_lmhead_fwdbwd,
        .axpy = sim_axpy,
        .adamw = sim_adamw,
        .adamw_fused = sim_adamw_fused,
        .sumsq = sim_sumsq,
        .sumsq_to = sim_sumsq_to,
        .loss_acc = sim_loss_acc,
        .scale = sim_scale,
        .sync = sim_sync,
        .timer_mark = sim_timer_mark,
        .timer_read = sim_timer_read,
        .tp_embed_fwd = sim_tp_embed_fwd,
        .tp_embed_bwd = sim_tp_embed_bwd,
        .tp_xent_max = sim_tp_xent_max,
        .tp_xent_sums = sim_tp_xent_sums,
        .tp_xent_finish = sim_tp_xent_finish,
        .tp_xent_bwd = sim_tp_xent_bwd,
        .bf16_cast = sim_bf16_cast,
        .bf16_weights = sim_bf16_weights,
    };
    *out = &d->table;
    return 0;
}

void devsim_destroy(eng_backend_t *be)
{
    if (be == NULL)
        return;
    devsim_t *d = ds(be);
    for (size_t i = 0; i < d->n; i++)
        unmap_views(d, &d->r[i]);
    free(d->r);
    free(d->wtmp);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

void devsim_stats(const eng_backend_t *be, devsim_stats_t *out)
{
    devsim_t *d = ds(be);
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    out->live = d->n;
    pthread_mutex_unlock(&d->mu);
}
