// Every model family and every optimizer has its test cases, the way EveryOpHasACase holds every
// backend op to one: a family row (engine/src/models/layout.cc) needs a parity case against torch,
// an HF config round trip, a plan == measured peak case, and, where its row enables them, a LoRA
// case and a generation case; an optimizer row (engine/src/optim/optimizer.cc) needs its torch
// reference, plan == peak, ZeRO-1 and offload cases. The checker reads the named test lists
// (a TEST, a TEST_P suite with its INSTANTIATE lists, or a helper function that builds the cases)
// and collects the families and optimizers they name; a row without a case fails, naming the row,
// the kind and where its case belongs. Families whose row is not built yet (qwen3, gemma until
// their blocks are) are checked once built. The planted-omission tests show the checker catching
// a case taken out of a list.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "models/layout.h"
#include "optim/optimizer.h"

namespace traind::engine {
namespace {

// A new Arch fails this build until its enum name is here (and its cases are listed below).
static_assert(kNumArchs == 8, "a new Arch: add its enum spelling to kEnumNames");
const std::map<std::string, Arch> kEnumNames = {
    {"kGpt2", Arch::kGpt2},   {"kLlama", Arch::kLlama}, {"kMistral", Arch::kMistral},
    {"kQwen2", Arch::kQwen2}, {"kQwen3", Arch::kQwen3}, {"kGemma", Arch::kGemma},
    {"kBert", Arch::kBert},   {"kMixtral", Arch::kMixtral}};

using Reader = std::function<std::string(const std::string& file)>;

std::string ReadTestFile(const std::string& file) {
  std::ifstream in(std::string(TRAIND_TESTS_DIR) + "/" + file);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The text from `open` (a '{' or '(') to its match.
std::string Balanced(const std::string& text, size_t open) {
  const char o = text[open], c = o == '{' ? '}' : ')';
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == o) ++depth;
    if (text[i] == c && --depth == 0) return text.substr(open, i - open + 1);
  }
  return text.substr(open);
}

// The text of the named test list in `text`: a TEST / TEST_F named `name`, a TEST_P suite `name`
// (every TEST_P body and INSTANTIATE_TEST_SUITE_P statement of it), or a function `name()`.
// Empty when there is none.
std::string NamedList(const std::string& text, const std::string& name) {
  std::string out;
  auto append = [&](const std::regex& re, char open) {
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
         ++it) {
      const size_t at = text.find(open, static_cast<size_t>(it->position(0)) + it->length(0) - 1);
      if (at != std::string::npos) out += Balanced(text, at) + "\n";
    }
  };
  append(std::regex("\\bTEST(_F)?\\(\\s*\\w+\\s*,\\s*" + name + "\\s*\\)\\s*\\{"), '{');
  append(std::regex("\\bTEST_P\\(\\s*" + name + "\\s*,\\s*\\w+\\s*\\)\\s*\\{"), '{');
  append(std::regex("\\bINSTANTIATE_TEST_SUITE_P\\(\\s*\\w+\\s*,\\s*" + name + "\\s*,"), '(');
  append(std::regex("\\b" + name + "\\(\\)\\s*\\{"), '{');
  return out;
}

// The families a test list names: Arch::kX, the tiny-config factories (Tiny<Family>, as in
// tests/engine/model_test_util.h), string literals that are a family name or a testing::TinyFamily variant of
// it ("llama3_rope", "llama_tied", "gpt2 all modules": the family name, then no letter), and
// config.json texts of the file (`constexpr char kQwen25Config[] = R"({... "model_type":
// "qwen2" ...})"`) the list names.
std::set<Arch> FamiliesIn(const std::string& list, const std::string& file) {
  std::set<Arch> out;
  const std::regex config_re("\\b(k\\w+Config)\\b");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), config_re);
       it != std::sregex_iterator(); ++it) {
    const size_t def = file.find("char " + std::string((*it)[1]) + "[] = R\"(");
    if (def == std::string::npos) continue;
    const size_t end = file.find(")\"", def);
    const std::string text = file.substr(def, end == std::string::npos ? std::string::npos : end - def);
    std::smatch m;
    if (std::regex_search(text, m, std::regex("\"model_type\":\\s*\"(\\w+)\""))) {
      if (std::optional<Arch> a = ParseArch(m[1].str())) out.insert(*a);
    }
  }
  const std::regex enum_re("Arch::(k\\w+)");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), enum_re);
       it != std::sregex_iterator(); ++it) {
    auto e = kEnumNames.find((*it)[1]);
    if (e != kEnumNames.end()) out.insert(e->second);
  }
  // TinyGpt2(), TinyLlama(...), TinyLlamaConfig(...), TinyBert(...), TinyMixtral(...).
  const std::regex factory_re("\\bTiny([A-Z][a-z]+[0-9]*)");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), factory_re);
       it != std::sregex_iterator(); ++it) {
    std::string n = (*it)[1];
    for (char& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (std::optional<Arch> a = ParseArch(n)) out.insert(*a);
  }
  const std::regex literal("\"([a-z][a-z0-9_ ,]*)\"");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), literal);
       it != std::sregex_iterator(); ++it) {
    const std::string s = (*it)[1];
    for (Arch a : kAllArchs) {
      const std::string n = ArchName(a);
      if (s.compare(0, n.size(), n) == 0 && (s.size() == n.size() || !std::islower(s[n.size()]))) {
        out.insert(a);
      }
    }
  }
  return out;
}

