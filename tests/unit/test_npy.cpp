// .npy header parsing, whole-array read and write, and malformed files (src/npy.c).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "tessel/tessel.h"

namespace
{

class Npy : public ::testing::Test
{
  protected:
    void SetUp() override
    {
        char tmpl[] = "/tmp/tessel-npy-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir = tmpl;
    }
    void TearDown() override
    {
        std::string cmd = "rm -rf '" + dir + "'";
        ASSERT_EQ(std::system(cmd.c_str()), 0);
    }
    std::string path(const char *name) const
    {
        return dir + "/" + name;
    }
    void write_raw(const std::string &p, const std::string &bytes) const
    {
        FILE *f = std::fopen(p.c_str(), "wb");
        ASSERT_NE(f, nullptr);
        ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
        std::fclose(f);
    }
    // A version-1 file with the given dict text, padded to 64 bytes, then `data_bytes`.
    static std::string v1_file(const std::string &dict, size_t data_bytes)
    {
        std::string header = dict;
        size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
        header.append(total - 10 - header.size() - 1, ' ');
        header.push_back('\n');
        std::string out("\x93NUMPY\x01\x00", 8);
        out.push_back((char)(header.size() & 0xff));
        out.push_back((char)(header.size() >> 8));
        return out + header + std::string(data_bytes, '\x01');
    }
    tsl_status read(const std::string &p, tsl_npy_header *h)
    {
        void *data = nullptr;
        tsl_status st = tsl_npy_read(p.c_str(), h, &data);
        if (st == TSL_OK)
            EXPECT_NE(data, nullptr);
        else
            EXPECT_EQ(data, nullptr);
        tsl_free(data);
        return st;
    }
    std::string dir;
};

} // namespace

TEST_F(Npy, RoundTripEveryDtype)
{
    std::mt19937 rng(42);
    const tsl_dtype dtypes[] = {TSL_F32, TSL_F64, TSL_I32, TSL_I64, TSL_U8};
    for (tsl_dtype dt : dtypes) {
        for (int ndim = 1; ndim <= TSL_MAX_DIMS; ndim++) {
            int64_t dims[TSL_MAX_DIMS];
            for (int d = 0; d < ndim; d++)
                dims[d] = 1 + rng() % 5;
            tsl_shape shape;
            ASSERT_EQ(tsl_shape_make(&shape, ndim, dims), TSL_OK);
            size_t bytes = (size_t)tsl_shape_numel(&shape) * tsl_dtype_size(dt);
            std::vector<unsigned char> data(bytes);
            for (auto &b : data)
                b = (unsigned char)rng();
            std::string p = path("round.npy");
            ASSERT_EQ(tsl_npy_write(p.c_str(), dt, &shape, data.data()), TSL_OK)
                << tsl_last_error();
            tsl_npy_header h;
            void *back = nullptr;
            ASSERT_EQ(tsl_npy_read(p.c_str(), &h, &back), TSL_OK) << tsl_last_error();
            EXPECT_EQ(h.dtype, dt);
            EXPECT_EQ(h.version_major, 1);
            EXPECT_EQ(h.shape.ndim, ndim);
            for (int d = 0; d < ndim; d++)
                EXPECT_EQ(h.shape.dims[d], dims[d]);
            EXPECT_EQ(h.data_offset % 64, 0);
            EXPECT_EQ((size_t)h.data_bytes, bytes);
            EXPECT_EQ(std::memcmp(back, data.data(), bytes), 0);
            tsl_free(back);
        }
    }
}

