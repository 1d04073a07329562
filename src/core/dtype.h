// Storage dtypes and scalar conversions (bf16/f16 <-> f32), shared by io, backends and tests.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace qf {

enum class DType : uint8_t { F32, F16, BF16, U32, U8, I32, I64, F64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
// Parses a safetensors dtype name; returns false for names qflash does not read.
bool dtype_from_name(const std::string& s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, NaN kept quiet (same rule as torch's float -> bfloat16 cast).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace qf
