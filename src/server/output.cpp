#include "server/output.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "server/request.h"

namespace qf {

namespace {

constexpr std::string_view kThinkEnd = "</think>", kCallOpen = "<tool_call>", kCallClose = "</tool_call>";

// Longest proper prefix of `marker` that `s` ends with.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t L = std::min(s.size(), marker.size() - 1); L > 0; L--)
    if (s.substr(s.size() - L) == marker.substr(0, L)) return L;
  return 0;
}

size_t trailing(std::string_view s, std::string_view chars) {
  size_t n = 0;
  while (n < s.size() && chars.find(s[s.size() - 1 - n]) != std::string_view::npos) n++;
  return n;
}

// What must wait for more text: a possible start of `marker` and the `space` before it.
size_t held_back(std::string_view s, std::string_view marker, std::string_view space) {
  const size_t p = partial_suffix(s, marker);
  return p + trailing(s.substr(0, s.size() - p), space);
}

void trim_front(std::vector<Segment>& segs, std::string_view chars) {
  while (!segs.empty()) {
    std::string& t = segs.front().text;
    t.erase(0, std::min(t.find_first_not_of(chars), t.size()));
    if (!t.empty()) return;
    segs.erase(segs.begin());
  }
}

void trim_back(std::vector<Segment>& segs, std::string_view chars) {
  while (!segs.empty()) {
    std::string& t = segs.back().text;
    t.resize(t.size() - trailing(t, chars));
    if (!t.empty()) return;
    segs.pop_back();
  }
}

}  // namespace

std::string OutputEvent::text() const {
  std::string s;
  for (const Segment& g : segments) s += g.text;
  return s;
}

void OutputAssembler::Tagged::append(std::string_view s, TokenOrigin o) {
  if (s.empty()) return;
  text_ += s;
  runs_.emplace_back(s.size(), o);
}

void OutputAssembler::Tagged::append(const std::vector<Segment>& segs) {
  for (const Segment& g : segs) append(g.text, g.origin);
}

std::vector<Segment> OutputAssembler::Tagged::take(size_t n) {
  std::vector<Segment> out;
  size_t at = 0, used = 0;
  while (at < n && used < runs_.size()) {
    auto& [len, o] = runs_[used];
    const size_t k = std::min(len, n - at);
    out.push_back({text_.substr(at, k), o});
    at += k;
    if (k == len) {
      used++;
    } else {
      len -= k;
    }
  }
  runs_.erase(runs_.begin(), runs_.begin() + static_cast<long>(used));
  text_.erase(0, at);
  return out;
}

void OutputAssembler::Tagged::drop(size_t n) { take(n); }

OutputAssembler::OutputAssembler(OutputOptions opt) : opt_(std::move(opt)) {
  in_reasoning_ = opt_.reasoning;
  if (opt_.tools && opt_.tool_call_prefix.rfind(kCallOpen, 0) == 0) {
    in_call_ = true;
    call_buf_ = opt_.tool_call_prefix.substr(kCallOpen.size());
  }
}

void OutputAssembler::emit(OutputEvent::Kind k, std::vector<Segment> segs, std::vector<OutputEvent>& out) {
  segs.erase(std::remove_if(segs.begin(), segs.end(), [](const Segment& g) { return g.text.empty(); }), segs.end());
  if (segs.empty()) return;
  if (!out.empty() && out.back().kind == k && k != OutputEvent::Kind::ToolCall) {
    for (auto& g : segs) out.back().segments.push_back(std::move(g));
    return;
  }
  out.push_back({k, std::move(segs), {}});
}

bool OutputAssembler::push(std::string_view text, TokenOrigin origin, std::vector<OutputEvent>& out) {
  if (stopped_ || finished_) return false;
  stop_buf_.append(text, origin);
  if (opt_.stop.empty()) {
    reasoning_stage(stop_buf_.take(stop_buf_.size()), false, out);
    return true;
  }
  const std::string& s = stop_buf_.str();
  size_t first = std::string::npos;
  for (const std::string& st : opt_.stop) first = std::min(first, s.find(st));
  if (first != std::string::npos) {
    std::vector<Segment> before = stop_buf_.take(first);
    stop_buf_ = Tagged();
    stopped_ = true;
    reasoning_stage(std::move(before), false, out);
    return false;
  }
  size_t hold = 0;
  for (const std::string& st : opt_.stop) hold = std::max(hold, partial_suffix(s, st));
  reasoning_stage(stop_buf_.take(s.size() - hold), false, out);
  return true;
}

void OutputAssembler::finish(std::vector<OutputEvent>& out) {
  if (finished_) return;
  finished_ = true;
  reasoning_stage(stop_buf_.take(stop_buf_.size()), true, out);
}

