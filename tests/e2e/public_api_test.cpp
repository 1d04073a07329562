// The public API: loads the demo pair, generates the same text as the engine's CLI path, and
// turns failures into a Status instead of an exception.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "qflash/qflash.h"

namespace {

TEST(PublicApi, LoadGenerateAndStats) {
  std::unique_ptr<qflash::Model> m;
  qflash::LoadOptions lo;
  lo.device = "cpu";
  qflash::Status s = qflash::Model::load(lo, &m);
  ASSERT_TRUE(s) << s.message;
  EXPECT_EQ(m->draft_source(), "dflash2");
  EXPECT_EQ(m->backend(), "cpu");
  qflash::GenerateRequest req;
  req.prompt = "import os\n";
  req.max_tokens = 24;
  qflash::GenerateResult r, plain;
  std::string streamed;
  ASSERT_TRUE(m->generate(req, &r, [&](std::string_view p) {
    streamed += p;
    return true;
  }));
  EXPECT_FALSE(r.text.empty());
  EXPECT_EQ(streamed, r.text);
  auto j = nlohmann::json::parse(r.stats_json);
  EXPECT_EQ(j["draft"], "dflash2");
  // Same text without drafting.
  std::unique_ptr<qflash::Model> p;
  lo.draft = "none";
  ASSERT_TRUE(qflash::Model::load(lo, &p));
  ASSERT_TRUE(p->generate(req, &plain));
  EXPECT_EQ(plain.text, r.text);
}

TEST(PublicApi, ErrorsAreStatuses) {
  std::unique_ptr<qflash::Model> m;
  qflash::LoadOptions lo;
  lo.model_dir = "/nonexistent/model";
  qflash::Status s = qflash::Model::load(lo, &m);
  EXPECT_FALSE(s);
  EXPECT_EQ(s.kind, "io");
  EXPECT_NE(s.message.find("/nonexistent/model"), std::string::npos);
  EXPECT_EQ(m, nullptr);
}

}  // namespace
