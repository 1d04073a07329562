// The OpenAI-compatible server on loopback, driven over raw HTTP: completions (whole and
// streamed) carry exactly the engine's greedy text, each streamed piece says how its token was
// produced, and every bad request gets an OpenAI-style error with the right status.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/server/server_fixture.h"
#include "tokenizer/utf8.h"

namespace qf::test {
namespace {

using json = nlohmann::json;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { srv_ = new RunningServer(); }
  static void TearDownTestSuite() { delete srv_; }
  static int port() { return srv_->port; }
  static RunningServer* srv_;
};
RunningServer* ServerTest::srv_ = nullptr;

// An error reply: the status, and an OpenAI-style body naming the parameter, no library text.
void expect_error(const HttpResponse& r, int status, const std::string& param, const std::string& what = "") {
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, status) << r.body;
  EXPECT_EQ(r.headers.at("content-type"), "application/json");
  const json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.body;
  ASSERT_TRUE(j.contains("error")) << r.body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  if (param.empty())
    EXPECT_TRUE(j["error"]["param"].is_null()) << r.body;
  else
    EXPECT_EQ(j["error"]["param"], param) << r.body;
  if (!what.empty()) {
    EXPECT_NE(j["error"]["message"].get<std::string>().find(what), std::string::npos) << r.body;
  }
  EXPECT_EQ(r.body.find("json.exception"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("std::"), std::string::npos) << r.body;
}

TEST_F(ServerTest, HealthModelsAndLivePage) {
  auto h = request(port(), "GET", "/health");
  ASSERT_TRUE(h.ok);
  EXPECT_EQ(h.status, 200);
  auto m = request(port(), "GET", "/v1/models");
  EXPECT_EQ(json::parse(m.body)["data"][0]["id"], "demo");
  EXPECT_EQ(json::parse(request(port(), "GET", "/v1/models/demo").body)["id"], "demo");
  expect_error(request(port(), "GET", "/v1/models/gpt-4"), 404, "model");
  auto page = request(port(), "GET", "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("<html"), std::string::npos);
  EXPECT_NE(page.body.find("id=\"prompt\""), std::string::npos);
}

TEST_F(ServerTest, CompletionEqualsEngineOutputAndReportsTelemetry) {
  const std::string prompt = "import os\nimport sys\n";
  auto r = post(port(), "/v1/completions", {{"prompt", prompt}, {"max_tokens", 24}, {"model", "demo"}});
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], engine_text(prompt, 24));
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), j["usage"]["qflash"]["generated_tokens"].get<int>());
  EXPECT_GE(j["usage"]["qflash"]["tau"].get<double>(), 1.0);
  EXPECT_EQ(j["usage"]["qflash"]["draft"], "dflash2");
  auto s = request(port(), "GET", "/v1/stats");
  EXPECT_EQ(json::parse(s.body)["last"]["generated_tokens"], j["usage"]["completion_tokens"]);
}

