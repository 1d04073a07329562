// safetensors reading, sharded folders and atomic writing (src/io/safetensors.h).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "core/error.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace {

// A fresh folder per test, removed afterwards.
class IoSafetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = ::testing::TempDir() + "qflash_io_" + std::to_string(::getpid()) + "_" +
           std::to_string(counter++) + "_" + info->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Raw file: 8-byte little-endian length, header text, data bytes.
std::vector<uint8_t> raw_file(const std::string& header, size_t data_bytes,
                              uint64_t len_override = UINT64_MAX) {
  uint64_t len = len_override == UINT64_MAX ? header.size() : len_override;
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(len >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0xAB);
  return out;
}

void write_bytes(const std::string& p, const std::vector<uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Runs `fn`, which must throw qf::Error of `kind` whose message contains every `needle`.
void expect_error(const std::function<void()>& fn, qf::ErrorKind kind,
                  const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const qf::Error& e) {
    EXPECT_EQ(qf::error_kind_name(e.kind()), std::string(qf::error_kind_name(kind))) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message lacks '" << n << "': " << e.what();
    return;
  }
  ADD_FAILURE() << "no qf::Error thrown";
}

}  // namespace

TEST_F(IoSafetensors, RoundTripEveryDtype) {
  const qf::DType all[] = {qf::DType::BF16, qf::DType::F16, qf::DType::F32, qf::DType::U32,
                           qf::DType::U8,   qf::DType::I32, qf::DType::I64, qf::DType::F64};
  for (qf::DType dt : all) {
    SCOPED_TRACE(qf::dtype_name(dt));
    const std::vector<int64_t> shape = {3, 5, 7};
    auto bytes = random_bytes(105 * qf::dtype_size(dt), static_cast<uint32_t>(dt) + 1);
    auto odd = random_bytes(3, 99);  // 3 x U8 puts the next tensor off 8-byte alignment
    const std::string p = path(std::string("rt_") + qf::dtype_name(dt) + ".safetensors");
    // Given out of name order: the file must still list and lay them out sorted.
    qf::write_safetensors(p, {{"z.weight", dt, shape, bytes.data()},
                              {"a.odd", qf::DType::U8, {3}, odd.data()}},
                          {{"format", "pt"}});
    auto f = qf::SafetensorsFile::open(p);
    ASSERT_EQ(f->tensors().size(), 2u);
    const qf::TensorInfo& a = f->tensors()[0];
    const qf::TensorInfo& z = f->tensors()[1];
    EXPECT_EQ(a.name, "a.odd");
    EXPECT_EQ(z.name, "z.weight");
    EXPECT_EQ(z.dtype, dt);
    EXPECT_EQ(z.shape, shape);
    EXPECT_EQ(z.numel(), 105);
    EXPECT_EQ(z.shape_str(), "[3, 5, 7]");
    EXPECT_EQ(z.file, p);
    ASSERT_EQ(z.nbytes, bytes.size());
    EXPECT_EQ(std::memcmp(z.data, bytes.data(), bytes.size()), 0);
    EXPECT_EQ(std::memcmp(a.data, odd.data(), 3), 0);
    EXPECT_LT(a.data, z.data);  // sorted by name in the data section too
    EXPECT_EQ(f->metadata().at("format"), "pt");

    // Data section 8-byte aligned, header padded with spaces, file exactly header + data.
    std::ifstream in(p, std::ios::binary);
    std::vector<char> all_bytes((std::istreambuf_iterator<char>(in)), {});
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<uint8_t>(all_bytes[i]);
    EXPECT_EQ((8 + hlen) % 8, 0u);
    EXPECT_EQ(all_bytes.size(), 8 + hlen + bytes.size() + 3);
    std::string header(all_bytes.begin() + 8, all_bytes.begin() + 8 + static_cast<long>(hlen));
    EXPECT_EQ(header.front(), '{');
    EXPECT_LT(header.find("\"a.odd\""), header.find("\"z.weight\""));
  }
}