// The optimizers a test list names: string literals that are a training.optim name.
std::set<std::string> OptimizersIn(const std::string& list) {
  std::set<std::string> out;
  for (const OptimizerRow& row : Optimizers()) {
    std::string quoted = "\"";
    quoted.append(row.name).push_back('"');
    if (list.find(quoted) != std::string::npos) out.insert(row.name);
  }
  return out;
}

struct Source {
  std::string file;  // under tests/engine
  std::string name;  // a TEST, a TEST_P suite or a case-building function
};
std::string Where(const std::vector<Source>& sources) {
  std::string s;
  for (const Source& src : sources) s += (s.empty() ? "" : ", ") + src.file + " " + src.name;
  return s;
}

struct FamilyCaseKind {
  std::string kind;
  std::vector<Source> sources;
  std::function<bool(const ModelFamily&)> applies;  // from the family's row
};

const std::vector<FamilyCaseKind>& FamilyCaseKinds() {
  static const std::vector<FamilyCaseKind> kKinds = {
      {"parity (loss and gradients against a float64 torch reference of HF's modeling)",
       {{"model_parity_test.cc", "Gpt2AndLlamaMatchTorch"},
        {"model_parity_test.cc", "LlamaLikeFamiliesMatchTorch"},
        {"bert_model_test.cc", "BothHeadsMatchTorchOnPaddedBatches"},
        {"mixtral_model_test.cc", "MatchesTorchWithRoutingAndAuxLoss"}},
       [](const ModelFamily&) { return true; }},
      {"HF config round trip",
       {{"hf_config_test.cc", "WrittenConfigsReadBackIdentically"},
        {"hf_config_test.cc", "BertReadsAndRoundTrips"},
        {"hf_config_test.cc", "MixtralReadsAndRoundTrips"},
        {"hf_config_test.cc", "OutputsKeepEveryKeyAndRoundTripByteIdentically"}},
       [](const ModelFamily&) { return true; }},
      {"plan == measured peak",
       {{"model_memory_test.cc", "PlanCases"},
        {"bert_model_test.cc", "PlanIsExactAndCheckpointingIsBitIdentical"},
        {"mixtral_model_test.cc", "PlanIsExactAndCheckpointingIsBitIdentical"}},
       [](const ModelFamily&) { return true; }},
      {"LoRA (adapter gradients against torch with the family's PEFT names)",
       {{"lora_test.cc", "GradientsMatchTorchLoraReference"}},
       [](const ModelFamily& f) { return !f.lora_modules.empty(); }},
      {"generation (KV-cache decoder against the full forward)",
       {{"generate_test.cc", "KvDecoderTest"}},
       [](const ModelFamily& f) { return f.generation; }},
  };
  return kKinds;
}

struct OptimizerCaseKind {
  std::string kind;
  std::vector<Source> sources;
  // Instead of lists: the optimizer's own test file (tests/engine/optim_<name>_test.cc, the
  // name without '_'), which holds its comparison with the reference implementation.
  bool own_file = false;
};

std::string OwnTestFile(const std::string& optim) {
  std::string n;
  for (char ch : optim) {
    if (ch != '_') n += ch;
  }
  return "optim_" + n + "_test.cc";
}

const std::vector<OptimizerCaseKind>& OptimizerCaseKinds() {
  static const std::vector<OptimizerCaseKind> kKinds = {
      {"reference (torch / transformers / bitsandbytes) test file", {}, /*own_file=*/true},
      {"plan == measured peak and bit-identical resume", {{"trainer_optim_test.cc", "Cases"}}},
      {"ZeRO-1 shards", {{"sharded_optimizer_test.cc", "ShardsStepSaveAndLoadAsOneOptimizer"}}},
      {"offload", {{"sharded_optimizer_test.cc", "OffloadedShardsStepSaveAndLoadAsOneOptimizer"}}},
  };
  return kKinds;
}

