// Bearer-token authentication (see auth.h).
#include "auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

namespace traind::server {
namespace {

std::string RandomToken() {
  std::random_device rd;
  static const char kHex[] = "0123456789abcdef";
  std::string t;
  for (int i = 0; i < 40; ++i) t.push_back(kHex[rd() % 16]);
  return t;
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

}  // namespace

Result<TokenAuth> TokenAuth::Load(const std::string& state_dir, const std::string& tokens_file) {
  TokenAuth auth;
  const std::string path = state_dir + "/token";
  std::ifstream in(path);
  std::string token;
  if (in) {
    std::getline(in, token);
    token = Trim(token);
  }
  if (token.empty()) {
    token = RandomToken();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return Status::Unavailable("cannot create the token file " + path);
    ::fchmod(fd, 0600);
    const std::string line = token + "\n";
    const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ::fsync(fd);
    ::close(fd);
    if (!ok) return Status::Unavailable("cannot write the token file " + path);
  }
  auth.tokens_.emplace_back(token, "local");
  if (!tokens_file.empty()) {
    std::ifstream tf(tokens_file);
    if (!tf) return Status::Unavailable("cannot read the tokens file " + tokens_file);
    std::string line;
    std::map<std::string, int> roots_line;  // user → the line that gave their roots
    for (int n = 1; std::getline(tf, line); ++n) {
      line = Trim(line);
      if (line.empty() || line[0] == '#') continue;
      const std::string where = tokens_file + ":" + std::to_string(n) + ": ";
      std::istringstream ls(line);
      std::string user, tok, field;
      ls >> user >> tok;
      if (user.empty() || tok.empty() || tok.find('=') != std::string::npos)
        return Status::InvalidArgument(where + "expected `user token [data=DIR,...] [output=DIR,...]`");
      UserRoots roots;
      bool has_roots = false;
      while (ls >> field) {
        const auto eq = field.find('=');
        const std::string key = eq == std::string::npos ? field : field.substr(0, eq);
        if (eq == std::string::npos || (key != "data" && key != "output"))
          return Status::InvalidArgument(where + "unexpected '" + field +
                                         "': expected `user token [data=DIR,...] [output=DIR,...]`");
        std::optional<RootList>& slot = key == "data" ? roots.data : roots.output;
        if (slot) return Status::InvalidArgument(where + key + "= given twice");
        auto parsed = ParseRoots(field.substr(eq + 1), key + "=", /*allow_relative=*/false);
        if (!parsed.ok()) return Status::InvalidArgument(where + parsed.status().message());
        slot = std::move(*parsed);
        has_roots = true;
      }
      if (has_roots) {
        auto [it, inserted] = auth.user_roots_.emplace(user, roots);
        if (!inserted && (it->second.data != roots.data || it->second.output != roots.output))
          return Status::InvalidArgument(where + "user " + user + " already has other roots on line " +
                                         std::to_string(roots_line[user]) + "; roots belong to the user, give them once");
        roots_line.emplace(user, n);
      }
      auth.tokens_.emplace_back(tok, user);
    }
  }
  return auth;
}

Result<std::string> TokenAuth::Authenticate(const std::string& authorization) const {
  if (authorization.empty())
    return Status::Unauthenticated("missing `authorization: Bearer <token>` metadata; pass --token or --token-file");
  static const std::string kPrefix = "Bearer ";
  if (authorization.rfind(kPrefix, 0) != 0)
    return Status::Unauthenticated("the authorization metadata must be `Bearer <token>`");
  const std::string token = Trim(authorization.substr(kPrefix.size()));
  const std::string* user = nullptr;
  for (const auto& [t, u] : tokens_) {
    if (ConstantTimeEqual(t, token)) user = &u;
  }
  if (!user) return Status::Unauthenticated("the token is not valid for this traind");
  return *user;
}

}  // namespace traind::server
