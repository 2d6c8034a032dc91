// Tiled tensors under MPI: every layout (tile grid x owner map) must give the one-rank,
// one-tile result. Run by ctest at 1, 2 and 4 ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sched.h>
#include <string>
#include <unistd.h>
#include <vector>

#include "mpi_test_env.h"

using namespace tsltest;

namespace
{

struct Layout {
    std::string name;
    tsl_tile_grid grid;
    tsl_owner_map owners;
};

tsl_tile_grid grid_of(std::vector<int32_t> splits)
{
    tsl_tile_grid g = tsl_tile_grid_single();
    for (size_t d = 0; d < splits.size(); d++)
        g.splits[d] = splits[d];
    return g;
}

// Layouts for a shape: one tile, even and uneven grids, every kind of owner map.
std::vector<Layout> layouts_for(const tsl_shape &s)
{
    int n = s.ndim;
    std::vector<Layout> out;
    out.push_back({"one tile on rank 0", tsl_tile_grid_single(), tsl_owner_single(0)});
    out.push_back(
        {"one tile on the last rank", tsl_tile_grid_single(), tsl_owner_single(size - 1)});
    // Split the last dimension in 2 (or 1) and every other dimension as far as 3.
    std::vector<int32_t> even(n), uneven(n), fine(n);
    for (int d = 0; d < n; d++) {
        even[d] = d == n - 1 ? (int32_t)std::min<int64_t>(2, s.dims[d]) : 1;
        uneven[d] = (int32_t)std::min<int64_t>(3, s.dims[d]);
        fine[d] = d == n - 1 ? (int32_t)s.dims[d] : (int32_t)std::min<int64_t>(2, s.dims[d]);
    }
    out.push_back({"split last dim, linear blocks", grid_of(even), tsl_owner_block(nullptr)});
    int32_t pgrid[TSL_MAX_DIMS] = {0, 0, 0, 0, 0}, block[TSL_MAX_DIMS] = {1, 1, 1, 1, 1};
    for (int d = 0; d < n; d++)
        pgrid[d] = 1;
    pgrid[0] = size; // all ranks along the first dimension
    out.push_back(
        {"uneven 3-splits, process-grid blocks", grid_of(uneven), tsl_owner_block(pgrid)});
    int32_t cyc[TSL_MAX_DIMS] = {0, 0, 0, 0, 0};
    for (int d = 0; d < n; d++)
        cyc[d] = 1;
    cyc[n - 1] = size;
    out.push_back(
        {"uneven 3-splits, block-cyclic", grid_of(uneven), tsl_owner_block_cyclic(cyc, block)});
    out.push_back(
        {"finest last dim, round robin", grid_of(fine), tsl_owner_callback(round_robin, nullptr)});
    out.push_back(
        {"uneven 3-splits, reversed", grid_of(uneven), tsl_owner_callback(reversed, nullptr)});
    return out;
}

tsl_shape shape_of(std::vector<int64_t> dims)
{
    tsl_shape s;
    EXPECT_EQ(tsl_shape_make(&s, (int32_t)dims.size(), dims.data()), TSL_OK);
    return s;
}

// Random bytes of a valid array of `dtype` (floats finite), the same on every rank.
std::vector<unsigned char> random_array(tsl_dtype dtype, int64_t numel, uint64_t salt)
{
    std::mt19937_64 rng(seed ^ (salt * 0x9e3779b97f4a7c15ULL));
    std::vector<unsigned char> bytes((size_t)numel * tsl_dtype_size(dtype));
    std::uniform_real_distribution<double> mant(-1.0, 1.0);
    std::uniform_int_distribution<int> ex(-20, 20);
    for (int64_t i = 0; i < numel; i++) {
        switch (dtype) {
        case TSL_F32:
            ((float *)bytes.data())[i] = (float)std::ldexp(mant(rng), ex(rng));
            break;
        case TSL_F64:
            ((double *)bytes.data())[i] = std::ldexp(mant(rng), ex(rng));
            break;
        case TSL_I32:
            ((int32_t *)bytes.data())[i] = (int32_t)rng();
            break;
        case TSL_I64:
            ((int64_t *)bytes.data())[i] = (int64_t)rng();
            break;
        case TSL_U8:
            ((uint8_t *)bytes.data())[i] = (uint8_t)rng();
            break;
        }
    }
    return bytes;
}

struct Tensor {
    tsl_tensor_t t = nullptr;
    Tensor() = default;
    Tensor(tsl_dtype dtype, const tsl_shape &s, const Layout &l)
    {
        tsl_status st = tsl_tensor_create(&t, ctx, dtype, &s, &l.grid, &l.owners);
        EXPECT_EQ(st, TSL_OK) << l.name << ": " << tsl_context_last_error(ctx);
    }
    ~Tensor()
    {
        EXPECT_EQ(tsl_tensor_destroy(t), TSL_OK);
    }
    Tensor(const Tensor &) = delete;
    Tensor &operator=(const Tensor &) = delete;
    operator tsl_tensor_t() const
    {
        return t;
    }
};

// Gather to `root` into a buffer poisoned with 0xA5 so unwritten elements show.
std::vector<unsigned char> gather(tsl_tensor_t t, int root)
{
    tsl_shape s;
    tsl_dtype dt;
    tsl_tensor_shape(t, &s);
    tsl_tensor_dtype(t, &dt);
    std::vector<unsigned char> out((size_t)tsl_shape_numel(&s) * tsl_dtype_size(dt), 0xA5);
    EXPECT_EQ(tsl_tensor_gather(t, root, rank == root ? out.data() : nullptr), TSL_OK)
        << tsl_context_last_error(ctx);
    return out;
}

double quad_sum(const std::vector<unsigned char> &bytes, tsl_dtype dt)
{
    __float128 s = 0;
    size_t n = bytes.size() / tsl_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        switch (dt) {
        case TSL_F32:
            s += ((const float *)bytes.data())[i];
            break;
        case TSL_F64:
            s += ((const double *)bytes.data())[i];
            break;
        case TSL_I32:
            s += ((const int32_t *)bytes.data())[i];
            break;
        case TSL_U8:
            s += ((const uint8_t *)bytes.data())[i];
            break;
        default:
            break;
        }
    }
    return (double)s;
}

} // namespace

TEST(Context, Queries)
{
    int32_t r, s, ncpu, nany, owns;
    const char *sched = nullptr;
    ASSERT_EQ(tsl_context_rank(ctx, &r), TSL_OK);
    ASSERT_EQ(tsl_context_size(ctx, &s), TSL_OK);
    int mpi_rank, mpi_size;
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
    EXPECT_EQ(r, mpi_rank);
    EXPECT_EQ(s, mpi_size);
    ASSERT_EQ(tsl_context_worker_count(ctx, TSL_WORKER_CPU, &ncpu), TSL_OK);
    ASSERT_EQ(tsl_context_worker_count(ctx, TSL_WORKER_ANY, &nany), TSL_OK);
    EXPECT_GE(ncpu, 1);
    EXPECT_GE(nany, ncpu);
    ASSERT_EQ(tsl_context_owns_runtime(ctx, &owns), TSL_OK);
    EXPECT_EQ(owns, 1);
    ASSERT_EQ(tsl_context_scheduler(ctx, &sched), TSL_OK);
    ASSERT_NE(sched, nullptr);
    const char *env = std::getenv("STARPU_SCHED");
    if (env)
        EXPECT_STREQ(sched, env);
    EXPECT_EQ(tsl_context_rank(nullptr, &r), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_context_rank(ctx, nullptr), TSL_ERR_INVALID_ARG);
    EXPECT_STRNE(tsl_context_last_error(ctx), "");
    EXPECT_EQ(tsl_context_worker_count(ctx, (tsl_worker_kind)7, &ncpu), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_context_set_log_level(ctx, (tsl_log_level)9), TSL_ERR_INVALID_ARG);
    // A second owning context while StarPU runs is refused, not a crash.
    tsl_context_t second = nullptr;
    EXPECT_EQ(tsl_context_create(&second, nullptr), TSL_ERR_STATE);
    EXPECT_EQ(second, nullptr);
    EXPECT_NE(std::strstr(tsl_last_error(), "attach"), nullptr);
    tsl_context_config bad;
    tsl_context_config_init(&bad);
    bad.host_cache_bytes = TSL_HOST_CACHE_AUTO - 1;
    EXPECT_EQ(tsl_context_create(&second, &bad), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_last_error(), "host cache"), nullptr);
}

