#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_load.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace qf {

using json = nlohmann::json;

struct Tokenizer::Impl {
  std::string source;
  std::unique_ptr<BpeModel> bpe;
  std::vector<NormForm> norm;
  PreTokenizer pretok;
  AddedTokenMatcher raw_matcher;   // added tokens with normalized=false
  AddedTokenMatcher norm_matcher;  // added tokens with normalized=true
  std::unordered_map<std::string, int32_t> added_by_content;
  std::vector<std::string> token_str;    // [vocab_size] token as written in the file
  std::vector<std::string> token_bytes;  // [vocab_size] decoded bytes
  std::vector<uint8_t> flags;            // [vocab_size] kPresent | kAdded | kSpecial
  std::vector<int32_t> eos;

  static constexpr uint8_t kPresent = 1, kAdded = 2, kSpecial = 4;

  void encode_plain(std::string_view raw, bool parse_special, std::vector<int32_t>& out) const;
};

namespace {

// ---- JSON field access with errors that name the file and the field ----------------------

struct Ctx {
  const std::string& file;
};

// A value for an error message, cut short: a wrong-typed vocab can be megabytes of JSON.
std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', true);  // ASCII-only, so the cut cannot split a character
  return s.size() <= 80 ? s : s.substr(0, 77) + "...";
}

[[noreturn]] void field_error(const Ctx& c, const std::string& field, const std::string& what) {
  fail(ErrorKind::Tokenizer, "%s: %s: %s", c.file.c_str(), field.c_str(), what.c_str());
}

const json& require(const Ctx& c, const json& obj, const char* key, const std::string& field) {
  if (!obj.is_object()) field_error(c, field, "expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) field_error(c, field + "." + key, "missing");
  return *it;
}

bool opt_bool(const Ctx& c, const json& obj, const char* key, bool dflt, const std::string& field) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) field_error(c, field + "." + key, "expected true or false, found " + brief(*it));
  return it->get<bool>();
}

std::string opt_string(const Ctx& c, const json& obj, const char* key, const std::string& field) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return {};
  if (!it->is_string()) field_error(c, field + "." + key, "expected a string, found " + brief(*it));
  return it->get<std::string>();
}

std::string type_of(const Ctx& c, const json& obj, const std::string& field) {
  const json& t = require(c, obj, "type", field);
  if (!t.is_string()) field_error(c, field + ".type", "expected a string");
  return t.get<std::string>();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorKind::Tokenizer, "%s: cannot open tokenizer file", path.c_str());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(const std::string& text, const std::string& name) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    fail(ErrorKind::Tokenizer, "%s: bad JSON: %s", name.c_str(), e.what());
  }
}

// ---- sections ---------------------------------------------------------------------------

void parse_normalizer(const Ctx& c, const json& n, const std::string& field, std::vector<NormForm>& out) {
  if (n.is_null()) return;
  std::string type = type_of(c, n, field);
  if (type == "NFC") out.push_back(NormForm::NFC);
  else if (type == "NFD") out.push_back(NormForm::NFD);
  else if (type == "NFKC") out.push_back(NormForm::NFKC);
  else if (type == "NFKD") out.push_back(NormForm::NFKD);
  else if (type == "Sequence") {
    const json& list = require(c, n, "normalizers", field);
    if (!list.is_array()) field_error(c, field + ".normalizers", "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_normalizer(c, list[i], field + ".normalizers[" + std::to_string(i) + "]", out);
  } else {
    field_error(c, field + ".type", "unsupported normalizer \"" + type + "\" (supported: NFC, NFD, NFKC, NFKD, Sequence)");
  }
}

SplitBehavior parse_behavior(const Ctx& c, const json& step, const std::string& field) {
  std::string b = opt_string(c, step, "behavior", field);
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  field_error(c, field + ".behavior", "unsupported split behavior \"" + b + "\"");
}

// Returns true when a ByteLevel step was seen (the BPE then works on bytes).
bool parse_pretokenizer(const Ctx& c, const json& p, const std::string& field, PreTokenizer& out) {
  if (p.is_null()) return false;
  std::string type = type_of(c, p, field);
  if (type == "Sequence") {
    const json& list = require(c, p, "pretokenizers", field);
    if (!list.is_array()) field_error(c, field + ".pretokenizers", "expected an array");
    bool byte_level = false;
    for (size_t i = 0; i < list.size(); ++i)
      byte_level |= parse_pretokenizer(c, list[i], field + ".pretokenizers[" + std::to_string(i) + "]", out);
    return byte_level;
  }
  PreTokStep step;
  if (type == "Split") {
    step.kind = PreTokStep::Kind::Split;
    const json& pat = require(c, p, "pattern", field);
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      step.regex = std::make_shared<const Regex>(pat["Regex"].get<std::string>(),
                                                 c.file + ": " + field + ".pattern.Regex");
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      step.literal = pat["String"].get<std::string>();
    } else {
      field_error(c, field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}, found " + brief(pat));
    }
    step.behavior = parse_behavior(c, p, field);
    step.invert = opt_bool(c, p, "invert", false, field);
    out.add_step(std::move(step));
    return false;
  }
  if (type == "ByteLevel") {
    step.kind = PreTokStep::Kind::ByteLevel;
    step.add_prefix_space = opt_bool(c, p, "add_prefix_space", true, field);
    step.use_regex = opt_bool(c, p, "use_regex", true, field);
    out.add_step(std::move(step));
    return true;
  }
  field_error(c, field + ".type", "unsupported pre-tokenizer \"" + type + "\" (supported: Split, ByteLevel, Sequence)");
}