TEST_F(IoSafetensors, RoundTripScalarAndEmpty) {
  float scalar = 2.5f;
  const std::string p = path("model.safetensors");
  qf::write_safetensors(p, {{"s", qf::DType::F32, {}, &scalar},
                            {"e", qf::DType::BF16, {0, 4}, nullptr}});
  auto store = qf::TensorStore::open_dir(dir_);
  ASSERT_EQ(store.size(), 2u);
  const auto& s = store.require("s", {qf::DType::F32}, {});
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.shape_str(), "[]");
  float back;
  std::memcpy(&back, s.data, 4);
  EXPECT_EQ(back, 2.5f);
  EXPECT_EQ(store.require("e", {}, {0, 4}).nbytes, 0u);
  EXPECT_EQ(store.total_bytes(), 4u);
}

TEST_F(IoSafetensors, ShardedIndex) {
  auto a = random_bytes(64, 1), b = random_bytes(32, 2), c = random_bytes(16, 3);
  qf::write_safetensors(path("model-00001-of-00002.safetensors"),
                        {{"a", qf::DType::F32, {4, 4}, a.data()},
                         {"b", qf::DType::BF16, {16}, b.data()}});
  qf::write_safetensors(path("model-00002-of-00002.safetensors"),
                        {{"c", qf::DType::U8, {16}, c.data()}});
  qf::write_file_atomic(path("model.safetensors.index.json"),
                        R"({"metadata": {"total_size": 112}, "weight_map": {
                          "a": "model-00001-of-00002.safetensors",
                          "b": "model-00001-of-00002.safetensors",
                          "c": "model-00002-of-00002.safetensors"}})");
  auto store = qf::TensorStore::open_dir(dir_);
  EXPECT_EQ(store.size(), 3u);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(store.total_bytes(), 112u);
  EXPECT_EQ(store.find("c")->file, path("model-00002-of-00002.safetensors"));
  EXPECT_EQ(std::memcmp(store.find("a")->data, a.data(), 64), 0);
  EXPECT_EQ(std::memcmp(store.find("c")->data, c.data(), 16), 0);
  EXPECT_EQ(store.find("nope"), nullptr);
}

TEST_F(IoSafetensors, IndexMissingShard) {
  float x = 1;
  qf::write_safetensors(path("s1.safetensors"), {{"a", qf::DType::F32, {1}, &x}});
  qf::write_file_atomic(path("model.safetensors.index.json"),
                        R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_error([&] { qf::TensorStore::open_dir(dir_); }, qf::ErrorKind::Io,
               {"model.safetensors.index.json", "s2.safetensors", "'b'"});
}

TEST_F(IoSafetensors, IndexTensorNotInShard) {
  float x = 1;
  qf::write_safetensors(path("s1.safetensors"), {{"a", qf::DType::F32, {1}, &x}});
  qf::write_file_atomic(path("model.safetensors.index.json"),
                        R"({"weight_map": {"a": "s1.safetensors", "ghost": "s1.safetensors"}})");
  expect_error([&] { qf::TensorStore::open_dir(dir_); }, qf::ErrorKind::Format,
               {"model.safetensors.index.json", "'ghost'", "s1.safetensors"});
}

TEST_F(IoSafetensors, IndexMalformed) {
  qf::write_file_atomic(path("model.safetensors.index.json"), R"({"weight_map": [1, 2]})");
  expect_error([&] { qf::TensorStore::open_dir(dir_); }, qf::ErrorKind::Format,
               {"model.safetensors.index.json", "weight_map"});
  qf::write_file_atomic(path("model.safetensors.index.json"), "{not json");
  expect_error([&] { qf::TensorStore::open_dir(dir_); }, qf::ErrorKind::Format,
               {"model.safetensors.index.json"});
  qf::write_file_atomic(path("model.safetensors.index.json"),
                        R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
  expect_error([&] { qf::TensorStore::open_dir(dir_); }, qf::ErrorKind::Format,
               {"../elsewhere.safetensors", "'a'"});
}

TEST_F(IoSafetensors, FallbackGlobSortedAndDuplicates) {
  float x = 1, y = 2;
  qf::write_safetensors(path("b.safetensors"), {{"t1", qf::DType::F32, {1}, &x}});
  qf::write_safetensors(path("a.safetensors"), {{"t0", qf::DType::F32, {1}, &y}});
  write_bytes(path("notes.txt"), {1, 2, 3});
  auto store = qf::TensorStore::open_dir(dir_);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"t0", "t1"}));
  EXPECT_EQ(store.find("t0")->file, path("a.safetensors"));

  qf::write_safetensors(path("c.safetensors"), {{"t1", qf::DType::F32, {1}, &y}});
  expect_error([&] { qf::TensorStore::open_dir(dir_); }, qf::ErrorKind::Format,
               {"'t1'", path("b.safetensors"), path("c.safetensors")});
}

