/* devsim (tests/unit/devsim.h), the fake device backend: in poison mode a host access to its
 * memory faults and a host pointer handed to a kernel aborts; copies and memset move the right
 * bytes and are counted; and the model and the optimizer kernels on it give the CPU backend's
 * bits in both modes, which is what lets other tests use it to prove the engine's staging. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/jobspec.h"
#include "common/plan.h"
#include "devsim.h"
#include "workerd/engine/mem.h"
#include "workerd/engine/model.h"
#include "workerd/engine/trainer.h"

static eng_backend_t *make(int poison)
{
    eng_backend_t *be = NULL;
    cr_assert_eq(devsim_create(poison, &be), 0);
    return be;
}

static void *dalloc(const eng_backend_t *be, size_t bytes)
{
    void *p = NULL;
    cr_assert_eq(be->alloc(be, bytes, &p), 0);
    cr_assert_not_null(p);
    return p;
}

/* Run fn(ctx) in a child process. Returns the signal that ended it (0: it exited) and puts
 * what it wrote to stderr into err. */
static int in_child(void (*fn)(void *), void *ctx, char *err, size_t errlen)
{
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], STDERR_FILENO);
        /* the default actions: UCX (linked through the collectives) installs its own
         * SIGSEGV handler, which prints a backtrace and exits instead */
        signal(SIGSEGV, SIG_DFL);
        signal(SIGABRT, SIG_DFL);
        fn(ctx);
        _exit(0);
    }
    close(fd[1]);
    size_t len = 0;
    ssize_t got;
    while (len + 1 < errlen && (got = read(fd[0], err + len, errlen - 1 - len)) > 0)
        len += (size_t)got;
    err[len] = '\0';
    close(fd[0]);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* deterministic values in [-1, 1) */
static void fill(float *x, size_t n, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)(s >> 8) / (float)(1u << 23) - 1.0f;
    }
}

// ----------------------------------------------------------------------------
// memory

Test(devsim, the_table_is_complete_and_says_device_memory)
{
    eng_backend_t *be = make(1);
    cr_assert_str_eq(be->name, "devsim");
    cr_assert_eq(be->host_memory, 0);
    cr_assert_not_null(be->ud);
    int complete = be->alloc && be->free && be->copy && be->memset && be->encoder_fwd &&
                   be->encoder_bwd && be->layernorm_fwd && be->layernorm_bwd && be->matmul_fwd &&
                   be->matmul_bwd && be->attention_fwd && be->attention_bwd && be->gelu_fwd &&
                   be->gelu_bwd && be->residual_fwd && be->lmhead_fwd && be->lmhead_bwd &&
                   be->lmhead_fwdbwd && be->axpy && be->adamw && be->adamw_fused && be->sumsq &&
                   be->scale && be->sync && be->timer_mark && be->timer_read && be->tp_embed_fwd &&
                   be->tp_embed_bwd && be->tp_xent_max && be->tp_xent_sums && be->tp_xent_finish &&
                   be->tp_xent_bwd && be->sumsq_to && be->loss_acc;
    cr_assert(complete, "an entry of the devsim table is NULL");
    devsim_destroy(be);
    devsim_destroy(NULL);
}

static void read_one(void *p)
{
    volatile float *f = p;
    fprintf(stderr, "read %g\n", (double)f[0]);
}

static void write_one(void *p)
{
    volatile float *f = p;
    f[3] = 1.0f;
}