// Returns true for a ByteLevel decoder, false for none.
bool parse_decoder(const Ctx& c, const json& d) {
  if (d.is_null()) return false;
  std::string type = type_of(c, d, "decoder");
  if (type == "ByteLevel") return true;
  field_error(c, "decoder.type", "unsupported decoder \"" + type + "\" (supported: ByteLevel)");
}

std::unique_ptr<BpeModel> parse_model(const Ctx& c, const json& m, TokenizerJson& tj) {
  if (!m.is_object()) field_error(c, "model", "expected an object");
  // Old files omit model.type; a merges list identifies BPE.
  std::string type = m.contains("type") ? type_of(c, m, "model") : (m.contains("merges") ? "BPE" : "");
  if (type != "BPE") field_error(c, "model.type", "unsupported model type \"" + type + "\" (only BPE)");
  if (!opt_string(c, m, "continuing_subword_prefix", "model").empty() ||
      !opt_string(c, m, "end_of_word_suffix", "model").empty())
    field_error(c, "model", "continuing_subword_prefix / end_of_word_suffix are not supported");
  if (opt_bool(c, m, "byte_fallback", false, "model"))
    field_error(c, "model.byte_fallback", "byte_fallback is not supported (byte-level BPE needs none)");

  // vocab and merges were streamed by the SAX pass when they had the right container type.
  const json& vj = require(c, m, "vocab", "model");
  if (!tj.vocab_streamed) field_error(c, "model.vocab", "expected an object of token -> id, found " + brief(vj));
  const json& mj = require(c, m, "merges", "model");
  if (!tj.merges_streamed) field_error(c, "model.merges", "expected an array, found " + brief(mj));
  std::unordered_map<std::string, int32_t> vocab = std::move(tj.vocab);
  std::vector<std::pair<std::string, std::string>> merges = std::move(tj.merges);

  std::optional<int32_t> unk;
  std::string unk_tok = opt_string(c, m, "unk_token", "model");
  if (!unk_tok.empty()) {
    auto it = vocab.find(unk_tok);
    if (it == vocab.end()) field_error(c, "model.unk_token", "\"" + unk_tok + "\" is not in model.vocab");
    unk = it->second;
  }
  return std::make_unique<BpeModel>(std::move(vocab), merges, c.file, unk,
                                    opt_bool(c, m, "fuse_unk", false, "model"),
                                    opt_bool(c, m, "ignore_merges", false, "model"));
}

std::vector<AddedToken> parse_added(const Ctx& c, const json& root) {
  std::vector<AddedToken> out;
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return out;
  if (!it->is_array()) field_error(c, "added_tokens", "expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    std::string field = "added_tokens[" + std::to_string(i) + "]";
    AddedToken t;
    const json& id = require(c, e, "id", field);
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      field_error(c, field + ".id", "expected a non-negative integer, found " + brief(id));
    t.id = static_cast<int32_t>(id.get<int64_t>());
    const json& content = require(c, e, "content", field);
    if (!content.is_string() || content.get_ref<const std::string&>().empty())
      field_error(c, field + ".content", "expected a non-empty string");
    t.content = content.get<std::string>();
    t.special = opt_bool(c, e, "special", false, field);
    t.lstrip = opt_bool(c, e, "lstrip", false, field);
    t.rstrip = opt_bool(c, e, "rstrip", false, field);
    t.normalized = opt_bool(c, e, "normalized", !t.special, field);
    t.single_word = opt_bool(c, e, "single_word", false, field);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

// ---- loading -----------------------------------------------------------------------------

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file = path;
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  if (!fs::exists(file, ec)) fail(ErrorKind::Tokenizer, "%s: tokenizer file not found", file.string().c_str());
  std::string config_text;
  fs::path config = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config, ec)) config_text = read_file(config.string());
  return from_json(read_file(file.string()), file.string(), config_text);
}

