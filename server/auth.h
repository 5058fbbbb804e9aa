// TokenAuth: bearer tokens → users. At first start it writes a random token for user `local` to
// <state-dir>/token (mode 0600); more users come from a tokens file of `user token` lines
// (# comments and blank lines allowed), each optionally followed by the user's path roots:
// `user token [data=DIR,DIR] [output=DIR,DIR]` (absolute, existing directories; path_policy.h).
// Immutable after Load, so thread-safe.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "path_policy.h"
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

  // The roots the tokens file gives per user (users without data= or output= are absent). Roots
  // belong to the user, not to one token: lines of the same user must not give different ones.
  const std::map<std::string, UserRoots>& user_roots() const { return user_roots_; }

 private:
  std::vector<std::pair<std::string, std::string>> tokens_;  // (token, user)
  std::map<std::string, UserRoots> user_roots_;
};

}  // namespace traind::server