Test(devsim, a_direct_host_access_to_poisoned_memory_faults)
{
    eng_backend_t *be = make(1);
    float *p = dalloc(be, 1000 * sizeof(float));
    cr_assert_eq((uintptr_t)p % 64, 0, "not 64-byte aligned");
    char err[256];
    cr_expect_eq(in_child(read_one, p, err, sizeof err), SIGSEGV, "reading device memory: %s", err);
    cr_expect_eq(in_child(read_one, p + 999, err, sizeof err), SIGSEGV, "read inside: %s", err);
    cr_expect_eq(in_child(write_one, p, err, sizeof err), SIGSEGV, "writing device memory");
    be->free(be, p);

    /* the plain mode is host memory: the same accesses work */
    eng_backend_t *plain = make(0);
    float *q = dalloc(plain, 1000 * sizeof(float));
    cr_assert_eq(plain->memset(plain, q, 0, 1000 * sizeof(float)), 0);
    cr_expect_eq(in_child(read_one, q, err, sizeof err), 0);
    cr_expect_str_eq(err, "read 0\n");
    cr_expect_eq(in_child(write_one, q, err, sizeof err), 0);
    plain->free(plain, q);
    devsim_destroy(plain);
    devsim_destroy(be);
}

static void copies_round_trip(int poison)
{
    eng_backend_t *be = make(poison);
    enum { N = 5000 };
    float host[N], back[N];
    fill(host, N, 7);
    float *a = dalloc(be, N * sizeof(float)), *b = dalloc(be, 2 * N * sizeof(float));
    void *z0 = dalloc(be, 0), *z1 = dalloc(be, 0);
    cr_expect_neq(z0, z1, "size-0 allocations must be unique");

    /* H2D into a, D2D into the second half of b (pointer arithmetic within it), D2H back */
    cr_assert_eq(be->copy(be, a, host, N * sizeof(float), ENG_COPY_H2D), 0);
    cr_assert_eq(be->copy(be, b + N, a, N * sizeof(float), ENG_COPY_D2D), 0);
    cr_assert_eq(be->copy(be, back, b + N, N * sizeof(float), ENG_COPY_D2H), 0);
    cr_expect_eq(memcmp(host, back, sizeof host), 0, "H2D -> D2D -> D2H changed the data");

    /* memset of a middle range: only it changes */
    cr_assert_eq(be->memset(be, a + 100, 0, 50 * sizeof(float)), 0);
    cr_assert_eq(be->copy(be, back, a, N * sizeof(float), ENG_COPY_D2H), 0);
    for (int i = 0; i < N; i++) {
        float want = i >= 100 && i < 150 ? 0.0f : host[i];
        cr_assert_eq(bits(back[i]), bits(want), "element %d after memset", i);
    }
    /* zero-byte operations take any pointer */
    cr_expect_eq(be->copy(be, NULL, NULL, 0, ENG_COPY_D2D), 0);
    cr_expect_eq(be->memset(be, NULL, 1, 0), 0);
    cr_expect_eq(be->sync(be), 0);

    devsim_stats_t st;
    devsim_stats(be, &st);
    cr_expect_eq(st.h2d, 1);
    cr_expect_eq(st.d2h, 2);
    cr_expect_eq(st.d2d, 2);
    cr_expect_eq(st.h2d_bytes, N * sizeof(float));
    cr_expect_eq(st.d2h_bytes, 2 * N * sizeof(float));
    cr_expect_eq(st.allocs, 4);
    cr_expect_eq(st.live, 4);
    cr_expect_eq(st.syncs, 1);

    be->free(be, z1);
    be->free(be, a);
    be->free(be, NULL);
    be->free(be, b);
    be->free(be, z0);
    devsim_stats(be, &st);
    cr_expect_eq(st.live, 0);
    cr_expect_eq(st.allocs, 4);
    devsim_destroy(be);
}

Test(devsim, copies_round_trip_and_are_counted_poisoned)
{
    copies_round_trip(1);
}

Test(devsim, copies_round_trip_and_are_counted_plain)
{
    copies_round_trip(0);
}

// ----------------------------------------------------------------------------
// misuse aborts, naming the entry and the argument

typedef struct misuse {
    eng_backend_t *be;
    float *dev;  /* 64 floats of backend memory */
    float *host; /* 64 floats of host memory */
} misuse_t;

static void host_weight_to_matmul(void *ctx)
{
    misuse_t *u = ctx;
    u->be->matmul_fwd(u->be, u->dev, u->dev, u->host, NULL, 4, 4, 4);
}

