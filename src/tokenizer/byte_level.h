// GPT-2 byte-level alphabet: every byte 0..255 is shown as one printable code point, so a
// BPE vocabulary of strings can cover arbitrary bytes. Printable Latin-1 bytes map to
// themselves; the other 68 (controls, space, 0x7F-0xA0, 0xAD) map to U+0100.. in byte order.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace qf::byte_level {

// The code point that stands for byte b.
uint32_t byte_to_cp(uint8_t b);

// Appends the byte-level spelling (UTF-8 of the mapped code points) of raw bytes.
void encode(std::string_view bytes, std::string& out);

// Maps a token's byte-level spelling back to raw bytes, appended to out. Returns false (and
// appends nothing) when some character is outside the alphabet: the ByteLevel decoder then
// keeps such a token's UTF-8 as it is, which is how added tokens like "<|im_end|>" survive.
bool decode(std::string_view token, std::string& out);

}  // namespace qf::byte_level