// A streamed write gives the same bytes as a whole one; a short or an overlong stream leaves no
// file.
TEST_F(Npy, StreamedWriteMatchesWholeWrite)
{
    std::mt19937 rng(7);
    int64_t dims[3] = {7, 3, 5};
    tsl_shape shape;
    ASSERT_EQ(tsl_shape_make(&shape, 3, dims), TSL_OK);
    std::vector<double> data((size_t)tsl_shape_numel(&shape));
    for (double &v : data)
        v = (double)rng() / 3.0;
    std::string whole = path("whole.npy"), streamed = path("streamed.npy");
    ASSERT_EQ(tsl_npy_write(whole.c_str(), TSL_F64, &shape, data.data()), TSL_OK);
    tsl_npy_writer_t w = nullptr;
    ASSERT_EQ(tsl_npy_writer_open(&w, streamed.c_str(), TSL_F64, &shape), TSL_OK)
        << tsl_last_error();
    EXPECT_NE(access(streamed.c_str(), F_OK), 0) << "visible before close";
    size_t done = 0;
    for (size_t piece : {size_t(0), size_t(15), size_t(1), size_t(50), size_t(39)}) {
        ASSERT_EQ(tsl_npy_writer_append(w, data.data() + done, (int64_t)piece), TSL_OK);
        done += piece;
    }
    ASSERT_EQ(done, data.size());
    ASSERT_EQ(tsl_npy_writer_close(w), TSL_OK) << tsl_last_error();
    auto slurp = [](const std::string &p) {
        FILE *f = std::fopen(p.c_str(), "rb");
        std::string bytes;
        char buf[4096];
        size_t n;
        while (f && (n = std::fread(buf, 1, sizeof buf, f)) > 0)
            bytes.append(buf, n);
        if (f)
            std::fclose(f);
        return bytes;
    };
    EXPECT_EQ(slurp(streamed), slurp(whole));

    // Too few elements: close fails and no file appears.
    std::string short_path = path("short.npy");
    ASSERT_EQ(tsl_npy_writer_open(&w, short_path.c_str(), TSL_F64, &shape), TSL_OK);
    ASSERT_EQ(tsl_npy_writer_append(w, data.data(), 104), TSL_OK);
    EXPECT_EQ(tsl_npy_writer_close(w), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("never appended"), std::string::npos)
        << tsl_last_error();
    // Too many: the append fails, and so does the close.
    std::string long_path = path("long.npy");
    ASSERT_EQ(tsl_npy_writer_open(&w, long_path.c_str(), TSL_F64, &shape), TSL_OK);
    EXPECT_EQ(tsl_npy_writer_append(w, data.data(), 106), TSL_ERR_INVALID_ARG);
    EXPECT_NE(tsl_npy_writer_close(w), TSL_OK);
    // Discarded: nothing.
    std::string gone = path("gone.npy");
    ASSERT_EQ(tsl_npy_writer_open(&w, gone.c_str(), TSL_F64, &shape), TSL_OK);
    ASSERT_EQ(tsl_npy_writer_append(w, data.data(), 105), TSL_OK);
    tsl_npy_writer_discard(w);
    for (const std::string &p : {short_path, long_path, gone})
        EXPECT_NE(access(p.c_str(), F_OK), 0) << p;
    std::string cmd = "test -z \"$(ls '" + dir + "' | grep tmp)\"";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << "a temporary file was left behind";
}

TEST_F(Npy, HeaderTextMatchesNumpy)
{
    int64_t dims[2] = {3, 4};
    tsl_shape s;
    ASSERT_EQ(tsl_shape_make(&s, 2, dims), TSL_OK);
    float data[12] = {0};
    std::string p = path("h.npy");
    ASSERT_EQ(tsl_npy_write(p.c_str(), TSL_F32, &s, data), TSL_OK);
    FILE *f = std::fopen(p.c_str(), "rb");
    char buf[128] = {0};
    ASSERT_EQ(std::fread(buf, 1, 128, f), 128u);
    std::fclose(f);
    const std::string want = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }";
    EXPECT_EQ(std::string(buf + 10, want.size()), want);
    for (size_t i = 10 + want.size(); i < 127; i++)
        EXPECT_EQ(buf[i], ' ') << i;
    EXPECT_EQ(buf[127], '\n');
}

