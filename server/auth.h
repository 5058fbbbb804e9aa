// TokenAuth: bearer tokens → users. At first start it writes a random token for user `local` to
// <state-dir>/token (mode 0600); more users come from a tokens file of `user token` lines
// (# comments and blank lines allowed). Immutable after Load, so thread-safe.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "traind/engine/status.h"

namespace traind::server {

class TokenAuth {
 public:
  // Reads (or creates) <state_dir>/token and, when not empty, `tokens_file`. INVALID_ARGUMENT for a
  // malformed tokens file (with the line number), UNAVAILABLE when a file cannot be read or written.
  static Result<TokenAuth> Load(const std::string& state_dir, const std::string& tokens_file);

  // The user of an `authorization` metadata value ("Bearer <token>"), or UNAUTHENTICATED with a
  // sentence saying what is wrong. Compares in constant time per token.
  Result<std::string> Authenticate(const std::string& authorization) const;

 private:
  std::vector<std::pair<std::string, std::string>> tokens_;  // (token, user)
};

}  // namespace traind::server
