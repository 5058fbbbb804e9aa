// PathPolicy: where a submitted job may read and write (CLI.md "Paths"; docs/daemon.md). With
// --data-roots / --output-roots, or roots on a user's tokens-file line, every path of a spec must
// resolve (symlinks and `..` included) inside the caller's roots. Without any roots nothing is
// confined. Immutable after Create, so thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"

namespace traind::server {

// Absolute directories with symlinks resolved (as ParseRoots returns them).
using RootList = std::vector<std::string>;

// The roots of one tokens-file line. An unset list means the global flag's list for that kind.
struct UserRoots {
  std::optional<RootList> data;
  std::optional<RootList> output;
};

// Parses "DIR,DIR,...": each must exist and be a directory. Relative entries resolve against the
// working directory when `allow_relative`, else they are an error. INVALID_ARGUMENT starting with
// `what` (a flag name or "data=") and naming the bad entry.
Result<RootList> ParseRoots(const std::string& csv, const std::string& what, bool allow_relative);

// `path` made absolute (against the working directory) and weakly canonical: symlinks and `..`
// resolved on its longest existing prefix, the rest normalised. INVALID_ARGUMENT when a component
// cannot be examined (e.g. no permission).
Result<std::string> ResolvePath(const std::string& path);

// True when resolved `path` is `root` or lies below it (component-wise, not by string prefix).
bool IsWithin(const std::string& path, const std::string& root);

class PathPolicy {
 public:
  PathPolicy() = default;  // confines nobody

  // `data` / `output`: the global --data-roots / --output-roots (may be empty); `per_user`: the
  // tokens file's roots, which replace the global list of the kinds they name for that user only.
  // INVALID_ARGUMENT when a confined user (or the global flags) could write nowhere (data roots
  // but no output roots).
  static Result<PathPolicy> Create(RootList data, RootList output, std::map<std::string, UserRoots> per_user);

  // Whether `user`'s jobs are confined at all.
  bool Confines(const std::string& user) const;

  // OK when every path of `spec` lies inside `user`'s roots: inputs (data.train_file,
  // model.init_from, data.tokenizer unless "byte") in a data or output root, outputs (output_dir,
  // training.offload_dir) in an output root; for a path that is an existing directory, every
  // symlink below it too. Otherwise INVALID_ARGUMENT with one sentence that starts with the field,
  // e.g. "data.train_file: /etc/passwd is outside the data and output roots of user alice
  // (/srv/data, /srv/out)". Touches the file system (stat, readlink, directory listings) only.
  Status CheckSpec(const std::string& user, const engine::JobSpec& spec) const;
  // The same check for one input path outside a spec (`trainctl generate`'s OUTPUT_DIR), the
  // sentence starting with `field`.
  Status CheckInput(const std::string& user, const std::string& field, const std::string& path) const;

 private:
  struct Field {
    std::string name;
    std::string path;
    bool output;
  };
  Status CheckFields(const std::string& user, const std::vector<Field>& fields) const;
  struct Effective {
    RootList data, output;
  };
  Effective RootsOf(const std::string& user) const;

  RootList data_, output_;
  std::map<std::string, UserRoots> per_user_;
};

}  // namespace traind::server
