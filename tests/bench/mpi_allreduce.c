/* chorus-bench-mpi-ref: the reference chorus-bench-collectives compares against. Times
 * MPI_Allreduce (fp32 sum, separate send and receive buffers, like the Chorus run) over
 * 4 KiB .. 256 MiB (powers of 4) and prints, from rank 0, one line per size:
 *   size=<bytes> time_s=<slowest rank's mean seconds per call>
 * Run: mpirun --allow-run-as-root --oversubscribe -np N chorus-bench-mpi-ref */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define MIN_BYTES (4u << 10)
#define MAX_BYTES (256u << 20)
#define NSIZES    9

/* Same iteration rule as the Chorus bench: ~256 MiB of traffic, 3 .. 500 calls. */
static int iters_for(size_t bytes)
{
    size_t it = (size_t)(256u << 20) / bytes;
    return it < 3 ? 3 : it > 500 ? 500 : (int)it;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    float *send = malloc(MAX_BYTES), *recv = malloc(MAX_BYTES);
    if (!send || !recv) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < MAX_BYTES / sizeof(float); i++)
        send[i] = (float)((i + (size_t)rank) % 7), recv[i] = 0;
    for (int k = 0; k < NSIZES; k++) {
        size_t bytes = (size_t)MIN_BYTES << (2 * k);
        int count = (int)(bytes / sizeof(float)), iters = iters_for(bytes);
        for (int i = 0; i < 2; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / iters, tmax = 0;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("size=%zu time_s=%.9f\n", bytes, tmax);
            fflush(stdout);
        }
    }
    free(recv);
    free(send);
    MPI_Finalize();
    return 0;
}
