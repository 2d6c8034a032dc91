/* Embedding: a host application that runs its own StarPU + StarPU-MPI attaches tessel,
 * works on tessel tiles with its own tasks, detaches, and keeps using StarPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <starpu_mpi.h>

#include "tessel/starpu.h"
#include "tessel/tessel.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "embed test, line %d: ", __LINE__);                                    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

/* The host's own codelet: add 1 to every element of a float vector tile. */
static void add_one_cpu(void *buffers[], void *arg)
{
    (void)arg;
    float *v = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    unsigned n = STARPU_VECTOR_GET_NX(buffers[0]);
    for (unsigned i = 0; i < n; i++)
        v[i] += 1.0f;
}

static struct starpu_codelet add_one_cl = {
    .cpu_funcs = {add_one_cpu},
    .nbuffers = 1,
    .modes = {STARPU_RW},
    .name = "host_add_one",
};

static int host_log_lines = 0;
static void host_log(tsl_log_level level, int rank, const char *message, void *user)
{
    (void)level;
    (void)rank;
    (void)message;
    (*(int *)user)++;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    CHECK(provided == MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE unavailable");
    CHECK(starpu_mpi_init_conf(NULL, NULL, 0, MPI_COMM_WORLD, NULL) == 0, "host StarPU start");
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    /* The host uses StarPU-MPI tags 0..99 itself; tessel gets its own range. */
    tsl_context_config cfg;
    tsl_context_config_init(&cfg);
    cfg.tag_base = 100;
    cfg.tag_count = 1000;
    cfg.log_level = TSL_LOG_DEBUG;
    cfg.log_fn = host_log;
    cfg.log_user = &host_log_lines;
    tsl_context_t ctx;
    CHECK(tsl_context_create(&ctx, NULL) == TSL_ERR_STATE, "create must refuse a running StarPU");
    CHECK(tsl_context_attach(&ctx, MPI_COMM_WORLD, &cfg) == TSL_OK, "attach: %s", tsl_last_error());
    int32_t owns = 1;
    tsl_context_owns_runtime(ctx, &owns);
    CHECK(owns == 0, "attached context claims to own StarPU");

    int64_t dims[2] = {8, 10};
    tsl_shape shape;
    tsl_shape_make(&shape, 2, dims);
    tsl_tile_grid grid = tsl_tile_grid_single();
    grid.splits[0] = 4;
    tsl_tensor_t t;
    CHECK(tsl_tensor_create(&t, ctx, TSL_F32, &shape, &grid, NULL) == TSL_OK, "create");
    CHECK(tsl_tensor_fill_constant(t, 2.0) == TSL_OK, "fill");

    /* The host runs its own task on each tessel tile through StarPU-MPI. */
    MPI_Comm comm;
    tsl_context_comm(ctx, &comm);
    for (int64_t i = 0; i < 4; i++) {
        starpu_data_handle_t h;
        CHECK(tsl_tensor_tile_handle(t, i, &h) == TSL_OK, "tile handle");
        CHECK(starpu_mpi_task_insert(comm, &add_one_cl, STARPU_RW, h, 0) == 0, "host task");
    }
    double sum = 0;
    CHECK(tsl_tensor_sum(t, &sum) == TSL_OK, "sum: %s", tsl_last_error());
    CHECK(sum == 3.0 * 80, "sum %g, want 240", sum);

    /* Errors still come back as values through the host's log callback. */
    int before = host_log_lines;
    CHECK(tsl_tensor_fill_uniform(t, 1, 3.0, 1.0) == TSL_ERR_INVALID_ARG, "bad fill");
    CHECK(host_log_lines > before, "the host's log callback saw nothing");

    CHECK(tsl_tensor_destroy(t) == TSL_OK, "destroy tensor");
    CHECK(tsl_context_destroy(ctx) == TSL_OK, "detach");

    /* StarPU is still the host's: it runs a task after tessel has gone. */
    CHECK(starpu_is_initialized(), "StarPU stopped by an attached context");
    float v[4] = {1, 2, 3, 4};
    starpu_data_handle_t mine;
    starpu_vector_data_register(&mine, STARPU_MAIN_RAM, (uintptr_t)v, 4, sizeof(float));
    starpu_mpi_data_register(mine, 7, 0);
    CHECK(starpu_mpi_task_insert(MPI_COMM_WORLD, &add_one_cl, STARPU_RW, mine, 0) == 0, "task");
    starpu_data_unregister(mine);
    if (rank == 0)
        CHECK(v[0] == 2 && v[3] == 5, "host task after detach did not run");
    starpu_mpi_shutdown();
    MPI_Finalize();
    if (rank == 0)
        printf("embedding test passed on %d ranks\n", size);
    return 0;
}
