// Datasets and the batch loader (src/data/): Fashion-MNIST checked
// against the raw files read here with zlib, malformed IDX files, the synthetic set, `.npy`
// directories, the epoch order against the documented generator, and the prefetching loader
// against synchronous reads.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#include "tessel/tessel.h"
#include "../target_storage.h"

namespace
{

using Bytes = std::vector<uint8_t>;

uint64_t test_seed()
{
    static const uint64_t seed = [] {
        const char *fixed = std::getenv("TESSEL_TEST_SEED");
        uint64_t s = fixed ? std::strtoull(fixed, nullptr, 10)
                           : (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count();
        std::printf("dataset tests: seed %llu (set TESSEL_TEST_SEED to repeat)\n",
                    (unsigned long long)s);
        return s;
    }();
    return seed;
}

// A whole gzip file, decompressed here with zlib: the reference the dataset is checked against.
Bytes gunzip(const std::string &path)
{
    gzFile file = gzopen(path.c_str(), "rb");
    EXPECT_NE(file, nullptr) << path;
    Bytes out;
    if (!file)
        return out;
    std::vector<uint8_t> chunk(1 << 20);
    int got;
    while ((got = gzread(file, chunk.data(), (unsigned)chunk.size())) > 0)
        out.insert(out.end(), chunk.begin(), chunk.begin() + got);
    EXPECT_EQ(got, 0) << path;
    gzclose(file);
    return out;
}

uint32_t big_endian(const Bytes &b, size_t at)
{
    return (uint32_t)b[at] << 24 | (uint32_t)b[at + 1] << 16 | (uint32_t)b[at + 2] << 8 | b[at + 3];
}

// An IDX file of unsigned bytes: magic 00 00 08 ndim, big-endian sizes, the payload.
Bytes idx_file(const std::vector<uint32_t> &dims, const Bytes &payload, uint8_t type = 0x08)
{
    Bytes out = {0, 0, type, (uint8_t)dims.size()};
    for (uint32_t d : dims)
        for (int shift = 24; shift >= 0; shift -= 8)
            out.push_back((uint8_t)(d >> shift));
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

float normalised(uint8_t pixel)
{
    return (float)(((double)pixel / 255.0 - 0.2860) / 0.3530);
}

tsl_status open_dataset(tsl_dataset_t *ds, const std::string &spec, tsl_split split)
{
    *ds = nullptr;
    return tsl_dataset_open(ds, spec.c_str(), split);
}

// Open must fail with `status` and a message that contains `needle`.
void expect_open_error(const std::string &spec, tsl_split split, tsl_status status,
                       const std::string &needle)
{
    tsl_dataset_t ds = nullptr;
    EXPECT_EQ(tsl_dataset_open(&ds, spec.c_str(), split), status) << spec;
    EXPECT_EQ(ds, nullptr);
    EXPECT_NE(std::string(tsl_last_error()).find(needle), std::string::npos)
        << spec << ": message '" << tsl_last_error() << "' lacks '" << needle << "'";
}

struct Batch {
    std::vector<float> x;
    std::vector<int64_t> y;
};

Batch read(tsl_dataset_t ds, const std::vector<int64_t> &indices)
{
    tsl_dataset_info info;
    EXPECT_EQ(tsl_dataset_get_info(ds, &info), TSL_OK);
    Batch b;
    b.x.assign(indices.size() * (size_t)info.sample_numel, NAN);
    b.y.assign(indices.size() * (size_t)info.label_numel, -7);
    EXPECT_EQ(tsl_dataset_read(ds, indices.data(), (int64_t)indices.size(), b.x.data(), b.y.data()),
              TSL_OK)
        << tsl_last_error();
    return b;
}

std::vector<int64_t> iota(int64_t n)
{
    std::vector<int64_t> v((size_t)n);
    for (int64_t i = 0; i < n; i++)
        v[(size_t)i] = i;
    return v;
}

class TempDir : public ::testing::Test
{
  protected:
    void SetUp() override
    {
        char tmpl[] = "/tmp/tessel-data-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir = tmpl;
    }
    void TearDown() override
    {
        std::string cmd = "rm -rf '" + dir + "'";
        ASSERT_EQ(std::system(cmd.c_str()), 0);
    }
    std::string path(const std::string &name) const
    {
        return dir + "/" + name;
    }
    void write_raw(const std::string &name, const Bytes &bytes) const
    {
        FILE *f = std::fopen(path(name).c_str(), "wb");
        ASSERT_NE(f, nullptr);
        if (!bytes.empty())
            ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
        std::fclose(f);
    }
    void write_gz(const std::string &name, const Bytes &bytes) const
    {
        gzFile f = gzopen(path(name).c_str(), "wb");
        ASSERT_NE(f, nullptr);
        ASSERT_EQ(gzwrite(f, bytes.data(), (unsigned)bytes.size()), (int)bytes.size());
        ASSERT_EQ(gzclose(f), Z_OK);
    }
    Bytes read_raw(const std::string &name) const
    {
        FILE *f = std::fopen(path(name).c_str(), "rb");
        EXPECT_NE(f, nullptr);
        Bytes out;
        int c;
        while (f && (c = std::fgetc(f)) != EOF)
            out.push_back((uint8_t)c);
        if (f)
            std::fclose(f);
        return out;
    }
    std::string dir;
};

// ---------------------------------------------------------------- Fashion-MNIST, the real files

const char *fashion_dir = "/usr/share/datasets/fashion-mnist";

// The dataset against the raw files: shapes, labels, exact normalised pixels, statistics.
void check_fashion_split(tsl_split split, const char *prefix, int64_t samples,
                         const std::vector<int64_t> &first_labels)
{
    tsl_dataset_t ds;
    ASSERT_EQ(open_dataset(&ds, "fashion-mnist", split), TSL_OK) << tsl_last_error();
    tsl_dataset_info info;
    ASSERT_EQ(tsl_dataset_get_info(ds, &info), TSL_OK);
    EXPECT_EQ(info.samples, samples);
    EXPECT_EQ(info.classes, 10);
    ASSERT_EQ(info.sample_shape.ndim, 3);
    EXPECT_EQ(info.sample_shape.dims[0], 1);
    EXPECT_EQ(info.sample_shape.dims[1], 28);
    EXPECT_EQ(info.sample_shape.dims[2], 28);
    EXPECT_EQ(info.label_shape.ndim, 0);
    EXPECT_EQ(info.sample_numel, 784);
    EXPECT_EQ(info.label_numel, 1);

    std::string base = std::string(fashion_dir) + "/" + prefix;
    Bytes images = gunzip(base + "-images-idx3-ubyte.gz");
    Bytes labels = gunzip(base + "-labels-idx1-ubyte.gz");
    ASSERT_EQ(images.size(), 16 + (size_t)samples * 784);
    ASSERT_EQ(labels.size(), 8 + (size_t)samples);
    ASSERT_EQ(big_endian(images, 0), 0x803u);
    ASSERT_EQ(big_endian(labels, 0), 0x801u);

    // Every sample, in batches: exact values and labels against the raw bytes.
    std::vector<int64_t> counts(10, 0);
    int64_t wrong_labels = 0, wrong_values = 0;
    double sum = 0, sum_sq = 0, raw_sum = 0, raw_sum_sq = 0;
    const int64_t batch = 5000;
    for (int64_t first = 0; first < samples; first += batch) {
        std::vector<int64_t> indices((size_t)batch);
        for (int64_t i = 0; i < batch; i++)
            indices[(size_t)i] = first + i;
        Batch b = read(ds, indices);
        for (int64_t i = 0; i < batch; i++) {
            int64_t label = b.y[(size_t)i];
            wrong_labels += label != labels[8 + (size_t)(first + i)];
            ASSERT_TRUE(label >= 0 && label < 10);
            counts[(size_t)label]++;
        }
        for (size_t k = 0; k < b.x.size(); k++) {
            uint8_t pixel = images[16 + (size_t)first * 784 + k];
            wrong_values += b.x[k] != normalised(pixel);
            sum += b.x[k];
            sum_sq += (double)b.x[k] * b.x[k];
            raw_sum += pixel / 255.0;
            raw_sum_sq += (pixel / 255.0) * (pixel / 255.0);
        }
    }
    EXPECT_EQ(wrong_labels, 0);
    EXPECT_EQ(wrong_values, 0);
    for (size_t i = 0; i < first_labels.size(); i++)
        EXPECT_EQ(labels[8 + i], first_labels[i]) << "label " << i;
    for (int c = 0; c < 10; c++)
        EXPECT_EQ(counts[(size_t)c], samples / 10) << "class " << c; // both splits are balanced
    double n = (double)samples * 784;
    double raw_mean = raw_sum / n, raw_std = std::sqrt(raw_sum_sq / n - raw_mean * raw_mean);
    double mean = sum / n, std_dev = std::sqrt(sum_sq / n - mean * mean);
    if (split == TSL_SPLIT_TRAIN) {
        // The documented constants are the training set's statistics...
        EXPECT_NEAR(raw_mean, TSL_FASHION_MNIST_MEAN, 5e-5);
        EXPECT_NEAR(raw_std, TSL_FASHION_MNIST_STD, 5e-5);
        // ...so the normalised training set has mean 0 and standard deviation 1.
        EXPECT_NEAR(mean, 0.0, 2e-4);
        EXPECT_NEAR(std_dev, 1.0, 2e-4);
    } else {
        EXPECT_NEAR(mean, (raw_mean - 0.2860) / 0.3530, 1e-5);
        EXPECT_NEAR(std_dev, raw_std / 0.3530, 1e-5);
    }
    EXPECT_EQ(tsl_dataset_destroy(ds), TSL_OK);
}

TEST(DatasetFashionMnist, TrainSplitMatchesTheRawFiles)
{
    check_fashion_split(TSL_SPLIT_TRAIN, "train", 60000, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
}

TEST(DatasetFashionMnist, TestSplitIsTheT10kFiles)
{
    check_fashion_split(TSL_SPLIT_TEST, "t10k", 10000, {9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
}

// ---------------------------------------------------------------- IDX files made here

class DatasetIdx : public TempDir
{
  protected:
    // A valid small Fashion-MNIST-like train split: n images of 28 x 28 and n labels.
    void write_valid(int n, bool compressed = true)
    {
        std::mt19937 rng(1234); // incompressible, so the gzip streams are long
        images.assign((size_t)n * 784, 0);
        for (uint8_t &pixel : images)
            pixel = (uint8_t)rng();
        labels.clear();
        for (int i = 0; i < n; i++)
            labels.push_back((uint8_t)(i * 3 % 10));
        Bytes image_file = idx_file({(uint32_t)n, 28, 28}, images);
        Bytes label_file = idx_file({(uint32_t)n}, labels);
        if (compressed) {
            write_gz("train-images-idx3-ubyte.gz", image_file);
            write_gz("train-labels-idx1-ubyte.gz", label_file);
        } else {
            write_raw("train-images-idx3-ubyte", image_file);
            write_raw("train-labels-idx1-ubyte", label_file);
        }
    }
    std::string spec() const
    {
        return "fashion-mnist:dir=" + dir;
    }
    void expect_error(tsl_status status, const std::string &needle) const
    {
        expect_open_error(spec(), TSL_SPLIT_TRAIN, status, needle);
    }
    Bytes images, labels;
};

TEST_F(DatasetIdx, AnotherDirectoryCompressedOrNot)
{
    for (bool compressed : {true, false}) {
        SCOPED_TRACE(compressed ? "gzip" : "plain");
        std::system(("rm -f '" + dir + "'/*").c_str());
        write_valid(7, compressed);
        for (const std::string &s : {spec(), "fashion-mnist:" + dir}) {
            tsl_dataset_t ds;
            ASSERT_EQ(open_dataset(&ds, s, TSL_SPLIT_TRAIN), TSL_OK) << tsl_last_error();
            tsl_dataset_info info;
            ASSERT_EQ(tsl_dataset_get_info(ds, &info), TSL_OK);
            EXPECT_EQ(info.samples, 7);
            Batch b = read(ds, {6, 0, 6});
            const int64_t order[3] = {6, 0, 6};
            for (int i = 0; i < 3; i++) {
                EXPECT_EQ(b.y[(size_t)i], labels[(size_t)order[i]]);
                for (int k = 0; k < 784; k++)
                    ASSERT_EQ(b.x[(size_t)i * 784 + k],
                              normalised(images[(size_t)order[i] * 784 + k]));
            }
            tsl_dataset_destroy(ds);
        }
    }
    // The test split is missing here.
    expect_open_error(spec(), TSL_SPLIT_TEST, TSL_ERR_IO, "t10k-images-idx3-ubyte.gz");
}

TEST_F(DatasetIdx, MissingDirectory)
{
    expect_open_error("fashion-mnist:dir=/nonexistent/fmnist", TSL_SPLIT_TRAIN, TSL_ERR_IO,
                      "dataset-fashion-mnist");
}

TEST_F(DatasetIdx, WrongMagic)
{
    write_valid(3);
    write_gz("train-images-idx3-ubyte.gz", idx_file({3, 28, 28}, images, 0x0d)); // floats
    expect_error(TSL_ERR_FORMAT, "type 0x0d");
    write_gz("train-images-idx3-ubyte.gz", idx_file({3, 784}, images)); // 2 dimensions
    expect_error(TSL_ERR_FORMAT, "2 dimensions; want 3");
    Bytes bad = idx_file({3, 28, 28}, images);
    bad[0] = 0x1f;
    write_gz("train-images-idx3-ubyte.gz", bad);
    expect_error(TSL_ERR_FORMAT, "not an IDX file");
    write_valid(3);
    write_gz("train-labels-idx1-ubyte.gz", idx_file({3, 28, 28}, images)); // images as labels
    expect_error(TSL_ERR_FORMAT, "3 dimensions; want 1");
}

TEST_F(DatasetIdx, GarbageThatIsNotGzip)
{
    write_valid(3);
    const char *text = "this is neither gzip nor IDX, just some text in a file\n";
    write_raw("train-images-idx3-ubyte.gz", Bytes(text, text + std::strlen(text)));
    expect_error(TSL_ERR_FORMAT, "not gzip-compressed either");
    write_raw("train-images-idx3-ubyte.gz", Bytes());
    expect_error(TSL_ERR_FORMAT, "truncated");
}

TEST_F(DatasetIdx, TruncatedData)
{
    write_valid(4);
    Bytes short_file = idx_file({4, 28, 28}, images);
    short_file.resize(short_file.size() - 100);
    write_gz("train-images-idx3-ubyte.gz", short_file);
    expect_error(TSL_ERR_FORMAT, "truncated");
    write_gz("train-images-idx3-ubyte.gz", Bytes{0, 0, 8, 3, 0, 0}); // inside the sizes
    expect_error(TSL_ERR_FORMAT, "truncated");
    write_gz("train-images-idx3-ubyte.gz", idx_file({0, 28, 28}, {}));
    expect_error(TSL_ERR_FORMAT, "empty");
    Bytes long_file = idx_file({4, 28, 28}, images);
    long_file.push_back(1);
    write_gz("train-images-idx3-ubyte.gz", long_file);
    expect_error(TSL_ERR_FORMAT, "more than");
}

TEST_F(DatasetIdx, TruncatedAndCorruptGzipStreams)
{
    write_valid(40);
    Bytes whole = read_raw("train-images-idx3-ubyte.gz");
    ASSERT_GT(whole.size(), 30000u);

    Bytes cut(whole.begin(), whole.begin() + (long)whole.size() / 2);
    write_raw("train-images-idx3-ubyte.gz", cut);
    expect_error(TSL_ERR_FORMAT, "gzip stream ends early");

    Bytes no_trailer(whole.begin(), whole.end() - 4); // the length field is missing
    write_raw("train-images-idx3-ubyte.gz", no_trailer);
    expect_error(TSL_ERR_FORMAT, "gzip");

    Bytes bad_crc = whole;
    bad_crc[bad_crc.size() - 6] ^= 0xff; // inside the CRC-32 of the trailer
    write_raw("train-images-idx3-ubyte.gz", bad_crc);
    expect_error(TSL_ERR_FORMAT, "corrupt");

    Bytes scrambled = whole;
    for (size_t k = whole.size() / 2; k < whole.size() / 2 + 40; k++)
        scrambled[k] = (uint8_t)(scrambled[k] * 131 + 17);
    write_raw("train-images-idx3-ubyte.gz", scrambled);
    expect_error(TSL_ERR_FORMAT, "gzip");
}

TEST_F(DatasetIdx, LabelsDoNotFitTheImages)
{
    write_valid(5);
    write_gz("train-labels-idx1-ubyte.gz", idx_file({4}, Bytes{1, 2, 3, 4}));
    expect_error(TSL_ERR_SHAPE, "holds 4 labels but");
    write_gz("train-labels-idx1-ubyte.gz", idx_file({5}, Bytes{1, 2, 10, 4, 5}));
    expect_error(TSL_ERR_FORMAT, "label 10 of sample 2");
}

// ---------------------------------------------------------------- specs

TEST(DatasetSpecs, BadSpecsAreClearErrors)
{
    const tsl_split train = TSL_SPLIT_TRAIN;
    expect_open_error("mnist", train, TSL_ERR_INVALID_ARG, "unknown dataset 'mnist'");
    expect_open_error("synthetic:colour=red", train, TSL_ERR_INVALID_ARG, "unknown key 'colour'");
    expect_open_error("synthetic:dims=4", train, TSL_ERR_INVALID_ARG, "dims must be");
    expect_open_error("synthetic:size=abc", train, TSL_ERR_INVALID_ARG, "got 'abc'");
    expect_open_error("synthetic:size=12x", train, TSL_ERR_INVALID_ARG, "size must be");
    expect_open_error("synthetic:classes=1", train, TSL_ERR_INVALID_ARG, "classes must be");
    expect_open_error("synthetic:seed=-3", train, TSL_ERR_INVALID_ARG, "seed must be");
    expect_open_error("synthetic:noise=nan", train, TSL_ERR_INVALID_ARG, "noise must be");
    expect_open_error("synthetic:dims=3,size=2000", train, TSL_ERR_INVALID_ARG, "too large");
    expect_open_error("synthetic:dims=2,dims=3", train, TSL_ERR_INVALID_ARG, "given twice");
    expect_open_error("synthetic:dims=2,", train, TSL_ERR_INVALID_ARG, "empty option");
    expect_open_error("synthetic:size=", train, TSL_ERR_INVALID_ARG, "empty option");
    expect_open_error("synthetic:/data", train, TSL_ERR_INVALID_ARG, "key=value options only");
    expect_open_error("synthetic:dims=2,3", train, TSL_ERR_INVALID_ARG, "not key=value");
    expect_open_error("fashion-mnist:dir=/x,size=3", train, TSL_ERR_INVALID_ARG,
                      "unknown key 'size'");
    expect_open_error("npy", train, TSL_ERR_INVALID_ARG, "npy needs a directory");
    expect_open_error("npy:/nonexistent-dir-xyz", train, TSL_ERR_IO, "x.npy");
    tsl_dataset_t ds = nullptr;
    EXPECT_EQ(tsl_dataset_open(&ds, nullptr, train), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_open(nullptr, "synthetic", train), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_open(&ds, "synthetic", (tsl_split)7), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(ds, nullptr);
    EXPECT_EQ(tsl_dataset_destroy(nullptr), TSL_OK);
}

// ---------------------------------------------------------------- synthetic

TEST(DatasetSynthetic, ShapesForOneTwoAndThreeDimensions)
{
    for (int dims = 1; dims <= 3; dims++) {
        tsl_dataset_t ds;
        std::string spec =
            "synthetic:dims=" + std::to_string(dims) + ",size=12,samples=5,classes=4,channels=2";
        ASSERT_EQ(open_dataset(&ds, spec, TSL_SPLIT_TRAIN), TSL_OK) << tsl_last_error();
        tsl_dataset_info info;
        ASSERT_EQ(tsl_dataset_get_info(ds, &info), TSL_OK);
        EXPECT_EQ(info.samples, 5);
        EXPECT_EQ(info.classes, 4);
        ASSERT_EQ(info.sample_shape.ndim, dims + 1);
        ASSERT_EQ(info.label_shape.ndim, dims);
        EXPECT_EQ(info.sample_shape.dims[0], 2);
        int64_t voxels = 1;
        for (int d = 0; d < dims; d++) {
            EXPECT_EQ(info.sample_shape.dims[d + 1], 12);
            EXPECT_EQ(info.label_shape.dims[d], 12);
            voxels *= 12;
        }
        EXPECT_EQ(info.sample_numel, 2 * voxels);
        EXPECT_EQ(info.label_numel, voxels);
        Batch b = read(ds, {0, 4});
        for (int64_t label : b.y) {
            EXPECT_GE(label, 0);
            EXPECT_LT(label, 4);
        }
        for (float v : b.x)
            EXPECT_TRUE(std::isfinite(v));
        tsl_dataset_destroy(ds);
    }
}

// labels=sample: one label per sample, the class covering the most voxels apart from the
// background, worked out here from the voxel labels of the same samples.
TEST(DatasetSynthetic, PerSampleLabelsAreTheLargestClass)
{
    const std::string voxel = "synthetic:dims=3,size=10,samples=12,classes=4,objects=3,seed=5";
    tsl_dataset_t v, c;
    ASSERT_EQ(open_dataset(&v, voxel, TSL_SPLIT_TRAIN), TSL_OK);
    ASSERT_EQ(open_dataset(&c, voxel + ",labels=sample", TSL_SPLIT_TRAIN), TSL_OK)
        << tsl_last_error();
    tsl_dataset_info info;
    ASSERT_EQ(tsl_dataset_get_info(c, &info), TSL_OK);
    EXPECT_EQ(info.label_shape.ndim, 0);
    EXPECT_EQ(info.label_numel, 1);
    EXPECT_EQ(info.sample_numel, 1000);
    std::vector<int64_t> all = iota(12);
    Batch per_voxel = read(v, all), per_sample = read(c, all);
    ASSERT_EQ(per_sample.y.size(), 12u);
    EXPECT_EQ(per_sample.x, per_voxel.x);
    std::vector<int> seen(4, 0);
    for (size_t i = 0; i < 12; i++) {
        std::vector<int64_t> count(4, 0);
        for (size_t k = 0; k < 1000; k++)
            count[(size_t)per_voxel.y[i * 1000 + k]]++;
        int64_t want = 0;
        for (int64_t cl = 1; cl < 4; cl++)
            if (count[(size_t)cl] > 0 && (want == 0 || count[(size_t)cl] > count[(size_t)want]))
                want = cl;
        EXPECT_EQ(per_sample.y[i], want) << "sample " << i;
        seen[(size_t)per_sample.y[i]] = 1;
    }
    EXPECT_GE(seen[1] + seen[2] + seen[3], 2) << "labels should vary between samples";
    expect_open_error("synthetic:labels=pixel", TSL_SPLIT_TRAIN, TSL_ERR_INVALID_ARG,
                      "want voxel or sample");
    tsl_dataset_destroy(v);
    tsl_dataset_destroy(c);
}

TEST(DatasetSynthetic, DeterministicFromSeedSplitAndIndex)
{
    const std::string spec = "synthetic:dims=3,size=16,samples=6,classes=3,seed=11";
    tsl_dataset_t a, b, other_seed, test;
    ASSERT_EQ(open_dataset(&a, spec, TSL_SPLIT_TRAIN), TSL_OK);
    ASSERT_EQ(open_dataset(&b, spec, TSL_SPLIT_TRAIN), TSL_OK);
    ASSERT_EQ(open_dataset(&other_seed, "synthetic:dims=3,size=16,samples=6,classes=3,seed=12",
                           TSL_SPLIT_TRAIN),
              TSL_OK);
    ASSERT_EQ(open_dataset(&test, spec, TSL_SPLIT_TEST), TSL_OK);
    std::vector<int64_t> all = iota(6);
    Batch first = read(a, all), again = read(b, all);
    EXPECT_EQ(std::memcmp(first.x.data(), again.x.data(), first.x.size() * sizeof(float)), 0);
    EXPECT_EQ(first.y, again.y);
    // A sample depends on its index only, not on what else the read holds.
    Batch reversed = read(a, {5, 4, 3, 2, 1, 0});
    size_t numel = first.x.size() / 6, labels = first.y.size() / 6;
    for (size_t i = 0; i < 6; i++) {
        EXPECT_EQ(
            std::memcmp(&first.x[i * numel], &reversed.x[(5 - i) * numel], numel * sizeof(float)),
            0);
        EXPECT_TRUE(std::equal(first.y.begin() + (long)(i * labels),
                               first.y.begin() + (long)((i + 1) * labels),
                               reversed.y.begin() + (long)((5 - i) * labels)));
    }
    // Samples differ from each other, across seeds and across splits.
    EXPECT_FALSE(std::equal(first.y.begin(), first.y.begin() + (long)labels,
                            first.y.begin() + (long)labels));
    Batch seeded = read(other_seed, all), held_out = read(test, all);
    EXPECT_NE(first.y, seeded.y);
    EXPECT_NE(first.y, held_out.y);
    EXPECT_NE(std::memcmp(first.x.data(), seeded.x.data(), first.x.size() * sizeof(float)), 0);
    EXPECT_NE(std::memcmp(first.x.data(), held_out.x.data(), first.x.size() * sizeof(float)), 0);
    // Labels only (x NULL) are the same labels.
    std::vector<int64_t> only_y(first.y.size());
    ASSERT_EQ(tsl_dataset_read(a, all.data(), 6, nullptr, only_y.data()), TSL_OK);
    EXPECT_EQ(only_y, first.y);
    std::vector<float> only_x(first.x.size());
    ASSERT_EQ(tsl_dataset_read(a, all.data(), 6, only_x.data(), nullptr), TSL_OK);
    EXPECT_EQ(std::memcmp(only_x.data(), first.x.data(), only_x.size() * sizeof(float)), 0);
    for (tsl_dataset_t ds : {a, b, other_seed, test})
        tsl_dataset_destroy(ds);
}

// Every class is present in sensible amounts and its voxels are brighter the higher the class:
// a network can learn it.
TEST(DatasetSynthetic, ClassesAreBalancedAndSeparable)
{
    struct Case {
        std::string spec;
        int classes;
    };
    const Case cases[] = {
        {"synthetic:dims=1,size=256,samples=64,classes=3,seed=5", 3},
        {"synthetic:dims=2,size=32,samples=64,classes=4,seed=6", 4},
        {"synthetic:dims=3,size=64,samples=32,classes=3", 3},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.spec);
        tsl_dataset_t ds;
        ASSERT_EQ(open_dataset(&ds, c.spec, TSL_SPLIT_TRAIN), TSL_OK) << tsl_last_error();
        tsl_dataset_info info;
        ASSERT_EQ(tsl_dataset_get_info(ds, &info), TSL_OK);
        Batch b = read(ds, iota(info.samples));
        std::vector<double> count((size_t)c.classes, 0), sum((size_t)c.classes, 0);
        for (size_t v = 0; v < b.y.size(); v++) {
            ASSERT_GE(b.y[v], 0);
            ASSERT_LT(b.y[v], c.classes);
            count[(size_t)b.y[v]]++;
            sum[(size_t)b.y[v]] += b.x[v];
        }
        double total = (double)b.y.size();
        EXPECT_GT(count[0] / total, 0.3);
        EXPECT_LT(count[0] / total, 0.95);
        for (int k = 0; k < c.classes; k++) {
            if (k > 0) {
                EXPECT_GT(count[(size_t)k] / total, 0.03) << "class " << k;
            }
            EXPECT_NEAR(sum[(size_t)k] / count[(size_t)k], k, 0.02) << "class " << k;
        }
        tsl_dataset_destroy(ds);
    }
}

// ---------------------------------------------------------------- epoch order

// The documented generator, written again here: SplitMix64 seeded with
// mix(mix(seed + gamma) ^ epoch), Fisher-Yates from the top, rejection below 2^64 mod bound.
std::vector<int64_t> reference_order(int64_t n, uint64_t seed, int64_t epoch)
{
    const uint64_t gamma = 0x9e3779b97f4a7c15ULL;
    auto mix = [](uint64_t z) {
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    };
    uint64_t state = mix(mix(seed + gamma) ^ (uint64_t)epoch);
    std::vector<int64_t> order = iota(n);
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t bound = (uint64_t)i + 1, r;
        do {
            state += gamma;
            r = mix(state);
        } while (r < (0 - bound) % bound);
        std::swap(order[(size_t)i], order[(size_t)(r % bound)]);
    }
    return order;
}

TEST(DatasetEpochOrder, PermutationPerEpochFromTheDocumentedGenerator)
{
    const int64_t n = 1000;
    uint64_t seed = test_seed();
    std::vector<int64_t> previous;
    for (int64_t epoch = 0; epoch < 4; epoch++) {
        std::vector<int64_t> order((size_t)n, -1);
        ASSERT_EQ(tsl_dataset_epoch_order(order.data(), n, seed, epoch, 1), TSL_OK);
        EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), (size_t)n);
        EXPECT_EQ(*std::min_element(order.begin(), order.end()), 0);
        EXPECT_EQ(*std::max_element(order.begin(), order.end()), n - 1);
        EXPECT_NE(order, iota(n));
        EXPECT_NE(order, previous);
        EXPECT_EQ(order, reference_order(n, seed, epoch));
        previous = order;
    }
    // A fixed case, so a change of generator cannot go unnoticed.
    std::vector<int64_t> order(10);
    ASSERT_EQ(tsl_dataset_epoch_order(order.data(), 10, 42, 3, 1), TSL_OK);
    EXPECT_EQ(order, reference_order(10, 42, 3));
    // Shuffle off, tiny and empty orders, bad arguments.
    ASSERT_EQ(tsl_dataset_epoch_order(order.data(), 10, 42, 3, 0), TSL_OK);
    EXPECT_EQ(order, iota(10));
    int64_t one = -1;
    ASSERT_EQ(tsl_dataset_epoch_order(&one, 1, 42, 3, 1), TSL_OK);
    EXPECT_EQ(one, 0);
    EXPECT_EQ(tsl_dataset_epoch_order(nullptr, 0, 1, 0, 1), TSL_OK);
    EXPECT_EQ(tsl_dataset_epoch_order(nullptr, 5, 1, 0, 1), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_epoch_order(order.data(), -1, 1, 0, 1), TSL_ERR_INVALID_ARG);
}

TEST(DatasetRead, BadIndicesAreRefused)
{
    tsl_dataset_t ds;
    ASSERT_EQ(open_dataset(&ds, "synthetic:dims=1,size=8,samples=3", TSL_SPLIT_TRAIN), TSL_OK);
    std::vector<float> x(3 * 8);
    std::vector<int64_t> y(3 * 8);
    const int64_t bad[2] = {1, 3};
    EXPECT_EQ(tsl_dataset_read(ds, bad, 2, x.data(), y.data()), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("index 3 (position 1)"), std::string::npos);
    const int64_t negative = -1;
    EXPECT_EQ(tsl_dataset_read(ds, &negative, 1, x.data(), y.data()), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_read(ds, nullptr, 1, x.data(), y.data()), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_read(ds, nullptr, 0, x.data(), y.data()), TSL_OK);
    EXPECT_EQ(tsl_dataset_read(nullptr, bad, 1, x.data(), y.data()), TSL_ERR_INVALID_ARG);
    tsl_dataset_info info;
    EXPECT_EQ(tsl_dataset_get_info(nullptr, &info), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_get_info(ds, nullptr), TSL_ERR_INVALID_ARG);
    tsl_dataset_destroy(ds);
}

// ---------------------------------------------------------------- boxes of a sample

// Random boxes of random samples: each equals the same box cut out of the whole sample read
// by tsl_dataset_read() (bit for bit), labels too, and the outputs outside the box stay as
// poisoned.
void expect_boxes_are_cuts(tsl_dataset_t ds, int rounds, uint64_t salt)
{
    tsl_dataset_info info;
    ASSERT_EQ(tsl_dataset_get_info(ds, &info), TSL_OK);
    std::mt19937_64 rng(test_seed() + salt);
    const int32_t nd = info.sample_shape.ndim;
    std::vector<float> whole((size_t)info.sample_numel);
    std::vector<int64_t> labels((size_t)info.label_numel);
    for (int r = 0; r < rounds; r++) {
        int64_t index = (int64_t)(rng() % (uint64_t)info.samples);
        ASSERT_EQ(tsl_dataset_read(ds, &index, 1, whole.data(), labels.data()), TSL_OK);
        int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS], numel = 1, label_numel = 1;
        for (int32_t d = 0; d < nd; d++) {
            int64_t n = info.sample_shape.dims[d];
            // Whole axes now and then, so runs that merge axes are met too.
            start[d] = rng() % 3 == 0 ? 0 : (int64_t)(rng() % (uint64_t)n);
            extent[d] =
                start[d] == 0 && rng() % 2 ? n : 1 + (int64_t)(rng() % (uint64_t)(n - start[d]));
            numel *= extent[d];
            if (d > 0 && info.label_shape.ndim > 0)
                label_numel *= extent[d];
        }
        std::vector<float> x((size_t)numel + 1, NAN);
        std::vector<int64_t> y((size_t)label_numel + 1, -7);
        ASSERT_EQ(tsl_dataset_read_box(ds, index, start, extent, x.data(), y.data()), TSL_OK)
            << tsl_last_error();
        EXPECT_TRUE(std::isnan(x[(size_t)numel]));
        EXPECT_EQ(y[(size_t)label_numel], -7);
        int64_t at[TSL_MAX_DIMS] = {0};
        for (int64_t i = 0; i < numel; i++) {
            int64_t offset = 0, label_offset = 0;
            for (int32_t d = 0; d < nd; d++) {
                offset = offset * info.sample_shape.dims[d] + start[d] + at[d];
                if (d > 0)
                    label_offset = label_offset * info.sample_shape.dims[d] + start[d] + at[d];
            }
            ASSERT_EQ(std::memcmp(&x[(size_t)i], &whole[(size_t)offset], sizeof(float)), 0)
                << "sample " << index << ", box element " << i;
            if (info.label_shape.ndim > 0 && at[0] == 0)
                ASSERT_EQ(y[(size_t)(i % label_numel)], labels[(size_t)label_offset])
                    << "sample " << index << ", box element " << i;
            for (int32_t d = nd - 1; d >= 0 && ++at[d] == extent[d]; d--)
                at[d] = 0;
        }
        if (info.label_shape.ndim == 0)
            EXPECT_EQ(y[0], labels[0]);
        // One output alone.
        std::vector<float> x_only((size_t)numel);
        ASSERT_EQ(tsl_dataset_read_box(ds, index, start, extent, x_only.data(), nullptr), TSL_OK);
        EXPECT_EQ(std::memcmp(x_only.data(), x.data(), (size_t)numel * sizeof(float)), 0);
        std::vector<int64_t> y_only((size_t)label_numel);
        ASSERT_EQ(tsl_dataset_read_box(ds, index, start, extent, nullptr, y_only.data()), TSL_OK);
        EXPECT_TRUE(std::equal(y_only.begin(), y_only.end(), y.begin()));
    }
}

TEST(DatasetBox, SyntheticBoxesAreCutsOfTheWholeSample)
{
    for (const char *spec :
         {"synthetic:dims=1,size=41,samples=5", "synthetic:dims=2,size=23,channels=3,samples=5",
          "synthetic:dims=3,size=13,channels=2,samples=5,objects=9",
          "synthetic:dims=3,size=11,samples=5,labels=sample,classes=5",
          "synthetic:dims=2,size=19,samples=5,labels=sample,seed=77"}) {
        SCOPED_TRACE(spec);
        for (tsl_split split : {TSL_SPLIT_TRAIN, TSL_SPLIT_TEST}) {
            tsl_dataset_t ds;
            ASSERT_EQ(open_dataset(&ds, spec, split), TSL_OK) << tsl_last_error();
            expect_boxes_are_cuts(ds, 25, (uint64_t)split);
            tsl_dataset_destroy(ds);
        }
    }
}

TEST(DatasetBox, FashionMnistBoxesAreCutsOfTheWholeSample)
{
    tsl_dataset_t ds;
    ASSERT_EQ(open_dataset(&ds, "fashion-mnist", TSL_SPLIT_TEST), TSL_OK) << tsl_last_error();
    expect_boxes_are_cuts(ds, 40, 3);
    tsl_dataset_destroy(ds);
}

TEST(DatasetBox, BoxesOutsideTheSampleAreRefused)
{
    tsl_dataset_t ds;
    ASSERT_EQ(open_dataset(&ds, "synthetic:dims=2,size=8,channels=2,samples=3", TSL_SPLIT_TRAIN),
              TSL_OK);
    std::vector<float> x(2 * 64);
    std::vector<int64_t> y(64);
    const int64_t start[3] = {0, 2, 3}, fits[3] = {2, 6, 5};
    EXPECT_EQ(tsl_dataset_read_box(ds, 2, start, fits, x.data(), y.data()), TSL_OK);
    const int64_t too_long[3] = {2, 7, 5}, empty[3] = {2, 0, 5}, channel[3] = {3, 6, 5};
    EXPECT_EQ(tsl_dataset_read_box(ds, 2, start, too_long, x.data(), y.data()),
              TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("axis 1 of the box is [2, 9)"), std::string::npos)
        << tsl_last_error();
    EXPECT_EQ(tsl_dataset_read_box(ds, 2, start, empty, x.data(), y.data()), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_read_box(ds, 2, start, channel, x.data(), y.data()), TSL_ERR_INVALID_ARG);
    const int64_t negative[3] = {0, -1, 0};
    EXPECT_EQ(tsl_dataset_read_box(ds, 2, negative, fits, x.data(), y.data()), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_read_box(ds, 3, start, fits, x.data(), y.data()), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("index 3"), std::string::npos);
    EXPECT_EQ(tsl_dataset_read_box(ds, 0, nullptr, fits, x.data(), y.data()), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_read_box(nullptr, 0, start, fits, x.data(), y.data()),
              TSL_ERR_INVALID_ARG);
    tsl_dataset_destroy(ds);
}

// ---------------------------------------------------------------- .npy directories

class DatasetNpy : public TempDir
{
  protected:
    template <typename T>
    void write(const std::string &name, tsl_dtype dtype, std::vector<int64_t> dims,
               const std::vector<T> &values)
    {
        tsl_shape shape;
        ASSERT_EQ(tsl_shape_make(&shape, (int32_t)dims.size(), dims.data()), TSL_OK);
        ASSERT_EQ(tsl_npy_write(path(name).c_str(), dtype, &shape, values.data()), TSL_OK)
            << tsl_last_error();
    }
    // x: n x 2 x 3 x 4 random floats; y: n labels or n x 3 x 4 labels in [0, classes).
    void write_pair(const std::string &suffix, int64_t n, bool per_voxel, int64_t classes)
    {
        std::mt19937_64 rng(test_seed() + suffix.size());
        std::normal_distribution<float> normal;
        xs[suffix].resize((size_t)n * 24);
        for (float &v : xs[suffix])
            v = normal(rng);
        ys[suffix].resize((size_t)n * (per_voxel ? 12 : 1));
        for (int64_t &v : ys[suffix])
            v = (int64_t)(rng() % (uint64_t)classes);
        ys[suffix][0] = classes - 1; // the largest label is there
        write("x" + suffix + ".npy", TSL_F32, {n, 2, 3, 4}, xs[suffix]);
        if (per_voxel)
            write("y" + suffix + ".npy", TSL_I64, {n, 3, 4}, ys[suffix]);
        else
            write("y" + suffix + ".npy", TSL_I64, {n}, ys[suffix]);
    }
    // x as write_pair's (6 samples), y: f32 targets of 6 x 2 x 3 x 4 random floats (returned).
    std::vector<float> write_targets(uint64_t salt)
    {
        write_pair("", 6, false, 3); // (x, and labels that the targets replace)
        std::mt19937_64 rng(test_seed() + salt);
        std::normal_distribution<float> normal;
        std::vector<float> t(6 * 2 * 3 * 4);
        for (float &v : t)
            v = normal(rng);
        write("y.npy", TSL_F32, {6, 2, 3, 4}, t);
        return t;
    }
    void expect_error(tsl_status status, const std::string &needle,
                      tsl_split split = TSL_SPLIT_TRAIN)
    {
        expect_open_error("npy:" + dir, split, status, needle);
    }
    std::map<std::string, std::vector<float>> xs;
    std::map<std::string, std::vector<int64_t>> ys;
};

TEST_F(DatasetNpy, RoundTripClassificationAndSegmentation)
{
    for (bool per_voxel : {false, true}) {
        SCOPED_TRACE(per_voxel ? "labels per voxel" : "one label per sample");
        write_pair("", 9, per_voxel, 5);
        write_pair("_test", 4, per_voxel, 5);
        for (tsl_split split : {TSL_SPLIT_TRAIN, TSL_SPLIT_TEST}) {
            const std::string suffix = split == TSL_SPLIT_TRAIN ? "" : "_test";
            tsl_dataset_t ds;
            ASSERT_EQ(open_dataset(&ds, "npy:" + dir, split), TSL_OK) << tsl_last_error();
            tsl_dataset_info info;
            ASSERT_EQ(tsl_dataset_get_info(ds, &info), TSL_OK);
            EXPECT_EQ(info.samples, split == TSL_SPLIT_TRAIN ? 9 : 4);
            EXPECT_EQ(info.classes, 5);
            ASSERT_EQ(info.sample_shape.ndim, 3);
            EXPECT_EQ(info.sample_shape.dims[0], 2);
            EXPECT_EQ(info.sample_shape.dims[2], 4);
            EXPECT_EQ(info.sample_numel, 24);
            EXPECT_EQ(info.label_shape.ndim, per_voxel ? 2 : 0);
            EXPECT_EQ(info.label_numel, per_voxel ? 12 : 1);
            std::vector<int64_t> indices = {3, 0, 3, info.samples - 1};
            Batch b = read(ds, indices);
            for (size_t i = 0; i < indices.size(); i++) {
                size_t row = (size_t)indices[i], labels = (size_t)info.label_numel;
                EXPECT_EQ(std::memcmp(&b.x[i * 24], &xs[suffix][row * 24], 24 * sizeof(float)), 0);
                EXPECT_TRUE(std::equal(&b.y[i * labels], &b.y[i * labels] + labels,
                                       &ys[suffix][row * labels]));
            }
            tsl_dataset_destroy(ds);
        }
    }
    // More classes than the labels show.
    tsl_dataset_t ds;
    ASSERT_EQ(open_dataset(&ds, "npy:dir=" + dir + ",classes=12", TSL_SPLIT_TRAIN), TSL_OK);
    tsl_dataset_info info;
    ASSERT_EQ(tsl_dataset_get_info(ds, &info), TSL_OK);
    EXPECT_EQ(info.classes, 12);
    tsl_dataset_destroy(ds);
}

TEST_F(DatasetNpy, BoxesAreCutsOfTheWholeSample)
{
    for (bool per_voxel : {false, true}) {
        SCOPED_TRACE(per_voxel ? "labels per voxel" : "one label per sample");
        write_pair("", 7, per_voxel, 4);
        tsl_dataset_t ds;
        ASSERT_EQ(open_dataset(&ds, "npy:" + dir, TSL_SPLIT_TRAIN), TSL_OK) << tsl_last_error();
        expect_boxes_are_cuts(ds, 60, per_voxel ? 11 : 12);
        tsl_dataset_destroy(ds);
    }
}

// f32 y: float targets of any per-sample shape (the output's), read box by box; the label
// calls refuse them, and the target call refuses a dataset of labels.
TEST_F(DatasetNpy, FloatTargetsAreReadBoxByBox)
{
    const std::vector<float> t = write_targets(91);
    tsl_dataset_t ds;
    ASSERT_EQ(open_dataset(&ds, "npy:" + dir, TSL_SPLIT_TRAIN), TSL_OK) << tsl_last_error();
    tsl_dataset_info info;
    ASSERT_EQ(tsl_dataset_get_info(ds, &info), TSL_OK);
    EXPECT_EQ(info.targets, 1);
    EXPECT_EQ(info.classes, 0);
    ASSERT_EQ(info.label_shape.ndim, 3);
    EXPECT_EQ(info.label_shape.dims[0], 2);
    EXPECT_EQ(info.label_numel, 24);
    // every box of every sample against the whole array
    for (int64_t s = 0; s < 6; s++)
        for (int64_t c0 = 0; c0 < 2; c0++)
            for (int64_t h0 = 0; h0 < 3; h0++)
                for (int64_t w0 = 0; w0 < 4; w0 += 2) {
                    const int64_t start[3] = {c0, h0, w0}, extent[3] = {2 - c0, 3 - h0, 2};
                    std::vector<float> got((size_t)(extent[0] * extent[1] * extent[2]), NAN);
                    ASSERT_EQ(tsl_dataset_read_target_box(ds, s, start, extent, got.data()), TSL_OK)
                        << tsl_last_error();
                    size_t k = 0;
                    for (int64_t c = c0; c < 2; c++)
                        for (int64_t h = h0; h < 3; h++)
                            for (int64_t w = w0; w < w0 + 2; w++, k++)
                                ASSERT_EQ(got[k], t[(size_t)(((s * 2 + c) * 3 + h) * 4 + w)])
                                    << "sample " << s << " box " << c0 << "," << h0 << "," << w0;
                }
    const int64_t start[3] = {0, 0, 0}, outside[3] = {2, 3, 5}, whole[4] = {2, 3, 4, 0};
    std::vector<float> buf(64);
    EXPECT_EQ(tsl_dataset_read_target_box(ds, 0, start, outside, buf.data()), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_read_target_box(ds, 6, start, whole, buf.data()), TSL_ERR_INVALID_ARG);
    std::vector<int64_t> labels(64);
    const int64_t xbox[3] = {2, 3, 4};
    EXPECT_EQ(tsl_dataset_read_box(ds, 0, start, xbox, buf.data(), labels.data()),
              TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("float targets"), std::string::npos);
    EXPECT_EQ(tsl_dataset_read_box(ds, 0, start, xbox, buf.data(), nullptr), TSL_OK); // x alone
    tsl_dataset_destroy(ds);
    write_pair("", 6, false, 3);
    ASSERT_EQ(open_dataset(&ds, "npy:" + dir, TSL_SPLIT_TRAIN), TSL_OK);
    EXPECT_EQ(tsl_dataset_read_target_box(ds, 0, start, whole, buf.data()), TSL_ERR_INVALID_ARG);
    tsl_dataset_destroy(ds);
}

TEST_F(DatasetNpy, FilesThatDoNotFit)
{
    write_pair("", 5, false, 3);
    expect_error(TSL_ERR_IO, "x_test.npy", TSL_SPLIT_TEST);
    expect_open_error("npy:dir=" + dir + ",classes=2", TSL_SPLIT_TRAIN, TSL_ERR_FORMAT,
                      "outside [0, 2)");

    write("y.npy", TSL_I64, {4}, std::vector<int64_t>{0, 1, 2, 1});
    expect_error(TSL_ERR_SHAPE, "labels must be N");
    write("y.npy", TSL_I64, {5, 3, 5}, std::vector<int64_t>(75, 1));
    expect_error(TSL_ERR_SHAPE, "spatial sizes of x");
    write("y.npy", TSL_I32, {5}, std::vector<int32_t>{0, 1, 2, 1, 0});
    expect_error(TSL_ERR_DTYPE, "y must be i64 class labels");
    write("y.npy", TSL_F32, {4, 2, 3, 4}, std::vector<float>(96, 0.5f));
    expect_error(TSL_ERR_SHAPE, "f32 targets must be N x the output's shape");
    write("y.npy", TSL_F32, {5}, std::vector<float>(5, 0.5f));
    expect_error(TSL_ERR_SHAPE, "f32 targets must be N x the output's shape");
    write("y.npy", TSL_F32, {5, 1, 3}, std::vector<float>(15, 0.5f));
    expect_open_error("npy:dir=" + dir + ",classes=3", TSL_SPLIT_TRAIN, TSL_ERR_INVALID_ARG,
                      "classes= is for class labels");
    write("y.npy", TSL_I64, {5}, std::vector<int64_t>{0, 1, -2, 1, 0});
    expect_error(TSL_ERR_FORMAT, "label -2 (element 2");
    // Labels all 0 say nothing of the classes (as in HDF5 files): classes= must.
    write("y.npy", TSL_I64, {5}, std::vector<int64_t>(5, 0));
    expect_error(TSL_ERR_FORMAT, "every label of");
    tsl_dataset_t zeros = nullptr;
    ASSERT_EQ(open_dataset(&zeros, "npy:dir=" + dir + ",classes=2", TSL_SPLIT_TRAIN), TSL_OK)
        << tsl_last_error();
    tsl_dataset_info info;
    ASSERT_EQ(tsl_dataset_get_info(zeros, &info), TSL_OK);
    EXPECT_EQ(info.classes, 2);
    tsl_dataset_destroy(zeros);

    write("y.npy", TSL_I64, {5}, std::vector<int64_t>{0, 1, 2, 1, 0});
    write("x.npy", TSL_F64, {5, 2, 3, 4}, std::vector<double>(120, 0.5));
    expect_error(TSL_ERR_DTYPE, "x must be f32");
    write("x.npy", TSL_F32, {5}, std::vector<float>(5, 0.5f));
    expect_error(TSL_ERR_SHAPE, "x must be N x C");

    write("x.npy", TSL_F32, {5, 2, 3, 4}, std::vector<float>(120, 0.5f));
    Bytes whole = read_raw("x.npy");
    write_raw("x.npy", Bytes(whole.begin(), whole.end() - 8));
    expect_error(TSL_ERR_FORMAT, "truncated");
    write_raw("x.npy", Bytes(30, 'z'));
    expect_error(TSL_ERR_FORMAT, "bad magic");
    std::remove(path("x.npy").c_str());
    expect_error(TSL_ERR_IO, "x.npy");
}

// ---------------------------------------------------------------- the loader

// Every batch of a few epochs equals the synchronous read of the documented order.
void check_loader(tsl_dataset_t ds, int64_t batch_size, uint64_t seed, int32_t shuffle,
                  int32_t drop_last)
{
    SCOPED_TRACE("batch " + std::to_string(batch_size) + (shuffle ? " shuffled" : " in order") +
                 (drop_last ? ", drop last" : ", keep last"));
    tsl_dataset_info info;
    ASSERT_EQ(tsl_dataset_get_info(ds, &info), TSL_OK);
    tsl_loader_t ld = nullptr;
    ASSERT_EQ(tsl_loader_create(&ld, ds, batch_size, seed, shuffle, drop_last), TSL_OK)
        << tsl_last_error();
    int64_t n = info.samples, per_epoch;
    int64_t expect_per_epoch = drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
    ASSERT_EQ(tsl_loader_batches_per_epoch(ld, &per_epoch), TSL_OK);
    ASSERT_EQ(per_epoch, expect_per_epoch);
    for (int64_t epoch = 0; epoch < 3; epoch++) {
        std::vector<int64_t> order((size_t)n);
        ASSERT_EQ(tsl_dataset_epoch_order(order.data(), n, seed, epoch, shuffle), TSL_OK);
        for (int64_t b = 0; b < per_epoch; b++) {
            tsl_batch batch;
            ASSERT_EQ(tsl_loader_next(ld, &batch), TSL_OK) << tsl_last_error();
            int64_t start = b * batch_size, count = std::min(batch_size, n - start);
            ASSERT_EQ(batch.count, count);
            EXPECT_EQ(batch.epoch, epoch);
            EXPECT_EQ(batch.index, b);
            EXPECT_EQ(batch.last, b + 1 == per_epoch ? 1 : 0);
            std::vector<int64_t> indices(order.begin() + start, order.begin() + start + count);
            ASSERT_TRUE(std::equal(indices.begin(), indices.end(), batch.indices));
            Batch expected = read(ds, indices);
            ASSERT_EQ(std::memcmp(batch.x, expected.x.data(), expected.x.size() * sizeof(float)),
                      0);
            ASSERT_TRUE(std::equal(expected.y.begin(), expected.y.end(), batch.y));
        }
    }
    EXPECT_EQ(tsl_loader_destroy(ld), TSL_OK);
}

// Float targets through the loader (batch.targets, y NULL) and from an application's storage
// (tsl_dataset_create_callback_targets): the same values as the npy directory they come from;
// a sample the application cannot read is the loader's error; bad descriptions are refused.
TEST_F(DatasetNpy, LoaderAndCallbacksGiveFloatTargets)
{
    const std::vector<float> t = write_targets(92);
    TargetStorage storage;
    ASSERT_EQ(open_dataset(&storage.inner, "npy:" + dir, TSL_SPLIT_TRAIN), TSL_OK);
    tsl_dataset_info info;
    ASSERT_EQ(tsl_dataset_get_info(storage.inner, &info), TSL_OK);
    tsl_dataset_t fed = nullptr;
    ASSERT_EQ(tsl_dataset_create_callback_targets(&fed, 6, 3, info.sample_shape.dims, 3,
                                                  info.label_shape.dims, target_storage_x,
                                                  target_storage_read, &storage),
              TSL_OK)
        << tsl_last_error();
    tsl_dataset_info fed_info;
    ASSERT_EQ(tsl_dataset_get_info(fed, &fed_info), TSL_OK);
    EXPECT_EQ(std::memcmp(&fed_info, &info, sizeof info), 0);
    for (tsl_dataset_t ds : {storage.inner, fed}) {
        SCOPED_TRACE(ds == fed ? "the application's storage" : "the npy directory");
        tsl_loader_t ld = nullptr;
        ASSERT_EQ(tsl_loader_create(&ld, ds, 4, 5, 0, 0), TSL_OK) << tsl_last_error();
        for (int k = 0; k < 3; k++) { // batches of 4, 2, then 4 of the next epoch
            tsl_batch b;
            ASSERT_EQ(tsl_loader_next(ld, &b), TSL_OK) << tsl_last_error();
            EXPECT_EQ(b.y, nullptr);
            ASSERT_NE(b.targets, nullptr);
            for (int64_t i = 0; i < b.count; i++) {
                size_t row = (size_t)b.indices[i];
                EXPECT_EQ(std::memcmp(&b.targets[i * 24], &t[row * 24], 24 * sizeof(float)), 0);
                EXPECT_EQ(std::memcmp(&b.x[i * 24], &xs[""][row * 24], 24 * sizeof(float)), 0);
            }
        }
        tsl_loader_destroy(ld);
    }
    // A box of the application's targets is its storage's box.
    const int64_t start[3] = {1, 1, 2}, extent[3] = {1, 2, 2};
    std::vector<float> a(4, NAN), b(4, NAN);
    ASSERT_EQ(tsl_dataset_read_target_box(fed, 5, start, extent, a.data()), TSL_OK);
    ASSERT_EQ(tsl_dataset_read_target_box(storage.inner, 5, start, extent, b.data()), TSL_OK);
    EXPECT_EQ(a, b);
    // The application cannot read sample 3: the loader's batch holding it fails, saying so.
    storage.broken = 3;
    tsl_loader_t ld = nullptr;
    ASSERT_EQ(tsl_loader_create(&ld, fed, 6, 5, 0, 0), TSL_OK);
    tsl_batch batch;
    EXPECT_EQ(tsl_loader_next(ld, &batch), TSL_ERR_IO);
    EXPECT_NE(std::string(tsl_last_error()).find("read_targets failed"), std::string::npos)
        << tsl_last_error();
    tsl_loader_destroy(ld);
    tsl_dataset_destroy(fed);
    // Bad descriptions.
    const int64_t dims[3] = {2, 3, 4}, zero[3] = {2, 0, 4};
    EXPECT_EQ(tsl_dataset_create_callback_targets(&fed, 6, 3, dims, 3, dims, target_storage_x,
                                                  nullptr, &storage),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_create_callback_targets(&fed, 0, 3, dims, 3, dims, target_storage_x,
                                                  target_storage_read, &storage),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_create_callback_targets(&fed, 6, 3, dims, 0, dims, target_storage_x,
                                                  target_storage_read, &storage),
              TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_dataset_create_callback_targets(&fed, 6, 3, dims, 3, zero, target_storage_x,
                                                  target_storage_read, &storage),
              TSL_ERR_SHAPE);
    EXPECT_NE(std::string(tsl_last_error()).find("axis 1 of the target has size 0"),
              std::string::npos)
        << tsl_last_error();
    tsl_dataset_destroy(storage.inner);
}

TEST(DatasetLoader, GivesTheSynchronousBatches)
{
    tsl_dataset_t ds;
    ASSERT_EQ(open_dataset(&ds, "synthetic:dims=2,size=10,samples=23,classes=3,channels=2",
                           TSL_SPLIT_TRAIN),
              TSL_OK);
    uint64_t seed = test_seed();
    for (int32_t shuffle : {1, 0})
        for (int32_t drop_last : {0, 1})
            check_loader(ds, 5, seed, shuffle, drop_last);
    check_loader(ds, 23, seed, 1, 1); // exactly one batch
    check_loader(ds, 40, seed, 1, 0); // one batch, smaller than asked
    check_loader(ds, 1, seed, 1, 0);
    tsl_dataset_destroy(ds);
}

// After a seek, the loader hands out the batches a loader that never stopped would, from
// that point on (resuming from a checkpoint), also after batches already taken.
TEST(DatasetLoader, SeekContinuesTheSchedule)
{
    tsl_dataset_t ds;
    ASSERT_EQ(open_dataset(&ds, "synthetic:dims=2,size=6,samples=17,classes=3", TSL_SPLIT_TRAIN),
              TSL_OK);
    uint64_t seed = test_seed();
    const int64_t bs = 4, per_epoch = 4; // drop last: 4 batches per epoch
    std::vector<std::vector<int64_t>> straight;
    tsl_loader_t ld;
    ASSERT_EQ(tsl_loader_create(&ld, ds, bs, seed, 1, 1), TSL_OK);
    for (int64_t k = 0; k < 3 * per_epoch; k++) {
        tsl_batch b;
        ASSERT_EQ(tsl_loader_next(ld, &b), TSL_OK);
        straight.emplace_back(b.indices, b.indices + b.count);
    }
    EXPECT_EQ(tsl_loader_destroy(ld), TSL_OK);
    for (int64_t start : {0, 1, 3, 4, 6, 11}) {
        SCOPED_TRACE("seek to batch " + std::to_string(start));
        ASSERT_EQ(tsl_loader_create(&ld, ds, bs, seed, 1, 1), TSL_OK);
        tsl_batch b;
        for (int take = 0; take < (int)(start % 3); take++) // some batches taken first
            ASSERT_EQ(tsl_loader_next(ld, &b), TSL_OK);
        ASSERT_EQ(tsl_loader_seek(ld, start / per_epoch, start % per_epoch), TSL_OK);
        for (int64_t k = start; k < 3 * per_epoch; k++) {
            ASSERT_EQ(tsl_loader_next(ld, &b), TSL_OK);
            EXPECT_EQ(b.epoch, k / per_epoch);
            EXPECT_EQ(b.index, k % per_epoch);
            std::vector<int64_t> indices(b.indices, b.indices + b.count);
            ASSERT_EQ(indices, straight[(size_t)k]);
            Batch expected = read(ds, indices);
            ASSERT_EQ(std::memcmp(b.x, expected.x.data(), expected.x.size() * sizeof(float)), 0);
        }
        EXPECT_EQ(tsl_loader_seek(ld, 0, per_epoch), TSL_ERR_INVALID_ARG);
        EXPECT_EQ(tsl_loader_seek(ld, -1, 0), TSL_ERR_INVALID_ARG);
        EXPECT_EQ(tsl_loader_destroy(ld), TSL_OK);
    }
    EXPECT_EQ(tsl_loader_seek(nullptr, 0, 0), TSL_ERR_INVALID_ARG);
    tsl_dataset_destroy(ds);
}

// Batches over 64 MiB are read when asked for, into one buffer instead of two: the same
// batches, also after a seek and after batches taken first.
TEST(DatasetLoader, LargeBatchesReadOnDemand)
{
    tsl_dataset_t ds;
    // 1200^2 pixels of f32 and per-pixel i64 labels: 16.5 MiB a sample, 66 MiB a batch of 4.
    ASSERT_EQ(open_dataset(&ds, "synthetic:dims=2,size=1200,samples=9,classes=3", TSL_SPLIT_TRAIN),
              TSL_OK);
    check_loader(ds, 4, test_seed(), 1, 0);
    tsl_loader_t ld = nullptr;
    ASSERT_EQ(tsl_loader_create(&ld, ds, 4, 5, 1, 0), TSL_OK);
    tsl_batch b;
    ASSERT_EQ(tsl_loader_next(ld, &b), TSL_OK);
    ASSERT_EQ(tsl_loader_seek(ld, 1, 2), TSL_OK);
    ASSERT_EQ(tsl_loader_next(ld, &b), TSL_OK);
    EXPECT_EQ(b.epoch, 1);
    EXPECT_EQ(b.index, 2);
    EXPECT_EQ(b.count, 1);
    std::vector<int64_t> order(9);
    ASSERT_EQ(tsl_dataset_epoch_order(order.data(), 9, 5, 1, 1), TSL_OK);
    EXPECT_EQ(b.indices[0], order[8]);
    Batch expected = read(ds, {order[8]});
    EXPECT_EQ(std::memcmp(b.x, expected.x.data(), expected.x.size() * sizeof(float)), 0);
    ASSERT_EQ(tsl_loader_next(ld, &b), TSL_OK); // wraps to the next epoch
    EXPECT_EQ(b.epoch, 2);
    EXPECT_EQ(b.index, 0);
    EXPECT_EQ(tsl_loader_destroy(ld), TSL_OK);
    tsl_dataset_destroy(ds);
}

TEST(DatasetLoader, OnTheTestSplit)
{
    tsl_dataset_t ds;
    ASSERT_EQ(open_dataset(&ds, "synthetic:dims=1,size=16,samples=50,classes=4", TSL_SPLIT_TEST),
              TSL_OK);
    check_loader(ds, 16, 3, 1, 0);
    tsl_dataset_destroy(ds);
}

TEST(DatasetLoader, BadArgumentsAndEarlyDestroy)
{
    tsl_dataset_t ds;
    ASSERT_EQ(open_dataset(&ds, "synthetic:dims=1,size=8,samples=5", TSL_SPLIT_TRAIN), TSL_OK);
    tsl_loader_t ld = nullptr;
    EXPECT_EQ(tsl_loader_create(&ld, ds, 6, 1, 1, 1), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("no complete batch"), std::string::npos);
    EXPECT_EQ(tsl_loader_create(&ld, ds, 0, 1, 1, 0), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_loader_create(&ld, nullptr, 2, 1, 1, 0), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(ld, nullptr);
    EXPECT_EQ(tsl_loader_next(nullptr, nullptr), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_loader_destroy(nullptr), TSL_OK);
    // Destroyed while its thread waits with a batch ready, or right away.
    for (int take = 0; take < 3; take++) {
        ASSERT_EQ(tsl_loader_create(&ld, ds, 2, 1, 1, 0), TSL_OK);
        tsl_batch batch;
        for (int t = 0; t < take; t++)
            ASSERT_EQ(tsl_loader_next(ld, &batch), TSL_OK);
        EXPECT_EQ(tsl_loader_destroy(ld), TSL_OK);
    }
    tsl_dataset_destroy(ds);
}

// A read error on the loader's thread reaches the caller, with its message, and stays.
TEST_F(DatasetNpy, LoaderReportsTheThreadsError)
{
    write_pair("", 6, true, 3);
    tsl_dataset_t ds;
    ASSERT_EQ(open_dataset(&ds, "npy:" + dir, TSL_SPLIT_TRAIN), TSL_OK) << tsl_last_error();
    check_loader(ds, 4, 9, 1, 0);
    ASSERT_EQ(truncate(path("x.npy").c_str(), 200), 0); // the file changes under the dataset
    tsl_loader_t ld;
    ASSERT_EQ(tsl_loader_create(&ld, ds, 4, 9, 0, 0), TSL_OK);
    tsl_batch batch;
    for (int call = 0; call < 2; call++) {
        EXPECT_EQ(tsl_loader_next(ld, &batch), TSL_ERR_IO);
        EXPECT_NE(std::string(tsl_last_error()).find("ended early"), std::string::npos)
            << tsl_last_error();
    }
    EXPECT_EQ(tsl_loader_destroy(ld), TSL_OK);
    tsl_dataset_destroy(ds);
}

} // namespace
