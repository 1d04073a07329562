// The server's threads besides the HTTP one: a small pool that parses, validates and tokenizes
// requests (so a long prompt never holds the engine), and ONE engine thread that runs
// generations in arrival order from a bounded queue (the engine holds one sequence state).
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "server/output.h"

namespace qf {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();  // finishes queued tasks, then joins
  void submit(std::function<void()> task);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// One generation. The callbacks run on the engine thread, in this order: on_token for every
// emitted token (return false to stop), then on_finish exactly once (also for a job cancelled
// while queued, with stats.stop_reason "cancelled", and with `error` set when generation threw).
struct EngineJob {
  std::vector<int32_t> prompt;
  GenerateOptions options;  // already validated and mapped (Engine::generate_options)
  std::function<bool(int32_t token, TokenOrigin origin)> on_token;
  std::function<void(int drafted, int accepted)> on_round;  // optional; before the round's tokens
  std::function<void(const GenStats& stats, const std::string* error)> on_finish;
  std::function<bool()> cancelled;  // the client went away
};

// What produces one generation's tokens, with Engine::generate's contract: every emitted token
// through the token callback (false stops it), each round through the round callback before
// the round's tokens, `max_new_tokens` and `stop_ids` honoured (a stop id is not emitted), and
// GenStats with the stop reason. The server runs Engine::generate; tests inject a scripted
// source here (tests/server/scripted_generation.h) so that everything after the engine, from
// token origins to the HTTP bytes, runs as it does in production on a known token sequence.
using GenerateFn = std::function<GenStats(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                          const TokenCallback& on_token, const RoundCallback& on_round)>;

class EngineQueue {
 public:
  // `capacity`: jobs that may wait behind the running one; a submit beyond that is refused.
  // `generate_fn`: tests only; empty runs the engine.
  EngineQueue(Engine& engine, int capacity, GenerateFn generate_fn = nullptr);
  ~EngineQueue();  // cancels what waits (on_finish "cancelled"), finishes the running job
  bool submit(std::shared_ptr<EngineJob> job);
  int waiting() const;
  bool busy() const;
  // Seconds a refused client should wait: the queue's length times the mean job time, >= 1.
  int retry_after_s() const;

  // The one place a generation runs: a token prompt in, tokens out through `on_token`, with
  // each token's origin. Prefix reuse (resuming from a cached state of the prompt's longest
  // cached prefix) belongs here.
  GenStats generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                    const std::function<bool(int32_t, TokenOrigin)>& on_token,
                    const std::function<void(int drafted, int accepted)>& on_round = nullptr);

 private:
  void loop();
  Engine& engine_;
  const GenerateFn generate_fn_;
  const int capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<EngineJob>> jobs_;
  bool stop_ = false, running_ = false;
  double mean_job_s_ = 1.0;  // moving average of job wall time
  std::thread thread_;
};

}  // namespace qf
