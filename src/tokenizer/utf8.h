// UTF-8 helpers shared by the tokenizer and the streaming detokenizer. Invalid input is never an
// error here: callers decide between keeping raw bytes (decode) and replacing with U+FFFD.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qf::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Appends the UTF-8 encoding of a code point (no validation beyond the 4-byte range).
void append(std::string& out, uint32_t cp);

// Length of the well-formed sequence starting at s[i], or 0 when s[i] starts no well-formed
// sequence (stray continuation, overlong, surrogate, > U+10FFFF, or cut short by the end).
size_t sequence_len(std::string_view s, size_t i);

// Length in bytes of the maximal subpart of an ill-formed sequence at s[i] (Unicode 3.9,
// "U+FFFD substitution of maximal subparts", the rule Python and browsers use): one U+FFFD
// replaces each such subpart. Only meaningful when sequence_len(s, i) == 0.
size_t invalid_subpart_len(std::string_view s, size_t i);

// True when s[i..] is a proper prefix of some well-formed sequence, i.e. more bytes could
// still complete it. Used by the streaming decoder to hold back an incomplete tail.
bool is_incomplete_prefix(std::string_view s, size_t i);

bool is_valid(std::string_view s);

// Copy of s with every maximal ill-formed subpart replaced by U+FFFD.
std::string sanitize(std::string_view s);

// At most `max_bytes` of sanitize(s), cut at a character boundary, with "..." appended when
// anything was cut: a piece of untrusted text that is safe to quote (in JSON, in a log line).
std::string clip(std::string_view s, size_t max_bytes);

}  // namespace qf::utf8