TEST_F(IoSafetensors, PrefersSingleFileOverGlob) {
  float x = 1;
  qf::write_safetensors(path("model.safetensors"), {{"main", qf::DType::F32, {1}, &x}});
  qf::write_safetensors(path("extra.safetensors"), {{"other", qf::DType::F32, {1}, &x}});
  auto store = qf::TensorStore::open_dir(dir_);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"main"}));
}

TEST_F(IoSafetensors, OpenDirAcceptsFileAndTrailingSlash) {
  float x = 1;
  qf::write_safetensors(path("model.safetensors"), {{"m", qf::DType::F32, {1}, &x}});
  auto by_file = qf::TensorStore::open_dir(path("model.safetensors"));
  EXPECT_EQ(by_file.names(), (std::vector<std::string>{"m"}));
  auto slashed = qf::TensorStore::open_dir(dir_ + "/");
  EXPECT_EQ(slashed.dir(), dir_);
  EXPECT_EQ(slashed.find("m")->file, path("model.safetensors"));
}

TEST_F(IoSafetensors, MissingFolderOrFiles) {
  expect_error([&] { qf::TensorStore::open_dir(path("absent")); }, qf::ErrorKind::Io,
               {path("absent")});
  expect_error([&] { qf::TensorStore::open_dir(dir_); }, qf::ErrorKind::Io, {dir_});
  expect_error([&] { qf::SafetensorsFile::open(path("absent.safetensors")); }, qf::ErrorKind::Io,
               {path("absent.safetensors")});
}

TEST_F(IoSafetensors, RequireErrors) {
  std::vector<uint16_t> w(6, 0);
  qf::write_safetensors(path("model.safetensors"), {{"w", qf::DType::BF16, {2, 3}, w.data()}});
  auto store = qf::TensorStore::open_dir(dir_);
  EXPECT_EQ(store.require("w", {qf::DType::F32, qf::DType::BF16}, {2, 3}).nbytes, 12u);
  EXPECT_EQ(store.require("w", {}, {-1, 3}).nbytes, 12u);  // -1 matches any size
  try {
    store.require("lm_head.weight", {qf::DType::BF16}, {2, 3});
    ADD_FAILURE() << "missing tensor accepted";
  } catch (const qf::Error& e) {
    EXPECT_EQ(e.kind(), qf::ErrorKind::Tensor);
    EXPECT_EQ(std::string(e.what()),
              "tensor 'lm_head.weight' not found in " + dir_ + " (1 tensors)");
  }
  expect_error([&] { store.require("w", {qf::DType::F32}, {2, 3}); }, qf::ErrorKind::Tensor,
               {"'w'", path("model.safetensors"), "BF16", "expected F32"});
  expect_error([&] { store.require("w", {qf::DType::BF16}, {3, 2}); }, qf::ErrorKind::Tensor,
               {"'w'", path("model.safetensors"), "[2, 3]", "expected [3, 2]"});
  expect_error([&] { store.require("w", {qf::DType::BF16}, {2, 3, 1}); }, qf::ErrorKind::Tensor,
               {"'w'", "[2, 3]", "[2, 3, 1]"});
}

