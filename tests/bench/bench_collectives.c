/* chorus-bench-collectives: bus bandwidth of the UCX backend's allreduce, reduce_scatter and
 * allgather with 2 and 4 ranks (forked processes, rendezvous through files in a temporary
 * directory) over 4 KiB .. 256 MiB, against memcpy bandwidth and Open MPI's MPI_Allreduce
 * (chorus-bench-mpi-ref under mpirun, when both exist), all measured in this run.
 *
 * Definitions are nccl-tests': bytes is the whole buffer (allreduce: the vector; reduce_scatter:
 * the send buffer; allgather: the receive buffer), algbw = bytes / time, and
 * busbw = algbw * 2(n-1)/n for allreduce, algbw * (n-1)/n for the other two. Time is the
 * slowest rank's mean over the timed iterations.
 *
 * The memcpy reference is one thread copying a 64 MiB buffer to another (pages already
 * touched), best of 5, counted as bytes copied per second (64 MiB / time: the read and the
 * write of a byte count once, as a collective's bytes do), measured before and again after
 * the runs of each rank count; the higher figure is the reference. RESULT lines give each 64 MiB
 * busbw, that reference and their ratio; for allreduce also against MPI_Allreduce's busbw,
 * at its best and at its default (below).
 * Ranks get the environment workerd gives a one-node job (WORLD_SIZE == LOCAL_WORLD_SIZE);
 * UCX_TLS, when set, still wins.
 *
 * The MPI reference is Open MPI at its best: chorus-bench-mpi-ref sweeps the tuned
 * component's allreduce algorithms (its own choice and the six it can be forced to) under
 * each mpirun setting of mpi_settings (single-copy mechanism CMA or none; for ranks <= cores
 * also Open MPI's mode for shared cores, yield when idle and no binding, which it takes by
 * itself when ranks > cores), each time the fastest of 3 batches. Per size the fastest
 * algorithm and setting is the reference (mpi-best, the winner named); Open MPI's default
 * (its own algorithm choice, plain mpirun) is reported beside it as mpi-default.
 *
 * Buffers come from wrk_coll_mem_alloc, as nccl-tests' come from cudaMalloc: the memory an
 * engine hands the collectives (the UCX backend registers it, so same-host members reduce
 * in place). One more line measures the 64 MiB allreduce on plain malloc buffers, which
 * same-host groups have to stage through their shared segment; MPI's buffers are malloc'd.
 * An optional argument runs one rank count only (2 or 4). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "common/util.h"
#include "workerd/coll/coll.h"

#define MIN_BYTES      (4u << 10)
#define MAX_BYTES      (256u << 20)
#define NSIZES         9 /* 4 KiB * 4^k */
#define HEADLINE_BYTES (64u << 20)
/* how the memcpy reference is measured (memcpy_gbs), in its RESULT lines */
#define MEMCPY_REF "memcpy(1_thread,64MiB,best_of_5,higher_of_before_after)"

enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, NOPS };
static const char *const op_names[NOPS] = {"allreduce", "reduce_scatter", "allgather"};

// ----------------------------------------------------------------------------
// file rendezvous: one file per key, written atomically

static void key_path(const char *dir, const char *key, char *path, size_t len)
{
    char flat[CH_RDZV_KEY_MAX];
    snprintf(flat, sizeof flat, "%s", key);
    for (char *p = flat; *p; p++)
        if (*p == '/')
            *p = '_';
    snprintf(path, len, "%s/%s", dir, flat);
}

static int file_set(void *ud, const char *key, const void *val, size_t len)
{
    char path[PATH_MAX];
    key_path(ud, key, path, sizeof path);
    return ch_file_write_atomic(path, val, len, 0600);
}

static int file_get(void *ud, const char *key, int timeout_ms, void **val, size_t *len)
{
    char path[PATH_MAX];
    key_path(ud, key, path, sizeof path);
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        char *data = NULL;
        int rc = ch_file_read(path, CH_RDZV_VALUE_MAX, &data, len);
        if (rc == 0) {
            *val = data;
            return 0;
        }
        if (rc != -ENOENT)
            return rc;
        if (ch_now_ms() >= deadline)
            return -ETIMEDOUT;
        usleep(1000);
    }
}

