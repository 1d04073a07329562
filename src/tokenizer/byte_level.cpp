#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace qf::byte_level {
namespace {

struct Tables {
  std::array<uint32_t, 256> cp_of_byte{};
  std::array<int16_t, 0x144> byte_of_cp{};  // mapped code points are all below U+0144; -1 = none
  std::array<std::string, 256> utf8_of_byte;

  Tables() {
    byte_of_cp.fill(-1);
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      cp_of_byte[b] = cp;
      byte_of_cp[cp] = static_cast<int16_t>(b);
      utf8::append(utf8_of_byte[b], cp);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_cp(uint8_t b) { return tables().cp_of_byte[b]; }

void encode(std::string_view bytes, std::string& out) {
  const Tables& t = tables();
  for (char c : bytes) out += t.utf8_of_byte[static_cast<uint8_t>(c)];
}

bool decode(std::string_view token, std::string& out) {
  const Tables& t = tables();
  size_t start = out.size();
  for (size_t i = 0; i < token.size();) {
    auto b0 = static_cast<uint8_t>(token[i]);
    uint32_t cp;
    // The alphabet lives in U+0021..U+0143: one or two UTF-8 bytes.
    if (b0 < 0x80) {
      cp = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < token.size() &&
               (static_cast<uint8_t>(token[i + 1]) & 0xC0) == 0x80) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(token[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      out.resize(start);
      return false;
    }
    if (cp >= t.byte_of_cp.size() || t.byte_of_cp[cp] < 0) {
      out.resize(start);
      return false;
    }
    out.push_back(static_cast<char>(t.byte_of_cp[cp]));
  }
  return true;
}

}  // namespace qf::byte_level
