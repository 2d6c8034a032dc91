/* In-situ training: a StarPU-MPI application (here a heat-equation simulation) that owns MPI,
 * StarPU and StarPU-MPI attaches tessel and trains a small U-Net on the fields it holds, in
 * the same DAG, without writing them out or gathering them.
 *
 * The simulation: S independent fields of H x W (periodic boundaries), each one tile of a
 * tessel tensor (S, 1, H, W) whose tiles are dealt over the ranks; every time step is one host
 * task per tile (an explicit 5-point diffusion step, the host's own codelet on the tile's
 * StarPU handle). Every K steps the network learns to predict, from the fields K steps
 * earlier, their temperature bands now (cold, warm, hot per position: a segmentation the
 * host's second codelet computes into a label tensor): tsl_model_train_step_tensors() on the
 * host's tensors, copied tile to tile into the model's tiling.
 *
 * To show that nothing is lost in the hand-over, the example also writes each round's fields
 * as .npy files and trains a second model (same seed) on them through tessel's dataset reader:
 * its parameters must equal the in-situ model's bit for bit (exit 1 otherwise).
 *
 * usage: mpirun -n R insitu_heat [--fields S] [--size N] [--every K] [--rounds T] [--dir DIR]
 * (defaults 4 fields of 32 x 32, 10 steps a round, 5 rounds, a new folder under /tmp) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <starpu_mpi.h>

#include "tessel/starpu.h"
#include "tessel/tessel.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "insitu_heat: ");                                                      \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

/* ---- the host's codelets (plain StarPU: its own, not tessel's) ---- */

typedef struct field_args {
    int32_t sample, h, w;
} field_args;

/* Field `sample` at time 0: two warm spots and a hot one, placed by the sample number. */
static void init_cpu(void *buffers[], void *arg)
{
    field_args a;
    starpu_codelet_unpack_args(arg, &a);
    float *u = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const float sigma2 = (float)(a.w * a.w) / 64.0f;
    const int cx[3] = {(a.sample * 7 + 3) % a.w, (a.sample * 13 + a.w / 2) % a.w,
                       (a.sample * 3 + 1) % a.w};
    const int cy[3] = {(a.sample * 5 + 2) % a.h, (a.sample * 11 + a.h / 3) % a.h,
                       (a.sample * 17 + a.h / 2) % a.h};
    const float peak[3] = {0.6f, 0.6f, 1.5f};
    for (int y = 0; y < a.h; y++)
        for (int x = 0; x < a.w; x++) {
            float v = 0;
            for (int k = 0; k < 3; k++) {
                float dx = (float)(x - cx[k]), dy = (float)(y - cy[k]);
                v += peak[k] * expf(-(dx * dx + dy * dy) / (2 * sigma2));
            }
            u[y * a.w + x] = v;
        }
}

/* One explicit diffusion step, u += 0.2 (sum of the 4 neighbours - 4 u), periodic. */
static void heat_step_cpu(void *buffers[], void *arg)
{
    field_args a;
    starpu_codelet_unpack_args(arg, &a);
    float *u = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    float *old = malloc(sizeof *old * (size_t)(a.h * a.w));
    if (!old)
        abort();
    memcpy(old, u, sizeof *old * (size_t)(a.h * a.w));
    for (int y = 0; y < a.h; y++)
        for (int x = 0; x < a.w; x++) {
            int up = (y + a.h - 1) % a.h, down = (y + 1) % a.h;
            int left = (x + a.w - 1) % a.w, right = (x + 1) % a.w;
            float c = old[y * a.w + x];
            float lap = old[up * a.w + x] + old[down * a.w + x] + old[y * a.w + left] +
                        old[y * a.w + right] - 4 * c;
            u[y * a.w + x] = c + 0.2f * lap;
        }
    free(old);
}

/* Bands of a field: 0 below 0.1, 1 below 0.4, 2 above; as u8 labels (the model's) and as
 * i64 (what an .npy dataset holds). */
static void bands_cpu(void *buffers[], void *arg)
{
    field_args a;
    starpu_codelet_unpack_args(arg, &a);
    const float *u = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    uint8_t *y8 = (uint8_t *)STARPU_VECTOR_GET_PTR(buffers[1]);
    int64_t *y64 = (int64_t *)STARPU_VECTOR_GET_PTR(buffers[2]);
    for (int i = 0; i < a.h * a.w; i++) {
        int band = u[i] < 0.1f ? 0 : u[i] < 0.4f ? 1 : 2;
        y8[i] = (uint8_t)band;
        y64[i] = band;
    }
}

static struct starpu_codelet init_cl = {
    .cpu_funcs = {init_cpu}, .nbuffers = 1, .modes = {STARPU_W}, .name = "heat_init"};
static struct starpu_codelet step_cl = {
    .cpu_funcs = {heat_step_cpu}, .nbuffers = 1, .modes = {STARPU_RW}, .name = "heat_step"};
static struct starpu_codelet bands_cl = {.cpu_funcs = {bands_cpu},
                                         .nbuffers = 3,
                                         .modes = {STARPU_R, STARPU_W, STARPU_W},
                                         .name = "heat_bands"};