static void copy_past_the_end(void *ctx)
{
    misuse_t *u = ctx;
    u->be->copy(u->be, u->dev + 32, u->host, 64 * sizeof(float), ENG_COPY_H2D);
}

static void free_a_host_pointer(void *ctx)
{
    misuse_t *u = ctx;
    u->be->free(u->be, u->host);
}

static void host_moments_to_adamw_fused(void *ctx)
{
    misuse_t *u = ctx;
    u->be->adamw_fused(u->be, u->dev, u->dev, u->host, u->dev, 64, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1,
                       1.0f, 0);
}

Test(devsim, a_host_pointer_where_backend_memory_belongs_aborts)
{
    float host[64] = {0};
    misuse_t u = {make(1), NULL, host};
    u.dev = dalloc(u.be, 64 * sizeof(float));
    char err[512];
    cr_expect_eq(in_child(host_weight_to_matmul, &u, err, sizeof err), SIGABRT);
    cr_expect(strstr(err, "matmul_fwd") && strstr(err, "weight"), "message: %s", err);
    cr_expect_eq(in_child(host_moments_to_adamw_fused, &u, err, sizeof err), SIGABRT);
    cr_expect(strstr(err, "adamw_fused") && strstr(err, " m = "), "message: %s", err);
    cr_expect_eq(in_child(copy_past_the_end, &u, err, sizeof err), SIGABRT);
    cr_expect(strstr(err, "copy") && strstr(err, "past the end"), "message: %s", err);
    cr_expect_eq(in_child(free_a_host_pointer, &u, err, sizeof err), SIGABRT);
    cr_expect(strstr(err, "free") && strstr(err, "never handed out"), "message: %s", err);
    /* the same call with backend memory everywhere runs */
    float *w = dalloc(u.be, 64 * sizeof(float));
    cr_assert_eq(u.be->memset(u.be, w, 0, 64 * sizeof(float)), 0);
    cr_assert_eq(u.be->memset(u.be, u.dev, 0, 64 * sizeof(float)), 0);
    u.be->matmul_fwd(u.be, u.dev + 16, u.dev, w, NULL, 4, 4, 4);
    u.be->free(u.be, w);
    u.be->free(u.be, u.dev);
    devsim_destroy(u.be);
}

// ----------------------------------------------------------------------------
// the model on devsim: the CPU backend's bits

/* The parameter or gradient slab of m on the host. */
static float *slab(eng_model_t *m, int grads)
{
    const eng_backend_t *be = eng_model_backend(m);
    size_t n = eng_model_nparams(m);
    float *h = malloc(n * sizeof *h);
    cr_assert_not_null(h);
    const float *d = grads ? eng_model_grads(m) : eng_model_params(m);
    cr_assert_eq(be->copy(be, h, d, n * sizeof *h, ENG_COPY_D2H), 0);
    return h;
}

/* One forward and backward of cfg on devsim and on the CPU from the same seed: the loss and
 * every parameter and gradient bit for bit. */
