// A seeded mutator of JSON documents for the fuzz-style tests (request bodies, config files):
// replaces, removes or wraps random nodes and adds top-level fields, with values at the edges of
// every JSON type (numbers past int32/int64/double ranges, markers and odd UTF-8 in strings,
// nested containers). Header-only; the vocabulary of strings and keys is the caller's.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace qf::test {

struct JsonMutator {
  using ojson = nlohmann::ordered_json;
  std::vector<std::string> strings;  // string values to draw from
  std::vector<std::string> keys;     // keys of random objects
  std::vector<std::string> top;      // top-level fields to add or overwrite

  ojson value(std::mt19937_64& rng, int depth) const {
    auto pick = [&](size_t n) { return static_cast<size_t>(rng() % (n ? n : 1)); };
    static const std::vector<int64_t> ints = {0, 1, -1, 2, 3, 7, 8, 16, 64, 100, 1000000, -1000000, INT32_MAX, INT32_MIN,
                                              int64_t(1) << 40, INT64_MAX, INT64_MIN};
    static const std::vector<double> reals = {0.0, -0.0, 0.5, 1.0, 1.5, 2.0, -0.5, 1e-300, 1e300, -1e300, 3.7, 100.0};
    switch (depth > 3 ? pick(6) : pick(8)) {
      case 0: return nullptr;
      case 1: return pick(2) == 0;
      case 2: return ints[pick(ints.size())];
      case 3: return reals[pick(reals.size())];
      case 4: return static_cast<uint64_t>(UINT64_MAX - rng() % 3);
      case 5: return strings.empty() ? ojson("") : ojson(strings[pick(strings.size())]);
      case 6: {
        ojson a = ojson::array();
        for (size_t i = pick(4); i > 0; i--) a.push_back(value(rng, depth + 1));
        return a;
      }
      default: {
        ojson o = ojson::object();
        for (size_t i = pick(4); i > 0 && !keys.empty(); i--) o[keys[pick(keys.size())]] = value(rng, depth + 1);
        return o;
      }
    }
  }

  // 1 to 3 mutations of v.
  ojson mutate(ojson v, std::mt19937_64& rng) const {
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; k--) {
      std::vector<ojson::json_pointer> ps;
      paths(v, ojson::json_pointer(), ps);
      const ojson::json_pointer p = ps[rng() % ps.size()];
      switch (rng() % 4) {
        case 0:  // replace the node
          if (p.empty()) v = value(rng, 0);
          else v[p] = value(rng, 1);
          break;
        case 1:  // remove it (from its object, or an element of its array)
          if (!p.empty()) {
            ojson& parent = v[p.parent_pointer()];
            if (parent.is_object()) parent.erase(p.back());
            else if (parent.is_array() && !parent.empty())
              parent.erase(parent.begin() + static_cast<std::ptrdiff_t>(rng() % parent.size()));
          }
          break;
        case 2:  // wrap it in an array or an object
          if (rng() % 2) v[p] = ojson::array({v[p]});
          else v[p] = ojson{{"content", v[p]}};
          break;
        default:  // a top-level field with a random value
          if (v.is_object() && !top.empty()) v[top[rng() % top.size()]] = value(rng, 1);
      }
    }
    return v;
  }

  // Every node of v (containers included) by JSON pointer.
  static void paths(const ojson& v, const ojson::json_pointer& at, std::vector<ojson::json_pointer>& out) {
    out.push_back(at);
    if (v.is_object())
      for (auto it = v.begin(); it != v.end(); ++it) paths(it.value(), at / it.key(), out);
    else if (v.is_array())
      for (size_t i = 0; i < v.size(); i++) paths(v[i], at / i, out);
  }
};

}  // namespace qf::test
