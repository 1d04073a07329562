// Typed field lookup for config.json validation. A reader searches one or more JSON objects
// ("scopes") in order, e.g. dflash_config before the top level, and every failure is a
// qf::Error(Config) "config.json (<origin>): field '<scope><key>' ..." naming the expected and
// the found value. JSON null counts as absent (transformers writes null for unset ids).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace qf {

using Json = nlohmann::json;

// Parses `text` as a JSON object; Format error naming `origin` otherwise.
Json parse_config_json(const std::string& text, const std::string& origin);

// Short printable form of a JSON value for error messages ("\"gelu\"", "[11, 11, 10]").
std::string json_brief(const Json& v);

// Config error "config.json (<origin>): <message>".
[[noreturn]] void config_error(const std::string& origin, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

class ConfigFields {
 public:
  struct Scope {
    const Json* obj;     // may be null (scope absent)
    std::string prefix;  // "text_config.", "dflash_config.", "" for the top level
  };
  ConfigFields(std::string origin, std::vector<Scope> scopes);

  // The first non-null value of `key` across the scopes; nullptr when absent everywhere.
  const Json* find(const std::string& key) const;
  // Qualified name of `key` where it was found, or in the first scope when absent.
  std::string name(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  int req_int(const std::string& key) const;
  int req_pos_int(const std::string& key) const;  // > 0
  int opt_int(const std::string& key, int def) const;
  double req_num(const std::string& key) const;
  double opt_num(const std::string& key, double def) const;
  bool opt_bool(const std::string& key, bool def) const;
  std::string req_str(const std::string& key) const;
  std::string opt_str(const std::string& key, const std::string& def) const;
  // A JSON int, or an array of ints (eos_token_id); empty when absent.
  std::vector<int> opt_int_or_list(const std::string& key) const;
  std::vector<int> opt_int_list(const std::string& key) const;  // array of ints; empty if absent
  // The value as an object, or nullptr when absent; an error when present but not an object.
  const Json* opt_object(const std::string& key) const;

  [[noreturn]] void missing(const std::string& key) const;
  // "field '<name>' expected <expected>, found <found>".
  [[noreturn]] void bad(const std::string& key, const std::string& expected,
                        const std::string& found) const;
  // Same, with the field's current value as the found part.
  [[noreturn]] void bad(const std::string& key, const std::string& expected) const;

  const std::string& origin() const { return origin_; }

 private:
  int to_int(const std::string& key, const Json& v) const;
  std::string origin_;
  std::vector<Scope> scopes_;
};

}  // namespace qf