static void model_matches_cpu(const eng_config_t *cfg, uint32_t B, const int32_t *inputs,
                              const int32_t *targets, int poison)
{
    eng_backend_t *be = make(poison);
    eng_model_opts_t opts = {.backend = be};
    eng_model_t *ref = NULL, *m = NULL;
    cr_assert_eq(eng_model_create(cfg, B, 5, &ref), 0);
    cr_assert_eq(eng_model_create_opts(cfg, &opts, B, 5, &m), 0);
    size_t n = eng_model_nparams(m);
    float *p = slab(m, 0);
    cr_assert_eq(memcmp(p, eng_model_params(ref), n * sizeof(float)), 0, "initial parameters");

    float lref = 0, lsim = 0;
    cr_assert_eq(eng_model_forward(ref, inputs, targets, B, cfg->seq_len, &lref), 0);
    cr_assert_eq(eng_model_backward(ref, 1.0f / (float)(B * cfg->seq_len)), 0);
    cr_assert_eq(eng_model_forward(m, inputs, targets, B, cfg->seq_len, &lsim), 0);
    cr_assert_eq(eng_model_backward(m, 1.0f / (float)(B * cfg->seq_len)), 0);
    cr_expect_eq(bits(lsim), bits(lref), "loss %.9g vs the CPU's %.9g", (double)lsim, (double)lref);
    float *g = slab(m, 1);
    const float *gref = eng_model_grads(ref);
    size_t diff = 0;
    while (diff < n && bits(g[diff]) == bits(gref[diff]))
        diff++;
    cr_expect_eq(diff, n, "gradient %zu: %.9g vs the CPU's %.9g", diff,
                 (double)(diff < n ? g[diff] : 0), (double)(diff < n ? gref[diff] : 0));
    free(g);
    free(p);

    devsim_stats_t st;
    devsim_stats(be, &st);
    cr_expect_gt(st.h2d, 0, "the model staged nothing into backend memory");
    eng_model_destroy(m);
    eng_model_destroy(ref);
    devsim_stats(be, &st);
    cr_expect_eq(st.live, 0, "%llu allocations not freed", (unsigned long long)st.live);
    devsim_destroy(be);
}

static const eng_config_t tiny = {
    .layers = 2, .heads = 2, .embd = 8, .vocab = 11, .padded_vocab = 16, .seq_len = 5};
static const int32_t tiny_in[2 * 5] = {1, 4, 10, 0, 7, 3, 3, 9, 2, 5};
static const int32_t tiny_tgt[2 * 5] = {4, 10, 0, 7, 2, 3, 9, 2, 5, 8};

/* lmhead_fwd and lmhead_bwd: the logits fit the model's budget */
Test(devsim, the_model_gives_the_cpu_bits_poisoned)
{
    model_matches_cpu(&tiny, 2, tiny_in, tiny_tgt, 1);
}

Test(devsim, the_model_gives_the_cpu_bits_plain)
{
    model_matches_cpu(&tiny, 2, tiny_in, tiny_tgt, 0);
}

/* A vocabulary large enough that 256 rows of logits exceed the model's budget (64M floats):
 * the head takes the fused path, lmhead_fwdbwd then axpy. */
static void fused_head_matches_cpu(int poison)
{
    eng_config_t cfg = {.layers = 1,
                        .heads = 1,
                        .embd = 8,
                        .vocab = 299999,
                        .padded_vocab = 300000,
                        .seq_len = 128};
    enum { NT = 2 * 128 };
    int32_t in[NT], tgt[NT];
    for (size_t i = 0; i < NT; i++) {
        in[i] = (int32_t)((i * 7919) % cfg.vocab);
        tgt[i] = (int32_t)((i * 104729 + 13) % cfg.vocab);
    }
    model_matches_cpu(&cfg, 2, in, tgt, poison);
}

Test(devsim, the_fused_head_gives_the_cpu_bits_poisoned)
{
    fused_head_matches_cpu(1);
}

Test(devsim, the_fused_head_gives_the_cpu_bits_plain)
{
    fused_head_matches_cpu(0);
}

// ----------------------------------------------------------------------------
// the optimizer's entries on the CPU's bits

/* bytes of backend memory holding host's */
static void *staged_bytes(const eng_backend_t *be, const void *host, size_t bytes)
{
    void *d = dalloc(be, bytes);
    cr_assert_eq(be->copy(be, d, host, bytes, ENG_COPY_H2D), 0);
    return d;
}

/* n floats of backend memory holding host[0..n) */
static float *staged(const eng_backend_t *be, const float *host, size_t n)
{
    return staged_bytes(be, host, n * sizeof(float));
}

static void expect_same(const eng_backend_t *be, const float *d, const float *want, size_t n,
                        const char *what)
{
    float *h = malloc(n * sizeof *h);
    cr_assert_not_null(h);
    cr_assert_eq(be->copy(be, h, d, n * sizeof *h, ENG_COPY_D2H), 0);
    cr_expect_eq(memcmp(h, want, n * sizeof *h), 0, "%s differs from the CPU's", what);
    free(h);
}

