/* chorus-bench-mpi-ref: the reference chorus-bench-collectives compares against. Times
 * MPI_Allreduce (fp32 sum, separate send and receive buffers from malloc) over
 * 4 KiB .. 256 MiB (powers of 4) under each of Open MPI's tuned allreduce algorithms and
 * prints, from rank 0, one line per algorithm and size:
 *   alg=<k> size=<bytes> time_s=<slowest rank's mean seconds per call> iters=<timed calls>
 *
 *   mpirun --mca coll_tuned_use_dynamic_rules 1 [other MCA settings] -np N \
 *       chorus-bench-mpi-ref [MAX_S]
 *
 * Algorithms: 0 is Open MPI's own choice (its fixed decision rules, what a plain mpirun
 * gets), 1..6 are forced with coll_tuned_allreduce_algorithm (basic linear, nonoverlapping,
 * recursive doubling, ring, segmented ring, Rabenseifner). The tuned component reads that
 * variable whenever a communicator is created, so one process sweeps them all: write it
 * through MPI_T, MPI_Comm_dup, time on the new communicator. Algorithm 0 runs on
 * MPI_COMM_WORLD, made while the variable is 0: with no rules file the tuned component then
 * keeps its fixed rules, exactly as without use_dynamic_rules. Without use_dynamic_rules (or
 * MPI_T) only algorithm 0 is measured. Settings fixed at MPI_Init
 * (single-copy mechanism, yield when idle, binding) are one mpirun each.
 *
 * Sizes are the outer loop, so the algorithms of a size are measured one after the other in
 * the same state of this shared machine. Per algorithm and size: one warm-up call, then
 * ROUNDS batches of 64 MiB of traffic (1 .. 200 calls) taken in turns with the other
 * algorithms; the time is the fastest batch's mean, the reference at its best. To keep the
 * sweep short, a forced algorithm whose first batch took over PRUNE times the fastest first
 * batch of that size gets no more batches there (Open MPI's own choice always gets all, being
 * the default figure), and one whose warm-up call took over MAX_S (default 5) seconds is
 * dropped for that size and the larger ones. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIN_BYTES (4u << 10)
#define MAX_BYTES (256u << 20)
#define NSIZES    9
#define NALGS     7 /* 0: Open MPI's choice, 1..6 forced */
#define ROUNDS    3 /* timed batches per algorithm and size; the fastest counts */
/* a forced algorithm whose first batch is this many times the fastest first batch of its
 * size gets no more batches at that size */
#define PRUNE 4

/* Slowest rank's seconds for `iters` calls on comm, on every rank. */
static double time_calls(MPI_Comm comm, const float *send, float *recv, int count, int iters)
{
    MPI_Barrier(comm);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, comm);
    double t = MPI_Wtime() - t0, tmax = 0;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, comm);
    return tmax;
}

/* Index of the MPI_T control variable `name`, or -1. */
static int cvar_index(const char *name)
{
    int n = 0;
    MPI_T_cvar_get_num(&n);
    for (int i = 0; i < n; i++) {
        char nm[256], desc[16];
        int nl = sizeof nm, dl = sizeof desc, verb, bind, scope;
        MPI_Datatype dt;
        MPI_T_enum en;
        if (MPI_T_cvar_get_info(i, nm, &nl, &verb, &dt, &en, desc, &dl, &bind, &scope) ==
                MPI_SUCCESS &&
            strcmp(nm, name) == 0)
            return i;
    }
    return -1;
}

static int cvar_rw(int idx, int *val, int write)
{
    MPI_T_cvar_handle h;
    int cnt, rc = MPI_T_cvar_handle_alloc(idx, NULL, &h, &cnt);
    if (rc != MPI_SUCCESS)
        return rc;
    rc = write ? MPI_T_cvar_write(h, val) : MPI_T_cvar_read(h, val);
    MPI_T_cvar_handle_free(&h);
    return rc;
}

/* comms[k]: a communicator whose allreduce is algorithm k; returns how many were made
 * (1 when algorithms cannot be forced: only MPI_COMM_WORLD, Open MPI's choice). */
static int make_comms(MPI_Comm comms[NALGS])
{
    comms[0] = MPI_COMM_WORLD;
    int dyn = 0, prov, ialg, idyn;
    if (MPI_T_init_thread(MPI_THREAD_SINGLE, &prov) != MPI_SUCCESS)
        return 1;
    idyn = cvar_index("coll_tuned_use_dynamic_rules");
    ialg = cvar_index("coll_tuned_allreduce_algorithm");
    int made = 1;
    if (idyn < 0 || ialg < 0 || cvar_rw(idyn, &dyn, 0) != MPI_SUCCESS)
        dyn = 0;
    for (int k = 1; k < NALGS && dyn; k++) {
        int v = k;
        if (cvar_rw(ialg, &v, 1) != MPI_SUCCESS)
            break;
        MPI_Comm_dup(MPI_COMM_WORLD, &comms[k]);
        made++;
    }
    int zero = 0;
    if (made > 1)
        cvar_rw(ialg, &zero, 1);
    MPI_T_finalize();
    return made;
}

/* Calls per timed batch: 64 MiB of traffic, 1 .. 200 calls (the same for every algorithm
 * and unaffected by how busy the machine is when it is chosen). */
static int batch_calls(size_t bytes)
{
    size_t it = (size_t)(64u << 20) / bytes;
    return it < 1 ? 1 : it > 200 ? 200 : (int)it;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    double max_s = argc > 1 ? atof(argv[1]) : 5.0;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    float *send = malloc(MAX_BYTES), *recv = malloc(MAX_BYTES);
    if (!send || !recv) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < MAX_BYTES / sizeof(float); i++)
        send[i] = (float)((i + (size_t)rank) % 7), recv[i] = 0;
    MPI_Comm comms[NALGS];
    int nalgs = make_comms(comms), alive[NALGS];
    for (int a = 0; a < nalgs; a++)
        alive[a] = 1;
    for (int k = 0; k < NSIZES; k++) {
        size_t bytes = (size_t)MIN_BYTES << (2 * k);
        int count = (int)(bytes / sizeof(float)), iters = batch_calls(bytes);
        double best[NALGS], best_first = 1e30;
        for (int a = 0; a < nalgs; a++) {
            best[a] = 1e30;
            /* warm-up: this communicator's first call of this size */
            if (alive[a])
                alive[a] = time_calls(comms[a], send, recv, count, 1) <= max_s;
        }
        for (int r = 0; r < ROUNDS; r++)
            for (int a = 0; a < nalgs; a++) {
                if (!alive[a] || (r > 0 && a > 0 && best[a] > PRUNE * best_first))
                    continue;
                double t = time_calls(comms[a], send, recv, count, iters) / iters;
                best[a] = t < best[a] ? t : best[a];
                if (r == 0)
                    best_first = t < best_first ? t : best_first;
            }
        for (int a = 0; a < nalgs && rank == 0; a++)
            if (best[a] < 1e30)
                printf("alg=%d size=%zu time_s=%.9f iters=%d\n", a, bytes, best[a], iters);
        fflush(stdout);
    }
    for (int a = 1; a < nalgs; a++)
        MPI_Comm_free(&comms[a]);
    free(recv);
    free(send);
    MPI_Finalize();
    return 0;
}
