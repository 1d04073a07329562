// Fuzz-style robustness of SafetensorsFile::parse: truncations and seeded header mutations of a
// valid file must either parse (with every tensor inside the buffer) or throw qf::Error; never
// crash, read out of bounds (the ASan build checks that) or leak another exception type.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

// A small valid file produced by write_safetensors, read back as bytes.
std::vector<uint8_t> valid_file() {
  const std::string p = ::testing::TempDir() + "qflash_io_fuzz_" + std::to_string(::getpid()) +
                        ".safetensors";
  std::vector<uint16_t> w(6, 0x3f80);
  std::vector<float> b = {1.f, 2.f, 3.f};
  std::vector<uint8_t> q = {1, 2, 3, 4, 5};
  qf::write_safetensors(p, {{"layer.weight", qf::DType::BF16, {2, 3}, w.data()},
                            {"layer.bias", qf::DType::F32, {3}, b.data()},
                            {"q", qf::DType::U8, {5}, q.data()}},
                        {{"format", "pt"}});
  std::ifstream in(p, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  std::filesystem::remove(p);
  return bytes;
}

enum class Outcome { Parsed, Rejected };

// Parses a private heap copy of exactly `n` bytes, so any read past the end is an ASan error.
Outcome parse_copy(const std::vector<uint8_t>& src, size_t n) {
  std::unique_ptr<uint8_t[]> buf(new uint8_t[n]);
  if (n) std::memcpy(buf.get(), src.data(), n);
  const uint8_t* lo = buf.get();
  const uint8_t* hi = lo + n;
  try {
    std::map<std::string, std::string> meta;
    auto ts = qf::SafetensorsFile::parse(lo, n, "fuzz.safetensors", &meta);
    for (const auto& t : ts) {
      EXPECT_GE(t.data, lo) << t.name;
      EXPECT_LE(t.data + t.nbytes, hi) << t.name;
      EXPECT_EQ(static_cast<int64_t>(t.nbytes),
                t.numel() * static_cast<int64_t>(qf::dtype_size(t.dtype)))
          << t.name;
      volatile uint8_t sink = 0;  // touch every byte: ASan reports any range outside the copy
      for (size_t i = 0; i < t.nbytes; ++i) sink = sink ^ t.data[i];
    }
    return Outcome::Parsed;
  } catch (const qf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fuzz.safetensors"), std::string::npos) << e.what();
    return Outcome::Rejected;
  }
  // Any other exception type escapes and fails the test.
}

uint64_t header_len(const std::vector<uint8_t>& f) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | f[i];
  return n;
}

}  // namespace

TEST(IoFuzz, EveryTruncationIsRejected) {
  const auto file = valid_file();
  ASSERT_LT(file.size(), 1000u);  // keep the sweep small
  // The last tensor ends at the end of the file, so every shorter prefix is invalid.
  for (size_t n = 0; n < file.size(); ++n)
    EXPECT_EQ(parse_copy(file, n), Outcome::Rejected) << "prefix of " << n << " bytes";
  EXPECT_EQ(parse_copy(file, file.size()), Outcome::Parsed);
}

TEST(IoFuzz, SeededHeaderMutations) {
  const auto file = valid_file();
  const size_t header_end = 8 + header_len(file);
  ASSERT_LE(header_end, file.size());
  // Bytes that matter to a JSON lexer, to reach deeper than random noise alone.
  const uint8_t interesting[] = {'"', '{', '}', '[', ']', ',', ':', '-', '0', '1', '9',
                                 'e', '.', '\\', ' ', 0x00, 0x7f, 0x80, 0xc3, 0xff};
  std::mt19937 rng(20261202);
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    std::vector<uint8_t> m = file;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      // One edit in eight hits the length prefix, the rest the JSON text.
      size_t pos = rng() % 8 == 0 ? rng() % 8 : 8 + rng() % (header_end - 8);
      switch (rng() % 3) {
        case 0: m[pos] = static_cast<uint8_t>(rng()); break;
        case 1: m[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        default: m[pos] = interesting[rng() % sizeof interesting]; break;
      }
    }
    SCOPED_TRACE(iter);
    (parse_copy(m, m.size()) == Outcome::Parsed ? parsed : rejected)++;
  }
  // Both outcomes must occur, or the mutations are not exercising the parser.
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
  std::printf("[ IoFuzz ] %d parsed, %d rejected\n", parsed, rejected);
}
