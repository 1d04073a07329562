#include "io/config_fields.h"

#include <climits>
#include <cmath>
#include <cstdarg>

#include "core/error.h"

namespace qf {

Json parse_config_json(const std::string& text, const std::string& origin) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    fail(ErrorKind::Format, "config.json (%s): not valid JSON: %s", origin.c_str(), e.what());
  }
  if (!root.is_object())
    fail(ErrorKind::Format, "config.json (%s): expected a JSON object, found %s", origin.c_str(),
         root.type_name());
  return root;
}

std::string json_brief(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

void config_error(const std::string& origin, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string msg = vstrf(fmt, ap);
  va_end(ap);
  throw Error(ErrorKind::Config, "config.json (" + origin + "): " + msg);
}

ConfigFields::ConfigFields(std::string origin, std::vector<Scope> scopes)
    : origin_(std::move(origin)), scopes_(std::move(scopes)) {}

const Json* ConfigFields::find(const std::string& key) const {
  for (const Scope& s : scopes_) {
    if (!s.obj || !s.obj->is_object()) continue;
    auto it = s.obj->find(key);
    if (it != s.obj->end() && !it->is_null()) return &*it;
  }
  return nullptr;
}

std::string ConfigFields::name(const std::string& key) const {
  for (const Scope& s : scopes_) {
    if (!s.obj || !s.obj->is_object()) continue;
    auto it = s.obj->find(key);
    if (it != s.obj->end() && !it->is_null()) return s.prefix + key;
  }
  return (scopes_.empty() ? std::string() : scopes_.front().prefix) + key;
}

void ConfigFields::missing(const std::string& key) const {
  std::string also;
  for (size_t i = 1; i < scopes_.size(); ++i)
    if (scopes_[i].prefix != scopes_[0].prefix) also += ", '" + scopes_[i].prefix + key + "'";
  if (also.empty())
    config_error(origin_, "field '%s' is missing", name(key).c_str());
  config_error(origin_, "field '%s' is missing (also looked for %s)", name(key).c_str(),
               also.substr(2).c_str());
}

void ConfigFields::bad(const std::string& key, const std::string& expected,
                       const std::string& found) const {
  config_error(origin_, "field '%s' expected %s, found %s", name(key).c_str(), expected.c_str(),
               found.c_str());
}

void ConfigFields::bad(const std::string& key, const std::string& expected) const {
  const Json* v = find(key);
  bad(key, expected, v ? json_brief(*v) : std::string("nothing"));
}

int ConfigFields::to_int(const std::string& key, const Json& v) const {
  if (v.is_number_unsigned()) {
    uint64_t x = v.get<uint64_t>();
    if (x <= static_cast<uint64_t>(INT_MAX)) return static_cast<int>(x);
  } else if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (x >= INT_MIN && x <= INT_MAX) return static_cast<int>(x);
  }
  bad(key, "an integer in int range", json_brief(v));
}

int ConfigFields::req_int(const std::string& key) const {
  const Json* v = find(key);
  if (!v) missing(key);
  return to_int(key, *v);
}

int ConfigFields::req_pos_int(const std::string& key) const {
  int x = req_int(key);
  if (x <= 0) bad(key, "a positive integer");
  return x;
}

int ConfigFields::opt_int(const std::string& key, int def) const {
  const Json* v = find(key);
  return v ? to_int(key, *v) : def;
}

double ConfigFields::req_num(const std::string& key) const {
  const Json* v = find(key);
  if (!v) missing(key);
  if (!v->is_number()) bad(key, "a number");
  double x = v->get<double>();
  if (!std::isfinite(x)) bad(key, "a finite number");
  return x;
}

double ConfigFields::opt_num(const std::string& key, double def) const {
  return has(key) ? req_num(key) : def;
}

bool ConfigFields::opt_bool(const std::string& key, bool def) const {
  const Json* v = find(key);
  if (!v) return def;
  if (!v->is_boolean()) bad(key, "true or false");
  return v->get<bool>();
}

std::string ConfigFields::req_str(const std::string& key) const {
  const Json* v = find(key);
  if (!v) missing(key);
  if (!v->is_string()) bad(key, "a string");
  return v->get<std::string>();
}

std::string ConfigFields::opt_str(const std::string& key, const std::string& def) const {
  return has(key) ? req_str(key) : def;
}

std::vector<int> ConfigFields::opt_int_or_list(const std::string& key) const {
  const Json* v = find(key);
  if (!v) return {};
  if (v->is_number()) return {to_int(key, *v)};
  return opt_int_list(key);
}

std::vector<int> ConfigFields::opt_int_list(const std::string& key) const {
  const Json* v = find(key);
  if (!v) return {};
  if (!v->is_array()) bad(key, "a list of integers");
  std::vector<int> out;
  for (const Json& e : *v) {
    if (!e.is_number_integer()) bad(key, "a list of integers");
    out.push_back(to_int(key, e));
  }
  return out;
}

const Json* ConfigFields::opt_object(const std::string& key) const {
  const Json* v = find(key);
  if (v && !v->is_object()) bad(key, "an object");
  return v;
}

}  // namespace qf