// Freed tiles go to the context's host cache and come back for a tile of the same size;
// a tile handed out again still starts as zeros, whatever its previous tensor held.
TEST(Context, HostCacheHandsFreedTilesOutAgain)
{
    int64_t kept = -1, reused0 = -1, allocated0 = -1, reused1 = -1, allocated1 = -1;
    EXPECT_EQ(tsl_context_host_cache(ctx, nullptr, &reused0, &allocated0), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_context_host_cache(ctx, &kept, nullptr, &allocated0), TSL_ERR_INVALID_ARG);
    ASSERT_EQ(tsl_context_host_cache(ctx, &kept, &reused0, &allocated0), TSL_OK);
    tsl_shape s = {2, {1000, 37}};
    tsl_tile_grid grid = tsl_tile_grid_single();
    grid.splits[0] = size;
    tsl_owner_map owners = tsl_owner_block(nullptr);
    for (int round = 0; round < 2; round++) {
        tsl_tensor_t t = nullptr;
        ASSERT_EQ(tsl_tensor_create(&t, ctx, TSL_F32, &s, &grid, &owners), TSL_OK);
        std::vector<float> out(rank == 0 ? 1000 * 37 : 0, -1.0f);
        ASSERT_EQ(tsl_tensor_gather(t, 0, rank == 0 ? out.data() : nullptr), TSL_OK);
        for (size_t i = 0; i < out.size(); i++)
            ASSERT_EQ(out[i], 0.0f) << "round " << round << " element " << i;
        ASSERT_EQ(tsl_tensor_fill_constant(t, 7.0), TSL_OK);
        ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
        ASSERT_EQ(tsl_tensor_destroy(t), TSL_OK);
    }
    ASSERT_EQ(tsl_context_host_cache(ctx, &kept, &reused1, &allocated1), TSL_OK);
    // Every round took a buffer through the cache (the harness's context keeps the default
    // one), and the second round's tile is the first round's buffer.
    EXPECT_GE(reused1 + allocated1 - reused0 - allocated0, 2);
    EXPECT_GE(reused1 - reused0, 1);
    EXPECT_GE(kept, 1000 / size * 37 * 4);
    EXPECT_LE(kept, 32 << 20); // the default limit
}

// StarPU's main-memory buffers are counted exactly: a rank's tile adds its bytes when the
// tensor is created and gives them back when it is destroyed; a one-tile copy gathered on rank
// 0 adds the whole tensor there; copies of remote tiles received for it are gone once the
// tensors are; the most at once covers what was held together.
TEST(Context, BufferBytesCountEveryTileAndReceivedCopy)
{
    int64_t in0 = -1, most0 = -1, in = -1, most = -1;
    EXPECT_EQ(tsl_context_buffer_bytes(ctx, nullptr, &most0), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_context_buffer_bytes(ctx, &in0, nullptr), TSL_ERR_INVALID_ARG);
    ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
    ASSERT_EQ(tsl_context_buffer_bytes(ctx, &in0, &most0), TSL_OK);
    EXPECT_GE(in0, 0);
    EXPECT_GE(most0, in0);
    const int64_t rows = 1200, cols = 53, whole = rows * cols * 4, mine = whole / size;
    tsl_shape s = {2, {rows, cols}};
    tsl_tile_grid grid = tsl_tile_grid_single();
    grid.splits[0] = size;
    tsl_tensor_t t = nullptr, copy = nullptr;
    ASSERT_EQ(tsl_tensor_create(&t, ctx, TSL_F32, &s, &grid, nullptr), TSL_OK);
    ASSERT_EQ(tsl_tensor_fill_constant(t, 3.0), TSL_OK);
    ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
    ASSERT_EQ(tsl_context_buffer_bytes(ctx, &in, &most), TSL_OK);
    EXPECT_EQ(in - in0, mine);
    EXPECT_GE(most, in);
    tsl_tile_grid one = tsl_tile_grid_single();
    tsl_owner_map on0 = tsl_owner_single(0);
    ASSERT_EQ(tsl_tensor_create(&copy, ctx, TSL_F32, &s, &one, &on0), TSL_OK);
    ASSERT_EQ(tsl_tensor_redistribute(copy, t), TSL_OK);
    ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
    std::vector<float> out(rank == 0 ? rows * cols : 0);
    ASSERT_EQ(tsl_tensor_gather(copy, 0, rank == 0 ? out.data() : nullptr), TSL_OK);
    for (size_t i = 0; i < out.size(); i++)
        ASSERT_EQ(out[i], 3.0f) << i;
    ASSERT_EQ(tsl_context_buffer_bytes(ctx, &in, &most), TSL_OK);
    EXPECT_GE(in - in0, mine + (rank == 0 ? whole : 0));
    EXPECT_GE(most - in0, mine + (rank == 0 ? whole : 0));
    ASSERT_EQ(tsl_tensor_destroy(copy), TSL_OK);
    ASSERT_EQ(tsl_tensor_destroy(t), TSL_OK);
    ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
    ASSERT_EQ(tsl_context_buffer_bytes(ctx, &in, &most), TSL_OK);
    EXPECT_EQ(in, in0) << "buffers left behind";
}

// Ranks on one node run their CPU workers on cores of their own (tsl_node_share(), whose rule
// the unit tests check for every node shape), unless the environment or the launcher binds
// them: with at least two cores per rank a run of cores each, with fewer (the harness's
// context yields idle threads, the default) one core each, spread evenly over the node.
TEST(Context, RanksOnANodeBindTheirWorkersToDifferentCores)
{
    for (const char *v : {"STARPU_WORKERS_CPUID", "STARPU_WORKERS_COREID", "STARPU_WORKERS_NOBIND"})
        if (getenv(v))
            GTEST_SKIP() << v << " is set";
    MPI_Comm node;
    ASSERT_EQ(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
              MPI_SUCCESS);
    int local = 0, nlocal = 1;
    MPI_Comm_rank(node, &local);
    MPI_Comm_size(node, &nlocal);
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t allowed;
    ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    if (cores > 64) { // (every rank of the node skips alike: collective calls stay matched)
        MPI_Comm_free(&node);
        GTEST_SKIP() << "more cores than the test's masks hold";
    }
    if (CPU_COUNT(&allowed) != cores) {
        MPI_Comm_free(&node);
        GTEST_SKIP() << "the launcher bound this rank to " << CPU_COUNT(&allowed) << " of " << cores
                     << " cores";
    }
    // This rank's workers' cores, as a bit set, next to every other rank's on the node.
    std::vector<int> ids(64);
    unsigned n = starpu_worker_get_ids_by_type(STARPU_CPU_WORKER, ids.data(), (unsigned)ids.size());
    uint64_t mask = 0;
    for (unsigned i = 0; i < n; i++) {
        int b = starpu_worker_get_bindid(ids[i]);
        ASSERT_GE(b, 0);
        ASSERT_LT(b, 64);
        mask |= (uint64_t)1 << b;
    }
    std::vector<uint64_t> masks((size_t)nlocal);
    MPI_Allgather(&mask, 1, MPI_UINT64_T, masks.data(), 1, MPI_UINT64_T, node);
    int workers = 0, mine = (int)n;
    MPI_Allreduce(&mine, &workers, 1, MPI_INT, MPI_SUM, node);
    MPI_Comm_free(&node);
    if (nlocal == 1)
        GTEST_SKIP() << "one rank on this node: StarPU's own binding";
    std::vector<int> on(64, 0);
    for (uint64_t m : masks)
        for (int c = 0; c < 64; c++)
            on[(size_t)c] += (int)((m >> c) & 1);
    int share = (workers + cores - 1) / cores; // workers of the node per core
    for (int c = 0; c < 64; c++)
        EXPECT_LE(on[(size_t)c], share) << "core " << c << " runs workers of " << on[(size_t)c]
                                        << " of the node's " << nlocal << " ranks";
    if (workers <= cores)
        for (int r = 0; r < nlocal; r++)
            if (r != local)
                EXPECT_EQ(masks[(size_t)r] & mask, 0u) << "ranks " << local << " and " << r;
}