/* One host task per field (tile s of each tensor), on the tile's owner. */
static void per_field(struct starpu_codelet *cl, int32_t fields, int32_t h, int32_t w,
                      tsl_tensor_t t0, tsl_tensor_t t1, tsl_tensor_t t2, MPI_Comm comm)
{
    for (int32_t s = 0; s < fields; s++) {
        field_args a = {s, h, w};
        starpu_data_handle_t h0, h1 = NULL, h2 = NULL;
        CHECK(tsl_tensor_tile_handle(t0, s, &h0) == TSL_OK, "tile handle");
        if (t1)
            CHECK(tsl_tensor_tile_handle(t1, s, &h1) == TSL_OK, "tile handle");
        if (t2)
            CHECK(tsl_tensor_tile_handle(t2, s, &h2) == TSL_OK, "tile handle");
        int ret =
            t1 ? starpu_mpi_task_insert(comm, cl, STARPU_R, h0, STARPU_W, h1, STARPU_W, h2,
                                        STARPU_VALUE, &a, sizeof a, 0)
               : starpu_mpi_task_insert(comm, cl, cl->modes[0], h0, STARPU_VALUE, &a, sizeof a, 0);
        CHECK(ret == 0, "starpu_mpi_task_insert: %d", ret);
    }
}

/* A tensor of `dims` with one tile per field, dealt over the ranks in blocks. */
static tsl_tensor_t field_tensor(tsl_context_t ctx, tsl_dtype dtype, int32_t ndim,
                                 const int64_t *dims)
{
    tsl_shape shape;
    CHECK(tsl_shape_make(&shape, ndim, dims) == TSL_OK, "shape");
    tsl_tile_grid grid = tsl_tile_grid_single();
    grid.splits[0] = (int32_t)dims[0];
    tsl_tensor_t t = NULL;
    CHECK(tsl_tensor_create(&t, ctx, dtype, &shape, &grid, NULL) == TSL_OK, "tensor: %s",
          tsl_last_error());
    return t;
}

static tsl_optimizer_t sgd(tsl_context_t ctx)
{
    tsl_sgd_config c;
    tsl_sgd_config_init(&c);
    c.lr = 0.05;
    c.momentum = 0.9;
    tsl_optimizer_t opt = NULL;
    CHECK(tsl_optimizer_create_sgd(&opt, ctx, &c) == TSL_OK, "optimizer: %s", tsl_last_error());
    return opt;
}