Tokenizer Tokenizer::from_json(const std::string& json_text, const std::string& name,
                               const std::string& config_text) {
  auto impl = std::make_shared<Impl>();
  impl->source = name;
  Ctx c{impl->source};
  TokenizerJson tj = parse_tokenizer_json(json_text, name);
  const json& root = tj.root;
  if (!root.is_object()) field_error(c, "(root)", "expected a JSON object");

  impl->bpe = parse_model(c, require(c, root, "model", "(root)"), tj);
  parse_normalizer(c, root.value("normalizer", json()), "normalizer", impl->norm);
  if (!parse_pretokenizer(c, root.value("pre_tokenizer", json()), "pre_tokenizer", impl->pretok))
    field_error(c, "pre_tokenizer", "no ByteLevel step: only byte-level BPE tokenizers are supported");
  bool byte_level_decoder = parse_decoder(c, root.value("decoder", json()));
  std::vector<AddedToken> added = parse_added(c, root);

  // Id tables over the union of vocab and added tokens; an added token overrides the vocab
  // entry with the same id (its content is what the file means by that id).
  // The tables are sized by the largest id, so ids are bounded (a hostile or corrupt file must
  // not make a 2^31-entry table): at most kMaxTokenId, and at most kMaxIdGaps unused ids below
  // the largest (real vocabularies are dense: Qwen3's 151,669 ids leave none).
  constexpr int64_t kMaxTokenId = (int64_t(1) << 24) - 1, kMaxIdGaps = 65536;
  int64_t n64 = 0;
  for (const auto& [tok, id] : impl->bpe->vocab()) {
    if (id > kMaxTokenId)
      field_error(c, "model.vocab[\"" + tok + "\"]", "expected an id of at most " + std::to_string(kMaxTokenId) +
                                                      ", found " + std::to_string(id));
    n64 = std::max<int64_t>(n64, int64_t(id) + 1);
  }
  for (size_t i = 0; i < added.size(); ++i) {
    if (added[i].id > kMaxTokenId)
      field_error(c, "added_tokens[" + std::to_string(i) + "].id",
                  "expected an id of at most " + std::to_string(kMaxTokenId) + ", found " + std::to_string(added[i].id));
    n64 = std::max<int64_t>(n64, int64_t(added[i].id) + 1);
  }
  const int64_t entries = static_cast<int64_t>(impl->bpe->vocab().size() + added.size());
  if (n64 > entries + kMaxIdGaps)
    field_error(c, "model.vocab", "ids up to " + std::to_string(n64 - 1) + " for " + std::to_string(entries) +
                                      " tokens (at most " + std::to_string(kMaxIdGaps) + " unused ids are allowed)");
  const int32_t n = static_cast<int32_t>(n64);
  impl->token_str.assign(n, std::string());
  impl->flags.assign(n, 0);
  for (const auto& [tok, id] : impl->bpe->vocab()) {
    impl->token_str[id] = tok;
    impl->flags[id] = Impl::kPresent;
  }
  std::vector<AddedToken> raw_tokens, norm_tokens;
  std::vector<std::string> raw_patterns, norm_patterns;
  for (const AddedToken& t : added) {
    impl->token_str[t.id] = t.content;
    impl->flags[t.id] = Impl::kPresent | Impl::kAdded | (t.special ? Impl::kSpecial : 0);
    impl->added_by_content[t.content] = t.id;
    // Like the reference: non-normalized tokens are cut from the raw text first, then the
    // normalized ones from each normalized remainder (also when there is no normalizer).
    if (t.normalized) {
      norm_patterns.push_back(normalize(t.content, impl->norm));
      norm_tokens.push_back(t);
    } else {
      raw_patterns.push_back(t.content);
      raw_tokens.push_back(t);
    }
  }
  impl->raw_matcher.build(std::move(raw_tokens), std::move(raw_patterns));
  impl->norm_matcher.build(std::move(norm_tokens), std::move(norm_patterns));

  impl->token_bytes.assign(n, std::string());
  for (int32_t id = 0; id < n; ++id) {
    const std::string& s = impl->token_str[id];
    if (!byte_level_decoder || !byte_level::decode(s, impl->token_bytes[id])) impl->token_bytes[id] = s;
  }

  auto push_eos = [&](const std::string& content) {
    auto it = impl->added_by_content.find(content);
    std::optional<int32_t> id;
    if (it != impl->added_by_content.end()) id = it->second;
    else if (auto v = impl->bpe->vocab().find(content); v != impl->bpe->vocab().end()) id = v->second;
    if (id && std::find(impl->eos.begin(), impl->eos.end(), *id) == impl->eos.end()) impl->eos.push_back(*id);
  };
  push_eos("<|im_end|>");
  push_eos("<|endoftext|>");
  if (!config_text.empty()) {
    std::string cfg_name = "tokenizer_config.json (beside " + name + ")";
    Ctx cc{cfg_name};
    json cfg = parse_json(config_text, cfg_name);
    if (cfg.is_object() && cfg.contains("eos_token") && !cfg["eos_token"].is_null()) {
      const json& e = cfg["eos_token"];
      // Either a plain string or an AddedToken object {"content": ...}.
      if (e.is_string()) push_eos(e.get<std::string>());
      else if (e.is_object() && e.contains("content") && e["content"].is_string()) push_eos(e["content"].get<std::string>());
      else field_error(cc, "eos_token", "expected a string or {\"content\": ...}, found " + brief(e));
    }
  }
  return Tokenizer(std::move(impl));
}