// The harness's context initialised MPI with waiting threads yielding (the default): Open MPI
// then yields in its polling, which it reports through the MPI tools interface. Another MPI
// library, or a value set by the user, skips the check.
TEST(Context, OpenMpiYieldsWhenTesselInitialisedMpi)
{
    const char *user = std::getenv("OMPI_MCA_mpi_yield_when_idle");
    if (user && std::strcmp(user, "1") != 0)
        GTEST_SKIP() << "OMPI_MCA_mpi_yield_when_idle=" << user << " set by the user";
    int provided = 0;
    // (at the context's thread level: with MPI_THREAD_SINGLE here, a later tsl_context_attach
    // found MPI at a level below MPI_THREAD_MULTIPLE and refused)
    ASSERT_EQ(MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided), MPI_SUCCESS);
    int n = 0, found = -1, type_size = 0;
    ASSERT_EQ(MPI_T_cvar_get_num(&n), MPI_SUCCESS);
    for (int i = 0; i < n && found < 0; i++) {
        char name[256], desc[1024];
        int name_len = sizeof name, desc_len = sizeof desc, verbosity, bind, scope;
        MPI_Datatype type;
        MPI_T_enum enumtype;
        if (MPI_T_cvar_get_info(i, name, &name_len, &verbosity, &type, &enumtype, desc, &desc_len,
                                &bind, &scope) == MPI_SUCCESS &&
            std::strcmp(name, "mpi_yield_when_idle") == 0) {
            found = i;
            MPI_Type_size(type, &type_size); // a C bool (1 byte) or an int
        }
    }
    long long value = -1;
    if (found >= 0) {
        MPI_T_cvar_handle h;
        int count = 0;
        ASSERT_EQ(MPI_T_cvar_handle_alloc(found, nullptr, &h, &count), MPI_SUCCESS);
        ASSERT_EQ(count, 1);
        unsigned char buf[16] = {0};
        ASSERT_EQ(MPI_T_cvar_read(h, buf), MPI_SUCCESS);
        MPI_T_cvar_handle_free(&h);
        if (type_size == 1)
            value = buf[0];
        else if (type_size == (int)sizeof(int)) {
            int v;
            std::memcpy(&v, buf, sizeof v);
            value = v;
        }
    }
    MPI_T_finalize();
    if (found < 0)
        GTEST_SKIP() << "this MPI has no mpi_yield_when_idle variable";
    EXPECT_EQ(value, 1);
}

TEST(ScatterGather, RoundTripEveryLayoutAndDtype)
{
    struct Case {
        std::vector<int64_t> dims;
        std::vector<tsl_dtype> dtypes;
    };
    const Case cases[] = {
        {{37}, {TSL_F32, TSL_F64, TSL_I32, TSL_I64, TSL_U8}},
        {{5, 3, 17, 9}, {TSL_F32, TSL_U8}},
        {{2, 3, 4, 5, 6}, {TSL_F64}},
        {{4, 2, 16, 16}, {TSL_I32}},
    };
    uint64_t salt = 1;
    for (const Case &c : cases) {
        tsl_shape s = shape_of(c.dims);
        for (tsl_dtype dt : c.dtypes) {
            auto data = random_array(dt, tsl_shape_numel(&s), salt++);
            for (const Layout &l : layouts_for(s)) {
                Tensor t(dt, s, l);
                ASSERT_EQ(tsl_tensor_scatter(t, 0, rank == 0 ? data.data() : nullptr), TSL_OK);
                int root = size - 1;
                auto back = gather(t, root);
                if (rank == root)
                    EXPECT_EQ(back, data) << l.name << " dtype " << tsl_dtype_name(dt);
                // Scattered again (root's own tiles are written in place): no rank reads the
                // first values from a copy it kept.
                auto again = random_array(dt, tsl_shape_numel(&s), salt + 1000);
                ASSERT_EQ(tsl_tensor_scatter(t, 0, rank == 0 ? again.data() : nullptr), TSL_OK);
                back = gather(t, root);
                if (rank == root)
                    EXPECT_EQ(back, again) << l.name << " dtype " << tsl_dtype_name(dt);
            }
        }
    }
}

// Scattering again after other ranks read root's tiles (y's owners differ from x's; root's own
// tiles are written in place): the next read gets the new values.
TEST(ScatterGather, ScatterAgainReachesRanksThatReadTheTiles)
{
    // Small tiles go through staging copies, tiles of 1 MiB and more are written in place.
    for (tsl_shape s : {shape_of({4, 3, 10, 6}), shape_of({4, 4, 256, 256})})
        for (const Layout &l : layouts_for(s)) {
            Layout other = l;
            other.owners = tsl_owner_callback(reversed, nullptr);
            Tensor x(TSL_F32, s, l), y(TSL_F32, s, other);
            for (uint64_t k = 0; k < 2; k++) {
                auto data = random_array(TSL_F32, tsl_shape_numel(&s), 77 + k);
                ASSERT_EQ(tsl_tensor_scatter(x, 0, rank == 0 ? data.data() : nullptr), TSL_OK);
                ASSERT_EQ(tsl_tensor_fill_constant(y, 0.0), TSL_OK);
                ASSERT_EQ(tsl_tensor_axpy(y, 1.0, x), TSL_OK);
                auto back = gather(y, 0);
                if (rank == 0)
                    EXPECT_EQ(back, data) << l.name << " scatter " << k;
            }
        }
}

