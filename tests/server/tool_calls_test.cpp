// Tool calls end to end over HTTP. The demo pair never closes a <tool_call> block, so the server
// here replays a scripted model answer (tests/fixtures/server/tool_call_script.json: reasoning,
// text, two Qwen3 tool calls cut inside the tags and the JSON, then <|im_end|>) through the
// EngineQueue seam (scripted_generation.h): tokenizing, token origins, decoding, the output
// assembler, SSE framing and finish reasons are the production code's.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "tests/server/scripted_generation.h"
#include "tests/server/server_fixture.h"

namespace qf::test {
namespace {

using json = nlohmann::json;

const json& fixture() {
  static const json f = read_script_file(std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/server/tool_call_script.json");
  return f;
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {"type": "object", "properties": {}}}}
])");

struct ScriptedServer {
  Script script;
  std::shared_ptr<int> calls = std::make_shared<int>(0);
  std::unique_ptr<RunningServer> srv;
  explicit ScriptedServer(const std::vector<std::string>& pieces) {
    Engine& e = demo_engine();
    script = make_script(e.tokenizer(), pieces);
    srv = std::make_unique<RunningServer>(ServerOptions{}, e, scripted_generation(script, e.limits().max_context, calls));
  }
  int port() const { return srv->port; }
};

std::vector<std::string> script_pieces() { return fixture()["pieces"].get<std::vector<std::string>>(); }

json chat_body(bool stream, bool tools = true) {
  json b = {{"model", "demo"}, {"messages", {{{"role", "user"}, {"content", "Weather in Paris, and the time?"}}}}, {"stream", stream}};
  if (tools) b["tools"] = kTools;
  return b;
}

// The streamed answer, taken apart.
struct Streamed {
  std::string role, content, reasoning;
  std::map<int, json> calls;  // index -> {id, type, name, arguments (concatenated)}
  std::vector<std::string> finish_reasons;  // every non-null one, in order
  bool done_last = false;
  int tool_call_chunks = 0;
  json usage;
};

Streamed read_stream(const HttpResponse& r) {
  Streamed s;
  const std::vector<std::string> payloads = sse_payloads(r.body);
  EXPECT_FALSE(payloads.empty()) << r.body;
  if (payloads.empty()) return s;
  s.done_last = payloads.back() == "[DONE]";
  for (size_t i = 0; i + 1 < payloads.size(); i++) {
    const json c = json::parse(payloads[i], nullptr, false);
    EXPECT_TRUE(c.is_object()) << payloads[i];
    if (!c.is_object()) continue;
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    const json& ch = c["choices"][0];
    if (!ch["finish_reason"].is_null()) s.finish_reasons.push_back(ch["finish_reason"].get<std::string>());
    if (c.contains("usage")) s.usage = c["usage"];
    const json& d = ch["delta"];
    if (d.contains("role")) s.role += d["role"].get<std::string>();
    if (d.contains("content") && d["content"].is_string()) s.content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) s.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls")) {
      s.tool_call_chunks++;
      for (const json& tc : d["tool_calls"]) {
        json& call = s.calls[tc.at("index").get<int>()];
        if (tc.contains("id")) call["id"] = tc["id"];
        if (tc.contains("type")) call["type"] = tc["type"];
        const json& f = tc.at("function");
        if (f.contains("name")) call["name"] = f["name"];
        call["arguments"] = call.value("arguments", std::string()) + f.value("arguments", std::string());
      }
    }
  }
  return s;
}

// A text-only answer (no tool_calls), streamed or whole: its content and its one finish reason.
struct TextAnswer {
  std::string content, finish;
};
void text_answer(const HttpResponse& r, bool stream, TextAnswer* out) {
  if (stream) {
    const Streamed st = read_stream(r);
    EXPECT_TRUE(st.calls.empty()) << r.body;
    out->content = st.content;
    ASSERT_EQ(st.finish_reasons.size(), 1u);
    out->finish = st.finish_reasons[0];
  } else {
    const json j = json::parse(r.body);
    EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls")) << r.body;
    out->content = j["choices"][0]["message"]["content"].get<std::string>();
    out->finish = j["choices"][0]["finish_reason"].get<std::string>();
  }
}


// No trace of the call's markup in text meant for the user.
void expect_no_call_text(const std::string& s) {
  for (const char* bit : {"<tool", "tool_call", "</tool", "\"name\"", "\"arguments\"", "get_weather"})
    EXPECT_EQ(s.find(bit), std::string::npos) << "'" << bit << "' leaked into: " << s;
}