int main(int argc, char **argv)
{
    int32_t fields = 4, size = 32, every = 10, rounds = 5;
    char dir[512] = "";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--fields") == 0)
            fields = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--size") == 0)
            size = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--every") == 0)
            every = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--dir") == 0)
            snprintf(dir, sizeof dir, "%s", argv[i + 1]);
        else {
            fprintf(stderr, "usage: insitu_heat [--fields S] [--size N] [--every K] "
                            "[--rounds T] [--dir DIR]\n");
            return 2;
        }
    }
    if (fields < 1 || size < 8 || size % 8 || every < 1 || rounds < 1) {
        fprintf(stderr, "insitu_heat: fields >= 1, size a multiple of 8, every, rounds >= 1\n");
        return 2;
    }

    /* The host owns MPI, StarPU and StarPU-MPI. */
    int provided, rank, ranks;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    CHECK(provided == MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE unavailable");
    CHECK(starpu_mpi_init_conf(NULL, NULL, 0, MPI_COMM_WORLD, NULL) == 0, "StarPU start");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (rank == 0 && !dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/tessel-insitu-XXXXXX");
        CHECK(mkdtemp(dir), "mkdtemp");
    } else if (rank == 0) {
        mkdir(dir, 0755); /* (or it is there already) */
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);

    /* tessel attached, with StarPU-MPI tags of its own. */
    tsl_context_config cfg;
    tsl_context_config_init(&cfg);
    cfg.tag_base = 1000;
    cfg.tag_count = 1 << 20;
    tsl_context_t ctx;
    CHECK(tsl_context_attach(&ctx, MPI_COMM_WORLD, &cfg) == TSL_OK, "attach: %s", tsl_last_error());
    MPI_Comm comm;
    tsl_context_comm(ctx, &comm);

    const int64_t xdims[4] = {fields, 1, size, size}, ydims[3] = {fields, size, size};
    tsl_tensor_t u = field_tensor(ctx, TSL_F32, 4, xdims);
    tsl_tensor_t before = field_tensor(ctx, TSL_F32, 4, xdims);
    tsl_tensor_t bands8 = field_tensor(ctx, TSL_U8, 3, ydims);
    tsl_tensor_t bands64 = field_tensor(ctx, TSL_I64, 3, ydims);

    /* A small U-Net: the zoo's, on (1, N, N) fields, 3 classes. */
    tsl_graph_t g = NULL;
    CHECK(tsl_zoo_graph("unet2d", 3, xdims + 1, 3, &g) == TSL_OK, "%s", tsl_last_error());
    tsl_model_t model = NULL;
    CHECK(tsl_model_create(&model, ctx, g, 2026) == TSL_OK, "model: %s", tsl_last_error());
    CHECK(tsl_model_label_dtype(model) == TSL_U8, "3 classes are u8 labels");
    tsl_optimizer_t opt = sgd(ctx);

    per_field(&init_cl, fields, size, size, u, NULL, NULL, comm);
    CHECK(tsl_tensor_redistribute(before, u) == TSL_OK, "copy: %s", tsl_last_error());
    if (rank == 0)
        printf("insitu_heat: %d fields of %d x %d on %d ranks, training every %d steps, %d "
               "rounds (fields kept in %s)\n",
               (int)fields, (int)size, (int)size, ranks, (int)every, (int)rounds, dir);
    for (int32_t r = 0; r < rounds; r++) {
        for (int32_t k = 0; k < every; k++)
            per_field(&step_cl, fields, size, size, u, NULL, NULL, comm);
        per_field(&bands_cl, fields, size, size, u, bands8, bands64, comm);
        double loss = 0;
        int64_t correct = 0;
        CHECK(tsl_model_train_step_tensors(model, before, bands8, opt, &loss, &correct) == TSL_OK,
              "training: %s", tsl_context_last_error(ctx));
        /* The round's fields as .npy, for the check below. */
        char round[600], path[700];
        snprintf(round, sizeof round, "%s/round%d", dir, (int)r);
        if (rank == 0)
            mkdir(round, 0755);
        snprintf(path, sizeof path, "%s/x.npy", round);
        CHECK(tsl_tensor_write_npy(before, path, 0) == TSL_OK, "%s", tsl_context_last_error(ctx));
        snprintf(path, sizeof path, "%s/y.npy", round);
        CHECK(tsl_tensor_write_npy(bands64, path, 0) == TSL_OK, "%s", tsl_context_last_error(ctx));
        if (rank == 0)
            printf("round %d (step %d): loss %.4f, bands right %.1f%%\n", (int)r + 1,
                   (int)((r + 1) * every), loss,
                   100.0 * (double)correct / (double)(fields * size * size));
        CHECK(tsl_tensor_redistribute(before, u) == TSL_OK, "copy: %s", tsl_last_error());
    }

    /* The same rounds read back from the files into a second model of the same seed. */
    tsl_model_t again = NULL;
    CHECK(tsl_model_create(&again, ctx, g, 2026) == TSL_OK, "model: %s", tsl_last_error());
    tsl_optimizer_t opt2 = sgd(ctx);
    int64_t *order = malloc(sizeof *order * (size_t)fields);
    CHECK(order, "out of memory");
    for (int32_t s = 0; s < fields; s++)
        order[s] = s;
    for (int32_t r = 0; r < rounds; r++) {
        char spec[700];
        snprintf(spec, sizeof spec, "npy:%s/round%d,classes=3", dir, (int)r);
        tsl_dataset_t ds = NULL;
        CHECK(tsl_dataset_open(&ds, spec, TSL_SPLIT_TRAIN) == TSL_OK, "%s", tsl_last_error());
        CHECK(tsl_model_train_step_read(again, ds, fields, order, opt2, NULL, NULL) == TSL_OK,
              "training from the files: %s", tsl_context_last_error(ctx));
        tsl_dataset_destroy(ds);
    }
    int same = 1;
    for (int32_t i = 0; i < tsl_graph_param_count(g); i++) {
        tsl_tensor_t p, q;
        tsl_shape s;
        CHECK(tsl_model_param(model, i, &p, NULL) == TSL_OK &&
                  tsl_model_param(again, i, &q, NULL) == TSL_OK,
              "parameters");
        tsl_tensor_shape(p, &s);
        size_t n = (size_t)tsl_shape_numel(&s);
        float *a = rank == 0 ? malloc(sizeof *a * n) : NULL,
              *b = rank == 0 ? malloc(sizeof *b * n) : NULL;
        CHECK(rank != 0 || (a && b), "out of memory");
        CHECK(tsl_tensor_gather(p, 0, a) == TSL_OK && tsl_tensor_gather(q, 0, b) == TSL_OK,
              "gather");
        if (rank == 0 && memcmp(a, b, sizeof *a * n) != 0)
            same = 0;
        free(a);
        free(b);
    }
    MPI_Bcast(&same, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("in-situ training %s training on the saved fields, bit for bit\n",
               same ? "equals" : "DIFFERS from");

    free(order);
    tsl_optimizer_destroy(opt2);
    tsl_model_destroy(again);
    tsl_optimizer_destroy(opt);
    tsl_model_destroy(model);
    tsl_graph_destroy(g);
    tsl_tensor_destroy(u);
    tsl_tensor_destroy(before);
    tsl_tensor_destroy(bands8);
    tsl_tensor_destroy(bands64);
    tsl_context_destroy(ctx);
    /* The host goes on with StarPU after tessel left, then stops it. */
    starpu_mpi_shutdown();
    MPI_Finalize();
    return same ? 0 : 1;
}