// ---- header validation: one test per rule, each naming the file and the tensor -----------

struct BadHeader {
  const char* what;
  std::string header;
  size_t data_bytes;
  std::vector<std::string> needles;
};

TEST_F(IoSafetensors, HeaderValidationFailures) {
  const std::vector<BadHeader> cases = {
      {"not json", "{\"a\": ", 0, {"not valid JSON"}},
      {"not an object", "[1, 2]", 0, {"object", "array"}},
      {"entry not object", R"({"t": 5})", 0, {"'t'", "object"}},
      {"missing dtype", R"({"t": {"shape": [1], "data_offsets": [0, 4]}})", 4, {"'t'", "dtype"}},
      {"missing shape", R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, {"'t'", "shape"}},
      {"missing offsets", R"({"t": {"dtype": "F32", "shape": [1]}})", 4, {"'t'", "data_offsets"}},
      {"dtype not string", R"({"t": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}})", 4,
       {"'t'", "dtype", "7"}},
      {"unknown dtype", R"({"t": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}})",
       1, {"'t'", "unknown dtype 'F8_E4M3'"}},
      {"shape not array", R"({"t": {"dtype": "F32", "shape": 4, "data_offsets": [0, 4]}})", 4,
       {"'t'", "shape"}},
      {"negative dim", R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
       {"'t'", "non-negative", "-1"}},
      {"float dim", R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
       {"'t'", "integer", "1.5"}},
      {"numel overflow",
       R"({"t": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 1]}})", 1,
       {"'t'", "overflows"}},
      {"bytes overflow",
       R"({"t": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 1]}})", 1,
       {"'t'", "overflows"}},
      {"offsets not pair", R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4,
       {"'t'", "data_offsets"}},
      {"negative offset", R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4,
       {"'t'", "non-negative"}},
      {"begin after end", R"({"t": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}})", 4,
       {"'t'", "begin > end"}},
      {"span mismatch", R"({"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})",
       16, {"'t'", "span 12 bytes, expected 16", "[2, 2]"}},
      {"past data", R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 8,
       {"'t'", "past the data section (8 bytes)"}},
      {"overlap",
       R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, {"'x'", "'y'", "overlap"}},
      {"duplicate name",
       R"({"d": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
           "d": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
       2, {"'d'", "twice"}},
      {"metadata not object", R"({"__metadata__": 3})", 0, {"__metadata__"}},
      {"metadata value not string", R"({"__metadata__": {"k": 1}})", 0, {"__metadata__", "'k'"}},
      {"too deep", std::string(40, '[') + std::string(40, ']'), 0, {"nests 40 deep"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string p = path("bad.safetensors");
    write_bytes(p, raw_file(c.header, c.data_bytes));
    std::vector<std::string> needles = c.needles;
    needles.push_back(p);  // every message names the file
    expect_error([&] { qf::SafetensorsFile::open(p); }, qf::ErrorKind::Format, needles);
  }
}

TEST_F(IoSafetensors, ValidEdgeCasesAccepted) {
  // Zero-size tensors may sit anywhere inside the data section without "overlapping".
  auto bytes = raw_file(R"({"__metadata__": {"format": "pt"},
      "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [4, 4]},
      "extra": {"dtype": "U8", "shape": [], "data_offsets": [8, 9], "note": "ignored"}})", 9);
  std::map<std::string, std::string> meta;
  auto ts = qf::SafetensorsFile::parse(bytes.data(), bytes.size(), "mem", &meta);
  ASSERT_EQ(ts.size(), 3u);
  EXPECT_EQ(meta.at("format"), "pt");
  EXPECT_EQ(ts[1].nbytes, 0u);
  EXPECT_EQ(ts[2].nbytes, 1u);
}

