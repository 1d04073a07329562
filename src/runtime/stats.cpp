#include "runtime/stats.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"

namespace qf {

double GenStats::tau() const {
  if (accept_lengths.empty()) return 0;
  double s = 0;
  for (int a : accept_lengths) s += a;
  return s / static_cast<double>(accept_lengths.size());
}

double GenStats::k_mean() const {
  int64_t n = 0, sum = 0;
  for (size_t j = 0; j < k_rounds.size(); j++) {
    n += k_rounds[j];
    sum += static_cast<int64_t>(j) * k_rounds[j];
  }
  return n > 0 ? static_cast<double>(sum) / static_cast<double>(n) : 0.0;
}

double GenStats::tokens_per_second() const {
  return total_decode_ms > 0 ? generated_tokens / (total_decode_ms / 1000.0) : 0;
}

double GenStats::prefill_tokens_per_second() const {
  return prefill_ms > 0 ? (prompt_tokens - cached_tokens) / (prefill_ms / 1000.0) : 0;
}

std::vector<double> GenStats::accept_profile() const {
  std::vector<double> p(accept_at.size(), 0.0);
  for (size_t j = 0; j < accept_at.size(); j++)
    p[j] = drafted_at[j] > 0 ? static_cast<double>(accept_at[j]) / static_cast<double>(drafted_at[j]) : 0.0;
  return p;
}

std::string GenStats::to_json() const {
  nlohmann::json j;
  j["draft"] = draft;
  j["k"] = k;
  j["k_auto"] = k_auto;
  j["k_rounds"] = k_rounds;
  j["k_mean"] = k_mean();
  j["prompt_tokens"] = prompt_tokens;
  j["cached_tokens"] = cached_tokens;
  j["generated_tokens"] = generated_tokens;
  j["rounds"] = rounds;
  j["drafted"] = drafted;
  j["accepted"] = accepted;
  j["tau"] = tau();
  j["accept_profile"] = accept_profile();
  j["accept_lengths"] = accept_lengths;
  j["tokens_per_second"] = tokens_per_second();
  j["time_to_first_token_ms"] = ttft_ms;
  j["prefill_tokens_per_second"] = prefill_tokens_per_second();
  j["phases_ms"] = {{"prefill", prefill_ms}, {"draft", draft_ms}, {"verify", verify_ms},
                    {"accept", accept_ms}, {"decode_total", total_decode_ms}};
  j["stop_reason"] = stop_reason;
  return j.dump();
}

std::string GenStats::to_table() const {
  std::string s;
  if (k_auto)
    s += strf("draft source      %s (k = auto, 0..%d)\n", draft.c_str(), k);
  else
    s += strf("draft source      %s (k = %d)\n", draft.c_str(), k);
  s += strf("prompt tokens     %d (prefill %.1f ms, %.0f tokens/s; first token after %.1f ms)\n", prompt_tokens,
            prefill_ms, prefill_tokens_per_second(), ttft_ms);
  s += strf("generated tokens  %d (%s)\n", generated_tokens, stop_reason.c_str());
  s += strf("rounds            %d\n", rounds);
  s += strf("drafted/accepted  %lld / %lld", (long long)drafted, (long long)accepted);
  if (drafted > 0) s += strf(" (%.1f%%)", 100.0 * accepted / drafted);
  s += "\n";
  s += strf("tau               %.3f tokens per target pass\n", tau());
  if (k_auto) {
    s += strf("chosen k          mean %.2f |", k_mean());
    for (size_t j = 0; j < k_rounds.size(); j++) s += strf(" %zu:%lld", j, (long long)k_rounds[j]);
    s += "\n";
  }
  auto prof = accept_profile();
  if (!prof.empty()) {
    s += "accept profile   ";
    for (size_t j = 0; j < prof.size(); j++) s += strf(" d%zu:%.2f", j + 1, prof[j]);
    s += "\n";
  }
  s += strf("phases (ms)       prefill %.1f | draft %.1f | verify %.1f | accept+rollback %.1f\n", prefill_ms,
            draft_ms, verify_ms, accept_ms);
  s += strf("decode speed      %.2f tokens/s (%.2f ms/token)\n", tokens_per_second(),
            generated_tokens > 0 ? total_decode_ms / generated_tokens : 0.0);
  return s;
}

CatchUpSummary catch_up_summary(const std::vector<GenStats>& runs) {
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[(v.size() - 1) / 2];
  };
  std::vector<std::vector<double>> own;  // [k]: rounds that caught nothing up
  for (const GenStats& g : runs)
    for (const GenStats::RoundTime& r : g.round_times)
      if (r.k == 0 || r.deferred == 0) {
        if (static_cast<int>(own.size()) <= r.k) own.resize(r.k + 1);
        own[r.k].push_back(r.ms);
      }
  std::vector<double> med(own.size());
  for (size_t k = 0; k < own.size(); k++) med[k] = median(own[k]);
  CatchUpSummary out;
  out.plain_ms = med.empty() ? 0.0 : med[0];
  for (auto [lo, hi] : {std::pair{1, 4}, {5, 8}, {9, 16}, {17, 32}, {33, 64}, {65, 1 << 30}}) out.buckets.push_back({lo, hi});
  double sj = 0, se = 0, sjj = 0, sje = 0;
  for (const GenStats& g : runs)
    for (const GenStats::RoundTime& r : g.round_times) {
      if (r.k == 0 || r.deferred == 0 || r.k >= static_cast<int>(own.size()) || own[r.k].empty()) continue;
      const double e = r.ms - med[r.k];
      for (CatchUpSummary::Bucket& b : out.buckets)
        if (r.deferred >= b.lo && r.deferred <= b.hi) {
          b.excess_ms += (e - b.excess_ms) / ++b.n;
          break;
        }
      out.n++;
      sj += r.deferred;
      se += e;
      sjj += static_cast<double>(r.deferred) * r.deferred;
      sje += r.deferred * e;
    }
  if (out.n > 0) {
    const double var = sjj - sj * sj / out.n;
    out.per_row_ms = var > 0 ? (sje - sj * se / out.n) / var : 0.0;
    out.fixed_ms = (se - out.per_row_ms * sj) / out.n;
  }
  return out;
}

}  // namespace qf
