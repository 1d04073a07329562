// OutputAssembler on its own: text fed in arbitrary pieces comes out the same as when fed
// whole, stop strings split across pieces are caught and never sent, reasoning and tool calls
// are separated, and each byte keeps the origin of the piece it came from.
#include <gtest/gtest.h>

#include "server/output.h"

namespace qf {
namespace {

struct Result {
  std::string content, reasoning, origins;  // origins: one 'd' or 't' per content byte
  std::vector<ToolCall> calls;
  bool stopped = false;
};

// Feeds `text` cut at every `step` bytes, the odd pieces marked as drafts.
Result run(const OutputOptions& opt, const std::string& text, size_t step) {
  OutputAssembler a(opt);
  std::vector<OutputEvent> ev;
  size_t i = 0;
  for (int n = 0; i < text.size(); i += step, n++)
    if (!a.push(text.substr(i, step), n % 2 ? TokenOrigin::Draft : TokenOrigin::Target, ev)) break;
  a.finish(ev);
  Result r;
  r.stopped = a.stopped();
  for (const auto& e : ev) {
    if (e.kind == OutputEvent::Kind::ToolCall) r.calls.push_back(e.call);
    if (e.kind == OutputEvent::Kind::Reasoning) r.reasoning += e.text();
    if (e.kind == OutputEvent::Kind::Content)
      for (const auto& g : e.segments) {
        r.content += g.text;
        r.origins += std::string(g.text.size(), g.origin == TokenOrigin::Draft ? 'd' : 't');
      }
  }
  return r;
}

TEST(ServerOutput, PlainTextPassesThroughWithOrigins) {
  const std::string text = "def f(x):\n    return x\n";
  for (size_t step : {1, 2, 3, 7, 100}) {
    const Result r = run({}, text, step);
    EXPECT_EQ(r.content, text);
    for (size_t i = 0; i < text.size(); i++) EXPECT_EQ(r.origins[i], (i / step) % 2 ? 'd' : 't') << step << " " << i;
  }
}

TEST(ServerOutput, StopStringsSplitAcrossPieces) {
  OutputOptions o;
  o.stop = {"\n\n", "return"};
  const std::string text = "def f(x):\n    y = x\n    return y\n\nprint(1)";
  for (size_t step : {1, 2, 3, 5, 64}) {
    const Result r = run(o, text, step);
    EXPECT_EQ(r.content, "def f(x):\n    y = x\n    ") << step;
    EXPECT_TRUE(r.stopped);
  }
  // A held-back prefix that turns out not to be a stop string is released.
  o.stop = {"retort"};
  for (size_t step : {1, 2, 4}) {
    const Result r = run(o, "a ret b reto c", step);
    EXPECT_EQ(r.content, "a ret b reto c");
    EXPECT_FALSE(r.stopped);
  }
}

TEST(ServerOutput, ReasoningThenContent) {
  OutputOptions o;
  o.reasoning = true;
  for (size_t step : {1, 2, 3, 9, 200}) {
    const Result r = run(o, "\nLet me think.\nStill.\n</think>\n\nThe answer.\n", step);
    EXPECT_EQ(r.reasoning, "Let me think.\nStill.") << step;
    EXPECT_EQ(r.content, "The answer.\n") << step;
  }
  const Result cut = run(o, "thinking without end\n", 4);  // the answer never left <think>
  EXPECT_EQ(cut.reasoning, "thinking without end");
  EXPECT_EQ(cut.content, "");
}

TEST(ServerOutput, ToolCallsBecomeCalls) {
  OutputOptions o;
  o.tools = true;
  o.call_id_prefix = "call_x_";
  const std::string text =
      "I will check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n";
  for (size_t step : {1, 2, 3, 5, 11, 500}) {
    const Result r = run(o, text, step);
    EXPECT_EQ(r.content, "I will check.") << step;
    ASSERT_EQ(r.calls.size(), 2u) << step;
    EXPECT_EQ(r.calls[0].id, "call_x_0");
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Paris\", \"days\": 2}");
    EXPECT_EQ(r.calls[1].name, "now");
    EXPECT_EQ(r.calls[1].arguments, "{}");
  }
}

TEST(ServerOutput, BrokenOrCutCallsStayText) {
  OutputOptions o;
  o.tools = true;
  const Result bad = run(o, "x <tool_call>{not json}</tool_call> y", 3);
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "x<tool_call>{not json}</tool_call>y");
  const Result cut = run(o, "x <tool_call>{\"name\": \"f\", \"argu", 3);
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, "x<tool_call>{\"name\": \"f\", \"argu");
  // Without tools, the markers are just text.
  const Result plain = run({}, "a <tool_call>{\"name\": \"f\"}</tool_call>", 2);
  EXPECT_EQ(plain.content, "a <tool_call>{\"name\": \"f\"}</tool_call>");
}

TEST(ServerOutput, ForcedCallContinuesThePromptsOpening) {
  OutputOptions o;
  o.tools = true;
  o.tool_call_prefix = "<tool_call>\n{\"name\": \"f\", \"arguments\": ";
  const Result r = run(o, "{\"a\": [1, 2]}}\n</tool_call>", 4);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": [1, 2]}");
  EXPECT_EQ(r.content, "");
}

TEST(ServerOutput, StopStringInsideReasoningEndsEverything) {
  OutputOptions o;
  o.reasoning = true;
  o.stop = {"STOP"};
  const Result r = run(o, "abc ST", 2);
  EXPECT_FALSE(r.stopped);
  const Result s = run(o, "abc STOP def</think>answer", 2);
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.reasoning, "abc ");
  EXPECT_EQ(s.content, "");
}

}  // namespace
}  // namespace qf