TEST(Elementwise, EveryLayoutGivesTheOneTileResult)
{
    tsl_shape s = shape_of({3, 2, 13, 11});
    for (tsl_dtype dt : {TSL_F32, TSL_F64}) {
        std::vector<std::vector<unsigned char>> results;
        for (const Layout &l : layouts_for(s)) {
            // y's owners differ from x's: StarPU-MPI must move x's tiles for axpy.
            Layout other = l;
            other.owners = tsl_owner_callback(reversed, nullptr);
            Tensor x(dt, s, l), y(dt, s, other), z(dt, s, l), p(dt, s, l);
            ASSERT_EQ(tsl_tensor_fill_uniform(x, seed, -1.0, 1.0), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_normal(y, seed + 1, 0.5, 2.0), TSL_OK);
            auto x0 = gather(x, 0), y0 = gather(y, 0);
            ASSERT_EQ(tsl_tensor_scale(x, 1.5), TSL_OK);
            ASSERT_EQ(tsl_tensor_axpy(y, -0.75, x), TSL_OK);
            ASSERT_EQ(tsl_tensor_add(z, x, y), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_constant(p, 1e30), TSL_OK); // poisoned
            ASSERT_EQ(tsl_tensor_mul(p, x, y), TSL_OK);
            auto zr = gather(z, 0), pr = gather(p, 0);
            if (rank == 0) {
                // Independent serial reference from the gathered inputs.
                size_t n = (size_t)tsl_shape_numel(&s);
                double max_rel = 0, max_rel_mul = 0;
                for (size_t i = 0; i < n; i++) {
                    double xv, yv, got, prod;
                    if (dt == TSL_F32) {
                        float xf = ((float *)x0.data())[i] * 1.5f;
                        float yf = ((float *)y0.data())[i] + -0.75f * xf;
                        xv = xf;
                        yv = yf;
                        got = ((float *)zr.data())[i];
                        prod = ((float *)pr.data())[i];
                    } else {
                        xv = ((double *)x0.data())[i] * 1.5;
                        yv = ((double *)y0.data())[i] + -0.75 * xv;
                        got = ((double *)zr.data())[i];
                        prod = ((double *)pr.data())[i];
                    }
                    double want = xv + yv;
                    max_rel = std::max(max_rel, std::fabs(got - want) / (std::fabs(want) + 1e-30));
                    max_rel_mul =
                        std::max(max_rel_mul, std::isnan(prod) ? 1.0
                                                               : std::fabs(prod - xv * yv) /
                                                                     (std::fabs(xv * yv) + 1e-30));
                }
                EXPECT_LT(max_rel, dt == TSL_F32 ? 1e-6 : 1e-14) << l.name;
                EXPECT_LT(max_rel_mul, dt == TSL_F32 ? 1e-6 : 1e-14) << l.name << " (mul)";
                results.push_back(zr);
            }
        }
        if (rank == 0)
            for (size_t i = 1; i < results.size(); i++)
                EXPECT_EQ(results[i], results[0]) << "layout " << i << " differs from one tile";
    }
}

TEST(Fill, IdenticalForEveryLayout)
{
    tsl_shape s = shape_of({4, 3, 7, 10});
    struct F {
        tsl_dtype dt;
        int mode; // 0 constant, 1 uniform, 2 normal
        double a, b;
    };
    const F fills[] = {{TSL_F32, 1, -3.0, 5.0}, {TSL_F64, 2, 1.0, 0.5},
                       {TSL_F32, 2, 0.0, 1.0},  {TSL_I32, 1, -100.0, 100.0},
                       {TSL_U8, 1, 0.0, 256.0}, {TSL_I64, 0, -7.0, -7.0},
                       {TSL_F64, 0, 2.25, 2.25}};
    for (const F &f : fills) {
        std::vector<unsigned char> first;
        for (const Layout &l : layouts_for(s)) {
            Tensor t(f.dt, s, l);
            tsl_status st = f.mode == 0   ? tsl_tensor_fill_constant(t, f.a)
                            : f.mode == 1 ? tsl_tensor_fill_uniform(t, seed, f.a, f.b)
                                          : tsl_tensor_fill_normal(t, seed, f.a, f.b);
            ASSERT_EQ(st, TSL_OK) << tsl_context_last_error(ctx);
            auto got = gather(t, 0);
            if (rank != 0)
                continue;
            if (first.empty())
                first = got;
            else
                EXPECT_EQ(got, first) << l.name << " dtype " << tsl_dtype_name(f.dt);
        }
        if (rank == 0 && f.mode == 1) { // values inside [low, high)
            size_t n = first.size() / tsl_dtype_size(f.dt);
            for (size_t i = 0; i < n; i++) {
                double v = f.dt == TSL_F32   ? ((float *)first.data())[i]
                           : f.dt == TSL_I32 ? ((int32_t *)first.data())[i]
                                             : ((uint8_t *)first.data())[i];
                ASSERT_GE(v, f.a);
                ASSERT_LT(v, f.b);
            }
        }
    }
}

TEST(Sum, BitIdenticalForEveryLayoutAndRankCount)
{
    tsl_shape s = shape_of({6, 5, 9, 7});
    uint64_t salt = 100;
    for (tsl_dtype dt : {TSL_F32, TSL_F64, TSL_I32, TSL_U8}) {
        auto data = random_array(dt, tsl_shape_numel(&s), salt++);
        // The exact sum rounded once: the same whatever the rank count, since every rank
        // count's run compares with this same reference.
        double want = quad_sum(data, dt);
        for (const Layout &l : layouts_for(s)) {
            Tensor t(dt, s, l);
            ASSERT_EQ(tsl_tensor_scatter(t, 0, rank == 0 ? data.data() : nullptr), TSL_OK);
            double got = NAN;
            ASSERT_EQ(tsl_tensor_sum(t, &got), TSL_OK) << tsl_context_last_error(ctx);
            EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
                << l.name << " " << tsl_dtype_name(dt) << ": " << got << " vs " << want;
            double lo = got, hi = got; // every rank holds the same value
            MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            EXPECT_EQ(lo, hi);
        }
    }
    Tensor big(TSL_I64, s, layouts_for(s)[2]);
    double unused;
    EXPECT_EQ(tsl_tensor_sum(big, &unused), TSL_ERR_DTYPE);
}

TEST(Redistribute, PreservesEveryElementBetweenAnyTwoLayouts)
{
    tsl_shape s = shape_of({5, 3, 11, 8});
    auto data = random_array(TSL_F64, tsl_shape_numel(&s), 777);
    auto layouts = layouts_for(s);
    for (const Layout &from : layouts) {
        Tensor src(TSL_F64, s, from);
        ASSERT_EQ(tsl_tensor_scatter(src, 0, rank == 0 ? data.data() : nullptr), TSL_OK);
        for (const Layout &to : layouts) {
            Tensor dst(TSL_F64, s, to);
            ASSERT_EQ(tsl_tensor_fill_constant(dst, -12345.0), TSL_OK); // poison
            ASSERT_EQ(tsl_tensor_redistribute(dst, src), TSL_OK) << tsl_context_last_error(ctx);
            auto got = gather(dst, size - 1);
            if (rank == size - 1)
                EXPECT_EQ(got, data) << from.name << " -> " << to.name;
        }
        // The source is untouched.
        auto again = gather(src, 0);
        if (rank == 0)
            EXPECT_EQ(again, data) << from.name;
    }
}

