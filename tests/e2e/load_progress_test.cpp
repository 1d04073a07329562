// The load progress bar counts bytes: forced on (QFLASH_PROGRESS=1), loading the demo target
// ends at 100% of the checkpoint's text-model and head tensor bytes, summed here from the files.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <regex>
#include <string>

#include "io/safetensors.h"

namespace qf {
namespace {

TEST(LoadProgress, CountsBytes) {
  const std::string cmd = "QFLASH_PROGRESS=1 " + std::string(QFLASH_BINARY_DIR) +
                          "/qflash run --device cpu --draft none --max-tokens 1 --prompt x 2>&1 >/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(WEXITSTATUS(pclose(p)), 0) << out;
  std::smatch bar;
  ASSERT_TRUE(std::regex_search(out, bar, std::regex(R"(loading target \[#+\] 100% ([0-9.]+)/([0-9.]+) MB)"))) << out;
  const TensorStore st = TensorStore::open_dir(std::string(QFLASH_SOURCE_DIR) + "/models/demo");
  size_t bytes = 0;
  for (const std::string& n : st.names())
    if (n.rfind("model.", 0) == 0 || n == "lm_head.weight") bytes += st.find(n)->nbytes;
  char want[32];
  std::snprintf(want, sizeof want, "%.1f", bytes / 1e6);
  EXPECT_EQ(bar[1].str(), want);
  EXPECT_EQ(bar[2].str(), want);
  EXPECT_GT(bytes, size_t(1) << 20);  // bytes, not a layer count
}

}  // namespace
}  // namespace qf