TEST_F(IoSafetensors, LengthPrefixFailures) {
  const std::string p = path("short.safetensors");
  write_bytes(p, {1, 2, 3});
  expect_error([&] { qf::SafetensorsFile::open(p); }, qf::ErrorKind::Format,
               {p, "3 bytes", "too small"});
  write_bytes(p, {});
  expect_error([&] { qf::SafetensorsFile::open(p); }, qf::ErrorKind::Format, {p, "0 bytes"});
  write_bytes(p, raw_file("{}", 0, 1000));
  expect_error([&] { qf::SafetensorsFile::open(p); }, qf::ErrorKind::Format,
               {p, "header length 1000 exceeds file size - 8 = 2"});

  // A header length above 100 MB in a file that is really that large: a sparse file keeps it
  // cheap, and the limit must trip before any of it is parsed.
  const std::string big = path("big.safetensors");
  {
    std::vector<uint8_t> head = raw_file("{", 0, 150ull << 20);
    write_bytes(big, head);
    ASSERT_EQ(::truncate(big.c_str(), (160ll << 20)), 0);
  }
  expect_error([&] { qf::SafetensorsFile::open(big); }, qf::ErrorKind::Format,
               {big, "header length 157286400 exceeds the 104857600-byte limit"});
}

// ---- atomic writing ---------------------------------------------------------------------

bool has_temp_files(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

TEST_F(IoSafetensors, AtomicTextWriteAndRead) {
  const std::string p = path("cfg.json");
  qf::write_file_atomic(p, "first");
  EXPECT_EQ(qf::read_text_file(p), "first");
  qf::write_file_atomic(p, std::string("sec\0ond", 7));  // replaces, keeps embedded NUL
  EXPECT_EQ(qf::read_text_file(p), std::string("sec\0ond", 7));
  EXPECT_FALSE(has_temp_files(dir_));
  expect_error([&] { qf::read_text_file(path("missing.json")); }, qf::ErrorKind::Io,
               {path("missing.json")});
}

TEST_F(IoSafetensors, AtomicWriteFailureRemovesTemp) {
  // Renaming a file over a non-empty directory fails after the temp file is fully written.
  fs::create_directories(path("target.safetensors/sub"));
  float x = 1;
  expect_error([&] { qf::write_safetensors(path("target.safetensors"),
                                           {{"a", qf::DType::F32, {1}, &x}}); },
               qf::ErrorKind::Io, {path("target.safetensors")});
  EXPECT_FALSE(has_temp_files(dir_));
  fs::create_directories(path("cfg.json/sub"));
  expect_error([&] { qf::write_file_atomic(path("cfg.json"), "x"); }, qf::ErrorKind::Io,
               {path("cfg.json")});
  EXPECT_FALSE(has_temp_files(dir_));
  // A folder that does not exist: the temp file cannot even be created.
  expect_error([&] { qf::write_file_atomic(path("no/such/dir/f.json"), "x"); }, qf::ErrorKind::Io,
               {path("no/such/dir/f.json")});
}

TEST_F(IoSafetensors, WriteRejectsBadTensorsBeforeCreatingFiles) {
  float x = 1;
  const std::string p = path("w.safetensors");
  expect_error([&] { qf::write_safetensors(p, {{"a", qf::DType::F32, {1}, &x},
                                               {"a", qf::DType::F32, {1}, &x}}); },
               qf::ErrorKind::Tensor, {p, "'a'"});
  expect_error([&] { qf::write_safetensors(p, {{"a", qf::DType::F32, {-2}, &x}}); },
               qf::ErrorKind::Tensor, {p, "'a'", "[-2]"});  // printed as given
  expect_error([&] { qf::write_safetensors(p, {{"a", qf::DType::F32, {4}, nullptr}}); },
               qf::ErrorKind::Tensor, {p, "'a'"});
  expect_error([&] { qf::write_safetensors(p, {{"__metadata__", qf::DType::F32, {1}, &x}}); },
               qf::ErrorKind::Tensor, {p});
  EXPECT_TRUE(fs::is_empty(dir_));
}