// ----------------------------------------------------------------------------
// one rank (a child process)

static size_t size_at(int k)
{
    return (size_t)MIN_BYTES << (2 * k);
}

/* 1 GiB of traffic, at least 8 iterations: this machine's bandwidth moves with its
 * neighbours, so a few iterations would measure them more than us. */
static int iters_for(size_t bytes)
{
    size_t it = (size_t)(1u << 30) / bytes;
    return it < 8 ? 8 : it > 500 ? 500 : (int)it;
}

static int run_op(wrk_coll_group_t *g, int op, float *send, float *recv, size_t bytes)
{
    uint32_t n = wrk_coll_group_size(g);
    size_t count = bytes / sizeof(float);
    switch (op) {
    case OP_ALLREDUCE:
        return wrk_coll_allreduce(g, send, recv, count, WRK_COLL_F32, WRK_COLL_SUM, NULL);
    case OP_REDUCE_SCATTER:
        return wrk_coll_reduce_scatter(g, send, recv, count / n, WRK_COLL_F32, WRK_COLL_SUM, NULL);
    default:
        return wrk_coll_allgather(g, send, recv, count / n, WRK_COLL_F32, NULL);
    }
}

/* Mean seconds per operation, the slowest rank's. */
static int time_op(wrk_coll_group_t *g, int op, float *send, float *recv, size_t bytes,
                   double *secs)
{
    int iters = iters_for(bytes), rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = run_op(g, op, send, recv, bytes);
    if (rc == 0)
        rc = wrk_coll_barrier(g, NULL);
    uint64_t t0 = ch_now_ns();
    for (int i = 0; i < iters && rc == 0; i++)
        rc = run_op(g, op, send, recv, bytes);
    float t = (float)((double)(ch_now_ns() - t0) / 1e9 / iters);
    if (rc == 0)
        rc = wrk_coll_allreduce(g, &t, &t, 1, WRK_COLL_F32, WRK_COLL_MAX, NULL);
    *secs = t;
    return rc;
}

static double memcpy_gbs(void);
static double busbw(int op, uint32_t n, size_t bytes, double secs);

#define PAIRED_ROUNDS 7

/* The 64 MiB allreduce and the memcpy reference measured in turns (rank 0 copies while the
 * others wait at a barrier), so both see the machine in the same state: the median over
 * the rounds of busbw / memcpy. This VM's bandwidth drifts by half within minutes. */
static int paired_ratio(wrk_coll_group_t *g, float *send, float *recv, double *ratio)
{
    double r[PAIRED_ROUNDS];
    int rc = 0;
    for (int k = 0; k < PAIRED_ROUNDS && rc == 0; k++) {
        double mem = wrk_coll_group_index(g) == 0 ? memcpy_gbs() : 1, secs = 0;
        if ((rc = wrk_coll_barrier(g, NULL)) == 0)
            rc = time_op(g, OP_ALLREDUCE, send, recv, HEADLINE_BYTES, &secs);
        r[k] = busbw(OP_ALLREDUCE, wrk_coll_group_size(g), HEADLINE_BYTES, secs) / mem;
        for (int j = k; j > 0 && r[j] < r[j - 1]; j--) {
            double x = r[j];
            r[j] = r[j - 1], r[j - 1] = x;
        }
    }
    *ratio = r[PAIRED_ROUNDS / 2];
    return rc;
}

/* plain: malloc'd buffers and only the 64 MiB allreduce; else the whole table. Then the
 * paired ratio (paired_ratio). */
