// A scripted token source for the server tests (EngineQueue's GenerateFn seam): it emits a fixed
// token sequence through the same callbacks, stop handling and stats as Engine::generate, so that
// the server's answer to a known model output (a closed <tool_call> block, which the demo pair
// never writes) is tested end to end over HTTP. Used by ServerToolCalls (tool_calls_test.cpp)
// and by qflash_server_scripted, the test-only binary the openai client test starts.
#pragma once
#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/workers.h"

namespace qf::test {

// The script: pieces of text, each encoded on its own so that a token boundary falls between
// any two pieces (a piece that is exactly one vocabulary entry, a special token such as
// "<|im_end|>" included, is that token; any other piece is encoded as plain text).
struct Script {
  std::vector<std::string> pieces;
  std::vector<int32_t> ids;         // the tokens, in order
  std::vector<size_t> piece_start;  // index into ids where each piece begins
};

inline Script make_script(const Tokenizer& tok, const std::vector<std::string>& pieces) {
  Script s;
  s.pieces = pieces;
  for (const std::string& p : pieces) {
    s.piece_start.push_back(s.ids.size());
    if (auto id = tok.token_to_id(p)) {
      s.ids.push_back(*id);
      continue;
    }
    for (int32_t t : tok.encode(p, /*parse_special=*/false)) s.ids.push_back(t);
  }
  return s;
}

// tests/fixtures/server/tool_call_script.json: {"pieces": [...], ...}.
inline nlohmann::json read_script_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// Emits `script.ids` in rounds of 1, 2, 3, 1, 2, 3, ... tokens: each round reports k = 3 drafts
// of which (its size - 1) were accepted, then its tokens (the last the target's bonus), the way
// the speculative loop does. Ends like Engine::generate: a stop id ends it unemitted
// ("stop_token"), then max_new_tokens ("max_tokens"), the context ("context_full"), a false
// from the callback ("callback"), or the script running out ("stop_token", as if the model had
// ended it). `calls` counts the generations it ran.
inline GenerateFn scripted_generation(const Script& script, int64_t max_context, std::shared_ptr<int> calls = nullptr) {
  return [script, max_context, calls](const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                      const TokenCallback& on_token, const RoundCallback& on_round) {
    if (calls) ++*calls;
    constexpr int k = 3;
    GenStats st;
    st.draft = "scripted";
    st.k = k;
    st.prompt_tokens = static_cast<int>(prompt.size());
    st.drafted_at.assign(k, 0);
    st.accept_at.assign(k, 0);
    st.k_rounds.assign(k + 1, 0);
    st.stop_reason = "stop_token";
    size_t at = 0;
    for (int r = 0; at < script.ids.size(); r++) {
      const size_t n = std::min<size_t>(1 + r % 3, script.ids.size() - at);
      const int accepted = static_cast<int>(n) - 1;
      const std::vector<int32_t> drafts(script.ids.begin() + static_cast<long>(at),
                                        script.ids.begin() + static_cast<long>(at + std::min<size_t>(n, k)));
      std::vector<int32_t> shown = drafts;
      shown.resize(k, drafts.empty() ? 0 : drafts.back());
      if (on_round) on_round(static_cast<int>(prompt.size()) + st.generated_tokens, shown, accepted, script.ids[at + n - 1]);
      st.rounds++;
      st.drafted += k;
      st.accepted += accepted;
      st.accept_lengths.push_back(accepted + 1);
      st.k_rounds[k]++;
      for (int j = 0; j < k; j++) st.drafted_at[j]++, st.accept_at[j] += j < accepted;
      for (size_t i = 0; i < n; i++, at++) {
        const int32_t t = script.ids[at];
        if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), t) != opt.stop_ids.end()) {
          st.stop_reason = "stop_token";
          return st;
        }
        if (st.generated_tokens >= opt.max_new_tokens) {
          st.stop_reason = "max_tokens";
          return st;
        }
        if (static_cast<int64_t>(prompt.size()) + st.generated_tokens >= max_context) {
          st.stop_reason = "context_full";
          return st;
        }
        st.generated_tokens++;
        if (!on_token(t)) {
          st.stop_reason = "callback";
          return st;
        }
        if (st.generated_tokens >= opt.max_new_tokens) {
          st.stop_reason = "max_tokens";
          return st;
        }
      }
    }
    return st;
  };
}

}  // namespace qf::test