TEST_F(Npy, Version2And3Headers)
{
    const char *dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }";
    for (int major : {2, 3}) {
        std::string header = dict;
        size_t total = (12 + header.size() + 1 + 63) / 64 * 64;
        header.append(total - 12 - header.size() - 1, ' ');
        header.push_back('\n');
        std::string file("\x93NUMPY", 6);
        file.push_back((char)major);
        file.push_back('\0');
        uint32_t len = (uint32_t)header.size();
        file.append(reinterpret_cast<const char *>(&len), 4);
        file += header + std::string(16, '\x02');
        std::string p = path("v2.npy");
        write_raw(p, file);
        tsl_npy_header h;
        ASSERT_EQ(read(p, &h), TSL_OK) << tsl_last_error();
        EXPECT_EQ(h.version_major, major);
        EXPECT_EQ(h.dtype, TSL_I64);
        EXPECT_EQ(h.shape.dims[0], 2);
    }
}

TEST_F(Npy, BadFilesGetClearErrors)
{
    struct Case {
        const char *name;
        std::string bytes;
        tsl_status want;
        const char *message_part;
    };
    const std::string good_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    std::string wrong_magic = v1_file(good_dict, 24);
    wrong_magic[1] = 'M';
    std::string truncated_header = v1_file(good_dict, 0).substr(0, 40);
    std::string bad_version = v1_file(good_dict, 24);
    bad_version[6] = 9;
    std::vector<Case> cases = {
        {"empty", "", TSL_ERR_FORMAT, "magic"},
        {"wrong magic", wrong_magic, TSL_ERR_FORMAT, "magic"},
        {"truncated header", truncated_header, TSL_ERR_FORMAT, "truncated"},
        {"truncated data", v1_file(good_dict, 23), TSL_ERR_FORMAT, "truncated"},
        {"trailing data", v1_file(good_dict, 25), TSL_ERR_FORMAT, "after the data"},
        {"fortran order", v1_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24),
         TSL_ERR_UNSUPPORTED, "Fortran"},
        {"big endian", v1_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24),
         TSL_ERR_UNSUPPORTED, "big-endian"},
        {"wrong dtype", v1_file("{'descr': '<c8', 'fortran_order': False, 'shape': (2, 3), }", 48),
         TSL_ERR_UNSUPPORTED, "dtype"},
        {"structured dtype",
         v1_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8),
         TSL_ERR_UNSUPPORTED, "structured"},
        {"huge shape",
         v1_file("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
                 8),
         TSL_ERR_FORMAT, "large"},
        {"overflowing size",
         v1_file("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }", 8),
         TSL_ERR_FORMAT, "shape"},
        {"shape larger than file",
         v1_file("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000), }", 8),
         TSL_ERR_FORMAT, "truncated"},
        {"zero-d", v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4),
         TSL_ERR_UNSUPPORTED, "0-d"},
        {"six dims",
         v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1), }", 4),
         TSL_ERR_UNSUPPORTED, "dimensions"},
        {"empty array", v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", 0),
         TSL_ERR_UNSUPPORTED, "empty"},
        {"negative size", v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8),
         TSL_ERR_FORMAT, "shape"},
        {"missing key", v1_file("{'descr': '<f4', 'shape': (2,), }", 8), TSL_ERR_FORMAT, "lacks"},
        {"repeated key",
         v1_file("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8),
         TSL_ERR_FORMAT, "repeated"},
        {"not a dict", v1_file("['descr', '<f4']", 8), TSL_ERR_FORMAT, "dict"},
        {"garbage after dict", v1_file(good_dict + " xyz", 24), TSL_ERR_FORMAT, "trailing"},
        {"bad version", bad_version, TSL_ERR_UNSUPPORTED, "version"},
    };
    for (const Case &c : cases) {
        std::string p = path("bad.npy");
        write_raw(p, c.bytes);
        tsl_npy_header h;
        EXPECT_EQ(read(p, &h), c.want) << c.name << ": " << tsl_last_error();
        EXPECT_NE(std::strstr(tsl_last_error(), c.message_part), nullptr)
            << c.name << ": message '" << tsl_last_error() << "' lacks '" << c.message_part << "'";
    }
}