static int rank_main(uint32_t rank, uint32_t n, const char *dir, int out_fd, int plain)
{
    wrk_coll_config_t cfg;
    wrk_coll_config_defaults(&cfg);
    cfg.rank = rank;
    cfg.world_size = n;
    cfg.rdzv = (ch_rdzv_t){.ud = (void *)dir, .set = file_set, .get = file_get};
    cfg.timeout_ms = 60000;
    wrk_coll_t *c = NULL;
    wrk_coll_group_t *g = NULL;
    float *send = NULL, *recv = NULL;
    int rc = wrk_coll_create(&cfg, &c);
    if (rc == 0 && plain) {
        send = malloc(MAX_BYTES), recv = malloc(MAX_BYTES);
        rc = send && recv ? 0 : -ENOMEM;
    } else if (rc == 0 && (rc = wrk_coll_mem_alloc(c, MAX_BYTES, (void **)&send)) == 0) {
        rc = wrk_coll_mem_alloc(c, MAX_BYTES, (void **)&recv);
    }
    if (rc == 0)
        rc = wrk_coll_group_layout(c, (ch_layout_t){1, 1, n}, WRK_COLL_GROUP_WORLD, &g);
    if (rc == 0 && rank == 0) {
        char tr[8] = {0};
        snprintf(tr, sizeof tr, "%s", wrk_coll_group_transport(g));
        if (write(out_fd, tr, sizeof tr) != sizeof tr)
            rc = -EIO;
    }
    if (rc == 0) {
        for (size_t i = 0; i < MAX_BYTES / sizeof(float); i++)
            send[i] = (float)((i + rank) % 7), recv[i] = 0;
    }
    for (int op = 0; op < (plain ? 1 : NOPS) && rc == 0; op++)
        for (int k = 0; k < NSIZES && rc == 0; k++) {
            if (plain && size_at(k) != HEADLINE_BYTES)
                continue;
            double secs = 0;
            rc = time_op(g, op, send, recv, size_at(k), &secs);
            if (rc == 0 && rank == 0 && write(out_fd, &secs, sizeof secs) != sizeof secs)
                rc = -EIO;
        }
    double ratio = 0;
    if (rc == 0)
        rc = paired_ratio(g, send, recv, &ratio);
    if (rc == 0 && rank == 0 && write(out_fd, &ratio, sizeof ratio) != sizeof ratio)
        rc = -EIO;
    if (rc < 0)
        fprintf(stderr, "bench rank %u: %s\n", rank, ch_strerror(rc));
    wrk_coll_group_destroy(g);
    if (plain) {
        free(recv);
        free(send);
    } else if (c) {
        wrk_coll_mem_free(c, recv);
        wrk_coll_mem_free(c, send);
    }
    wrk_coll_destroy(c);
    return rc < 0 ? 1 : 0;
}

/* What workerd gives each rank of a job placed on one node (proc.c): the UCX backend reads
 * it to choose same-host transports, as it would in a real job. */
static void set_rank_env(uint32_t rank, uint32_t n)
{
    char v[16];
    snprintf(v, sizeof v, "%u", rank);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%u", n);
    setenv("WORLD_SIZE", v, 1);
    setenv("LOCAL_WORLD_SIZE", v, 1);
}

/* secs[op][k] from n forked ranks (plain: secs[0][0], the 64 MiB allreduce on malloc'd
 * buffers), *ratio from paired_ratio; transport: how the group moved data. */
static int run_chorus(uint32_t n, int plain, double secs[NOPS][NSIZES], double *ratio,
                      char transport[8])
{
    char dir[] = "/tmp/chorus-bench-coll-XXXXXX";
    if (!mkdtemp(dir))
        return -errno;
    int fds[2];
    if (pipe(fds) < 0)
        return -errno;
    pid_t pids[8];
    for (uint32_t r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            close(fds[0]);
            set_rank_env(r, n);
            _exit(rank_main(r, n, dir, fds[1], plain));
        }
    }
    close(fds[1]);
    int rc = read(fds[0], transport, 8) == 8 ? 0 : -EIO;
    transport[7] = 0;
    for (int op = 0; op < (plain ? 1 : NOPS) && rc == 0; op++)
        for (int k = 0; k < (plain ? 1 : NSIZES) && rc == 0; k++)
            if (read(fds[0], &secs[op][k], sizeof(double)) != sizeof(double))
                rc = -EIO;
    if (rc == 0 && read(fds[0], ratio, sizeof *ratio) != sizeof *ratio)
        rc = -EIO;
    close(fds[0]);
    for (uint32_t r = 0; r < n; r++) {
        int st;
        if (rc < 0)
            kill(pids[r], SIGKILL);
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            rc = rc < 0 ? rc : -EIO;
    }
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return rc;
}