TEST(Memory, RankHoldsOnlyItsOwnTiles)
{
    tsl_shape s = shape_of({8, 4, 20, 12});
    int64_t total_bytes = tsl_shape_numel(&s) * 4;
    for (const Layout &l : layouts_for(s)) {
        int64_t before = 0, after = 0;
        tsl_context_owned_bytes(ctx, &before);
        {
            Tensor t(TSL_F32, s, l);
            int64_t ntiles = 0, expect_owned = 0, expect_count = 0;
            tsl_tensor_tile_count(t, &ntiles);
            for (int64_t i = 0; i < ntiles; i++) {
                int32_t owner;
                int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
                ASSERT_EQ(tsl_tensor_tile_info(t, i, nullptr, &owner, start, extent), TSL_OK);
                if (owner != rank)
                    continue;
                int64_t n = 1;
                for (int d = 0; d < s.ndim; d++)
                    n *= extent[d];
                expect_owned += n * 4;
                expect_count++;
            }
            int64_t owned_bytes = -1, owned = -1, allocated = -1;
            ASSERT_EQ(tsl_tensor_owned_bytes(t, &owned_bytes), TSL_OK);
            ASSERT_EQ(tsl_tensor_local_tiles(t, &owned, &allocated), TSL_OK);
            EXPECT_EQ(owned_bytes, expect_owned) << l.name;
            EXPECT_EQ(owned, expect_count) << l.name;
            EXPECT_EQ(allocated, owned) << l.name << ": memory for tiles of other ranks";
            int64_t sum = 0;
            MPI_Allreduce(&owned_bytes, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
            EXPECT_EQ(sum, total_bytes) << l.name;
            int64_t ctx_bytes = 0;
            tsl_context_owned_bytes(ctx, &ctx_bytes);
            EXPECT_EQ(ctx_bytes - before, owned_bytes);
            // Work that stays on owners keeps it that way.
            ASSERT_EQ(tsl_tensor_fill_uniform(t, seed, 0, 1), TSL_OK);
            ASSERT_EQ(tsl_tensor_scale(t, 2.0), TSL_OK);
            ASSERT_EQ(tsl_tensor_wait(t), TSL_OK);
            ASSERT_EQ(tsl_tensor_local_tiles(t, &owned, &allocated), TSL_OK);
            EXPECT_EQ(allocated, owned) << l.name;
        }
        tsl_context_owned_bytes(ctx, &after);
        EXPECT_EQ(after, before);
    }
}

TEST(Placement, TasksRunOnTileOwners)
{
    tsl_shape s = shape_of({4, 2, 9, 9});
    for (const Layout &l : layouts_for(s)) {
        Tensor where(TSL_I32, s, l);
        ASSERT_EQ(tsl_tensor_mark_placement(where), TSL_OK);
        auto marks = gather(where, 0);
        if (rank != 0)
            continue;
        int64_t ntiles;
        tsl_tensor_tile_count(where, &ntiles);
        int64_t strides[TSL_MAX_DIMS], st = 1;
        for (int d = s.ndim - 1; d >= 0; d--) {
            strides[d] = st;
            st *= s.dims[d];
        }
        for (int64_t i = 0; i < ntiles; i++) {
            int32_t owner;
            int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
            tsl_tensor_tile_info(where, i, nullptr, &owner, start, extent);
            int64_t first = 0;
            for (int d = 0; d < s.ndim; d++)
                first += start[d] * strides[d];
            EXPECT_EQ(((int32_t *)marks.data())[first] / 1000, owner) << l.name << " tile " << i;
        }
    }
}

TEST(Npy, ThroughTensorsOnEveryLayout)
{
    char dir[256] = "";
    if (rank == 0) {
        std::strcpy(dir, "/tmp/tessel-mpi-npy-XXXXXX");
        ASSERT_NE(mkdtemp(dir), nullptr);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    std::string in = std::string(dir) + "/in.npy", out = std::string(dir) + "/out.npy";
    tsl_shape s = shape_of({3, 4, 10, 7});
    auto data = random_array(TSL_F32, tsl_shape_numel(&s), 4242);
    if (rank == 0)
        ASSERT_EQ(tsl_npy_write(in.c_str(), TSL_F32, &s, data.data()), TSL_OK);
    for (const Layout &l : layouts_for(s)) {
        tsl_tensor_t t = nullptr;
        ASSERT_EQ(tsl_tensor_read_npy(&t, ctx, in.c_str(), 0, &l.grid, &l.owners), TSL_OK)
            << tsl_context_last_error(ctx);
        auto got = gather(t, 0);
        if (rank == 0)
            EXPECT_EQ(got, data) << l.name;
        int root = size - 1;
        ASSERT_EQ(tsl_tensor_write_npy(t, out.c_str(), root), TSL_OK)
            << tsl_context_last_error(ctx);
        if (rank == root) {
            tsl_npy_header h;
            void *back = nullptr;
            ASSERT_EQ(tsl_npy_read(out.c_str(), &h, &back), TSL_OK);
            EXPECT_EQ(std::memcmp(back, data.data(), data.size()), 0) << l.name;
            tsl_free(back);
        }
        tsl_tensor_destroy(t);
    }
    // Errors found on root reach every rank with root's message, and leave no tensor.
    tsl_tensor_t t = nullptr;
    std::string missing = std::string(dir) + "/missing.npy";
    EXPECT_EQ(tsl_tensor_read_npy(&t, ctx, missing.c_str(), 0, nullptr, nullptr), TSL_ERR_IO);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "missing.npy"), nullptr);
    EXPECT_EQ(t, nullptr);
    std::string bad = std::string(dir) + "/bad.npy";
    if (rank == 0) {
        FILE *f = std::fopen(bad.c_str(), "wb");
        std::fputs("\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'}  \n", f);
        std::fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ(tsl_tensor_read_npy(&t, ctx, bad.c_str(), 0, nullptr, nullptr), TSL_ERR_FORMAT);
    EXPECT_STRNE(tsl_context_last_error(ctx), "");
    tsl_tile_grid too_fine = grid_of({4, 1, 1, 1}); // 4 tiles along a dimension of 3
    EXPECT_EQ(tsl_tensor_read_npy(&t, ctx, in.c_str(), 0, &too_fine, nullptr), TSL_ERR_SHAPE);
    EXPECT_EQ(t, nullptr);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        std::string cmd = std::string("rm -rf '") + dir + "'";
        EXPECT_EQ(std::system(cmd.c_str()), 0);
    }
}

