#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "core/error.h"
#include "io/config.h"
#include "io/quantize.h"
#include "io/safetensors.h"

namespace qf::cli {

namespace fs = std::filesystem;

int cmd_inspect(const std::string& dir) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  const std::string text = read_text_file(cfg_path);
  const bool is_drafter = text.find("DFlash") != std::string::npos;
  int status = 0;
  if (is_drafter) {
    DrafterConfig d = load_drafter_config(dir);
    std::printf("drafter     %s (%s)\n", dir.c_str(), d.architecture.c_str());
    std::printf("shape       hidden %d, %d layers, heads %d/%d x %d, intermediate %d, vocab %d\n", d.hidden_size,
                d.num_hidden_layers, d.num_attention_heads, d.num_key_value_heads, d.head_dim, d.intermediate_size,
                d.vocab_size);
    std::printf("block       %d (%d drafts), mask id %d, window %d, taps [", d.block_size, d.block_size - 1,
                d.mask_token_id, d.sliding_window);
    for (size_t i = 0; i < d.target_layer_ids.size(); i++)
      std::printf("%s%d", i ? ", " : "", d.target_layer_ids[i]);
    std::printf("] of %d target layers\n", d.num_target_layers);
    if (d.is_v2)
      std::printf("dflash2     conv kernel %d group %d, selector rank %d top-%d\n", d.conv_kernel_size,
                  d.conv_group_size, d.selector_rank, d.selector_top_k);
  } else {
    TargetConfig c = load_target_config(dir);
    std::printf("target      %s (%s layout, model_type %s)\n", dir.c_str(), c.layout.c_str(), c.model_type.c_str());
    std::printf("shape       hidden %d, %d layers (%d attention, %d deltanet), intermediate %d, vocab %d\n",
                c.hidden_size, c.num_hidden_layers, c.n_full_layers(), c.n_gdn_layers(), c.intermediate_size,
                c.vocab_size);
    std::printf("attention   %d heads / %d kv x %d, rotary %d, theta %g\n", c.num_attention_heads,
                c.num_key_value_heads, c.head_dim, c.rotary_dim, c.rope_theta);
    std::printf("deltanet    %d key / %d value heads, dims %d/%d, conv %d\n", c.linear_num_key_heads,
                c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim);
    std::printf("mtp layers  %d\n", c.mtp_num_hidden_layers);
    if (c.quant_bits) std::printf("quantized   int%d, group %d\n", c.quant_bits, c.quant_group);
    const fs::path drafter = fs::path(dir) / "drafter";
    if (fs::exists(drafter / "config.json")) {
      try {
        DrafterConfig d = load_drafter_config(drafter.string());
        check_drafter_pair(d, c);
        std::printf("drafter     %s: %s, pairing ok\n", drafter.c_str(), d.architecture.c_str());
      } catch (const Error& e) {
        std::printf("drafter     %s: GUARD FAILED: %s\n", drafter.c_str(), e.what());
        status = 1;
      }
    }
  }
  try {
    TensorStore st = TensorStore::open_dir(dir);
    std::printf("tensors     %zu, %.2f MB\n", st.size(), st.total_bytes() / 1e6);
  } catch (const Error& e) {
    std::printf("tensors     GUARD FAILED: %s\n", e.what());
    status = 1;
  }
  return status;
}

int cmd_quantize(const QuantizeArgs& a) {
  QuantizeOptions o;
  o.group = a.group;
  o.keep_embed_and_head = a.keep_head;
  quantize_checkpoint(a.model, a.out, o);
  return 0;
}

}  // namespace qf::cli
