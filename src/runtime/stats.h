// Telemetry of one generation (docs/spec/speculative.md section 6).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace qf {

struct GenStats {
  std::string draft = "none";
  int k = 0;                     // drafts per round asked for (k_auto: the most the controller picks)
  bool k_auto = false;           // --draft-k auto: the depth controller chose each round's k
  int prompt_tokens = 0;
  int cached_tokens = 0;         // prompt tokens restored from a prefix snapshot, not prefilled
  int generated_tokens = 0;
  int rounds = 0;                // verify passes (plain steps count as rounds with k = 0)
  int64_t drafted = 0, accepted = 0;
  std::vector<int64_t> accept_at;   // [k]: rounds in which draft j+1 was accepted
  std::vector<int64_t> drafted_at;  // [k]: rounds in which draft j+1 was proposed
  std::vector<int> accept_lengths;  // a+1 per round
  std::vector<int64_t> k_rounds;    // [k+1]: rounds that drafted j (j = 0: plain steps)
  // Wall time per phase of docs/spec/speculative.md section 3. draft: the source's draft passes
  // and its observe() of committed rows; verify: the target pass and reading its outputs;
  // accept: the verdict and the target's rollback. total_decode_ms also holds emission.
  double prefill_ms = 0, draft_ms = 0, verify_ms = 0, accept_ms = 0, total_decode_ms = 0;
  double ttft_ms = 0;               // generate() entry to the first token (prefill included)
  // --draft-k auto only: every round's depth, the plain steps just before it (the rows a drafting
  // round catches up), and its cost as the depth controller was told it (ms). `qflash bench`
  // reads what a catch-up costs from these (catch_up_summary).
  struct RoundTime {
    int k = 0, deferred = 0;
    double ms = 0;
  };
  std::vector<RoundTime> round_times;
  std::string stop_reason;          // "stop_token", "max_tokens", "context_full", "callback"

  double tau() const;               // mean of accept_lengths
  double k_mean() const;            // mean drafts per round (k_rounds)
  double tokens_per_second() const;  // generated tokens / decode wall time (prefill excluded)
  double prefill_tokens_per_second() const;  // prefilled (prompt - cached) tokens / prefill wall time
  std::vector<double> accept_profile() const;
  std::string to_json() const;
  std::string to_table() const;
};

// What catching up costs, from --draft-k auto runs' round_times: a drafting round after j plain
// steps against the median of its depth's rounds that followed no plain step (its excess), per
// range of j, and a least-squares line excess = fixed_ms + per_row_ms * j over all of them.
struct CatchUpSummary {
  struct Bucket {
    int lo = 0, hi = 0;  // plain steps before the round, lo..hi
    int n = 0;
    double excess_ms = 0;  // mean
  };
  double plain_ms = 0;  // the median plain step (0 if none)
  std::vector<Bucket> buckets;
  int n = 0;  // switch rounds whose depth has a median
  double fixed_ms = 0, per_row_ms = 0;
};
CatchUpSummary catch_up_summary(const std::vector<GenStats>& runs);

// Adds the wall time of its scope to one phase total of GenStats. A phase should end where the
// backend has synced (a download or Backend::sync), so that device work is billed to the phase
// that enqueued it.
class PhaseTimer {
 public:
  explicit PhaseTimer(double& total_ms) : total_ms_(total_ms), t0_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    total_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double& total_ms_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace qf