// The stream's text is the engine's, and its pieces name each token's origin: with no stop
// token in the way every accepted draft and every target token is emitted, so the counts are
// the round loop's own (accepted drafts; one target token per round plus the first).
TEST_F(ServerTest, StreamCarriesTheTextAndEachTokensOrigin) {
  const std::string prompt = "def main(argv):\n";
  auto r = post(port(), "/v1/completions", {{"prompt", prompt}, {"max_tokens", 40}, {"stream", true}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers.at("content-type"), "text/event-stream");
  const auto payloads = sse_payloads(r.body);
  ASSERT_FALSE(payloads.empty());
  EXPECT_EQ(payloads.back(), "[DONE]");
  std::string text, pieces_text;
  int drafts = 0, targets = 0;
  json usage;
  for (const std::string& p : payloads) {
    if (p == "[DONE]") continue;
    auto j = json::parse(p);
    text += j["choices"][0]["text"].get<std::string>();
    if (j.contains("usage")) usage = j["usage"];
    if (!j.contains("qflash")) continue;
    for (const auto& piece : j["qflash"]["pieces"]) {
      pieces_text += piece["text"].get<std::string>();
      (piece["draft"].get<bool>() ? drafts : targets)++;
    }
    EXPECT_TRUE(j["qflash"]["stats"].contains("tau"));
  }
  EXPECT_EQ(text, engine_text(prompt, 40, true));
  EXPECT_EQ(pieces_text, text);
  ASSERT_FALSE(usage.is_null());
  ASSERT_EQ(drafts + targets, usage["completion_tokens"].get<int>()) << "one piece per token (ASCII text)";
  EXPECT_EQ(drafts, usage["qflash"]["accepted"].get<int>());
  EXPECT_EQ(targets, usage["qflash"]["rounds"].get<int>() + 1);
  EXPECT_GT(drafts, 0) << "the demo drafter gets drafts accepted on code";
}

TEST_F(ServerTest, BadRequestsGetOpenAIErrorsNamingTheField) {
  auto raw = [&](const std::string& body) { return request(port(), "POST", "/v1/completions", body); };
  expect_error(raw("{not json"), 400, "", "request body");
  expect_error(raw(""), 400, "", "request body");
  expect_error(raw(std::string(200, '[') + std::string(200, ']')), 400, "", "nested");
  expect_error(post(port(), "/v1/completions", {{"max_tokens", 3}}), 400, "prompt");
  expect_error(post(port(), "/v1/chat/completions", {{"messages", json::array()}}), 400, "messages");
  expect_error(post(port(), "/v1/completions", {{"prompt", "x"}, {"temperature", -1}}), 400, "temperature");
  expect_error(post(port(), "/v1/completions", {{"prompt", "x"}, {"stream", "yes"}}), 400, "stream");
  expect_error(post(port(), "/v1/completions", {{"prompt", "x"}, {"n", 2}}), 400, "n");
  expect_error(post(port(), "/v1/completions", {{"prompt", "x"}, {"stop", {"a", "b", "c", "d", "e"}}}), 400, "stop");
  expect_error(post(port(), "/v1/completions", {{"prompt", "x"}, {"model", "gpt-4"}}), 404, "model", "gpt-4");
  expect_error(post(port(), "/v1/chat/completions",
                    {{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}}),
               400, "messages[0].content[0]");
  expect_error(post(port(), "/v1/chat/completions", {{"messages", {{{"role", "robot"}, {"content", "x"}}}}}), 400,
               "messages[0].role");
  // A huge value is not echoed back whole.
  auto big = post(port(), "/v1/completions", {{"prompt", std::string(100000, 'x')}, {"top_p", std::string(5000, 'y')}});
  expect_error(big, 400, "top_p");
  EXPECT_LT(big.body.size(), 1000u);
}

// Bad options get a 400 with the shared validators' message, streamed or not (the request is
// checked before the reply starts); the vLLM-style extensions reach the engine.
TEST_F(ServerTest, OptionsAreCheckedBeforeTheReplyAndReachTheEngine) {
  for (bool stream : {false, true}) {
    auto a = post(port(), "/v1/completions", {{"prompt", "x"}, {"max_tokens", 4294967297LL}, {"stream", stream}});
    expect_error(a, 400, "max_tokens");
    EXPECT_EQ(json::parse(a.body)["error"]["message"], "max_tokens: expected an integer in [1, 1048576], found 4294967297");
    auto b = post(port(), "/v1/completions", {{"prompt", "x"}, {"max_tokens", 4}, {"draft_k", 8}, {"stream", stream}});
    expect_error(b, 400, "draft_k");
    EXPECT_EQ(json::parse(b.body)["error"]["message"],
              "draft_k: expected an integer in [1, 7] (the most draft source dflash2 proposes here), found 8");
    // Over the context (1024 positions): 400 for a stream too, not 200 and an SSE error.
    expect_error(post(port(), "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2000}, {"stream", stream}}), 400, "max_tokens");
    expect_error(post(port(), "/v1/chat/completions",
                      {{"messages", {{{"role", "user"}, {"content", std::string(4000, 'x') + " y z"}}}}, {"stream", stream}}),
                 400, "prompt");
  }
  auto k = post(port(), "/v1/completions", {{"prompt", "import os\n"}, {"max_tokens", 8}, {"draft_k", 2}});
  ASSERT_EQ(k.status, 200) << k.body;
  EXPECT_EQ(json::parse(k.body)["usage"]["qflash"]["k"], 2);
  // The first greedy token as a stop id: nothing is emitted.
  GenerateOptions one;
  one.max_new_tokens = 1;
  int32_t first = -1;
  demo_engine().generate(demo_engine().tokenizer().encode("import os\n"), one, [&](int32_t t) {
    first = t;
    return true;
  });
  auto s = post(port(), "/v1/completions", {{"prompt", "import os\n"}, {"max_tokens", 8}, {"stop_token_ids", {first}}});
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(json::parse(s.body)["usage"]["completion_tokens"], 0);
  EXPECT_EQ(json::parse(s.body)["choices"][0]["finish_reason"], "stop");
}

TEST_F(ServerTest, WrongMethodsAndPaths) {
  auto a = request(port(), "GET", "/v1/completions");
  expect_error(a, 405, "");
  EXPECT_EQ(a.headers.at("allow"), "POST");
  auto b = request(port(), "POST", "/health", "{}");
  expect_error(b, 405, "");
  EXPECT_EQ(b.headers.at("allow"), "GET");
  expect_error(request(port(), "DELETE", "/v1/chat/completions"), 405, "");
  expect_error(request(port(), "GET", "/v2/nothing"), 404, "");
}

TEST_F(ServerTest, FinishReasonLengthWhenMaxTokensOrTheContextEnds) {
  auto a = post(port(), "/v1/completions", {{"prompt", "def f(x):\n"}, {"max_tokens", 5}, {"ignore_eos", true}});
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(json::parse(a.body)["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(json::parse(a.body)["usage"]["completion_tokens"], 5);
  // No max_tokens and a prompt near the end of a 96-position context: the context ends the answer.
  RunningServer small({}, small_engine());
  std::string prompt;
  for (int i = 0; i < 14; i++) prompt += "x = 1\n";
  const int n = static_cast<int>(small_engine().tokenizer().encode(prompt).size());
  ASSERT_LT(n, 90);
  auto b = post(small.port, "/v1/completions", {{"prompt", prompt}, {"ignore_eos", true}});
  ASSERT_EQ(b.status, 200) << b.body;
  const json j = json::parse(b.body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), 96 - n);
}

// Stop strings end the answer before them, also when one is split across tokens and in a stream.
TEST_F(ServerTest, StopStringsSplitAcrossTokens) {
  const std::string prompt = "class Config:\n    def __init__(self";
  const auto pieces = engine_pieces(demo_engine().tokenizer().encode(prompt), 48, true);
  ASSERT_GE(pieces.size(), 12u);
  std::string full;
  for (const auto& p : pieces) full += p;
  // The last character of piece 6 and the first two of piece 7: a stop string across tokens.
  size_t cut = 0;
  for (int i = 0; i < 6; i++) cut += pieces[i].size();
  ASSERT_FALSE(pieces[5].empty());
  ASSERT_GE(pieces[6].size(), 2u);
  const std::string stop = full.substr(cut - 1, 3);
  const std::string want = full.substr(0, full.find(stop));
  for (bool stream : {false, true}) {
    auto r = post(port(), "/v1/completions",
                  {{"prompt", prompt}, {"max_tokens", 48}, {"ignore_eos", true}, {"stop", {"@never@", stop}}, {"stream", stream}});
    ASSERT_EQ(r.status, 200) << r.body;
    std::string text, reason;
    if (stream) {
      for (const auto& p : sse_payloads(r.body)) {
        if (p == "[DONE]") continue;
        auto j = json::parse(p);
        text += j["choices"][0]["text"].get<std::string>();
        if (!j["choices"][0]["finish_reason"].is_null()) reason = j["choices"][0]["finish_reason"];
      }
    } else {
      text = json::parse(r.body)["choices"][0]["text"];
      reason = json::parse(r.body)["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(text, want) << "stream " << stream << ", stop '" << stop << "'";
    EXPECT_EQ(reason, "stop");
  }
}

TEST_F(ServerTest, ChatStreamStartsWithTheRoleAndEqualsTheWholeReply) {
  json req = {{"messages", {{{"role", "user"}, {"content", "def fib(n):"}}}}, {"max_tokens", 12},
              {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto whole = post(port(), "/v1/chat/completions", req);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json w = json::parse(whole.body);
  EXPECT_EQ(w["object"], "chat.completion");
  EXPECT_EQ(w["choices"][0]["message"]["role"], "assistant");
  req["stream"] = true;
  auto s = post(port(), "/v1/chat/completions", req);
  ASSERT_EQ(s.status, 200) << s.body;
  const auto payloads = sse_payloads(s.body);
  ASSERT_GE(payloads.size(), 3u);
  const json first = json::parse(payloads[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  for (const auto& p : payloads) {
    if (p == "[DONE]") continue;
    const json d = json::parse(p)["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(content, w["choices"][0]["message"]["content"].get<std::string>());
}

// Error messages quote what the client sent (a path, a method, a header, a model name, a
// value): cut at a character and with invalid UTF-8 replaced, so the body is valid JSON and the
// server survives. Before, one such request threw on the I/O thread (the server died) or gave a
// 500 for an unknown model whose name had a multi-byte character at the cut.
TEST_F(ServerTest, ErrorsQuotingClientBytesStayValidJson) {
  auto raw = [&](const std::string& head) {
    const int fd = connect_to(port());
    send_all(fd, head);
    HttpResponse r = read_response(fd, 10);
    ::close(fd);
    return r;
  };
  auto valid = [](const HttpResponse& r) {
    EXPECT_TRUE(utf8::is_valid(r.body)) << r.body;
    EXPECT_FALSE(json::parse(r.body, nullptr, false).is_discarded()) << r.body;
  };
  const std::string e_acute = "\xC3\xA9";  // two bytes
  struct Case {
    std::string head;
    int status;
    std::string param;
  };
  const std::vector<Case> cases = {
      {"GET /\xFF\xFE HTTP/1.1\r\nHost: x\r\n\r\n", 404, ""},
      {"GET /" + std::string(98, 'a') + e_acute + " HTTP/1.1\r\nHost: x\r\n\r\n", 404, ""},  // the cut: inside it
      {"G\xFFT /health HTTP/1.1\r\nHost: x\r\n\r\n", 405, ""},
      {std::string(15, 'P') + e_acute + " /health HTTP/1.1\r\nHost: x\r\n\r\n", 405, ""},
      {"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1\xFF\r\n\r\n", 400, ""},
      {"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::string(31, '1') + e_acute + "\r\n\r\n", 400, ""},
  };
  for (const Case& c : cases) {
    const HttpResponse r = raw(c.head);
    ASSERT_TRUE(r.ok) << "no answer to " << json(utf8::sanitize(c.head)).dump();
    expect_error(r, c.status, c.param);
    valid(r);
    ASSERT_EQ(request(port(), "GET", "/health").status, 200) << "the server died";
  }
  // Body values whose quoted form is cut inside a character, at either byte.
  for (const std::string& pad : {std::string("a"), std::string("")}) {
    auto m = post(port(), "/v1/completions", {{"prompt", "x"}, {"model", pad + std::string(98, 'm') + e_acute + e_acute}});
    expect_error(m, 404, "model");
    valid(m);
    std::string v = pad;
    for (int i = 0; i < 60; i++) v += e_acute;
    auto t = post(port(), "/v1/completions", {{"prompt", "x"}, {"top_p", v}});
    expect_error(t, 400, "top_p");
    valid(t);
  }
  EXPECT_EQ(request(port(), "GET", "/health").status, 200);
}

// Prefix reuse through the server (runtime/prefix_cache.h): a request whose prompt extends an
// earlier one resumes from that one's snapshot and says how many prompt tokens it reused in
// usage.prompt_tokens_details.cached_tokens (in the stream's last chunk too); the text is still
// the engine's own without a cache. The expected counts come from the tokenizations: the last
// multiple of 64 below the earlier prompt's length, if the later prompt starts with those tokens
// and the one after.
TEST(ServerPrefixCache, ReportsReusedTokensAndKeepsTheText) {
  static std::unique_ptr<Engine> engine = [] {
    EngineOptions eo;
    eo.device = "cpu";
    eo.max_context = 1024;
    eo.prefix_cache_mb = 64;
    return Engine::create(eo);
  }();
  RunningServer srv(ServerOptions{}, *engine);
  std::string p1;
  for (int i = 0; i < 12; i++) p1 += "def f" + std::to_string(i) + "(x):\n    return x * " + std::to_string(i) + "\n\n";
  const std::string p2 = p1 + "class Point:\n    def __init__(self, x, y):\n", p3 = p2 + "        self.x = x\n";
  const Tokenizer& tok = engine->tokenizer();
  const auto ids1 = tok.encode(p1), ids2 = tok.encode(p2), ids3 = tok.encode(p3);
  ASSERT_GT(ids1.size(), 129u) << "the first prompt must span two snapshot blocks";
  auto reused = [](const std::vector<int32_t>& before, const std::vector<int32_t>& now) {
    const size_t b = (before.size() - 1) / 64 * 64;
    return now.size() > b && std::equal(before.begin(), before.begin() + b + 1, now.begin()) ? static_cast<int>(b) : 0;
  };
  const int want2 = reused(ids1, ids2), want3 = reused(ids2, ids3);
  ASSERT_GT(want2, 0) << "the extension must keep the first prompt's tokens";
  ASSERT_GT(want3, 0);

  auto r1 = post(srv.port, "/v1/completions", {{"prompt", p1}, {"max_tokens", 12}});
  ASSERT_EQ(r1.status, 200) << r1.body;
  json j = json::parse(r1.body);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(j["choices"][0]["text"], engine_text(p1, 12));

  auto r2 = post(srv.port, "/v1/completions", {{"prompt", p2}, {"max_tokens", 12}});
  ASSERT_EQ(r2.status, 200) << r2.body;
  j = json::parse(r2.body);
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int>(ids2.size()));
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], want2);
  EXPECT_EQ(j["usage"]["qflash"]["cached_tokens"], want2);
  EXPECT_EQ(j["choices"][0]["text"], engine_text(p2, 12));

  auto r3 = post(srv.port, "/v1/completions", {{"prompt", p3}, {"max_tokens", 12}, {"stream", true}});
  ASSERT_EQ(r3.status, 200) << r3.body;
  std::string text;
  json usage;
  for (const std::string& p : sse_payloads(r3.body)) {
    if (p == "[DONE]") continue;
    const json c = json::parse(p);
    text += c["choices"][0]["text"].get<std::string>();
    if (c.contains("usage")) usage = c["usage"];
  }
  ASSERT_FALSE(usage.is_null());
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], want3);
  EXPECT_EQ(text, engine_text(p3, 12));
}

}  // namespace
}  // namespace qf::test
