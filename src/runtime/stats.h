// Telemetry of one generation (spec/speculative.md section 6).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace qf {

struct GenStats {
  std::string draft = "none";
  int k = 0;                     // drafts per round asked for
  int prompt_tokens = 0;
  int generated_tokens = 0;
  int rounds = 0;                // verify passes (plain steps count as rounds with k = 0)
  int64_t drafted = 0, accepted = 0;
  std::vector<int64_t> accept_at;   // [k]: rounds in which draft j+1 was accepted
  std::vector<int64_t> drafted_at;  // [k]: rounds in which draft j+1 was proposed
  std::vector<int> accept_lengths;  // a+1 per round
  double prefill_ms = 0, draft_ms = 0, verify_ms = 0, accept_ms = 0, total_decode_ms = 0;
  std::string stop_reason;          // "stop_token", "max_tokens", "context_full"

  double tau() const;               // mean of accept_lengths
  double tokens_per_second() const;  // generated tokens / decode wall time (prefill excluded)
  std::vector<double> accept_profile() const;
  std::string to_json() const;
  std::string to_table() const;
};

}  // namespace qf
