// FieldsRanksMustAgree and the agreement documents: see spec_agreement.h.
#include "spec_agreement.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace traind::comm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// Fields that may differ between the ranks of one world (spec_agreement.h says why).
const std::set<std::string>& MayDiffer() {
  static const std::set<std::string> fields = {
      "name", "output_dir", "training.overwrite_output_dir", "training.offload_dir",
      "distributed.rank", "distributed.world_size", "distributed.master_addr",
      "distributed.master_port"};
  return fields;
}

// Fields compared by what their path holds.
const std::set<std::string>& PathFields() {
  static const std::set<std::string> fields = {"data.train_file", "data.tokenizer",
                                               "model.init_from", "training.resume_from_checkpoint"};
  return fields;
}

uint64_t Fnv1a(const char* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string Hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// A file's identity: "<size>:<FNV-1a of its first, middle and last MiB>" ("" when unreadable).
std::string FileIdentity(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return "";
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  constexpr uintmax_t kMiB = 1 << 20;
  std::vector<uintmax_t> starts = {0};
  if (size > kMiB) starts.push_back(std::min(size / 2, size - kMiB));
  if (size > kMiB) starts.push_back(size - kMiB);
  std::vector<char> buf(kMiB);
  uint64_t h = 0xcbf29ce484222325ull;
  uintmax_t covered = 0;  // overlapping windows of a small file are read once
  for (uintmax_t at : starts) {
    at = std::max(at, covered);
    const uintmax_t n = std::min<uintmax_t>(kMiB, size - std::min(size, at));
    if (n == 0) continue;
    in.seekg(static_cast<std::streamoff>(at));
    in.read(buf.data(), static_cast<std::streamsize>(n));
    if (!in) return "";
    h = Fnv1a(buf.data(), static_cast<size_t>(n), h);
    covered = at + n;
  }
  return std::to_string(size) + ":" + Hex(h);
}

// A path field's (compared, shown) values: the identity of what it names when that exists.
AgreedField PathField(const std::string& field, const json& value) {
  AgreedField f{field, value.dump(), value.dump()};
  if (!value.is_string()) return f;
  const fs::path path = value.get<std::string>();
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    const std::string id = FileIdentity(path);
    if (id.empty()) return f;
    const size_t colon = id.find(':');
    f.compared = "file " + id;
    f.shown = value.dump() + " (" + id.substr(0, colon) + " bytes, sampled FNV-1a " +
              id.substr(colon + 1) + ")";
  } else if (fs::is_directory(path, ec)) {
    std::map<std::string, std::string> files;  // name -> identity, sorted by name
    for (const auto& e : fs::directory_iterator(path, ec)) {
      const std::string name = e.path().filename().string();
      if (name.empty() || name[0] == '.' || !e.is_regular_file(ec)) continue;
      files[name] = FileIdentity(e.path());
    }
    if (ec) return f;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const auto& [name, id] : files) {
      const std::string line = name + "=" + id + "\n";
      h = Fnv1a(line.data(), line.size(), h);
    }
    f.compared = "folder " + Hex(h);
    f.shown = value.dump() + " (" + std::to_string(files.size()) + " files, FNV-1a of their names, "
              "sizes and sampled contents " + Hex(h) + ")";
  }
  return f;
}

void Flatten(const json& j, const std::string& path, std::vector<AgreedField>* out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [k, v] : j.items()) Flatten(v, path.empty() ? k : path + "." + k, out);
    return;
  }
  if (MayDiffer().count(path) != 0) return;
  if (PathFields().count(path) != 0) {
    out->push_back(PathField(path, j));
    return;
  }
  out->push_back({path, j.dump(), j.dump()});
}

}  // namespace

std::vector<AgreedField> FieldsRanksMustAgree(const engine::JobSpec& spec) {
  std::vector<AgreedField> fields;
  const json doc = json::parse(engine::JobSpecToJson(spec));
  Flatten(doc, "", &fields);
  return fields;
}

std::string EncodeAgreement(const std::string& job_name, const std::vector<AgreedField>& fields) {
  json doc;
  doc["name"] = job_name;
  json list = json::array();
  for (const AgreedField& f : fields) list.push_back({f.path, f.shown, f.compared});
  doc["fields"] = list;
  return doc.dump();
}

namespace {

bool Decode(const std::string& text, std::string* name, std::vector<AgreedField>* fields) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("fields") || !doc["fields"].is_array()) return false;
  if (doc.contains("name") && doc["name"].is_string()) *name = doc["name"].get<std::string>();
  for (const json& f : doc["fields"]) {
    if (!f.is_array() || f.size() != 3 || !f[0].is_string() || !f[1].is_string() ||
        !f[2].is_string()) {
      return false;
    }
    fields->push_back({f[0].get<std::string>(), f[1].get<std::string>(), f[2].get<std::string>()});
  }
  return true;
}

}  // namespace

std::string FirstDisagreement(int r, const std::string& theirs, const std::string& rank0s) {
  std::string name_r, name_0;
  std::vector<AgreedField> fr, f0;
  const std::string who = "rank " + std::to_string(r) + "'s ";
  if (!Decode(theirs, &name_r, &fr)) {
    return "distributed: " + who + "spec summary in the rendezvous store does not decode (a " +
           "process of another program or version at this master_addr:master_port?)";
  }
  if (!Decode(rank0s, &name_0, &f0)) {
    return "distributed: rank 0's spec summary in the rendezvous store does not decode (a "
           "process of another program or version at this master_addr:master_port?)";
  }
  std::map<std::string, const AgreedField*> by_path;
  for (const AgreedField& f : fr) by_path[f.path] = &f;
  const std::string tail =
      " (every rank must train the same job: only name, output_dir and the distributed block's "
      "rank and address may differ)";
  for (const AgreedField& f : f0) {
    auto it = by_path.find(f.path);
    if (it == by_path.end()) {
      return "distributed: " + who + f.path + " (not set) disagrees with rank 0's " + f.shown + tail;
    }
    if (it->second->compared != f.compared) {
      return "distributed: " + who + f.path + " " + it->second->shown + " disagrees with rank 0's " +
             f.shown + tail;
    }
    by_path.erase(it);
  }
  for (const AgreedField& f : fr) {
    if (by_path.count(f.path) != 0) {
      return "distributed: " + who + f.path + " " + f.shown +
             " disagrees with rank 0's (not set)" + tail;
    }
  }
  return "";
}

std::string AgreementJobName(const std::string& document) {
  std::string name;
  std::vector<AgreedField> fields;
  return Decode(document, &name, &fields) ? name : "";
}

}  // namespace traind::comm
