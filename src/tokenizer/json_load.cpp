#include "tokenizer/json_load.h"

#include "core/error.h"

namespace qf {
namespace {

using json = nlohmann::json;

class Sax : public nlohmann::json_sax<json> {
 public:
  Sax(TokenizerJson& out, const std::string& name) : out_(out), name_(name) {}

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::Vocab) return vocab_id(v, json(v));
    return value(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::Vocab) return vocab_id(v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v), json(v));
    return value(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
  bool string(string_t& v) override {
    if (mode_ == Mode::MergePair) {
      if (pair_n_ < 2) pair_[pair_n_] = std::move(v);
      ++pair_n_;
      return true;
    }
    if (mode_ == Mode::Merges) {
      size_t sp = v.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == v.size() || v.find(' ', sp + 1) != std::string::npos)
        bad_merge("expected \"left right\", found " + json(v).dump());
      out_.merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    return value(json(std::move(v)));
  }
  bool binary(binary_t&) override { return value(json()); }

  bool start_object(std::size_t) override {
    if (mode_ == Mode::Vocab) vocab_error(json::object());
    if (mode_ == Mode::Merges || mode_ == Mode::MergePair) bad_merge("expected \"a b\" or [\"a\", \"b\"], found an object");
    if (depth_ == 2 && path_is("model", "vocab")) {
      place(json::object());
      mode_ = Mode::Vocab;
      out_.vocab_streamed = true;
      ++depth_;
      return true;
    }
    open(json::object());
    return true;
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::Vocab) {
      key_ = std::move(k);
      return true;
    }
    key_ = k;
    if (depth_ <= 2) keys_[depth_ - 1] = k;  // the path is only needed two levels deep
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::Vocab) mode_ = Mode::Dom;
    else stack_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::Vocab) vocab_error(json::array());
    if (mode_ == Mode::MergePair) bad_merge("expected \"a b\" or [\"a\", \"b\"], found a nested array");
    if (mode_ == Mode::Merges) {
      mode_ = Mode::MergePair;
      pair_n_ = 0;
      ++depth_;
      return true;
    }
    if (depth_ == 2 && path_is("model", "merges")) {
      place(json::array());
      mode_ = Mode::Merges;
      out_.merges_streamed = true;
      ++depth_;
      return true;
    }
    open(json::array());
    return true;
  }
  bool end_array() override {
    --depth_;
    if (mode_ == Mode::MergePair) {
      if (pair_n_ != 2) bad_merge("expected \"a b\" or [\"a\", \"b\"], found an array of " + std::to_string(pair_n_) + " strings");
      out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::Merges;
      return true;
    }
    if (mode_ == Mode::Merges) mode_ = Mode::Dom;
    else stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    fail(ErrorKind::Tokenizer, "%s: bad JSON: %s", name_.c_str(), ex.what());
  }

 private:
  enum class Mode { Dom, Vocab, Merges, MergePair };

  bool path_is(const char* a, const char* b) const { return keys_[0] == a && keys_[1] == b; }

  // Inserts v into the current container (or makes it the root); returns where it went.
  json* place(json v) {
    if (stack_.empty()) {
      out_.root = std::move(v);
      return &out_.root;
    }
    json* parent = stack_.back();
    if (parent->is_object()) return &((*parent)[key_] = std::move(v));
    parent->push_back(std::move(v));
    return &parent->back();
  }
  void open(json v) {
    stack_.push_back(place(std::move(v)));
    ++depth_;
  }
  bool value(json v) {
    if (mode_ == Mode::Vocab) vocab_error(v);
    if (mode_ == Mode::Merges || mode_ == Mode::MergePair) bad_merge("expected strings, found " + v.dump());
    place(std::move(v));
    return true;
  }
  bool vocab_id(int64_t id, const json& shown) {
    if (id < 0 || id > INT32_MAX) vocab_error(shown);
    out_.vocab.emplace(std::move(key_), static_cast<int32_t>(id));
    return true;
  }
  [[noreturn]] void vocab_error(const json& found) {
    fail(ErrorKind::Tokenizer, "%s: model.vocab[\"%s\"]: expected a non-negative integer id, found %s",
         name_.c_str(), key_.c_str(), found.dump().c_str());
  }
  [[noreturn]] void bad_merge(const std::string& what) {
    fail(ErrorKind::Tokenizer, "%s: model.merges[%zu]: %s", name_.c_str(), out_.merges.size(), what.c_str());
  }

  TokenizerJson& out_;
  const std::string& name_;
  Mode mode_ = Mode::Dom;
  std::vector<json*> stack_;  // open DOM containers
  size_t depth_ = 0;          // nesting depth including streamed containers
  std::string keys_[2];       // keys at depth 1 and 2 (e.g. "model", "vocab")
  std::string key_;
  std::string pair_[2];
  size_t pair_n_ = 0;
};

}  // namespace

TokenizerJson parse_tokenizer_json(const std::string& text, const std::string& name) {
  TokenizerJson out;
  Sax sax(out, name);
  json::sax_parse(text, &sax);
  return out;
}

}  // namespace qf
