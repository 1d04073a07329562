#include "server/workers.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/log.h"

namespace qf {

WorkerPool::WorkerPool(int threads) {
  for (int i = 0; i < std::max(1, threads); i++)
    threads_.emplace_back([this] {
      while (true) {
        std::function<void()> task;
        {
          std::unique_lock<std::mutex> l(mu_);
          cv_.wait(l, [&] { return stop_ || !tasks_.empty(); });
          if (tasks_.empty()) return;
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
        task();
      }
    });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> l(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

EngineQueue::EngineQueue(Engine& engine, int capacity, GenerateFn generate_fn)
    : engine_(engine), generate_fn_(std::move(generate_fn)), capacity_(std::max(0, capacity)) {
  thread_ = std::thread([this] { loop(); });
}

EngineQueue::~EngineQueue() {
  std::deque<std::shared_ptr<EngineJob>> left;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    left.swap(jobs_);
  }
  cv_.notify_all();
  thread_.join();
  for (auto& j : left) {
    GenStats st;
    st.stop_reason = "cancelled";
    if (j->on_finish) j->on_finish(st, nullptr);
  }
}

bool EngineQueue::submit(std::shared_ptr<EngineJob> job) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_ || static_cast<int>(jobs_.size()) >= capacity_ + (running_ ? 0 : 1)) return false;
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

int EngineQueue::waiting() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(jobs_.size());
}

bool EngineQueue::busy() const {
  std::lock_guard<std::mutex> l(mu_);
  return running_;
}

int EngineQueue::retry_after_s() const {
  std::lock_guard<std::mutex> l(mu_);
  const double s = (static_cast<double>(jobs_.size()) + (running_ ? 1.0 : 0.0)) * mean_job_s_;
  return static_cast<int>(std::clamp(std::ceil(s), 1.0, 3600.0));
}

GenStats EngineQueue::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                               const std::function<bool(int32_t, TokenOrigin)>& on_token,
                               const std::function<void(int, int)>& on_round) {
  // The round loop reports each round (accepted drafts a, then the bonus) before it emits the
  // round's tokens: the next a tokens are drafts, the one after them the target's.
  int drafts_left = 0;
  const TokenCallback tokens = [&](int32_t t) {
    const TokenOrigin o = drafts_left > 0 ? TokenOrigin::Draft : TokenOrigin::Target;
    if (drafts_left > 0) drafts_left--;
    return on_token(t, o);
  };
  const RoundCallback rounds = [&](int, const std::vector<int32_t>& drafts, int accepted, int32_t) {
    drafts_left = accepted;
    if (on_round) on_round(static_cast<int>(drafts.size()), accepted);
  };
  if (generate_fn_) return generate_fn_(prompt, opt, tokens, rounds);
  return engine_.generate(prompt, opt, tokens, rounds);
}

void EngineQueue::loop() {
  while (true) {
    std::shared_ptr<EngineJob> job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      running_ = true;
    }
    const auto t0 = std::chrono::steady_clock::now();
    GenStats st;
    std::string error;
    bool failed = false;
    if (job->cancelled && job->cancelled()) {
      st.stop_reason = "cancelled";
    } else {
      try {
        st = generate(job->prompt, job->options, [&](int32_t t, TokenOrigin o) {
          if (job->cancelled && job->cancelled()) return false;
          return job->on_token(t, o);
        }, job->on_round);
      } catch (const std::exception& e) {
        failed = true;
        error = e.what();
        log_warn("generation failed: %s", e.what());
      }
    }
    if (job->on_finish) job->on_finish(st, failed ? &error : nullptr);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> l(mu_);
    running_ = false;
    if (st.stop_reason != "cancelled") mean_job_s_ = 0.8 * mean_job_s_ + 0.2 * s;
  }
}

}  // namespace qf