TEST(Errors, BadInputGetsAStatusAndAMessage)
{
    tsl_shape s = shape_of({4, 3, 8});
    tsl_tile_grid g = grid_of({2, 1, 2});
    tsl_tensor_t t = nullptr;
    auto expect_error = [](tsl_status got, tsl_status want, const char *what) {
        EXPECT_EQ(got, want) << what;
        EXPECT_STRNE(tsl_last_error(), "") << what;
    };
    tsl_shape bad_shape = s;
    bad_shape.dims[1] = 0;
    expect_error(tsl_tensor_create(&t, ctx, TSL_F32, &bad_shape, &g, nullptr), TSL_ERR_SHAPE,
                 "zero dimension");
    expect_error(tsl_tensor_create(&t, ctx, (tsl_dtype)9, &s, &g, nullptr), TSL_ERR_DTYPE,
                 "bad dtype");
    tsl_tile_grid too_fine = grid_of({5, 1, 1});
    expect_error(tsl_tensor_create(&t, ctx, TSL_F32, &s, &too_fine, nullptr), TSL_ERR_SHAPE,
                 "more tiles than elements");
    tsl_owner_map beyond = tsl_owner_single(size);
    expect_error(tsl_tensor_create(&t, ctx, TSL_F32, &s, &g, &beyond), TSL_ERR_SHAPE,
                 "owner outside the ranks");
    int32_t big_grid[TSL_MAX_DIMS] = {size + 1, 1, 1, 0, 0};
    tsl_owner_map too_many = tsl_owner_block(big_grid);
    expect_error(tsl_tensor_create(&t, ctx, TSL_F32, &s, &g, &too_many), TSL_ERR_SHAPE,
                 "process grid larger than the world");
    expect_error(tsl_tensor_create(&t, nullptr, TSL_F32, &s, &g, nullptr), TSL_ERR_INVALID_ARG,
                 "no context");
    expect_error(tsl_tensor_create(nullptr, ctx, TSL_F32, &s, &g, nullptr), TSL_ERR_INVALID_ARG,
                 "no output");
    EXPECT_EQ(t, nullptr);

    Tensor a(TSL_F32, s, {"g", g, tsl_owner_block(nullptr)});
    Tensor other_grid(TSL_F32, s, {"single", tsl_tile_grid_single(), tsl_owner_single(0)});
    Tensor doubles(TSL_F64, s, {"g", g, tsl_owner_block(nullptr)});
    Tensor labels(TSL_I32, s, {"g", g, tsl_owner_block(nullptr)});
    tsl_shape s2 = shape_of({4, 3, 9});
    Tensor other_shape(TSL_F32, s2, {"single", tsl_tile_grid_single(), tsl_owner_single(0)});
    expect_error(tsl_tensor_axpy(a, 1.0, other_grid), TSL_ERR_SHAPE, "axpy across grids");
    expect_error(tsl_tensor_axpy(a, 1.0, doubles), TSL_ERR_DTYPE, "axpy across dtypes");
    expect_error(tsl_tensor_add(a, a, other_shape), TSL_ERR_SHAPE, "add across shapes");
    expect_error(tsl_tensor_scale(labels, 2.0), TSL_ERR_DTYPE, "scale of integers");
    expect_error(tsl_tensor_redistribute(a, other_shape), TSL_ERR_SHAPE, "redistribute shapes");
    expect_error(tsl_tensor_redistribute(a, doubles), TSL_ERR_DTYPE, "redistribute dtypes");
    expect_error(tsl_tensor_scatter(a, size, nullptr), TSL_ERR_INVALID_ARG, "scatter root");
    expect_error(tsl_tensor_scatter(a, 0, nullptr), TSL_ERR_INVALID_ARG, "scatter without data");
    expect_error(tsl_tensor_gather(a, -1, nullptr), TSL_ERR_INVALID_ARG, "gather root");
    expect_error(tsl_tensor_fill_uniform(a, 1, 2.0, 1.0), TSL_ERR_INVALID_ARG, "low > high");
    expect_error(tsl_tensor_fill_normal(a, 1, 0.0, -1.0), TSL_ERR_INVALID_ARG, "negative stddev");
    expect_error(tsl_tensor_fill_constant(a, NAN), TSL_ERR_INVALID_ARG, "NaN fill");
    expect_error(tsl_tensor_fill_constant(labels, 1e12), TSL_ERR_INVALID_ARG, "out of i32 range");
    expect_error(tsl_tensor_fill_normal(labels, 1, 0, 1), TSL_ERR_DTYPE, "normal integers");
    expect_error(tsl_tensor_mark_placement(a), TSL_ERR_DTYPE, "placement into f32");
    expect_error(tsl_tensor_sum(a, nullptr), TSL_ERR_INVALID_ARG, "sum without output");
    expect_error(tsl_tensor_tile_info(a, 99, nullptr, nullptr, nullptr, nullptr),
                 TSL_ERR_INVALID_ARG, "tile out of range");
    expect_error(tsl_tensor_scale(nullptr, 1.0), TSL_ERR_INVALID_ARG, "NULL tensor");
    expect_error(tsl_tensor_write_npy(a, nullptr, 0), TSL_ERR_INVALID_ARG, "NULL path");
    // Nothing above changed the tensor: it still holds zeros and works.
    double sum = -1;
    EXPECT_EQ(tsl_tensor_sum(a, &sum), TSL_OK);
    EXPECT_EQ(sum, 0.0);
    EXPECT_EQ(tsl_tensor_destroy(nullptr), TSL_OK);
}

TEST(Attach, SecondContextOnTheSameRuntimeWithItsOwnTags)
{
    tsl_context_config cfg;
    tsl_context_config_init(&cfg);
    cfg.ncpu = 1;
    tsl_context_t attached = nullptr;
    EXPECT_EQ(tsl_context_attach(&attached, MPI_COMM_WORLD, &cfg), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_last_error(), "host"), nullptr);
    tsl_context_config_init(&cfg);
    cfg.tag_base = 1000;
    cfg.tag_count = 3;
    ASSERT_EQ(tsl_context_attach(&attached, MPI_COMM_WORLD, &cfg), TSL_OK);
    int32_t owns = 1;
    tsl_context_owns_runtime(attached, &owns);
    EXPECT_EQ(owns, 0);
    tsl_shape s = shape_of({4, 8});
    tsl_tile_grid four = grid_of({2, 2}), two = grid_of({2, 1});
    tsl_tensor_t t = nullptr;
    EXPECT_EQ(tsl_tensor_create(&t, attached, TSL_F32, &s, &four, nullptr), TSL_ERR_RESOURCE);
    EXPECT_NE(std::strstr(tsl_context_last_error(attached), "tags"), nullptr);
    ASSERT_EQ(tsl_tensor_create(&t, attached, TSL_F32, &s, &two, nullptr), TSL_OK);
    ASSERT_EQ(tsl_tensor_fill_constant(t, 0.5), TSL_OK);
    double sum = 0;
    EXPECT_EQ(tsl_tensor_sum(t, &sum), TSL_ERR_RESOURCE); // needs 2 more tags, 1 is left
    std::vector<float> host(32, 1.0f);
    EXPECT_EQ(tsl_tensor_scatter(t, 0, host.data()), TSL_ERR_RESOURCE);
    int64_t used = 0;
    tsl_context_tags_used(attached, &used);
    EXPECT_EQ(used, 2);
    EXPECT_EQ(tsl_context_wait(attached), TSL_OK);
    EXPECT_EQ(tsl_context_destroy(attached), TSL_OK); // destroys t too; StarPU keeps running
    // The owning context still works.
    Tensor u(TSL_F32, s, {"two", two, tsl_owner_block(nullptr)});
    ASSERT_EQ(tsl_tensor_fill_constant(u, 0.25), TSL_OK);
    ASSERT_EQ(tsl_tensor_sum(u, &sum), TSL_OK);
    EXPECT_EQ(sum, 8.0);
}

TEST(Elementwise, AliasedOperands)
{
    tsl_shape s = shape_of({3, 4, 7});
    for (const Layout &l : layouts_for(s)) {
        Tensor x(TSL_F64, s, l), y(TSL_F64, s, l);
        ASSERT_EQ(tsl_tensor_fill_uniform(x, seed, -1.0, 1.0), TSL_OK);
        ASSERT_EQ(tsl_tensor_fill_uniform(y, seed + 9, -1.0, 1.0), TSL_OK);
        auto x0 = gather(x, 0), y0 = gather(y, 0);
        ASSERT_EQ(tsl_tensor_add(y, y, x), TSL_OK);    // y = y + x
        ASSERT_EQ(tsl_tensor_axpy(x, 1.0, x), TSL_OK); // x = 2 x
        ASSERT_EQ(tsl_tensor_add(x, x, x), TSL_OK);    // x = 4 x
        auto x1 = gather(x, 0), y1 = gather(y, 0);
        if (rank != 0)
            continue;
        const double *xa = (const double *)x0.data(), *ya = (const double *)y0.data();
        const double *xb = (const double *)x1.data(), *yb = (const double *)y1.data();
        for (size_t i = 0; i < x0.size() / 8; i++) {
            ASSERT_EQ(yb[i], ya[i] + xa[i]) << l.name << " " << i;
            ASSERT_EQ(xb[i], 4 * xa[i]) << l.name << " " << i;
        }
    }
}