static void optimizer_entries_match_cpu(int poison)
{
    const eng_backend_t *cpu = eng_backend_cpu();
    eng_backend_t *be = make(poison);
    /* several sumsq blocks of 65536 and a ragged tail; large enough for the kernels' pool */
    enum { N = 3 * 65536 + 77 };
    float *p = malloc(N * sizeof *p), *g = malloc(N * sizeof *g);
    float *m = malloc(N * sizeof *m), *v = malloc(N * sizeof *v);
    cr_assert(p && g && m && v);
    fill(p, N, 1);
    fill(g, N, 2);
    fill(m, N, 3);
    fill(v, N, 4);
    for (size_t i = 0; i < N; i++)
        v[i] *= v[i]; /* second moments are not negative */
    float *dp = staged(be, p, N), *dg = staged(be, g, N), *dm = staged(be, m, N);
    float *dv = staged(be, v, N);

    double s = be->sumsq(be, dg + 5, N - 5), sref = cpu->sumsq(cpu, g + 5, N - 5);
    cr_expect_eq(memcmp(&s, &sref, sizeof s), 0, "sumsq %.17g vs the CPU's %.17g", s, sref);
    /* the step's reads left in device memory: the same bits once copied back */
    void *dd = NULL;
    double got[2] = {0, 0}, acc = 0;
    cr_assert_eq(be->alloc(be, 2 * sizeof(double), &dd), 0);
    cr_assert_eq(be->memset(be, dd, 0, 2 * sizeof(double)), 0);
    be->sumsq_to(be, dd, dg + 5, N - 5);
    be->loss_acc(be, (double *)dd + 1, dg, 4096);
    be->loss_acc(be, (double *)dd + 1, dg + 4096, 4096);
    cpu->loss_acc(cpu, &acc, g, 4096);
    cpu->loss_acc(cpu, &acc, g + 4096, 4096);
    cr_assert_eq(be->copy(be, got, dd, sizeof got, ENG_COPY_D2H), 0);
    cr_expect_eq(memcmp(&got[0], &sref, sizeof sref), 0, "sumsq_to %.17g vs %.17g", got[0], sref);
    cr_expect_eq(memcmp(&got[1], &acc, sizeof acc), 0, "loss_acc %.17g vs %.17g", got[1], acc);
    be->free(be, dd);

    be->scale(be, dg, N, 0.75f);
    cpu->scale(cpu, g, N, 0.75f);
    expect_same(be, dg, g, N, "scale");

    be->axpy(be, dm + 1, dg, N - 1, -0.5f);
    cpu->axpy(cpu, m + 1, g, N - 1, -0.5f);
    expect_same(be, dm, m, N, "axpy");

    be->adamw(be, dp, dg, dm, dv, N, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3);
    cpu->adamw(cpu, p, g, m, v, N, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3);
    expect_same(be, dp, p, N, "adamw parameters");

    be->adamw_fused(be, dp + 64, dg + 64, dm + 64, dv + 64, N - 64, 6e-4, 0.9, 0.95, 1e-8, 0.1, 4,
                    0.3f, 1);
    cpu->adamw_fused(cpu, p + 64, g + 64, m + 64, v + 64, N - 64, 6e-4, 0.9, 0.95, 1e-8, 0.1, 4,
                     0.3f, 1);
    expect_same(be, dp, p, N, "adamw_fused parameters");
    expect_same(be, dg, g, N, "adamw_fused gradients (zeroed)");
    expect_same(be, dm, m, N, "adamw_fused first moments");
    expect_same(be, dv, v, N, "adamw_fused second moments");
    cr_expect_eq(g[N - 1], 0.0f, "zero_g left the gradient");

    be->free(be, dv);
    be->free(be, dm);
    be->free(be, dg);
    be->free(be, dp);
    free(v);
    free(m);
    free(g);
    free(p);
    devsim_destroy(be);
}