// ---- encode / decode ---------------------------------------------------------------------

void Tokenizer::Impl::encode_plain(std::string_view raw, bool parse_special, std::vector<int32_t>& out) const {
  std::string normalized = normalize(raw, norm);
  std::vector<TextSegment> segs;
  if (parse_special && !norm_matcher.empty()) norm_matcher.split(normalized, segs);
  else segs.push_back({0, normalized.size(), -1});
  std::vector<std::string> pieces;
  for (const TextSegment& s : segs) {
    if (s.token_id >= 0) {
      out.push_back(s.token_id);
      continue;
    }
    pieces.clear();
    pretok.split(std::string_view(normalized).substr(s.begin, s.end - s.begin), pieces);
    for (const std::string& p : pieces) bpe->encode_word(p, out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::string cleaned;
  if (!utf8::is_valid(text)) {
    cleaned = utf8::sanitize(text);
    text = cleaned;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (!parse_special || impl_->raw_matcher.empty()) {
    impl_->encode_plain(text, parse_special, out);
    return out;
  }
  std::vector<TextSegment> segs;
  impl_->raw_matcher.split(text, segs);
  for (const TextSegment& s : segs) {
    if (s.token_id >= 0) out.push_back(s.token_id);
    else impl_->encode_plain(text.substr(s.begin, s.end - s.begin), parse_special, out);
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id < 0 || id >= vocab_size())
      fail(ErrorKind::Tokenizer, "%s: decode: id %d at position %zu is out of range [0, %d)",
           impl_->source.c_str(), id, i, vocab_size());
    if (skip_special && (impl_->flags[id] & Impl::kSpecial)) continue;
    out += impl_->token_bytes[id];
  }
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail(ErrorKind::Tokenizer, "%s: token id %d is out of range [0, %d)", impl_->source.c_str(), id, vocab_size());
  return impl_->token_bytes[id];
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail(ErrorKind::Tokenizer, "%s: token id %d is out of range [0, %d)", impl_->source.c_str(), id, vocab_size());
  return impl_->token_str[id];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->token_str.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  std::string key(token);
  if (auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end()) return it->second;
  if (auto it = impl_->bpe->vocab().find(key); it != impl_->bpe->vocab().end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && (impl_->flags[id] & Impl::kSpecial);
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < vocab_size() && (impl_->flags[id] & Impl::kAdded);
}

std::vector<int32_t> Tokenizer::eos_ids() const { return impl_->eos; }

const std::string& Tokenizer::source() const { return impl_->source; }

}  // namespace qf
