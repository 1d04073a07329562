// The OpenAI-compatible server on loopback, driven by an HTTP client: completions (plain and
// streamed) carry exactly the engine's greedy text, chat works, bad requests get 400s with an
// error message, and the live page and stats endpoint answer.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "server/server.h"

namespace qf {
namespace {

using json = nlohmann::json;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions eo;
    eo.device = "cpu";
    eo.max_context = 1024;
    engine_ = Engine::create(eo).release();
    ServerOptions so;
    so.model_name = "demo";
    server_ = new Server(*engine_, so);
    port_ = server_->start_background();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete engine_;
  }
  httplib::Client client() { return httplib::Client("127.0.0.1", port_); }
  // The engine's own greedy text for a prompt: what the server must return.
  std::string expected(const std::string& prompt, int n) {
    GenerateOptions g;
    g.max_new_tokens = n;
    g.stop_ids = engine_->stop_ids();
    StreamDecoder dec(engine_->tokenizer());
    std::string out;
    engine_->generate(engine_->tokenizer().encode(prompt), g, [&](int32_t t) {
      out += dec.push(t);
      return true;
    });
    return out + dec.flush();
  }
  static Engine* engine_;
  static Server* server_;
  static int port_;
};
Engine* ServerTest::engine_ = nullptr;
Server* ServerTest::server_ = nullptr;
int ServerTest::port_ = 0;

TEST_F(ServerTest, HealthModelsAndLivePage) {
  ASSERT_GT(port_, 0);
  auto c = client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "demo");
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_NE(page->body.find("<html"), std::string::npos);
}

TEST_F(ServerTest, CompletionEqualsEngineOutputAndReportsTelemetry) {
  const std::string prompt = "import os\nimport sys\n";
  const std::string want = expected(prompt, 24);
  auto c = client();
  auto r = c.Post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 24}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], want);
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), j["usage"]["qflash"]["generated_tokens"].get<int>());
  EXPECT_GE(j["usage"]["qflash"]["tau"].get<double>(), 1.0);
  EXPECT_EQ(j["usage"]["qflash"]["draft"], "dflash2");
  auto s = c.Get("/v1/stats");
  ASSERT_TRUE(s);
  EXPECT_EQ(json::parse(s->body)["last"]["generated_tokens"], j["usage"]["completion_tokens"]);
}

TEST_F(ServerTest, StreamedCompletionConcatenatesToTheSameText) {
  const std::string prompt = "def main(argv):\n";
  const std::string want = expected(prompt, 32);
  auto c = client();
  std::string body;
  auto r = c.Post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 32}, {"stream", true}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  std::string text;
  bool done = false, usage = false;
  size_t pos = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    const std::string payload = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    auto j = json::parse(payload);
    text += j["choices"][0]["text"].get<std::string>();
    usage = usage || j.contains("usage");
  }
  EXPECT_TRUE(done);
  EXPECT_TRUE(usage);
  EXPECT_EQ(text, want);
}

TEST_F(ServerTest, ChatCompletion) {
  auto c = client();
  json req = {{"messages", {{{"role", "user"}, {"content", "hello"}}}}, {"max_tokens", 8},
              {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto r = c.Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 8);
}

TEST_F(ServerTest, BadRequestsGet400WithAMessage) {
  auto c = client();
  auto a = c.Post("/v1/completions", "{not json", "application/json");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 400);
  EXPECT_FALSE(json::parse(a->body)["error"]["message"].get<std::string>().empty());
  auto b = c.Post("/v1/completions", json{{"max_tokens", 3}}.dump(), "application/json");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, 400);
  EXPECT_NE(b->body.find("prompt"), std::string::npos);
  auto d = c.Post("/v1/chat/completions", json{{"messages", json::array()}}.dump(), "application/json");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 400);
  auto e = c.Post("/v1/completions", json{{"prompt", "x"}, {"temperature", -1}}.dump(), "application/json");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
}

}  // namespace
}  // namespace qf