TEST_F(Npy, MissingFileAndBadArguments)
{
    tsl_npy_header h;
    void *data = nullptr;
    EXPECT_EQ(tsl_npy_read(path("none.npy").c_str(), &h, &data), TSL_ERR_IO);
    EXPECT_NE(std::strstr(tsl_last_error(), "none.npy"), nullptr);
    EXPECT_EQ(tsl_npy_read(nullptr, &h, &data), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_npy_parse_header(nullptr, 0, &h), TSL_ERR_INVALID_ARG);
    int64_t dims[1] = {2};
    tsl_shape s;
    ASSERT_EQ(tsl_shape_make(&s, 1, dims), TSL_OK);
    float v[2] = {1, 2};
    EXPECT_EQ(tsl_npy_write(path("x.npy").c_str(), (tsl_dtype)42, &s, v), TSL_ERR_DTYPE);
    EXPECT_EQ(tsl_npy_write((dir + "/no/such/dir/x.npy").c_str(), TSL_F32, &s, v), TSL_ERR_IO);
    // A failed write leaves nothing behind under the target name.
    EXPECT_NE(access((dir + "/no/such/dir/x.npy").c_str(), F_OK), 0);
}

TEST_F(Npy, ReadsFilesWrittenByNumpy)
{
    const char *fixtures = std::getenv("TESSEL_NUMPY_FIXTURES");
    if (!fixtures)
        GTEST_SKIP() << "TESSEL_NUMPY_FIXTURES not set (run through ctest)";
    // Written by tests/unit/make_numpy_fixtures.py: arange-based arrays, so element i has
    // value i (u8: i % 256), with format versions 1.0 and 2.0.
    struct F {
        const char *file;
        tsl_dtype dtype;
        int ndim;
        int64_t dims[3];
        int version;
    };
    const F files[] = {
        {"f4_v1.npy", TSL_F32, 3, {2, 3, 5}, 1}, {"f8_v2.npy", TSL_F64, 2, {7, 3}, 2},
        {"i4_v1.npy", TSL_I32, 1, {11}, 1},      {"i8_v1.npy", TSL_I64, 2, {4, 4}, 1},
        {"u1_v2.npy", TSL_U8, 1, {300}, 2},
    };
    for (const F &f : files) {
        std::string p = std::string(fixtures) + "/" + f.file;
        tsl_npy_header h;
        void *data = nullptr;
        ASSERT_EQ(tsl_npy_read(p.c_str(), &h, &data), TSL_OK) << f.file << ": " << tsl_last_error();
        EXPECT_EQ(h.dtype, f.dtype) << f.file;
        EXPECT_EQ(h.version_major, f.version) << f.file;
        ASSERT_EQ(h.shape.ndim, f.ndim) << f.file;
        int64_t n = 1;
        for (int d = 0; d < f.ndim; d++) {
            EXPECT_EQ(h.shape.dims[d], f.dims[d]);
            n *= f.dims[d];
        }
        for (int64_t i = 0; i < n; i++) {
            double v = 0;
            switch (f.dtype) {
            case TSL_F32:
                v = ((float *)data)[i];
                break;
            case TSL_F64:
                v = ((double *)data)[i];
                break;
            case TSL_I32:
                v = ((int32_t *)data)[i];
                break;
            case TSL_I64:
                v = (double)((int64_t *)data)[i];
                break;
            case TSL_U8:
                v = ((uint8_t *)data)[i];
                break;
            }
            ASSERT_EQ(v, f.dtype == TSL_U8 ? (double)(i % 256) : (double)i) << f.file << " " << i;
        }
        tsl_free(data);
    }
    // And numpy reads what tessel writes: the script checks files named tessel_*.npy when
    // run with --check; here write one for it.
    int64_t dims[2] = {3, 5};
    tsl_shape s;
    ASSERT_EQ(tsl_shape_make(&s, 2, dims), TSL_OK);
    std::vector<double> v(15);
    for (int i = 0; i < 15; i++)
        v[i] = i * 0.5;
    std::string out = std::string(fixtures) + "/tessel_f8.npy";
    ASSERT_EQ(tsl_npy_write(out.c_str(), TSL_F64, &s, v.data()), TSL_OK) << tsl_last_error();
}