void OutputAssembler::reasoning_stage(std::vector<Segment> segs, bool last, std::vector<OutputEvent>& out) {
  if (!in_reasoning_) return content_stage(std::move(segs), last, out);
  think_buf_.append(segs);
  const std::string& s = think_buf_.str();
  const size_t end = s.find(kThinkEnd);
  if (end != std::string::npos) {
    std::vector<Segment> r = think_buf_.take(end);
    trim_back(r, "\n");
    if (!reasoning_started_) trim_front(r, "\n");
    emit(OutputEvent::Kind::Reasoning, std::move(r), out);
    think_buf_.drop(kThinkEnd.size());
    in_reasoning_ = false;
    skip_space_ = true;  // "</think>\n\n" then the answer
    return content_stage(think_buf_.take(think_buf_.size()), last, out);
  }
  // Hold back what may begin "</think>", and trailing newlines (dropped if it follows).
  const size_t hold = last ? trailing(s, "\n") : held_back(s, kThinkEnd, "\n");
  std::vector<Segment> r = think_buf_.take(s.size() - hold);
  if (last) think_buf_ = Tagged();
  if (!reasoning_started_) trim_front(r, "\n");
  if (!r.empty()) reasoning_started_ = true;
  emit(OutputEvent::Kind::Reasoning, std::move(r), out);
}

void OutputAssembler::content_stage(std::vector<Segment> segs, bool last, std::vector<OutputEvent>& out) {
  content_buf_.append(segs);
  const std::string_view ws = " \t\r\n";
  while (true) {
    if (skip_space_) {
      const std::string& s = content_buf_.str();
      const size_t n = std::min(s.find_first_not_of(ws), s.size());
      content_buf_.drop(n);
      if (content_buf_.size() == 0 && !last) return;
      skip_space_ = false;
    }
    if (in_call_) {
      // Inside a call the text is only collected; origins no longer matter.
      for (const Segment& g : content_buf_.take(content_buf_.size())) call_buf_ += g.text;
      const size_t close = call_buf_.find(kCallClose);
      if (close == std::string::npos) {
        if (last) {  // cut off inside a call: it stays text
          emit(OutputEvent::Kind::Content, {{std::string(kCallOpen) + call_buf_, TokenOrigin::Target}}, out);
          call_buf_.clear();
          in_call_ = false;
        }
        return;
      }
      const std::string rest = call_buf_.substr(close + kCallClose.size());
      call_buf_.resize(close);
      end_call(out);
      content_buf_.append(rest, TokenOrigin::Target);
      skip_space_ = true;
      continue;
    }
    const std::string& s = content_buf_.str();
    if (!opt_.tools) {
      emit(OutputEvent::Kind::Content, content_buf_.take(s.size()), out);
      return;
    }
    const size_t open = s.find(kCallOpen);
    if (open != std::string::npos) {
      std::vector<Segment> before = content_buf_.take(open);
      trim_back(before, ws);
      emit(OutputEvent::Kind::Content, std::move(before), out);
      content_buf_.drop(kCallOpen.size());
      in_call_ = true;
      call_buf_.clear();
      continue;
    }
    // Hold back what may begin "<tool_call>", and trailing whitespace (dropped before a call,
    // and at the end of an answer that made calls).
    size_t hold = last ? 0 : held_back(s, kCallOpen, ws);
    if (last && n_calls_ > 0) hold = trailing(s, ws);
    std::vector<Segment> c = content_buf_.take(s.size() - hold);
    if (last) content_buf_ = Tagged();
    emit(OutputEvent::Kind::Content, std::move(c), out);
    return;
  }
}

// A closed <tool_call> block: {"name": string, "arguments": object or JSON text}.
void OutputAssembler::end_call(std::vector<OutputEvent>& out) {
  in_call_ = false;
  const auto j = nlohmann::ordered_json::parse(call_buf_, nullptr, /*allow_exceptions=*/false);
  const bool ok = j.is_object() && j.contains("name") && j["name"].is_string() && !j["name"].get<std::string>().empty();
  if (!ok) {
    emit(OutputEvent::Kind::Content,
         {{std::string(kCallOpen) + call_buf_ + std::string(kCallClose), TokenOrigin::Target}}, out);
    call_buf_.clear();
    return;
  }
  ToolCall c;
  c.id = opt_.call_id_prefix + std::to_string(n_calls_++);
  c.name = j["name"].get<std::string>();
  c.arguments = "{}";
  if (j.contains("arguments"))
    c.arguments = j["arguments"].is_string() ? j["arguments"].get<std::string>() : json_dump_python(j["arguments"]);
  out.push_back({OutputEvent::Kind::ToolCall, {}, std::move(c)});
  call_buf_.clear();
}

}  // namespace qf
