// The hdf5:FILE dataset against the same samples in an npy:DIR directory: the same shapes,
// classes and every box of every sample (x written as float64 and int32 labels in the HDF5 file,
// read as f32 and i64), for classification and per-voxel labels and both splits; other dataset
// names; float targets against the same targets in npy; and clear errors for a missing file or
// dataset, shapes that do not fit and labels outside classes=.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdlib>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "tessel/tessel.h"

namespace
{

class DatasetHdf5 : public ::testing::Test
{
  protected:
    void SetUp() override
    {
        char tmpl[] = "/tmp/tessel-hdf5-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir = tmpl;
        H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    }
    void TearDown() override
    {
        std::string cmd = "rm -rf '" + dir + "'";
        ASSERT_EQ(std::system(cmd.c_str()), 0);
    }
    // Dataset `name` of file `file` (created if need be) of `type`, shape `dims`, from `data`.
    void put(hid_t file, const char *name, hid_t type, const std::vector<hsize_t> &dims, hid_t mem,
             const void *data)
    {
        hid_t space = H5Screate_simple((int)dims.size(), dims.data(), nullptr);
        hid_t set = H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        ASSERT_GE(set, 0) << name;
        ASSERT_GE(H5Dwrite(set, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
        H5Dclose(set);
        H5Sclose(space);
    }
    // n samples of 2 x 5 x 7 (double) and labels (int32) per sample or per voxel, in the HDF5
    // file under `xname`/`yname` and, as f32/i64, in DIR/npy/x{suffix}.npy, y{suffix}.npy.
    void write_split(hid_t file, const std::string &suffix, const char *xname, const char *yname,
                     int64_t n, bool per_voxel, int64_t classes, uint64_t seed)
    {
        std::mt19937_64 rng(seed);
        std::normal_distribution<double> normal;
        std::vector<double> x64((size_t)n * 70);
        std::vector<float> x32(x64.size());
        for (size_t i = 0; i < x64.size(); i++) {
            x64[i] = normal(rng);
            x32[i] = (float)x64[i];
        }
        std::vector<int32_t> y32((size_t)(per_voxel ? n * 35 : n));
        std::vector<int64_t> y64(y32.size());
        for (size_t i = 0; i < y32.size(); i++)
            y64[i] = y32[i] = (int32_t)(rng() % (uint64_t)classes);
        y64[0] = y32[0] = (int32_t)classes - 1;
        std::vector<hsize_t> xd = {(hsize_t)n, 2, 5, 7}, yd = {(hsize_t)n};
        if (per_voxel)
            yd = {(hsize_t)n, 5, 7};
        put(file, xname, H5T_IEEE_F64LE, xd, H5T_NATIVE_DOUBLE, x64.data());
        put(file, yname, H5T_STD_I32LE, yd, H5T_NATIVE_INT32, y32.data());
        std::string npy = dir + "/npy";
        mkdir(npy.c_str(), 0755);
        tsl_shape xs, ys;
        const int64_t xdims[4] = {n, 2, 5, 7}, ydims[3] = {n, 5, 7};
        tsl_shape_make(&xs, 4, xdims);
        tsl_shape_make(&ys, per_voxel ? 3 : 1, ydims);
        ASSERT_EQ(tsl_npy_write((npy + "/x" + suffix + ".npy").c_str(), TSL_F32, &xs, x32.data()),
                  TSL_OK);
        ASSERT_EQ(tsl_npy_write((npy + "/y" + suffix + ".npy").c_str(), TSL_I64, &ys, y64.data()),
                  TSL_OK);
    }
    std::string file(const char *name) const
    {
        return dir + "/" + name;
    }
    std::string dir;
};

// Every box of a 2 x 5 x 7 sample set the same from both datasets.
void expect_same_boxes(tsl_dataset_t a, tsl_dataset_t b, int64_t n)
{
    tsl_dataset_info ia, ib;
    ASSERT_EQ(tsl_dataset_get_info(a, &ia), TSL_OK);
    ASSERT_EQ(tsl_dataset_get_info(b, &ib), TSL_OK);
    ASSERT_EQ(ia.samples, n);
    EXPECT_EQ(ia.samples, ib.samples);
    EXPECT_EQ(ia.classes, ib.classes);
    EXPECT_EQ(ia.label_shape.ndim, ib.label_shape.ndim);
    ASSERT_EQ(ia.sample_shape.ndim, 3);
    const int64_t boxes[3][2][3] = {
        {{0, 0, 0}, {2, 5, 7}}, {{1, 1, 2}, {1, 3, 4}}, {{0, 4, 6}, {2, 1, 1}}};
    for (int64_t i = 0; i < n; i++)
        for (const auto &box : boxes) {
            size_t count = (size_t)(box[1][0] * box[1][1] * box[1][2]);
            size_t labels = ia.label_shape.ndim ? (size_t)(box[1][1] * box[1][2]) : 1;
            std::vector<float> xa(count, -7), xb(count, -9);
            std::vector<int64_t> ya(labels, -7), yb(labels, -9);
            ASSERT_EQ(tsl_dataset_read_box(a, i, box[0], box[1], xa.data(), ya.data()), TSL_OK)
                << tsl_last_error();
            ASSERT_EQ(tsl_dataset_read_box(b, i, box[0], box[1], xb.data(), yb.data()), TSL_OK)
                << tsl_last_error();
            EXPECT_EQ(xa, xb) << "sample " << i;
            EXPECT_EQ(ya, yb) << "sample " << i;
        }
}

} // namespace

TEST_F(DatasetHdf5, ReadsTheSamplesAnNpyDirectoryHolds)
{
    for (bool per_voxel : {false, true}) {
        SCOPED_TRACE(per_voxel ? "labels per voxel" : "one label per sample");
        std::string cmd = "rm -rf '" + dir + "'/*";
        ASSERT_EQ(std::system(cmd.c_str()), 0);
        hid_t f = H5Fcreate(file("set.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        ASSERT_GE(f, 0);
        write_split(f, "", "x", "y", 6, per_voxel, 4, 11);
        write_split(f, "_test", "x_test", "y_test", 3, per_voxel, 4, 12);
        H5Fclose(f);
        for (tsl_split split : {TSL_SPLIT_TRAIN, TSL_SPLIT_TEST}) {
            tsl_dataset_t h5 = nullptr, npy = nullptr;
            ASSERT_EQ(tsl_dataset_open(&h5, ("hdf5:" + file("set.h5")).c_str(), split), TSL_OK)
                << tsl_last_error();
            ASSERT_EQ(tsl_dataset_open(&npy, ("npy:" + dir + "/npy").c_str(), split), TSL_OK)
                << tsl_last_error();
            expect_same_boxes(h5, npy, split == TSL_SPLIT_TRAIN ? 6 : 3);
            tsl_dataset_destroy(h5);
            tsl_dataset_destroy(npy);
        }
    }
}

TEST_F(DatasetHdf5, OtherDatasetNamesAndClasses)
{
    hid_t f = H5Fcreate(file("named.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    H5Gclose(H5Gcreate2(f, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    write_split(f, "", "train/images", "train/masks", 5, true, 3, 13);
    H5Fclose(f);
    tsl_dataset_t h5 = nullptr, npy = nullptr;
    std::string spec = "hdf5:" + file("named.h5") + ",x=train/images,y=train/masks,classes=6";
    ASSERT_EQ(tsl_dataset_open(&h5, spec.c_str(), TSL_SPLIT_TRAIN), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_dataset_open(&npy, ("npy:" + dir + "/npy,classes=6").c_str(), TSL_SPLIT_TRAIN),
              TSL_OK)
        << tsl_last_error();
    expect_same_boxes(h5, npy, 5);
    tsl_dataset_info info;
    tsl_dataset_get_info(h5, &info);
    EXPECT_EQ(info.classes, 6);
    tsl_dataset_destroy(h5);
    tsl_dataset_destroy(npy);
}

// Float targets (y of a float type: N x the output's shape): the same info and every box as the
// same targets in an npy directory (f64 in the file, f32 there), through
// tsl_dataset_read_target_box; the label calls refuse them.
TEST_F(DatasetHdf5, FloatTargetsMatchAnNpyDirectory)
{
    hid_t f = H5Fcreate(file("t.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const int64_t n = 5;
    write_split(f, "", "x", "labels", n, false, 3, 21); // x, and labels the targets replace
    std::mt19937_64 rng(22);
    std::normal_distribution<double> normal;
    std::vector<double> t64((size_t)(n * 3 * 5 * 7));
    std::vector<float> t32(t64.size());
    for (size_t i = 0; i < t64.size(); i++)
        t32[i] = (float)(t64[i] = normal(rng));
    put(f, "y", H5T_IEEE_F64LE, {(hsize_t)n, 3, 5, 7}, H5T_NATIVE_DOUBLE, t64.data());
    H5Fclose(f);
    tsl_shape ts;
    const int64_t tdims[4] = {n, 3, 5, 7};
    tsl_shape_make(&ts, 4, tdims);
    ASSERT_EQ(tsl_npy_write((dir + "/npy/y.npy").c_str(), TSL_F32, &ts, t32.data()), TSL_OK);
    tsl_dataset_t h5 = nullptr, npy = nullptr;
    ASSERT_EQ(tsl_dataset_open(&h5, ("hdf5:" + file("t.h5")).c_str(), TSL_SPLIT_TRAIN), TSL_OK)
        << tsl_last_error();
    ASSERT_EQ(tsl_dataset_open(&npy, ("npy:" + dir + "/npy").c_str(), TSL_SPLIT_TRAIN), TSL_OK)
        << tsl_last_error();
    tsl_dataset_info ia, ib;
    ASSERT_EQ(tsl_dataset_get_info(h5, &ia), TSL_OK);
    ASSERT_EQ(tsl_dataset_get_info(npy, &ib), TSL_OK);
    EXPECT_EQ(ia.targets, 1);
    EXPECT_EQ(ia.classes, 0);
    EXPECT_EQ(ia.samples, n);
    ASSERT_EQ(ia.label_shape.ndim, 3);
    for (int d = 0; d < 3; d++)
        EXPECT_EQ(ia.label_shape.dims[d], ib.label_shape.dims[d]);
    EXPECT_EQ(ia.label_numel, 105);
    const int64_t boxes[4][2][3] = {{{0, 0, 0}, {3, 5, 7}},
                                    {{1, 1, 2}, {2, 3, 4}},
                                    {{2, 4, 6}, {1, 1, 1}},
                                    {{0, 2, 0}, {3, 1, 7}}};
    for (int64_t i = 0; i < n; i++)
        for (const auto &box : boxes) {
            const size_t count = (size_t)(box[1][0] * box[1][1] * box[1][2]);
            std::vector<float> a(count, -7), b(count, -9);
            ASSERT_EQ(tsl_dataset_read_target_box(h5, i, box[0], box[1], a.data()), TSL_OK)
                << tsl_last_error();
            ASSERT_EQ(tsl_dataset_read_target_box(npy, i, box[0], box[1], b.data()), TSL_OK);
            EXPECT_EQ(a, b) << "sample " << i;
        }
    std::vector<float> x(70);
    std::vector<int64_t> y(35);
    const int64_t start[3] = {0, 0, 0}, whole[3] = {2, 5, 7}, outside[3] = {3, 5, 8};
    EXPECT_EQ(tsl_dataset_read_box(h5, 0, start, whole, x.data(), y.data()), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("float targets"), std::string::npos);
    EXPECT_EQ(tsl_dataset_read_target_box(h5, 0, start, outside, x.data()), TSL_ERR_INVALID_ARG);
    tsl_dataset_destroy(h5);
    tsl_dataset_destroy(npy);
    ASSERT_EQ(
        tsl_dataset_open(&h5, ("hdf5:" + file("t.h5") + ",y=labels").c_str(), TSL_SPLIT_TRAIN),
        TSL_OK); // integer y: class labels, which the target call refuses
    EXPECT_EQ(tsl_dataset_read_target_box(h5, 0, start, whole, x.data()), TSL_ERR_INVALID_ARG);
    tsl_dataset_destroy(h5);
}

TEST_F(DatasetHdf5, BadFilesAreClearErrors)
{
    hid_t f = H5Fcreate(file("bad.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    write_split(f, "", "x", "y", 4, false, 3, 14);
    std::vector<float> fy(4, 1.0f);
    put(f, "float_labels", H5T_IEEE_F32LE, {4}, H5T_NATIVE_FLOAT, fy.data());
    std::vector<int32_t> short_y(3, 1);
    put(f, "short_labels", H5T_STD_I32LE, {3}, H5T_NATIVE_INT32, short_y.data());
    std::vector<float> targets(4 * 5, 0.5f);
    put(f, "targets", H5T_IEEE_F32LE, {4, 1, 5}, H5T_NATIVE_FLOAT, targets.data());
    put(f, "short_targets", H5T_IEEE_F32LE, {2, 1, 10}, H5T_NATIVE_FLOAT, targets.data());
    H5Fclose(f);
    struct Bad {
        std::string spec;
        tsl_status status;
        const char *says;
    };
    const Bad bad[] = {
        {"hdf5:" + file("missing.h5"), TSL_ERR_IO, "cannot open"},
        {"hdf5:" + dir + "/npy/x.npy", TSL_ERR_IO, "not HDF5"},
        {"hdf5:" + file("bad.h5") + ",x=images", TSL_ERR_IO, "no dataset 'images'"},
        {"hdf5:" + file("bad.h5") + ",y=float_labels", TSL_ERR_SHAPE,
         "targets must be N x the output's shape"},
        {"hdf5:" + file("bad.h5") + ",y=targets,classes=3", TSL_ERR_INVALID_ARG,
         "classes= is for class labels"},
        {"hdf5:" + file("bad.h5") + ",x=y", TSL_ERR_DTYPE, "x must hold floats"},
        {"hdf5:" + file("bad.h5") + ",y=short_labels", TSL_ERR_SHAPE, "do not fit"},
        {"hdf5:" + file("bad.h5") + ",y=short_targets", TSL_ERR_SHAPE, "do not fit"},
        {"hdf5:" + file("bad.h5") + ",classes=2", TSL_ERR_FORMAT, "outside [0, 2)"},
        {"hdf5:" + file("bad.h5") + ",colour=red", TSL_ERR_INVALID_ARG, "colour"},
        {"hdf5", TSL_ERR_INVALID_ARG, "needs a file"},
    };
    for (const Bad &b : bad) {
        SCOPED_TRACE(b.spec);
        tsl_dataset_t ds = nullptr;
        EXPECT_EQ(tsl_dataset_open(&ds, b.spec.c_str(), TSL_SPLIT_TRAIN), b.status);
        EXPECT_EQ(ds, nullptr);
        EXPECT_NE(std::string(tsl_last_error()).find(b.says), std::string::npos)
            << tsl_last_error();
    }
    tsl_dataset_t ds = nullptr; // the test split's names are not in this file
    EXPECT_EQ(tsl_dataset_open(&ds, ("hdf5:" + file("bad.h5")).c_str(), TSL_SPLIT_TEST),
              TSL_ERR_IO);
    EXPECT_NE(std::string(tsl_last_error()).find("no dataset 'x_test'"), std::string::npos);
}
