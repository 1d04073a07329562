// From decoded text to what a client is sent, piece by piece as tokens arrive, so that a stream
// and a whole reply say the same thing:
//   1. stop strings: the answer ends before the first one, which is never sent; text that may
//      be the start of one (a stop string split across tokens) is held back until it is not;
//   2. reasoning (chat, thinking on): text up to "</think>" is reasoning_content, the rest content;
//   3. tool calls (chat with tools): each <tool_call>{"name": ..., "arguments": ...}</tool_call>
//      block becomes one tool call; a block that does not parse stays content.
// Every piece of text keeps the origin of the token that produced it (accepted draft or the
// target's own token), for the live page.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace qf {

// How a token was produced: an accepted draft, or the target's own pick (the first token after
// prefill and each round's bonus token).
enum class TokenOrigin { Target, Draft };

struct Segment {
  std::string text;
  TokenOrigin origin;
};

struct ToolCall {
  std::string id, name;
  std::string arguments;  // JSON text
};

struct OutputEvent {
  enum class Kind { Content, Reasoning, ToolCall } kind;
  std::vector<Segment> segments;  // Content, Reasoning
  ToolCall call;                  // ToolCall
  std::string text() const;       // the segments joined
};

struct OutputOptions {
  std::vector<std::string> stop;
  bool reasoning = false;        // the answer starts inside <think>
  bool tools = false;            // parse <tool_call> blocks
  std::string tool_call_prefix;  // the opening of a forced call, already in the prompt
  std::string call_id_prefix = "call_";  // tool call ids are this + 0, 1, ...
};

class OutputAssembler {
 public:
  explicit OutputAssembler(OutputOptions opt);
  // Adds decoded text; appends what can be sent now to `out`. Returns false once a stop string
  // ended the answer (nothing more is taken).
  bool push(std::string_view text, TokenOrigin origin, std::vector<OutputEvent>& out);
  // The answer ended: sends what was held back.
  void finish(std::vector<OutputEvent>& out);
  bool stopped() const { return stopped_; }
  int tool_calls() const { return n_calls_; }

 private:
  // Bytes of text with the origin of each run.
  class Tagged {
   public:
    void append(std::string_view s, TokenOrigin o);
    void append(const std::vector<Segment>& segs);
    std::vector<Segment> take(size_t n);  // the first n bytes
    void drop(size_t n);
    const std::string& str() const { return text_; }
    size_t size() const { return text_.size(); }

   private:
    std::string text_;
    std::vector<std::pair<size_t, TokenOrigin>> runs_;  // lengths, in order
  };

  void reasoning_stage(std::vector<Segment> segs, bool last, std::vector<OutputEvent>& out);
  void content_stage(std::vector<Segment> segs, bool last, std::vector<OutputEvent>& out);
  void emit(OutputEvent::Kind k, std::vector<Segment> segs, std::vector<OutputEvent>& out);
  void end_call(std::vector<OutputEvent>& out);

  OutputOptions opt_;
  bool stopped_ = false, finished_ = false;
  Tagged stop_buf_, think_buf_, content_buf_;
  bool in_reasoning_, reasoning_started_ = false;
  bool skip_space_ = false;  // drop leading whitespace of the content that follows (after </think>, a call)
  bool in_call_ = false;
  std::string call_buf_;     // text inside the open <tool_call>
  int n_calls_ = 0;
};

}  // namespace qf