Test(devsim, the_optimizer_entries_give_the_cpu_bits_poisoned)
{
    optimizer_entries_match_cpu(1);
}

Test(devsim, the_optimizer_entries_give_the_cpu_bits_plain)
{
    optimizer_entries_match_cpu(0);
}

// ----------------------------------------------------------------------------
// the vocab-parallel entries on the CPU's bits

/* n int32 of backend memory holding host[0..n) */
static int32_t *staged_ints(const eng_backend_t *be, const int32_t *host, size_t n)
{
    return staged_bytes(be, host, n * sizeof(int32_t));
}

/* One rank's slice (v0 = 32 of a padded vocab of 64, the real vocab 40: 8 valid columns) and
 * the first rank's (v0 = 0, every column valid), each entry on devsim against the CPU's. */
static void tp_entries_match_cpu(int poison)
{
    const eng_backend_t *cpu = eng_backend_cpu();
    eng_backend_t *be = make(poison);
    enum { B = 3, T = 5, N = B * T, C = 8, V = 40, Vl = 32 };
    int32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)((i * 17 + 3) % V); /* repeats, and both slices */
    float wte[Vl * C], wpe[T * C], dout[N * C], logits[N * Vl];
    float out[N * C], dwte[Vl * C], dwpe[T * C], rows[3 * N], lse[N], losses[N];
    fill(wte, Vl * C, 11);
    fill(wpe, T * C, 12);
    fill(dout, N * C, 13);
    fill(dwte, Vl * C, 14);
    fill(dwpe, T * C, 15);
    memset(out, 0, sizeof out);
    memset(rows, 0, sizeof rows);
    memset(lse, 0, sizeof lse);
    memset(losses, 0, sizeof losses);
    int32_t *dtok = staged_ints(be, tok, N);
    float *dwte_p = staged(be, wte, Vl * C), *dwpe_p = staged(be, wpe, T * C);
    float *ddout = staged(be, dout, N * C), *dout_p = staged(be, out, N * C);
    float *dgwte = staged(be, dwte, Vl * C), *dgwpe = staged(be, dwpe, T * C);
    float *drows = staged(be, rows, 3 * N), *dlse = staged(be, lse, N);
    float *dlosses = staged(be, losses, N);

    for (int v0 = 0; v0 <= Vl; v0 += Vl) {
        int valid = V - v0 < Vl ? V - v0 : Vl;
        const float *wpe_or_none = v0 == 0 ? wpe : NULL;
        be->tp_embed_fwd(be, dout_p, dtok, dwte_p, v0 == 0 ? dwpe_p : NULL, v0, Vl, B, T, C);
        cpu->tp_embed_fwd(cpu, out, tok, wte, wpe_or_none, v0, Vl, B, T, C);
        expect_same(be, dout_p, out, N * C, "tp_embed_fwd");
        be->tp_embed_bwd(be, dgwte, dgwpe, ddout, dtok, v0, Vl, B, T, C);
        cpu->tp_embed_bwd(cpu, dwte, dwpe, dout, tok, v0, Vl, B, T, C);
        expect_same(be, dgwte, dwte, Vl * C, "tp_embed_bwd dwte");
        expect_same(be, dgwpe, dwpe, T * C, "tp_embed_bwd dwpe");

        /* logits 4x the unit range, so exp spreads; a fresh copy each round */
        fill(logits, N * Vl, 16 + (uint32_t)v0);
        for (int i = 0; i < N * Vl; i++)
            logits[i] *= 4.0f;
        float *dlogits = staged(be, logits, N * Vl);
        float *mx = rows, *sum = rows + N, *tl = rows + 2 * N;
        be->tp_xent_max(be, drows, dlogits, N, Vl, valid);
        cpu->tp_xent_max(cpu, mx, logits, N, Vl, valid);
        be->tp_xent_sums(be, drows + N, drows + 2 * N, dlogits, drows, dtok, v0, N, Vl, valid);
        cpu->tp_xent_sums(cpu, sum, tl, logits, mx, tok, v0, N, Vl, valid);
        be->tp_xent_finish(be, dlse, dlosses, drows, drows + N, drows + 2 * N, N);
        cpu->tp_xent_finish(cpu, lse, losses, mx, sum, tl, N);
        expect_same(be, drows, rows, 3 * N, "tp_xent_max and tp_xent_sums");
        expect_same(be, dlse, lse, N, "tp_xent_finish lse");
        expect_same(be, dlosses, losses, N, "tp_xent_finish losses");
        be->tp_xent_bwd(be, dlogits, dlse, dtok, 0.25f, v0, N, Vl, valid);
        cpu->tp_xent_bwd(cpu, logits, lse, tok, 0.25f, v0, N, Vl, valid);
        expect_same(be, dlogits, logits, N * Vl, "tp_xent_bwd");
        for (int n = 0; n < N; n++)
            for (int j = valid; j < Vl; j++)
                cr_expect_eq(bits(logits[n * Vl + j]), 0u, "padded column %d not zero", j);
        be->free(be, dlogits);
    }

    float *dev[] = {dwte_p, dwpe_p, ddout, dout_p, dgwte, dgwpe, drows, dlse, dlosses};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        be->free(be, dev[i]);
    be->free(be, dtok);
    devsim_destroy(be);
}

