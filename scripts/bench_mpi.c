/* bench_mpi.c: the floor for scripts/bench_mpi.sh - a bare MPI_Send/MPI_Recv
 * ping-pong between ranks 0 and 1: rank 0 sends n bytes, rank 1 sends them
 * back, as an INOUT tensor of n bytes travels to a remote L3 and back.
 * Prints one line per size: "pingpong BYTES SECONDS_PER_ROUND_TRIP".
 * usage: mpirun -np 2 bench_mpi [min_ms per size] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        if (rank == 0) fprintf(stderr, "bench_mpi: start it with mpirun -np 2\n");
        MPI_Finalize();
        return 2;
    }
    double min_s = (argc > 1 ? atof(argv[1]) : 1000) / 1000;
    size_t max = 64u << 20;
    char *buf = malloc(max);
    if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
    memset(buf, 1, max);
    for (size_t n = 64u << 10; n <= max; n *= 4) {
        /* Batches of round trips as bench_mpi.lua runs its tasks (4, or 1
         * from 16 MiB), until min_s passed; the best batch counts, as there. */
        int per = n >= (16u << 20) ? 1 : 4, go = 1;
        double best = 1e30, t_end = MPI_Wtime() + min_s;
        for (int batch = 0; go; batch++) {
            double t0 = MPI_Wtime();
            for (int i = 0; i < per; i++) {
                if (rank == 0) {
                    MPI_Send(buf, (int)n, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
                    MPI_Recv(buf, (int)n, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else if (rank == 1) {
                    MPI_Recv(buf, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, (int)n, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
                }
            }
            double dt = (MPI_Wtime() - t0) / per;
            if (batch > 0 && dt < best) best = dt;   /* batch 0 warms up */
            go = batch < 2 || MPI_Wtime() < t_end;
            MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
        }
        if (rank == 0) printf("pingpong %zu %.9f\n", n, best);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
