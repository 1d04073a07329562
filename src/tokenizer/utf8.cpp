#include "tokenizer/utf8.h"

#include <algorithm>

namespace qf::utf8 {
namespace {

// Shape of a well-formed sequence by its lead byte (Unicode Table 3-7): total length and the
// allowed range of the second byte; later bytes are always 80..BF. len 0 = not a lead byte.
struct LeadInfo {
  int len;
  uint8_t lo, hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes from s[i] that agree with a well-formed sequence, and its full length.
size_t matched_prefix(std::string_view s, size_t i, int* full_len) {
  LeadInfo li = lead_info(static_cast<uint8_t>(s[i]));
  *full_len = li.len;
  if (li.len <= 1) return li.len;
  size_t n = 1;
  while (n < static_cast<size_t>(li.len) && i + n < s.size()) {
    auto b = static_cast<uint8_t>(s[i + n]);
    uint8_t lo = n == 1 ? li.lo : 0x80, hi = n == 1 ? li.hi : 0xBF;
    if (b < lo || b > hi) break;
    ++n;
  }
  return n;
}

}  // namespace

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t sequence_len(std::string_view s, size_t i) {
  int full = 0;
  size_t n = matched_prefix(s, i, &full);
  return full > 0 && n == static_cast<size_t>(full) ? n : 0;
}

size_t invalid_subpart_len(std::string_view s, size_t i) {
  int full = 0;
  size_t n = matched_prefix(s, i, &full);
  return n == 0 ? 1 : n;
}

bool is_incomplete_prefix(std::string_view s, size_t i) {
  int full = 0;
  size_t n = matched_prefix(s, i, &full);
  return full > 1 && n == s.size() - i && n < static_cast<size_t>(full);
}

bool is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = sequence_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = sequence_len(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append(kReplacement);
      i += invalid_subpart_len(s, i);
    }
  }
  return out;
}

std::string clip(std::string_view s, size_t max_bytes) {
  std::string out = sanitize(s.substr(0, std::min(s.size(), max_bytes + 4)));
  if (out.size() <= max_bytes && s.size() <= max_bytes) return out;
  size_t cut = std::min(max_bytes, out.size());
  while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) cut--;  // a continuation byte
  out.resize(cut);
  return out + "...";
}

}  // namespace qf::utf8