// ----------------------------------------------------------------------------
// references

static double memcpy_gbs(void)
{
    size_t bytes = HEADLINE_BYTES;
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        uint64_t t0 = ch_now_ns();
        memcpy(rep % 2 ? a : b, rep % 2 ? b : a, bytes);
        double gbs = (double)bytes / (double)(ch_now_ns() - t0);
        best = gbs > best ? gbs : best;
    }
    free(a);
    free(b);
    return best;
}

#define NALGS 7
static const char *const alg_names[NALGS] = {
    "default", "basic_linear",   "nonoverlapping", "recursive_doubling",
    "ring",    "segmented_ring", "rabenseifner",
};

/* One mpirun each; every one also sweeps the algorithms (chorus-bench-mpi-ref). */
typedef struct mpi_setting {
    const char *name; /* single-copy mechanism [+ shared-cores mode] */
    const char *opts; /* mpirun options */
    int shared;       /* Open MPI's shared-cores mode: only when ranks <= cores */
} mpi_setting_t;

#define SHARED_CORES "--mca mpi_yield_when_idle 1 --bind-to none"
static const mpi_setting_t mpi_settings[] = {
    {"cma", "", 0}, /* Open MPI's default mechanism here ("best available") */
    {"no_single_copy", "--mca btl_vader_single_copy_mechanism none", 0},
    {"cma+yield", SHARED_CORES, 1},
    {"no_single_copy+yield", "--mca btl_vader_single_copy_mechanism none " SHARED_CORES, 1},
};
#define NSETTINGS (sizeof mpi_settings / sizeof mpi_settings[0])

/* Seconds per size (0: not measured). best: over every algorithm and setting, won by
 * best_by; dflt: Open MPI's default (algorithm 0 under the first setting); all: every
 * algorithm and setting at the headline size. */
typedef struct mpi_ref {
    double best[NSIZES], dflt[NSIZES], all[NSETTINGS][NALGS];
    char best_by[NSIZES][48];
    int runs;
} mpi_ref_t;

/* Path of chorus-bench-mpi-ref next to this binary, or -ENOENT. */
static int mpi_ref_path(char *ref, size_t len)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return -ENOENT;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(ref, len, "%s/chorus-bench-mpi-ref", self);
    if (access(ref, X_OK) != 0 || system("command -v mpirun >/dev/null 2>&1") != 0)
        return -ENOENT;
    return 0;
}

/* One mpirun of chorus-bench-mpi-ref with setting si, folded into m. */
static int run_mpi_setting(const char *ref, uint32_t n, size_t si, mpi_ref_t *m)
{
    const mpi_setting_t *st = &mpi_settings[si];
    char cmd[2 * PATH_MAX], line[256];
    snprintf(cmd, sizeof cmd,
             "timeout 600 mpirun --allow-run-as-root --oversubscribe -np %u "
             "--mca coll_tuned_use_dynamic_rules 1 %s %s 2>/dev/null",
             n, st->opts, ref);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -errno;
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        int alg;
        size_t bytes;
        double t;
        if (sscanf(line, "alg=%d size=%zu time_s=%lf", &alg, &bytes, &t) != 3 || alg < 0 ||
            alg >= NALGS || t <= 0)
            continue;
        for (int k = 0; k < NSIZES; k++) {
            if (size_at(k) != bytes)
                continue;
            got++;
            if (si == 0 && alg == 0)
                m->dflt[k] = t;
            if (bytes == HEADLINE_BYTES)
                m->all[si][alg] = t;
            if (m->best[k] == 0 || t < m->best[k]) {
                m->best[k] = t;
                snprintf(m->best_by[k], sizeof m->best_by[k], "%s+%s", alg_names[alg], st->name);
            }
        }
    }
    int status = pclose(f);
    return got > 0 && status == 0 ? 0 : -EIO;
}