Test(devsim, the_tp_entries_give_the_cpu_bits_poisoned)
{
    tp_entries_match_cpu(1);
}

Test(devsim, the_tp_entries_give_the_cpu_bits_plain)
{
    tp_entries_match_cpu(0);
}

/* The rule the CUDA trainer lives by, on the fake device: every device buffer is allocated
 * when the trainer is made, before the first step (no allocation inside a step, where a
 * cudaMalloc would sync the device while collectives are in flight), and what it holds then
 * is the plan's figure for the rank (common/plan.h: 1% for 64-byte alignment), the figure
 * `chorusctl plan` prints and the rank reports at start. */
/* A two-block job of width embd, seq_len T, micro-batches of B sequences. */
static void small_job(ch_jobspec_t *j, const char *name, uint32_t embd, uint32_t T, uint32_t B)
{
    ch_jobspec_defaults(j);
    snprintf(j->name, sizeof j->name, "%s", name);
    j->model.layers = 2;
    j->model.heads = 4;
    j->model.embd = embd;
    j->model.vocab = 40;
    j->model.seq_len = T;
    j->parallel.micro_batch_size = B;
}

/* The plan of rank 0 of j at the attention's att_row. */
static void plan_of_job(const ch_jobspec_t *j, uint32_t att_row, ch_plan_t *p)
{
    ch_model_cfg_t m = ch_plan_model_of(j);
    m.att_row = att_row;
    cr_assert_eq(ch_plan_stage_rc(&m, ch_jobspec_layout(j), j->parallel.micro_batch_size,
                                  j->parallel.microbatches, j->parallel.reshard,
                                  j->parallel.recompute, 0, p),
                 0);
}

