// Fuzz target: the job spec parser (ParseJobSpec, YAML or JSON text, as trainctl submit sends it).
// Besides "no crash": a spec that parses must print (JobSpecToJson) to a document that parses back
// to the same spec, as the header promises.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "traind/engine/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace traind;
  using namespace traind::engine;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<JobSpec> spec = ParseJobSpec(text, "/fuzz/base");
  if (!spec.ok()) {
    FUZZ_CHECK(!spec.status().message().empty(), "an error without a message");
    return 0;
  }
  const std::string json = JobSpecToJson(*spec);
  Result<JobSpec> again = ParseJobSpec(json, "");
  FUZZ_CHECK(again.ok(),
             "JobSpecToJson output does not parse: " + again.status().ToString() + "\n" + json);
  FUZZ_CHECK(JobSpecToJson(*again) == json, "JobSpecToJson round trip differs:\n" + json);
  return 0;
}
