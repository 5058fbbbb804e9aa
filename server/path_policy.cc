// Path confinement of submitted jobs (see path_policy.h). Paths are resolved component by component
// the way the kernel walks them (a symlink is followed even when its target does not exist yet), so
// `..` after a symlink means the parent of the symlink's target, and a dangling symlink cannot
// smuggle a write outside the roots.
#include "path_policy.h"

#include <filesystem>
#include <set>
#include <system_error>

namespace traind::server {
namespace fs = std::filesystem;
namespace {

constexpr int kMaxSymlinks = 40;          // the kernel's MAXSYMLINKS
constexpr size_t kMaxEntries = 100000;    // entries walked below one directory path

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// Walks `rel` from `*cur` (absolute, already resolved), following symlinks as it goes.
Status Walk(fs::path* cur, const fs::path& rel, int* links, const std::string& original) {
  for (const fs::path& comp : rel) {
    const std::string c = comp.string();
    if (c.empty() || c == ".") continue;
    if (comp == comp.root_directory() || c == "/") {
      *cur = "/";
      continue;
    }
    if (c == "..") {
      *cur = cur->parent_path();
      continue;
    }
    const fs::path next = *cur / comp;
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(next, ec);
    if (ec && st.type() != fs::file_type::not_found)
      return Status::InvalidArgument(original + " cannot be resolved: " + next.string() + ": " + ec.message());
    if (st.type() == fs::file_type::symlink) {
      if (++*links > kMaxSymlinks)
        return Status::InvalidArgument(original + " cannot be resolved: more than 40 symlinks");
      const fs::path target = fs::read_symlink(next, ec);
      if (ec) return Status::InvalidArgument(original + " cannot be resolved: " + next.string() + ": " + ec.message());
      if (target.is_absolute()) *cur = "/";
      TRAIND_RETURN_IF_ERROR(Walk(cur, target, links, original));
      continue;
    }
    *cur = next;  // an existing file or directory, or a name that does not exist (yet)
  }
  return Status::Ok();
}

std::string Join(const RootList& roots) {
  std::string s;
  for (const auto& r : roots) s += (s.empty() ? "" : ", ") + r;
  return s.empty() ? "none" : s;
}

}  // namespace

Result<std::string> ResolvePath(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("an empty path cannot be resolved");
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  if (ec) return Status::InvalidArgument(path + " cannot be made absolute: " + ec.message());
  fs::path cur = "/";
  int links = 0;
  TRAIND_RETURN_IF_ERROR(Walk(&cur, abs.relative_path(), &links, path));
  return cur.lexically_normal().string();
}

bool IsWithin(const std::string& path, const std::string& root) {
  if (root == "/") return !path.empty() && path[0] == '/';
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

Result<RootList> ParseRoots(const std::string& csv, const std::string& what, bool allow_relative) {
  RootList out;
  std::set<std::string> seen;
  size_t start = 0;
  while (true) {
    const size_t comma = csv.find(',', start);
    const std::string entry = Trim(csv.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (entry.empty()) return Status::InvalidArgument(what + ": an empty directory name in '" + csv + "'");
    if (!allow_relative && !fs::path(entry).is_absolute())
      return Status::InvalidArgument(what + ": " + entry + " is not an absolute path");
    TRAIND_ASSIGN_OR_RETURN(std::string resolved, ResolvePath(entry));
    std::error_code ec;
    if (!fs::is_directory(resolved, ec))
      return Status::InvalidArgument(what + ": " + entry + " is not an existing directory");
    if (seen.insert(resolved).second) out.push_back(resolved);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Result<PathPolicy> PathPolicy::Create(RootList data, RootList output, std::map<std::string, UserRoots> per_user) {
  PathPolicy p;
  p.data_ = std::move(data);
  p.output_ = std::move(output);
  p.per_user_ = std::move(per_user);
  if (!p.data_.empty() && p.output_.empty())
    return Status::InvalidArgument(
        "--data-roots needs --output-roots too: jobs would have nowhere to write their output_dir");
  for (const auto& [user, roots] : p.per_user_) {
    const Effective e = p.RootsOf(user);
    if (!e.data.empty() && e.output.empty())
      return Status::InvalidArgument("tokens file: user " + user +
                                     " has data= roots but no output= roots and traind has no --output-roots: "
                                     "add output=DIR to the user's line");
  }
  return p;
}

PathPolicy::Effective PathPolicy::RootsOf(const std::string& user) const {
  Effective e{data_, output_};
  auto it = per_user_.find(user);
  if (it != per_user_.end()) {
    if (it->second.data) e.data = *it->second.data;
    if (it->second.output) e.output = *it->second.output;
  }
  return e;
}

bool PathPolicy::Confines(const std::string& user) const {
  const Effective e = RootsOf(user);
  return !e.data.empty() || !e.output.empty();
}

Status PathPolicy::CheckSpec(const std::string& user, const engine::JobSpec& spec) const {
  std::vector<Field> fields = {{"data.train_file", spec.data.train_file, false}};
  if (spec.model.init_from) fields.push_back({"model.init_from", *spec.model.init_from, false});
  if (spec.data.tokenizer != "byte") fields.push_back({"data.tokenizer", spec.data.tokenizer, false});
  if (spec.training.resume_from_checkpoint) {
    fields.push_back({"training.resume_from_checkpoint", *spec.training.resume_from_checkpoint, false});
  }
  fields.push_back({"output_dir", spec.output_dir, true});
  if (spec.training.offload_dir) fields.push_back({"training.offload_dir", *spec.training.offload_dir, true});
  return CheckFields(user, fields);
}

Status PathPolicy::CheckInput(const std::string& user, const std::string& field,
                              const std::string& path) const {
  return CheckFields(user, {{field, path, false}});
}

Status PathPolicy::CheckFields(const std::string& user, const std::vector<Field>& fields) const {
  const Effective e = RootsOf(user);
  if (e.data.empty() && e.output.empty()) return Status::Ok();
  RootList inputs = e.data;
  inputs.insert(inputs.end(), e.output.begin(), e.output.end());
  const std::string input_desc = "the data and output roots of user " + user + " (" + Join(inputs) + ")";
  const std::string output_desc = "the output roots of user " + user + " (" + Join(e.output) + ")";
  for (const Field& f : fields) {
    const RootList& allowed = f.output ? e.output : inputs;
    const std::string& desc = f.output ? output_desc : input_desc;
    auto inside = [&](const std::string& shown, const std::string& resolved) -> Status {
      for (const auto& root : allowed) {
        if (IsWithin(resolved, root)) return Status::Ok();
      }
      const bool same = shown == resolved || shown == resolved + "/";
      return Status::InvalidArgument(std::string(f.name) + ": " + shown +
                                     (same ? "" : " (resolves to " + resolved + ")") + " is outside " + desc);
    };
    auto resolved = ResolvePath(f.path);
    if (!resolved.ok()) return Status::InvalidArgument(std::string(f.name) + ": " + resolved.status().message());
    TRAIND_RETURN_IF_ERROR(inside(f.path, *resolved));
    // A folder (init_from, a tokenizer folder, an existing output_dir) is read or written below:
    // a symlink inside it must not lead out of the roots either.
    std::error_code ec;
    if (!fs::is_directory(*resolved, ec)) continue;
    fs::recursive_directory_iterator it(*resolved, fs::directory_options::skip_permission_denied, ec), end;
    size_t n = 0;
    for (; !ec && it != end; it.increment(ec)) {
      if (++n > kMaxEntries)
        return Status::InvalidArgument(std::string(f.name) + ": " + f.path + " holds more than " +
                                       std::to_string(kMaxEntries) + " entries to check; choose a smaller folder");
      if (!it->is_symlink(ec)) continue;
      const std::string entry = it->path().string();
      auto target = ResolvePath(entry);
      if (!target.ok()) return Status::InvalidArgument(std::string(f.name) + ": " + target.status().message());
      TRAIND_RETURN_IF_ERROR(inside(entry, *target));
    }
    if (ec) return Status::InvalidArgument(std::string(f.name) + ": " + f.path + " cannot be listed: " + ec.message());
  }
  return Status::Ok();
}

}  // namespace traind::server
