// int4 group-affine quantization in the mlx-community layout (docs/spec/qwen38.md 2.2): per group of
// `group` weights, scale = (max - min) / 15 and bias = min, both rounded to bf16 first;
// q = round((w - bias) / scale) in 0..15; 8 nibbles per u32, element j at bits 4j.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace qf {

// Quantizes one row of `cols` weights (cols % group == 0, group % 8 == 0).
// q: [cols/8] words, scales/biases: [cols/group] bf16 bit patterns.
void int4_quantize_row(const float* w, int64_t cols, int group, uint32_t* q, uint16_t* scales, uint16_t* biases);
// A whole row-major matrix [rows, cols] of bf16 / f16 / f32 (`src`, any alignment), rows in
// parallel: q [rows, cols/8], scales/biases [rows, cols/group]. Each row exactly as
// int4_quantize_row quantizes it (the result does not depend on the thread count).
void int4_quantize_matrix(const void* src, DType dtype, int64_t rows, int64_t cols, int group, uint32_t* q,
                          uint16_t* scales, uint16_t* biases);

// The int4 group sizes qflash reads and writes: 32, 64 or 128 (mlx's set, and config.json's
// "group_size" check). A u32 word holds 8 columns and the CUDA GEMV reads 32 columns under one
// scale, so a group must be a multiple of 32 to dequantize correctly on every backend.
bool int4_group_supported(int64_t group);
// Throws qf::Error(kind) unless `group` is supported and divides `cols`:
// "<what>: int4 group size expected 32, 64 or 128 dividing <cols>, found <group>".
void check_int4_group(ErrorKind kind, const std::string& what, int64_t cols, int64_t group);

struct QuantizeOptions {
  int64_t group = 64;
  bool keep_embed_and_head = false;   // leave embed_tokens / lm_head in bf16
  size_t shard_bytes = size_t(4) << 30;
};

// Throws qf::Error(Usage) for an unsupported group: "group: expected 32, 64 or 128, found <g>".
void validate_quantize_options(const QuantizeOptions& opt);

// Writes an int4 copy of the checkpoint `src` into the new folder `dst`: every 2-D matrix
// weight quantized (norms, conv, A_log, dt_bias kept), config.json with "quantization", the
// tokenizer and generation files and a drafter/ folder copied unchanged. Returns bytes written.
size_t quantize_checkpoint(const std::string& src, const std::string& dst, const QuantizeOptions& opt);

// The inverse direction: writes a bf16 copy of the int4 checkpoint `src` (config.json with a
// "quantization" block) into the new folder `dst`. Every int4 matrix becomes
// W[r, c] = bf16_rn(fl(q * scale) + bias), the value the int4 prefill path feeds its GEMM
// (backend.h), so the copy computes what the int4 checkpoint computes up to the kernels'
// accumulation order; other tensors, the tokenizer files and drafter/ are copied unchanged, and
// config.json loses its "quantization" block. Throws qf::Error(Usage) when `src` is not int4 or
// `dst` exists and is not empty, qf::Error(Format) naming the tensor when a matrix's words,
// scales or biases disagree in shape or dtype. Returns bytes written.
size_t dequantize_checkpoint(const std::string& src, const std::string& dst);

}  // namespace qf