static int32_t reverse_round_robin(const int32_t *tile, int32_t ndim, const tsl_tile_grid *grid,
                                   int32_t nranks, void *)
{
    int64_t linear = 0;
    for (int d = 0; d < ndim; d++)
        linear = linear * grid->splits[d] + tile[d];
    return (int32_t)(nranks - 1 - linear % nranks);
}

// Packed traffic for many small tensors: tsl_tensors_sum_rows equals the sum of each source's
// rows for one-tile destinations on every rank (packed per owner) and a sharded one (reduced
// as tsl_tensor_sum_rows does), moving each rank's partial sums across ranks once; then
// tsl_tensors_redistribute copies each one-tile value into a one-tile copy on every rank
// (packed per source owner) and a channels-last tensor into a plain one (copied alone), every
// copy exact. Bad pairs are errors before anything runs.
TEST(Tensor, PackedSumsAndCopiesOfManySmallTensors)
{
    const int64_t rows_per_rank = 2, P = rows_per_rank * size, K = 80; // packs of > 31 pieces
    std::vector<tsl_tensor_t> src, dst;
    std::vector<std::vector<float>> in;
    std::mt19937_64 gen(seed + 91);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    int64_t total = 0;
    for (int64_t k = 0; k < K; k++) {
        std::vector<int64_t> shape = {1 + 5 * k % 13, 1 + k % 3};
        int32_t shards = k == K - 1 ? std::min<int32_t>(size + 1, (int32_t)shape[0]) : 1;
        // One-tile destinations on owners unrelated to their order; the last one sharded.
        tsl_owner_map where = shards > 1 ? tsl_owner_callback(reverse_round_robin, nullptr)
                                         : tsl_owner_single((int32_t)((k * 5 + 1) % size));
        dst.push_back(make_tensor(TSL_F32, shape, {shards, 1}, where));
        src.push_back(make_tensor(TSL_F32, {P, shape[0], shape[1]}, {(int32_t)P, 1, 1},
                                  tsl_owner_block(nullptr)));
        in.emplace_back((size_t)(P * shape[0] * shape[1]));
        for (float &v : in.back())
            v = u(gen);
        ASSERT_EQ(tsl_tensor_scatter(src.back(), 0, rank == 0 ? in.back().data() : nullptr),
                  TSL_OK);
        ASSERT_EQ(tsl_tensor_fill_constant(dst.back(), 1e30), TSL_OK); // poison
        total += shape[0] * shape[1];
    }
    ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
    int64_t sent0, recv0, sent1, recv1;
    ASSERT_EQ(tsl_context_comm_bytes(ctx, &sent0, &recv0), TSL_OK);
    ASSERT_EQ(tsl_tensors_sum_rows((int32_t)K, dst.data(), src.data()), TSL_OK)
        << tsl_context_last_error(ctx);
    ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
    ASSERT_EQ(tsl_context_comm_bytes(ctx, &sent1, &recv1), TSL_OK);
    for (int64_t k = 0; k < K; k++) {
        std::vector<float> got = gather_all({dst[(size_t)k]})[0];
        int64_t numel = (int64_t)got.size();
        for (int64_t j = 0; rank == 0 && j < numel; j++) {
            double ref = 0;
            for (int64_t p = 0; p < P; p++)
                ref += in[(size_t)k][(size_t)(p * numel + j)];
            ASSERT_NEAR(got[(size_t)j], ref, 1e-5 * (1 + std::fabs(ref)))
                << "tensor " << k << ", element " << j;
        }
    }
    int64_t mine = sent1 - sent0, moved = 0;
    MPI_Allreduce(&mine, &moved, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_LE(moved, (size - 1) * total * 4);
    if (size > 1)
        EXPECT_GT(moved, 0);

    // Copies: every one-tile sum onto every rank, one source twice, and a layout change.
    std::vector<tsl_tensor_t> to, from;
    for (int64_t k = 0; k + 1 < K; k++)
        for (int32_t r = 0; r < size; r++) {
            std::vector<int64_t> shape = {1 + 5 * k % 13, 1 + k % 3};
            to.push_back(make_tensor(TSL_F32, shape, {1, 1}, tsl_owner_single(r)));
            from.push_back(dst[(size_t)k]);
        }
    tsl_tensor_t last = make_tensor(TSL_F32, {2, 3, 4, 5}, {1, 1, 1, 1}, tsl_owner_single(size - 1),
                                    TSL_LAYOUT_CHANNELS_LAST);
    tsl_tensor_t plain = make_tensor(TSL_F32, {2, 3, 4, 5}, {2, 1, 1, 1}, tsl_owner_block(nullptr));
    ASSERT_EQ(tsl_tensor_fill_uniform(last, seed, -1, 1), TSL_OK);
    to.push_back(plain);
    from.push_back(last);
    for (tsl_tensor_t t : to)
        ASSERT_EQ(tsl_tensor_fill_constant(t, 1e30), TSL_OK);
    ASSERT_EQ(tsl_tensors_redistribute((int32_t)to.size(), to.data(), from.data()), TSL_OK)
        << tsl_context_last_error(ctx);
    for (size_t i = 0; i < to.size(); i++) {
        auto both = gather_all({to[i], from[i]});
        if (rank == 0)
            ASSERT_EQ(both[0], both[1]) << "pair " << i;
    }

    // Misfits: shapes, a destination twice, a bad count; nothing is submitted.
    tsl_tensor_t odd = make_tensor(TSL_F32, {3, 3}, {1, 1}, tsl_owner_single(0));
    ASSERT_EQ(tsl_tensor_fill_constant(to[0], -7), TSL_OK);
    tsl_tensor_t bad_to[2] = {to[0], odd}, bad_from[2] = {from[0], from[1]};
    EXPECT_EQ(tsl_tensors_redistribute(2, bad_to, bad_from), TSL_ERR_SHAPE);
    std::vector<float> kept = gather_all({to[0]})[0];
    if (rank == 0)
        for (float v : kept)
            ASSERT_EQ(v, -7.0f);
    tsl_tensor_t twice[2] = {dst[0], dst[0]}, rows2[2] = {src[0], src[0]};
    EXPECT_EQ(tsl_tensors_sum_rows(2, twice, rows2), TSL_ERR_INVALID_ARG);
    tsl_tensor_t mixed[2] = {dst[0], dst[1]};
    EXPECT_EQ(tsl_tensors_sum_rows(2, mixed, rows2), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_tensors_sum_rows(-1, mixed, rows2), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_tensors_redistribute(0, nullptr, nullptr), TSL_OK);
    for (tsl_tensor_t t : to)
        tsl_tensor_destroy(t);
    for (size_t k = 0; k < dst.size(); k++) {
        tsl_tensor_destroy(dst[k]);
        tsl_tensor_destroy(src[k]);
    }
    tsl_tensor_destroy(last);
    tsl_tensor_destroy(odd);
}

// Sum over rows, reduce-scatter by placement: dst (uneven shards) equals the sum of src's rows
// (rows on every rank, several per rank), and each rank's piece of a row crosses ranks once.
// Two rows per rank go through cut pieces and trees; one row per rank through views of the
// rows sent as they are (each rank's row crossing once per shard it does not own).
TEST(Tensor, SumRowsReducesRowsOntoShardOwners)
{
    const std::vector<int64_t> shapes[] = {{7, 5}, {13}, {3, 2, 4}};
    for (int64_t rows_per_rank : {2, 1})
        for (const auto &shape : shapes) {
            const int64_t P = rows_per_rank * size;
            for (int64_t shards : {(int64_t)1, std::min<int64_t>(shape[0], size + 1)}) {
                SCOPED_TRACE("rows per rank " + std::to_string(rows_per_rank) + ", shape[0] " +
                             std::to_string(shape[0]) + ", shards " + std::to_string(shards));
                std::vector<int64_t> sdims = {P};
                sdims.insert(sdims.end(), shape.begin(), shape.end());
                std::vector<int32_t> ssplits(sdims.size(), 1), dsplits(shape.size(), 1);
                ssplits[0] = (int32_t)P;
                dsplits[0] = (int32_t)shards;
                tsl_tensor_t src = make_tensor(TSL_F32, sdims, ssplits, tsl_owner_block(nullptr));
                // Shards dealt from the last rank down, so trees end away from rank 0 too.
                tsl_tensor_t dst = make_tensor(TSL_F32, shape, dsplits,
                                               tsl_owner_callback(reverse_round_robin, nullptr));
                int64_t numel = 1;
                for (int64_t d : shape)
                    numel *= d;
                std::vector<float> in((size_t)(P * numel));
                std::mt19937_64 gen(seed + 77);
                std::uniform_real_distribution<float> u(-1.0f, 1.0f);
                for (float &v : in)
                    v = u(gen);
                ASSERT_EQ(tsl_tensor_scatter(src, 0, rank == 0 ? in.data() : nullptr), TSL_OK);
                ASSERT_EQ(tsl_tensor_fill_constant(dst, 1e30), TSL_OK); // poison
                ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
                int64_t sent0, recv0, sent1, recv1;
                ASSERT_EQ(tsl_context_comm_bytes(ctx, &sent0, &recv0), TSL_OK);
                ASSERT_EQ(tsl_tensor_sum_rows(dst, src), TSL_OK) << tsl_context_last_error(ctx);
                ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
                ASSERT_EQ(tsl_context_comm_bytes(ctx, &sent1, &recv1), TSL_OK);
                std::vector<float> got = gather_all({dst})[0];
                if (rank == 0) {
                    for (int64_t j = 0; j < numel; j++) {
                        double ref = 0;
                        for (int64_t p = 0; p < P; p++)
                            ref += in[(size_t)(p * numel + j)];
                        ASSERT_NEAR(got[(size_t)j], ref, 1e-5 * (1 + std::fabs(ref)))
                            << "element " << j;
                    }
                }
                // Each rank's partial sum of a shard crosses ranks once: at most (size - 1) whole
                // tensors in all (less where a rank holds no piece), never a gathered sum.
                int64_t mine = sent1 - sent0, total = 0;
                MPI_Allreduce(&mine, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
                EXPECT_LE(total, (size - 1) * numel * 4);
                if (size > 1)
                    EXPECT_GT(total, 0);
                if (rows_per_rank == 1 && shards > 1) // every view of every row but the owner's
                    EXPECT_EQ(total, (size - 1) * numel * 4);
                tsl_tensor_destroy(src);
                tsl_tensor_destroy(dst);
            }
        }
    // Misfits are errors before anything runs.
    tsl_tensor_t a = make_tensor(TSL_F32, {2, 6}, {1, 1}, tsl_owner_single(0));
    tsl_tensor_t b = make_tensor(TSL_F32, {6}, {2}, tsl_owner_single(0));
    tsl_tensor_t c = make_tensor(TSL_F32, {5}, {1}, tsl_owner_single(0));
    EXPECT_EQ(tsl_tensor_sum_rows(b, a), TSL_ERR_SHAPE); // rows not one tile each
    tsl_tensor_t a2 = make_tensor(TSL_F32, {2, 6}, {2, 1}, tsl_owner_single(0));
    EXPECT_EQ(tsl_tensor_sum_rows(c, a2), TSL_ERR_SHAPE); // sizes differ
    EXPECT_EQ(tsl_tensor_sum_rows(b, a2), TSL_OK);
    for (tsl_tensor_t t : {a, b, c, a2})
        tsl_tensor_destroy(t);
}

// The critical path of traced tasks follows the tiles' dependencies across the ranks: tasks
// chained on one tile (a fill, then in-place scalings) have the sum of their times as the
// path; a fill of tiles dealt round the ranks has its longest task as the path, below the sum;
// a trace that saw more tasks than its limit gives none.
TEST(Trace, CriticalPathFollowsTheTiles)
{
    double critical = -1, total = -1;
    EXPECT_EQ(tsl_context_trace_critical_path(ctx, &critical, &total), TSL_ERR_INVALID_ARG);
    tsl_shape s = {2, {(int64_t)(4 * size), 20000}};
    tsl_tile_grid grid = tsl_tile_grid_single();
    grid.splits[0] = 4 * size;
    tsl_owner_map rr = tsl_owner_callback(round_robin, nullptr);
    tsl_tensor_t spread = nullptr, one = nullptr;
    ASSERT_EQ(tsl_tensor_create(&spread, ctx, TSL_F32, &s, &grid, &rr), TSL_OK);
    tsl_tile_grid single = tsl_tile_grid_single();
    ASSERT_EQ(tsl_tensor_create(&one, ctx, TSL_F32, &s, &single, nullptr), TSL_OK);

    ASSERT_EQ(tsl_context_trace_begin(ctx, 1 << 20), TSL_OK);
    ASSERT_EQ(tsl_tensor_fill_constant(one, 1.0), TSL_OK);
    for (int k = 0; k < 6; k++)
        ASSERT_EQ(tsl_tensor_scale(one, 1.0001), TSL_OK);
    ASSERT_EQ(tsl_context_trace_critical_path(ctx, &critical, &total), TSL_OK)
        << tsl_context_last_error(ctx);
    EXPECT_GT(total, 0);
    EXPECT_DOUBLE_EQ(critical, total) << "a chain of 7 tasks on one tile";

    ASSERT_EQ(tsl_context_trace_begin(ctx, 1 << 20), TSL_OK);
    ASSERT_EQ(tsl_tensor_fill_constant(spread, 2.0), TSL_OK);
    ASSERT_EQ(tsl_context_trace_critical_path(ctx, &critical, &total), TSL_OK)
        << tsl_context_last_error(ctx);
    EXPECT_GT(critical, 0);
    EXPECT_LT(critical, total) << 4 * size << " independent tiles";
    EXPECT_GE(critical * 4 * size, total * (1 - 1e-12)); // the longest is at least the mean
    // Then a chain on each tile: every tile's path is its own, the longest the whole.
    for (int k = 0; k < 3; k++)
        ASSERT_EQ(tsl_tensor_scale(spread, 0.5), TSL_OK);
    double critical2 = -1, total2 = -1;
    ASSERT_EQ(tsl_context_trace_critical_path(ctx, &critical2, &total2), TSL_OK);
    EXPECT_GT(total2, total);
    EXPECT_GE(critical2, critical);
    EXPECT_LT(critical2, total2);
    EXPECT_EQ(tsl_context_trace_write(ctx, "/dev/null"), TSL_OK) << tsl_context_last_error(ctx);
    // A trace keeps as many submissions as events: past that, no critical path (on every rank).
    ASSERT_EQ(tsl_context_trace_begin(ctx, 3), TSL_OK);
    for (int k = 0; k < 5; k++)
        ASSERT_EQ(tsl_tensor_scale(one, 1.0), TSL_OK);
    EXPECT_EQ(tsl_context_trace_critical_path(ctx, &critical, &total), TSL_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "limit"), nullptr);
    EXPECT_EQ(tsl_context_trace_write(ctx, "/dev/null"), TSL_OK);
    tsl_tensor_destroy(spread);
    tsl_tensor_destroy(one);
}