TEST(ServerToolCalls, StreamedCallsArriveAsToolCallDeltas) {
  ScriptedServer s(script_pieces());
  const json& want = fixture()["expect"];
  const HttpResponse r = post(s.port(), "/v1/chat/completions", chat_body(true));
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers.at("content-type"), "text/event-stream");
  EXPECT_EQ(*s.calls, 1) << "the scripted source did not run";
  const Streamed st = read_stream(r);
  EXPECT_EQ(st.role, "assistant");
  EXPECT_EQ(st.reasoning, want["reasoning_content"].get<std::string>());
  EXPECT_EQ(st.content, want["content"].get<std::string>());
  expect_no_call_text(st.content);
  expect_no_call_text(st.reasoning);
  ASSERT_EQ(st.calls.size(), want["tool_calls"].size()) << r.body;
  EXPECT_EQ(st.tool_call_chunks, 2);
  std::set<std::string> ids;
  for (size_t i = 0; i < want["tool_calls"].size(); i++) {
    ASSERT_TRUE(st.calls.count(static_cast<int>(i))) << "no tool call with index " << i << "\n" << r.body;
    const json& c = st.calls.at(static_cast<int>(i));
    ASSERT_TRUE(c.contains("id") && c["id"].is_string()) << c;
    EXPECT_TRUE(c["id"].get<std::string>().starts_with("call_")) << c;
    ids.insert(c["id"].get<std::string>());
    EXPECT_EQ(c["type"], "function");
    EXPECT_EQ(c["name"], want["tool_calls"][i]["name"]);
    const json args = json::parse(c["arguments"].get<std::string>(), nullptr, false);
    EXPECT_EQ(args, want["tool_calls"][i]["arguments"]) << c["arguments"];
  }
  EXPECT_EQ(ids.size(), st.calls.size()) << "tool call ids repeat";
  ASSERT_EQ(st.finish_reasons.size(), 1u) << r.body;
  EXPECT_EQ(st.finish_reasons[0], "tool_calls");
  EXPECT_TRUE(st.done_last);
  // Every scripted token but the closing <|im_end|> was emitted and counted.
  ASSERT_TRUE(st.usage.is_object()) << r.body;
  EXPECT_EQ(st.usage["completion_tokens"].get<size_t>(), s.script.ids.size() - 1);
  EXPECT_EQ(st.usage["qflash"]["stop_reason"], "stop_token");
  EXPECT_EQ(st.usage["qflash"]["draft"], "scripted");
}

TEST(ServerToolCalls, WholeAnswerHasMessageToolCallsLikeTheStream) {
  ScriptedServer s(script_pieces());
  const json& want = fixture()["expect"];
  const HttpResponse r = post(s.port(), "/v1/chat/completions", chat_body(false));
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  const json& ch = j["choices"][0];
  EXPECT_EQ(ch["finish_reason"], "tool_calls");
  const json& m = ch["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["content"], want["content"]);
  EXPECT_EQ(m["reasoning_content"], want["reasoning_content"]);
  expect_no_call_text(m["content"].get<std::string>());
  ASSERT_TRUE(m["tool_calls"].is_array()) << r.body;
  ASSERT_EQ(m["tool_calls"].size(), want["tool_calls"].size()) << r.body;
  std::set<std::string> ids;
  for (size_t i = 0; i < m["tool_calls"].size(); i++) {
    const json& c = m["tool_calls"][i];
    EXPECT_TRUE(c["id"].get<std::string>().starts_with("call_")) << c;
    ids.insert(c["id"].get<std::string>());
    EXPECT_EQ(c["type"], "function");
    EXPECT_EQ(c["function"]["name"], want["tool_calls"][i]["name"]);
    ASSERT_TRUE(c["function"]["arguments"].is_string()) << c;  // JSON text, as OpenAI sends it
    EXPECT_EQ(json::parse(c["function"]["arguments"].get<std::string>()), want["tool_calls"][i]["arguments"]);
  }
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(j["usage"]["completion_tokens"].get<size_t>(), s.script.ids.size() - 1);
  // The stream says the same.
  const Streamed st = read_stream(post(s.port(), "/v1/chat/completions", chat_body(true)));
  EXPECT_EQ(st.content, m["content"].get<std::string>());
  ASSERT_EQ(st.calls.size(), 2u);
  for (int i = 0; i < 2; i++) {
    EXPECT_EQ(st.calls.at(i)["name"], m["tool_calls"][i]["function"]["name"]);
    EXPECT_EQ(st.calls.at(i)["arguments"], m["tool_calls"][i]["function"]["arguments"]);
  }
  EXPECT_EQ(*s.calls, 2);
}

// Controls: the same tokens without tools are plain text (finish "stop"), and an answer cut by
// max_tokens inside a call keeps the call as text with finish "length", streamed or not.
TEST(ServerToolCalls, WithoutToolsOrCutShortTheCallStaysText) {
  ScriptedServer s(script_pieces());
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    const HttpResponse r = post(s.port(), "/v1/chat/completions", chat_body(stream, /*tools=*/false));
    ASSERT_EQ(r.status, 200) << r.body;
    TextAnswer ta;
    ASSERT_NO_FATAL_FAILURE(text_answer(r, stream, &ta));
    const std::string &content = ta.content, &finish = ta.finish;
    EXPECT_EQ(finish, "stop");
    EXPECT_NE(content.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>"),
              std::string::npos)
        << content;
  }
  // Cut inside the first call's arguments: the piece "is\", \"da" is never reached.
  const std::vector<std::string> pieces = script_pieces();
  const size_t cut = std::find(pieces.begin(), pieces.end(), "is\", \"da") - pieces.begin();
  ASSERT_LT(cut, pieces.size());
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed (cut)" : "whole (cut)");
    json b = chat_body(stream);
    b["max_tokens"] = s.script.piece_start[cut];
    const HttpResponse r = post(s.port(), "/v1/chat/completions", b);
    ASSERT_EQ(r.status, 200) << r.body;
    TextAnswer ta;
    ASSERT_NO_FATAL_FAILURE(text_answer(r, stream, &ta));
    const std::string &content = ta.content, &finish = ta.finish;
    EXPECT_EQ(finish, "length");
    EXPECT_TRUE(content.starts_with("Let me check that.")) << content;
    EXPECT_TRUE(content.ends_with("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par")) << content;
  }
}

}  // namespace
}  // namespace qf::test
