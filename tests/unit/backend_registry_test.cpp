// The backend registry (backend/registry.h): what --device accepts and which backends the tests
// run on.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "backend/registry.h"
#include "core/error.h"

namespace qf {
namespace {

TEST(BackendRegistry, CpuIsAlwaysAvailableAndLast) {
  const auto& reg = backend_registry();
  ASSERT_FALSE(reg.empty());
  EXPECT_EQ(reg.back().name, "cpu");
  EXPECT_FALSE(reg.back().accelerator);
  // accelerators first: --device auto prefers them
  const auto first_cpu = std::find_if(reg.begin(), reg.end(), [](const BackendEntry& e) { return !e.accelerator; });
  EXPECT_TRUE(std::all_of(first_cpu, reg.end(), [](const BackendEntry& e) { return !e.accelerator; }));
  std::string why = "unchanged";
  EXPECT_TRUE(backend_available("cpu", &why));
  EXPECT_TRUE(why.empty()) << why;
  const auto names = available_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
  EXPECT_NE(find_backend("cuda"), nullptr) << "cuda is listed in every build, available or not";
}

TEST(BackendRegistry, AvailableBackendsStartAndNameThemselves) {
  for (const std::string& name : available_backends()) {
    auto be = create_backend(name);
    ASSERT_NE(be, nullptr) << name;
    EXPECT_EQ(be->name().rfind(name, 0), 0u) << "backend " << name << " calls itself " << be->name();
    EXPECT_EQ(be->is_gpu(), find_backend(name)->accelerator) << name;
  }
}

TEST(BackendRegistry, AutoPicksTheFirstAvailable) {
  auto be = create_backend("auto");
  ASSERT_NE(be, nullptr);
  EXPECT_EQ(be->name().rfind(available_backends().front(), 0), 0u) << be->name();
}

TEST(BackendRegistry, UnknownAndUnavailableDevicesSayWhy) {
  try {
    create_backend("tpu");
    FAIL() << "--device tpu accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find(backend_names()), std::string::npos) << e.what();
  }
  std::string why;
  EXPECT_FALSE(backend_available("tpu", &why));
  EXPECT_NE(why.find("tpu"), std::string::npos) << why;
  EXPECT_EQ(find_backend("tpu"), nullptr);
  for (const BackendEntry& e : backend_registry()) {
    if (backend_available(e.name, &why)) continue;
    EXPECT_FALSE(why.empty()) << e.name;
    try {
      create_backend(e.name);
      ADD_FAILURE() << "--device " << e.name << " started although unavailable";
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::Backend);
      EXPECT_NE(std::string(err.what()).find(why), std::string::npos) << err.what();
    }
  }
}

}  // namespace
}  // namespace qf
