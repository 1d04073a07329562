// The public API: loads the demo pair, generates the same text as the engine's CLI path, and
// turns failures into a Status instead of an exception.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "qflash/qflash.h"
#include "runtime/engine.h"

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

// generate() maps every request field through the shared options: draft_k reaches the round
// loop, stop ids end generation, and what the loaded model cannot do is a usage Status.
TEST(PublicApi, GenerateOptionsReachTheEngineAndAreChecked) {
  std::unique_ptr<qflash::Model> m;
  qflash::LoadOptions lo;
  lo.device = "cpu";
  lo.max_context = 256;
  ASSERT_TRUE(qflash::Model::load(lo, &m));
  qflash::GenerateRequest req;
  req.prompt = "import os\n";
  req.max_tokens = 16;
  req.draft_k = 3;
  qflash::GenerateResult r;
  ASSERT_TRUE(m->generate(req, &r));
  EXPECT_EQ(nlohmann::json::parse(r.stats_json)["k"], 3);

  req.draft_k = 8;  // the demo drafter's block is 8: at most 7 drafts
  qflash::Status s = m->generate(req, &r);
  EXPECT_FALSE(s);
  EXPECT_EQ(s.kind, "usage");
  EXPECT_EQ(s.message, "draft_k: expected an integer in [1, 7] (the most draft source dflash2 proposes here), found 8");

  req.draft_k.reset();
  req.max_tokens = 300;
  s = m->generate(req, &r);
  EXPECT_FALSE(s);
  EXPECT_NE(s.message.find("max_tokens: expected at most"), std::string::npos) << s.message;

  req.max_tokens = -1;  // the static ranges come first, with the same text as validate()
  s = m->generate(req, &r);
  EXPECT_EQ(s.message, qflash::validate(req).message);
  EXPECT_EQ(s.message, "max_tokens: expected an integer in [1, 1048576], found -1");

  // A stop id equal to the first greedy token (found through the engine) ends generation
  // before anything is emitted.
  qf::EngineOptions eo;
  eo.device = "cpu";
  eo.draft = "none";
  auto engine = qf::Engine::create(eo);
  qf::GenerateOptions one;
  one.max_new_tokens = 1;
  int32_t first = -1;
  engine->generate(engine->tokenizer().encode(req.prompt), one, [&](int32_t t) {
    first = t;
    return true;
  });
  ASSERT_GE(first, 0);
  req.max_tokens = 4;
  req.stop_ids = {first};
  ASSERT_TRUE(m->generate(req, &r));
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(nlohmann::json::parse(r.stats_json)["stop_reason"], "stop_token");
}

}  // namespace