// One line per missing case (or missing list), empty when every row has all of its cases.
std::vector<std::string> MissingCases(const Reader& read) {
  std::vector<std::string> missing;
  std::map<std::string, std::string> files;
  auto list = [&](const Source& s) {
    if (!files.count(s.file)) files[s.file] = read(s.file);
    const std::string text = NamedList(files[s.file], s.name);
    if (text.empty()) missing.push_back(s.file + ": no test or function named " + s.name);
    return text;
  };
  for (const FamilyCaseKind& k : FamilyCaseKinds()) {
    std::set<Arch> covered;
    for (const Source& s : k.sources) {
      const std::string text = list(s);
      const std::set<Arch> got = FamiliesIn(text, files[s.file]);
      covered.insert(got.begin(), got.end());
    }
    for (Arch a : kAllArchs) {
      const ModelFamily& f = FamilyOf(a);
      if (!f.built || !k.applies(f) || covered.count(a)) continue;
      missing.push_back("family " + std::string(f.model_type) + " has no " + k.kind + " case (add it to one of: " +
                        Where(k.sources) + ")");
    }
  }
  for (const OptimizerCaseKind& k : OptimizerCaseKinds()) {
    if (k.own_file) {
      for (const OptimizerRow& row : Optimizers()) {
        const std::string file = OwnTestFile(row.name);
        if (read(file).find("TEST(") != std::string::npos) continue;
        missing.push_back("optimizer " + std::string(row.name) + " has no " + k.kind +
                          " (tests/engine/" + file + ")");
      }
      continue;
    }
    std::set<std::string> covered;
    for (const Source& s : k.sources) {
      const std::set<std::string> got = OptimizersIn(list(s));
      covered.insert(got.begin(), got.end());
    }
    for (const OptimizerRow& row : Optimizers()) {
      if (covered.count(row.name)) continue;
      missing.push_back("optimizer " + std::string(row.name) + " has no " + k.kind + " case (add it to one of: " +
                        Where(k.sources) + ")");
    }
  }
  return missing;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "\n  " + l;
  return s;
}

TEST(FamilyCases, TablesAreInEnumOrderAndParseBack) {
  for (Arch a : kAllArchs) {
    EXPECT_EQ(FamilyOf(a).arch, a);
    EXPECT_EQ(ParseArch(ArchName(a)), a) << ArchName(a);
    EXPECT_NE(FamilyOf(a).hf.defaults, nullptr) << ArchName(a);
  }
  EXPECT_EQ(ParseArch("t5"), std::nullopt);
  ASSERT_EQ(Optimizers().size(), static_cast<size_t>(kNumOptimKinds));
  for (size_t i = 0; i < Optimizers().size(); ++i) {
    const OptimizerRow& row = Optimizers()[i];
    EXPECT_EQ(static_cast<size_t>(row.kind), i) << row.name;
    EXPECT_EQ(FindOptimizer(row.name), &row);
  }
  EXPECT_EQ(FindOptimizer("lion"), nullptr);
}

TEST(FamilyCases, EveryFamilyAndOptimizerHasEachCase) {
  const std::vector<std::string> missing = MissingCases(ReadTestFile);
  EXPECT_TRUE(missing.empty()) << missing.size() << " missing case(s):" << Joined(missing);
}

// The checker itself: a case taken out of a named list is reported, naming the row and the kind.
TEST(FamilyCases, APlantedOmissionIsReported) {
  ASSERT_TRUE(MissingCases(ReadTestFile).empty()) << "the real lists must pass first";
  struct Plant {
    std::string file, from, to, expect;
  };
  const std::vector<Plant> plants = {
      // generation: qwen2 out of the decoder's INSTANTIATE list.
      {"generate_test.cc", "\"qwen2\", ", "", "family qwen2 has no generation"},
      // parity: mistral out of the llama-like families' torch comparison.
      {"model_parity_test.cc", "\"mistral\", ", "", "family mistral has no parity"},
      // plan == peak: mistral out of the plan cases.
      {"model_memory_test.cc", "TinyFamily(\"mistral\")", "TinyGpt2()",
       "family mistral has no plan == measured peak"},
      // ZeRO-1: sgd out of the sharded optimizer's list.
      {"sharded_optimizer_test.cc", "for (const char* optim : {\"adamw\", \"sgd\", ",
       "for (const char* optim : {\"adamw\", ", "optimizer sgd has no ZeRO-1"},
      // An optimizer's own reference test file gone.
      {"optim_sgd_test.cc", "TEST(", "SKIPPED(", "optimizer sgd has no reference"},
      // A renamed test: its list is gone.
      {"bert_model_test.cc", "BothHeadsMatchTorchOnPaddedBatches", "Renamed",
       "no test or function named BothHeadsMatchTorchOnPaddedBatches"},
  };
  for (const Plant& p : plants) {
    SCOPED_TRACE(p.file + ": " + p.from);
    const std::string real = ReadTestFile(p.file);
    ASSERT_NE(real.find(p.from), std::string::npos) << "the plant's text is not in " << p.file;
    const Reader planted = [&](const std::string& file) {
      std::string text = ReadTestFile(file);
      if (file != p.file) return text;
      for (size_t at = text.find(p.from); at != std::string::npos; at = text.find(p.from, at + p.to.size())) {
        text.replace(at, p.from.size(), p.to);
      }
      return text;
    };
    const std::vector<std::string> missing = MissingCases(planted);
    bool named = false;
    for (const std::string& m : missing) named = named || m.find(p.expect) != std::string::npos;
    EXPECT_TRUE(named) << "expected a line with '" << p.expect << "', got:" << Joined(missing);
  }
}

}  // namespace
}  // namespace traind::engine
