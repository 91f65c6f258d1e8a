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
 * busbw, that reference and their ratio; for allreduce also MPI_Allreduce's busbw.
 * Ranks get the environment workerd gives a one-node job (WORLD_SIZE == LOCAL_WORLD_SIZE);
 * UCX_TLS, when set, still wins.
 *
 * Buffers come from wrk_coll_mem_alloc, as nccl-tests' come from cudaMalloc: the memory an
 * engine hands the collectives (the UCX backend registers it, so same-host members reduce
 * in place). One more line measures the 64 MiB allreduce on plain malloc buffers, which
 * same-host groups have to stage through their shared segment. */
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

/* MPI_Allreduce seconds per size via chorus-bench-mpi-ref next to this binary; 0 if missing. */
static int run_mpi(uint32_t n, double secs[NSIZES])
{
    char self[PATH_MAX], ref[PATH_MAX + 32], cmd[2 * PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return -ENOENT;
    self[len] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(ref, sizeof ref, "%s/chorus-bench-mpi-ref", self);
    if (access(ref, X_OK) != 0 || system("command -v mpirun >/dev/null 2>&1") != 0)
        return -ENOENT;
    snprintf(cmd, sizeof cmd,
             "timeout 600 mpirun --allow-run-as-root --oversubscribe -np %u %s 2>/dev/null", n,
             ref);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -errno;
    char line[256];
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        size_t bytes;
        double t;
        if (sscanf(line, "size=%zu time_s=%lf", &bytes, &t) != 2)
            continue;
        for (int k = 0; k < NSIZES; k++)
            if (size_at(k) == bytes)
                secs[k] = t, got++;
    }
    int st = pclose(f);
    return got == NSIZES && st == 0 ? 0 : -EIO;
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

int main(void)
{
    static const uint32_t ranks[] = {2, 4};
    double mem = memcpy_gbs();
    printf("memcpy bandwidth (64 MiB, best of 5): %.2f GB/s\n", mem);
    int status = 0;
    for (size_t ri = 0; ri < sizeof ranks / sizeof ranks[0]; ri++) {
        uint32_t n = ranks[ri];
        double secs[NOPS][NSIZES] = {{0}}, mpi[NSIZES] = {0};
        char transport[8] = "";
        double ratio = 0, plain_ratio = 0;
        int rc = run_chorus(n, 0, secs, &ratio, transport);
        if (rc < 0) {
            fprintf(stderr, "%u ranks: %s\n", n, ch_strerror(rc));
            status = 1;
            continue;
        }
        int have_mpi = run_mpi(n, mpi) == 0;
        /* The reference again after the runs; the higher one counts (the conservative side). */
        double again = memcpy_gbs();
        if (again > mem)
            mem = again;
        printf("memcpy bandwidth again: %.2f GB/s; the reference for %u ranks: %.2f GB/s\n", again,
               n, mem);
        if (!have_mpi)
            printf("(no MPI reference: mpirun or chorus-bench-mpi-ref missing or failed)\n");
        printf("\n%u ranks through %s, busbw GB/s%s\n%10s %12s %15s %12s%s\n", n, transport,
               have_mpi ? " (mpi: MPI_Allreduce)" : "", "size", "allreduce", "reduce_scatter",
               "allgather", have_mpi ? "          mpi" : "");
        for (int k = 0; k < NSIZES; k++) {
            char name[32];
            size_name(size_at(k), name, sizeof name);
            printf("%10s %12.3f %15.3f %12.3f", name, busbw(0, n, size_at(k), secs[0][k]),
                   busbw(1, n, size_at(k), secs[1][k]), busbw(2, n, size_at(k), secs[2][k]));
            if (have_mpi)
                printf(" %12.3f", busbw(OP_ALLREDUCE, n, size_at(k), mpi[k]));
            printf("\n");
        }
        int kh = 0;
        while (size_at(kh) != HEADLINE_BYTES)
            kh++;
        for (int op = 0; op < NOPS; op++) {
            double v = busbw(op, n, HEADLINE_BYTES, secs[op][kh]);
            if (op == OP_ALLREDUCE && have_mpi) {
                double ref = busbw(op, n, HEADLINE_BYTES, mpi[kh]);
                printf("RESULT name=%s_busbw_%ur_64MiB value=%.3f unit=GB/s ref=mpi_allreduce "
                       "ref_value=%.3f ratio=%.3f\n",
                       op_names[op], n, v, ref, v / ref);
            }
            printf("RESULT name=%s_busbw_%ur_64MiB value=%.3f unit=GB/s ref=memcpy "
                   "ref_value=%.3f ratio=%.3f\n",
                   op_names[op], n, v, mem, v / mem);
        }
        printf("RESULT name=allreduce_busbw_%ur_64MiB_paired ref=memcpy ratio=%.3f "
               "(median of %d rounds of memcpy then allreduce)\n",
               n, ratio, PAIRED_ROUNDS);
        double plain[NOPS][NSIZES] = {{0}};
        if (run_chorus(n, 1, plain, &plain_ratio, transport) == 0) {
            double v = busbw(OP_ALLREDUCE, n, HEADLINE_BYTES, plain[0][0]);
            printf("RESULT name=allreduce_busbw_%ur_64MiB_malloc value=%.3f unit=GB/s ref=memcpy "
                   "ref_value=%.3f ratio=%.3f\n",
                   n, v, mem, v / mem);
            printf("RESULT name=allreduce_busbw_%ur_64MiB_malloc_paired ref=memcpy ratio=%.3f\n", n,
                   plain_ratio);
        } else {
            status = 1;
        }
    }
    return status;
}