/* Every setting that applies to n ranks on this machine; 0 if at least one ran. */
static int run_mpi(uint32_t n, mpi_ref_t *m)
{
    char ref[PATH_MAX + 32];
    memset(m, 0, sizeof *m);
    if (mpi_ref_path(ref, sizeof ref) < 0)
        return -ENOENT;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    for (size_t si = 0; si < NSETTINGS; si++) {
        if (mpi_settings[si].shared && (long)n > cores)
            continue;
        uint64_t t0 = ch_now_ms();
        int rc = run_mpi_setting(ref, n, si, m);
        printf("(mpi reference, %u ranks, %s: %s, %.1f s)\n", n, mpi_settings[si].name,
               rc == 0 ? "ok" : ch_strerror(rc), (double)(ch_now_ms() - t0) / 1e3);
        fflush(stdout);
        m->runs += rc == 0;
    }
    return m->runs > 0 ? 0 : -EIO;
}

// ----------------------------------------------------------------------------

static double busbw(int op, uint32_t n, size_t bytes, double secs)
{
    double alg = (double)bytes / secs / 1e9;
    return op == OP_ALLREDUCE ? alg * 2.0 * (n - 1) / n : alg * (n - 1) / n;
}

static void size_name(size_t bytes, char *buf, size_t len)
{
    if (bytes >= (1u << 20))
        snprintf(buf, len, "%zuMiB", bytes >> 20);
    else
        snprintf(buf, len, "%zuKiB", bytes >> 10);
}

static void print_bw(double bw)
{
    if (bw > 0)
        printf(" %12.3f", bw);
    else
        printf(" %12s", "-");
}

/* The Chorus figure v against both MPI references at the headline size. */
static void result_mpi(const char *name, uint32_t n, double v, const mpi_ref_t *m, int kh)
{
    char best[64];
    snprintf(best, sizeof best, "mpi-best(%s)", m->best_by[kh]);
    const char *what[2] = {best, "mpi-default"};
    double t[2] = {m->best[kh], m->dflt[kh]};
    for (int i = 0; i < 2; i++) {
        if (t[i] <= 0) {
            printf("%s: no %s figure at 64 MiB\n", name, i == 0 ? "mpi-best" : what[i]);
            continue;
        }
        double ref = busbw(OP_ALLREDUCE, n, HEADLINE_BYTES, t[i]);
        printf("RESULT name=%s value=%.3f unit=GB/s ref=%s ref_value=%.3f ratio=%.3f\n", name, v,
               what[i], ref, v / ref);
    }
}

/* Every MPI algorithm and setting at the headline size, for the record. */
static void print_mpi_headline(uint32_t n, const mpi_ref_t *m)
{
    printf("MPI_Allreduce 64 MiB busbw GB/s, %u ranks, per algorithm (rows) and setting:\n%20s", n,
           "");
    for (size_t si = 0; si < NSETTINGS; si++)
        printf(" %21s", mpi_settings[si].name);
    printf("\n");
    for (int a = 0; a < NALGS; a++) {
        printf("%20s", alg_names[a]);
        for (size_t si = 0; si < NSETTINGS; si++) {
            double t = m->all[si][a];
            if (t > 0)
                printf(" %21.3f", busbw(OP_ALLREDUCE, n, HEADLINE_BYTES, t));
            else
                printf(" %21s", "-");
        }
        printf("\n");
    }
    printf("(-: not run for this rank count, or dropped: a call over 5 s at this size or a "
           "smaller one)\n");
}

