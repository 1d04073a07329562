// ChatML rendering (docs/spec/qwen38.md 5.2): transformers' output where the Qwen3 template agrees
// with the 3.8 grammar, hand-written strings where 3.8 differs.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

using qf::ChatMessage;
using qf::chat_render;

TEST(TokenizerChat, MatchesTransformersWhereTemplatesAgree) {
  std::ifstream f(std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/tokenizer/chat.json");
  ASSERT_TRUE(f) << "missing tests/fixtures/tokenizer/chat.json";
  std::stringstream ss;
  ss << f.rdbuf();
  auto fx = nlohmann::json::parse(ss.str());
  ASSERT_GE(fx["cases"].size(), 3u);
  for (const auto& c : fx["cases"]) {
    std::vector<ChatMessage> msgs;
    for (const auto& m : c["messages"]) msgs.push_back({m["role"], m["content"], m["reasoning"]});
    EXPECT_EQ(chat_render(msgs, c["add_generation_prompt"], c["enable_thinking"]), c["text"].get<std::string>())
        << c["name"];
  }
}

TEST(TokenizerChat, GenerationPromptThinkingOnAndOff) {
  std::vector<ChatMessage> msgs = {{"system", "Be brief.", ""}, {"user", "Hi", ""}};
  const std::string head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n";
  EXPECT_EQ(chat_render(msgs, true, true), head + "<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(chat_render(msgs, true, false), head + "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(chat_render(msgs, false, true), head);
}

TEST(TokenizerChat, ReasoningKeptOnEveryAssistantTurn) {
  // Qwen3.8: preserve_thinking defaults to true, so earlier turns keep their reasoning too.
  std::vector<ChatMessage> msgs = {{"user", "Q1", ""},
                                   {"assistant", "A1", "\nthink one\n"},
                                   {"user", "Q2", ""},
                                   {"assistant", "\nA2", ""}};
  EXPECT_EQ(chat_render(msgs, false, true),
            "<|im_start|>user\nQ1<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nthink one\n</think>\n\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n");
}

TEST(TokenizerChat, EmptySystemOmittedAndToolsFolded) {
  std::vector<ChatMessage> msgs = {{"system", "", ""}, {"user", "go", ""}, {"tool", "r1", ""}, {"tool", "r2", ""}};
  EXPECT_EQ(chat_render(msgs, false, true),
            "<|im_start|>user\ngo<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>"
            "<|im_end|>\n");
}

TEST(TokenizerChat, RejectsBadConversations) {
  auto kind_of = [](const std::vector<ChatMessage>& m) {
    try {
      chat_render(m, true, true);
    } catch (const qf::Error& e) {
      return e.kind();
    }
    return qf::ErrorKind::Internal;  // no throw
  };
  EXPECT_EQ(kind_of({{"user", "a", ""}, {"system", "late", ""}}), qf::ErrorKind::Usage);
  EXPECT_EQ(kind_of({{"user", "a", ""}, {"robot", "b", ""}}), qf::ErrorKind::Usage);
  EXPECT_EQ(kind_of({{"system", "only", ""}}), qf::ErrorKind::Usage);
  EXPECT_EQ(kind_of({}), qf::ErrorKind::Usage);
}

}  // namespace
