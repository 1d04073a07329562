// int4 group-affine quantization in the mlx-community layout (spec/qwen38.md 2.2): per group of
// `group` weights, scale = (max - min) / 15 and bias = min, both rounded to bf16 first;
// q = round((w - bias) / scale) in 0..15; 8 nibbles per u32, element j at bits 4j.
#pragma once
#include <cstdint>
#include <string>

namespace qf {

// Quantizes one row of `cols` weights (cols % group == 0, group % 8 == 0).
// q: [cols/8] words, scales/biases: [cols/group] bf16 bit patterns.
void int4_quantize_row(const float* w, int64_t cols, int group, uint32_t* q, uint16_t* scales, uint16_t* biases);

struct QuantizeOptions {
  int group = 64;
  bool keep_embed_and_head = false;   // leave embed_tokens / lm_head in bf16
  size_t shard_bytes = size_t(4) << 30;
};

// Writes an int4 copy of the checkpoint `src` into the new folder `dst`: every 2-D matrix
// weight quantized (norms, conv, A_log, dt_bias kept), config.json with "quantization", the
// tokenizer and generation files and a drafter/ folder copied unchanged. Returns bytes written.
size_t quantize_checkpoint(const std::string& src, const std::string& dst, const QuantizeOptions& opt);

}  // namespace qf
