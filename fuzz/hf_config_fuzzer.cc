// Fuzz target: the HF config.json reader (ReadHfConfig, which takes a path: the bytes go to a
// scratch file). A config it accepts must survive WriteHfConfigJson -> ReadHfConfig unchanged, as
// hf_config.h promises (a resumed checkpoint is matched through that text).
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "models/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace traind;
  using namespace traind::engine;
  const std::string path = traind::fuzz::WriteScratch("config.json", data, size);
  Result<ModelConfig> config = ReadHfConfig(path);
  if (!config.ok()) return 0;
  // A bert file without a task head (BertModel) is valid once the job spec names one.
  ModelConfig headed = *config;
  if (headed.arch == Arch::kBert && headed.head.empty()) headed.head = "masked_lm";
  FUZZ_CHECK(ValidateModelConfig(headed, "fuzz.").ok(), "ReadHfConfig accepted an invalid config");
  const std::string text = WriteHfConfigJson(*config);
  const std::string path2 = traind::fuzz::WriteScratch(
      "config2.json", reinterpret_cast<const uint8_t*>(text.data()), text.size());
  Result<ModelConfig> again = ReadHfConfig(path2);
  FUZZ_CHECK(again.ok(), "WriteHfConfigJson output is not read back: " + again.status().ToString() +
                             "\n" + text);
  FUZZ_CHECK(WriteHfConfigJson(*again) == text, "config.json round trip differs:\n" + text);
  return 0;
}
