// SpecReader: typed, path-aware reading of one YAML mapping of a job spec. Every error is an
// INVALID_ARGUMENT that starts with the dotted field path ("training.max_steps: expected an
// integer, got 'abc'"). Private to the job spec parser (job_spec.cc); no yaml-cpp exceptions escape.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "traind/engine/status.h"

namespace traind::engine::spec {

// Levenshtein distance (for "did you mean" hints).
int EditDistance(const std::string& a, const std::string& b);

// A short description of a node for error messages: "'abc'", "null", "a mapping", "a list".
std::string Describe(const YAML::Node& n);

class SpecReader {
 public:
  // `node` must be a mapping (checked by Open). `path` is the mapping's dotted path ("" for root).
  static Result<SpecReader> Open(const YAML::Node& node, const std::string& path);

  // Checks that every key is in `known`; keys in `foreign` get `foreign_message` instead of
  // "unknown field" ("model.config.n_embd: not a llama config key"). Also rejects duplicate keys.
  Status CheckKeys(const std::vector<std::string>& known, const std::set<std::string>& foreign = {},
                   const std::string& foreign_message = "") const;

  bool Has(const std::string& key) const;
  // The child node (undefined-node when absent).
  YAML::Node Child(const std::string& key) const;
  std::string PathOf(const std::string& key) const;

  // Readers leave *out unchanged when the key is absent. Integers accept a plain (unquoted)
  // decimal scalar; doubles any finite number; booleans true/false.
  Status Int(const std::string& key, int64_t* out, int64_t min) const;
  Status Double(const std::string& key, double* out) const;
  Status Bool(const std::string& key, bool* out) const;
  Status String(const std::string& key, std::string* out) const;
  Status OptionalString(const std::string& key, std::optional<std::string>* out) const;  // null ok
  // A string that must be one of `allowed`.
  Status Enum(const std::string& key, std::string* out, const std::vector<std::string>& allowed) const;

  Status Error(const std::string& key, const std::string& why) const {
    return Status::InvalidArgument(PathOf(key) + ": " + why);
  }

 private:
  YAML::Node node_;
  std::string path_;
};

// Parses a plain decimal integer scalar; false if it is not one or does not fit int64.
bool ParseInt64(const YAML::Node& n, int64_t* out);

}  // namespace traind::engine::spec