static void allocates_only_before_the_first_step(ch_recompute_t recompute, uint32_t mb)
{
    eng_backend_t *be = make(1);
    ch_jobspec_t j;
    small_job(&j, "devsim-alloc", 32, 16, 2);
    j.parallel.microbatches = mb;
    j.parallel.recompute = recompute;
    j.train.steps = 3;
    eng_trainer_opts_t opts = {.peak_flops = 1e9, .backend = be};
    eng_trainer_t *t = NULL;
    char msg[256] = "";
    cr_assert_eq(eng_trainer_create(&j, &opts, &t, msg, sizeof msg), 0, "%s", msg);

    devsim_stats_t before, after;
    eng_mem_stats_t ms;
    devsim_stats(be, &before);
    eng_trainer_mem(t, &ms);
    ch_plan_t p;
    plan_of_job(&j, ch_plan_model_of(&j).att_row, &p);
    double rel = ((double)ms.total - p.total_bytes) / p.total_bytes;
    printf("devsim: recompute %s: %zu bytes reserved before step 1 in %llu allocations; plan "
           "%.0f (%+.3f%%)\n",
           ch_recompute_name(recompute), ms.total, (unsigned long long)before.allocs, p.total_bytes,
           100 * rel);
    cr_expect_gt(before.allocs, 0);
    cr_expect_leq(fabs(rel), 0.01, "reserved %zu bytes, plan %.0f", ms.total, p.total_bytes);

    while (eng_trainer_next_step(t) < eng_trainer_total_steps(t)) {
        eng_step_info_t info;
        cr_assert_eq(eng_trainer_step(t, &info), 0);
        cr_assert(isfinite(info.loss));
        devsim_stats(be, &after);
        cr_expect_eq(after.allocs, before.allocs, "step %llu allocated %llu buffers",
                     (unsigned long long)info.step,
                     (unsigned long long)(after.allocs - before.allocs));
        cr_expect_eq(after.live, before.live, "step %llu: %llu buffers live, %llu before",
                     (unsigned long long)info.step, (unsigned long long)after.live,
                     (unsigned long long)before.live);
    }
    eng_trainer_mem(t, &ms);
    cr_expect_leq((double)ms.total_max, (double)ms.total, "a step held more than was reserved");
    eng_trainer_destroy(t);
    devsim_destroy(be);
}

Test(devsim, the_trainer_allocates_only_before_its_first_step)
{
    allocates_only_before_the_first_step(CH_RECOMPUTE_NONE, 2);
}

Test(devsim, the_trainer_allocates_only_before_its_first_step_recomputing)
{
    allocates_only_before_the_first_step(CH_RECOMPUTE_SELECTIVE, 3);
}

static int one_row(const eng_backend_t *be, int T, int hs)
{
    (void)be, (void)T, (void)hs;
    return 1;
}

/* bf16's packed activations where the attention keeps a row summary (CUDA's fused one, whose
 * backward reads its forward's output where the forward wrote it): the attention output
 * stays in its fp32 slot, the block's other kept activations are packed, and what the
 * trainer reserves is the plan's at that att_row; with the probabilities kept (devsim's own
 * att_row, T) the attention output is packed too, and the plan says so. No step runs: the
 * CPU's attention behind devsim keeps probabilities, not a summary. */
Test(devsim, bf16_packs_the_attention_output_only_when_no_fused_backward_reads_it)
{
    for (int fused = 0; fused < 2; fused++) {
        eng_backend_t *be = make(1);
        if (fused)
            be->att_row = one_row;
        ch_jobspec_t j;
        small_job(&j, "devsim-bf16acts", 64, 64, 4);
        j.train.steps = 1;
        j.train.precision = CH_PRECISION_BF16;
        j.train.emulate = 1;
        eng_trainer_opts_t opts = {.peak_flops = 1e9, .backend = be};
        eng_trainer_t *t = NULL;
        char msg[256] = "";
        cr_assert_eq(eng_trainer_create(&j, &opts, &t, msg, sizeof msg), 0, "%s", msg);
        eng_mem_stats_t ms;
        eng_trainer_mem(t, &ms);
        ch_plan_t p;
        plan_of_job(&j, fused ? 1 : 0, &p);
        double kept = p.act_mb_bytes * p.in_flight, acts = (double)ms.cur[ENG_MEM_ACTS];
        printf("devsim: bf16 %s: activations %.0f B reserved, plan %.0f; all %zu B, plan %.0f\n",
               fused ? "row summary" : "probabilities", acts, kept, ms.total, p.total_bytes);
        cr_expect_leq(fabs(acts - kept) / kept, 0.01, "activations %.0f, plan %.0f", acts, kept);
        cr_expect_leq(fabs((double)ms.total - p.total_bytes) / p.total_bytes, 0.01,
                      "reserved %zu, plan %.0f", ms.total, p.total_bytes);
        eng_trainer_destroy(t);
        devsim_destroy(be);
    }
}