/* Optional argument: one rank count only (default: 2 and 4). */
int main(int argc, char **argv)
{
    static const uint32_t ranks[] = {2, 4};
    uint32_t only = argc > 1 ? (uint32_t)atoi(argv[1]) : 0;
    double mem = memcpy_gbs();
    printf("memcpy bandwidth (1 thread, 64 MiB buffer to another, pages touched, best of 5): "
           "%.2f GB/s\n",
           mem);
    int status = 0;
    for (size_t ri = 0; ri < sizeof ranks / sizeof ranks[0]; ri++) {
        uint32_t n = ranks[ri];
        if (only && n != only)
            continue;
        double secs[NOPS][NSIZES] = {{0}};
        mpi_ref_t mpi;
        char transport[8] = "";
        double ratio = 0, plain_ratio = 0;
        int rc = run_chorus(n, 0, secs, &ratio, transport);
        if (rc < 0) {
            fprintf(stderr, "%u ranks: %s\n", n, ch_strerror(rc));
            status = 1;
            continue;
        }
        int have_mpi = run_mpi(n, &mpi) == 0;
        /* The reference again after the runs; the higher one counts (the conservative side). */
        double again = memcpy_gbs();
        if (again > mem)
            mem = again;
        printf("memcpy bandwidth again: %.2f GB/s; the reference for %u ranks (the higher): "
               "%.2f GB/s\n",
               again, n, mem);
        if (!have_mpi)
            printf("(no MPI reference: mpirun or chorus-bench-mpi-ref missing or failed)\n");
        printf("\n%u ranks through %s, busbw GB/s%s\n%10s %12s %15s %12s", n, transport,
               have_mpi ? " (MPI_Allreduce: mpi-best = fastest algorithm and setting, "
                          "mpi-default = plain mpirun)"
                        : "",
               "size", "allreduce", "reduce_scatter", "allgather");
        if (have_mpi)
            printf(" %12s %12s  %s", "mpi-default", "mpi-best", "mpi-best setting");
        printf("\n");
        for (int k = 0; k < NSIZES; k++) {
            char name[32];
            size_name(size_at(k), name, sizeof name);
            printf("%10s %12.3f %15.3f %12.3f", name, busbw(0, n, size_at(k), secs[0][k]),
                   busbw(1, n, size_at(k), secs[1][k]), busbw(2, n, size_at(k), secs[2][k]));
            if (have_mpi) {
                print_bw(mpi.dflt[k] > 0 ? busbw(OP_ALLREDUCE, n, size_at(k), mpi.dflt[k]) : 0);
                print_bw(mpi.best[k] > 0 ? busbw(OP_ALLREDUCE, n, size_at(k), mpi.best[k]) : 0);
                printf("  %s", mpi.best_by[k]);
            }
            printf("\n");
        }
        if (have_mpi)
            print_mpi_headline(n, &mpi);
        int kh = 0;
        while (size_at(kh) != HEADLINE_BYTES)
            kh++;
        char name[64];
        for (int op = 0; op < NOPS; op++) {
            double v = busbw(op, n, HEADLINE_BYTES, secs[op][kh]);
            snprintf(name, sizeof name, "%s_busbw_%ur_64MiB", op_names[op], n);
            if (op == OP_ALLREDUCE && have_mpi)
                result_mpi(name, n, v, &mpi, kh);
            printf("RESULT name=%s value=%.3f unit=GB/s ref=" MEMCPY_REF
                   " ref_value=%.3f ratio=%.3f\n",
                   name, v, mem, v / mem);
        }
        printf("RESULT name=allreduce_busbw_%ur_64MiB_paired ref=memcpy ratio=%.3f "
               "(median of %d rounds of memcpy then allreduce)\n",
               n, ratio, PAIRED_ROUNDS);
        double plain[NOPS][NSIZES] = {{0}};
        if (run_chorus(n, 1, plain, &plain_ratio, transport) == 0) {
            double v = busbw(OP_ALLREDUCE, n, HEADLINE_BYTES, plain[0][0]);
            snprintf(name, sizeof name, "allreduce_busbw_%ur_64MiB_malloc", n);
            if (have_mpi)
                result_mpi(name, n, v, &mpi, kh);
            printf("RESULT name=%s value=%.3f unit=GB/s ref=" MEMCPY_REF
                   " ref_value=%.3f ratio=%.3f\n",
                   name, v, mem, v / mem);
            printf("RESULT name=allreduce_busbw_%ur_64MiB_malloc_paired ref=memcpy ratio=%.3f\n", n,
                   plain_ratio);
        } else {
            status = 1;
        }
    }
    return status;
}
