// What the ranks of one world must agree on (comm/src/spec_agreement.h; JOBSPEC.md "Batching
// semantics"): specs that differ only in name, output_dir and the distributed block's rank and
// address agree; every field that changes the run (model, data, batch, steps, optimizer,
// precision, peft, seed, zero_stage) is named when it differs, with both values; the data file is
// compared by its contents, not its path. Then through the rendezvous (threads as ranks): ranks
// whose agreement documents differ fail at once, every one naming the field.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "spec_agreement.h"
#include "traind/comm/distributed.h"
#include "traind/comm/gloo_communicator.h"
#include "traind/engine/job_spec.h"
#include "free_port.h"

namespace traind::comm {
namespace {

namespace fs = std::filesystem;

std::string Dir() {
  static int n = 0;
  const std::string d = ::testing::TempDir() + "traind_agree_" + std::to_string(::getpid()) + "_" +
                        std::to_string(n++);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void WriteBytes(const std::string& path, size_t n, unsigned seed) {
  std::ofstream out(path, std::ios::binary);
  for (size_t i = 0; i < n; ++i) out.put(static_cast<char>((i * 131 + seed) & 0xff));
}

// The tiny gpt2 job; `edit` replaces its first occurrence of `from` by `to`.
std::string Yaml(const std::string& train_file, const std::string& from = "",
                 const std::string& to = "") {
  std::string s =
      "name: job-a\n"
      "model: {arch: gpt2, config: {vocab_size: 64, n_positions: 32, n_embd: 32, n_layer: 2, "
      "n_head: 2}}\n"
      "data: {train_file: " + train_file + ", format: tokens, token_dtype: uint16, seq_len: 16,\n"
      "       validation_split: 0.1, shuffle: true}\n"
      "training: {max_steps: 20, per_device_train_batch_size: 2, gradient_accumulation_steps: 1,\n"
      "  learning_rate: 3.0e-4, lr_scheduler_type: cosine, warmup_steps: 2, weight_decay: 0.1,\n"
      "  max_grad_norm: 1.0, seed: 7, logging_steps: 1, save_steps: 10}\n"
      "output_dir: /tmp/out-a\n"
      "distributed: {world_size: 2, rank: 0, master_addr: 127.0.0.1, master_port: 29500}\n";
  if (!from.empty()) {
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) s.replace(at, from.size(), to);
  }
  return s;
}

std::string Document(const std::string& yaml) {
  auto spec = engine::ParseJobSpec(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString() << "\n" << yaml;
  if (!spec.ok()) return "";
  return EncodeAgreement(spec->name, FieldsRanksMustAgree(*spec));
}

TEST(SpecAgreement, NameOutputDirRankAndAddressMayDiffer) {
  const std::string dir = Dir();
  WriteBytes(dir + "/tokens.bin", 5000, 1);
  const std::string zero = Document(Yaml(dir + "/tokens.bin"));
  std::string other = Yaml(dir + "/tokens.bin", "name: job-a", "name: job-b");
  other.replace(other.find("/tmp/out-a"), 10, "/tmp/out-b");
  other.replace(other.find("rank: 0, master_addr: 127.0.0.1, master_port: 29500"), 51,
                "rank: 1, master_addr: localhost, master_port: 29501");
  other.replace(other.find("save_steps: 10}"), 15, "save_steps: 10, overwrite_output_dir: true}");
  EXPECT_EQ(FirstDisagreement(1, Document(other), zero), "");
  EXPECT_EQ(AgreementJobName(Document(other)), "job-b");
  // Each rank's offload store has its own directory; offload itself is a field of the run.
  const std::string nvme = "save_steps: 10, optim: sgd, offload: nvme, offload_dir: ";
  const std::string store0 = Document(Yaml(dir + "/tokens.bin", "save_steps: 10", nvme + "/a"));
  EXPECT_EQ(FirstDisagreement(1, Document(Yaml(dir + "/tokens.bin", "save_steps: 10", nvme + "/b")),
                              store0),
            "");
  EXPECT_NE(FirstDisagreement(1, Document(Yaml(dir + "/tokens.bin", "save_steps: 10}",
                                               "save_steps: 10, optim: sgd, offload: cpu}")),
                              store0)
                .find("training.offload \"cpu\" disagrees with rank 0's \"nvme\""),
            std::string::npos);
}

TEST(SpecAgreement, TheFirstDisagreeingFieldIsNamedWithBothValues) {
  const std::string dir = Dir();
  WriteBytes(dir + "/tokens.bin", 5000, 1);
  const std::string tokens = dir + "/tokens.bin";
  const std::string zero = Document(Yaml(tokens));
  EXPECT_EQ(FirstDisagreement(1, Document(Yaml(tokens, "learning_rate: 3.0e-4",
                                                   "learning_rate: 1.0e-3")),
                              zero)
                .find("distributed: rank 1's training.learning_rate 0.001 disagrees with rank "
                      "0's 0.0003 (every rank must train the same job"),
            0u);
  struct Case {
    std::string from, to, field;
  };
  const std::vector<Case> cases = {
      {"arch: gpt2, config: {vocab_size: 64, n_positions: 32, n_embd: 32, n_layer: 2, n_head: 2}",
       "arch: llama, config: {vocab_size: 64, hidden_size: 32, intermediate_size: 64, "
       "num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 2}",
       "model.arch \"llama\" disagrees with rank 0's \"gpt2\""},
      {"n_layer: 2", "n_layer: 3", "model.config.n_layer 3 disagrees with rank 0's 2"},
      {"format: tokens, token_dtype: uint16", "format: tokens, token_dtype: uint32",
       "data.token_dtype \"uint32\""},
      {"seq_len: 16", "seq_len: 8", "data.seq_len 8 disagrees with rank 0's 16"},
      {"validation_split: 0.1", "validation_split: 0.2", "data.validation_split 0.2"},
      {"shuffle: true", "shuffle: false", "data.shuffle false disagrees with rank 0's true"},
      {"max_steps: 20", "max_steps: 21", "training.max_steps 21"},
      {"per_device_train_batch_size: 2", "per_device_train_batch_size: 4",
       "training.per_device_train_batch_size 4"},
      {"gradient_accumulation_steps: 1", "gradient_accumulation_steps: 2",
       "training.gradient_accumulation_steps 2"},
      {"lr_scheduler_type: cosine", "lr_scheduler_type: linear", "training.lr_scheduler_type"},
      {"warmup_steps: 2", "warmup_steps: 3", "training.warmup_steps 3"},
      {"weight_decay: 0.1", "weight_decay: 0.0", "training.weight_decay 0.0"},
      {"max_grad_norm: 1.0", "max_grad_norm: 0.5", "training.max_grad_norm 0.5"},
      {"seed: 7", "seed: 8", "training.seed 8 disagrees with rank 0's 7"},
      {"save_steps: 10}", "save_steps: 10, optim: sgd}", "training.optim \"sgd\""},
      {"save_steps: 10}", "save_steps: 10, adam_beta2: 0.99}", "training.adam_beta2 0.99"},
      {"save_steps: 10}", "save_steps: 10, bf16: true}", "training.bf16 true"},
      {"save_steps: 10}", "save_steps: 10, peft: {type: lora, r: 4}}", "training.peft"},
      {"save_steps: 10}", "save_steps: 10, gradient_checkpointing: true}",
       "training.gradient_checkpointing true"},
      {"master_port: 29500}", "master_port: 29500, zero_stage: 1}",
       "distributed.zero_stage 1 disagrees with rank 0's 0"},
  };
  for (const Case& c : cases) {
    const std::string msg = FirstDisagreement(1, Document(Yaml(tokens, c.from, c.to)), zero);
    EXPECT_NE(msg.find("distributed: rank 1's " + c.field), std::string::npos)
        << c.to << ": " << msg;
  }
  // optim_args: sgd's momentum, between two sgd specs.
  const std::string sgd = Document(Yaml(tokens, "save_steps: 10}", "save_steps: 10, optim: sgd}"));
  const std::string momentum = Document(Yaml(
      tokens, "save_steps: 10}", "save_steps: 10, optim: sgd, optim_args: {momentum: 0.9}}"));
  EXPECT_NE(FirstDisagreement(1, momentum, sgd).find("training.optim_args.momentum 0.9"),
            std::string::npos)
      << FirstDisagreement(1, momentum, sgd);
}

// The data file by its contents: a copy elsewhere agrees (another machine's mount), other bytes
// of the same size at the same name do not; a path that does not exist is compared as written.
TEST(SpecAgreement, TheDataFileIsComparedByItsContents) {
  const std::string dir = Dir();
  const size_t size = (3u << 20) + 12345;  // first, middle and last MiB all sampled
  WriteBytes(dir + "/a.bin", size, 1);
  fs::create_directories(dir + "/mnt");
  fs::copy_file(dir + "/a.bin", dir + "/mnt/a.bin");
  const std::string zero = Document(Yaml(dir + "/a.bin"));
  EXPECT_EQ(FirstDisagreement(1, Document(Yaml(dir + "/mnt/a.bin")), zero), "");
  // One byte changed in the middle of the file.
  {
    std::fstream f(dir + "/mnt/a.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2 + 100));
    f.put('x');
  }
  const std::string msg = FirstDisagreement(1, Document(Yaml(dir + "/mnt/a.bin")), zero);
  EXPECT_NE(msg.find("distributed: rank 1's data.train_file \"" + dir + "/mnt/a.bin\" (" +
                     std::to_string(size) + " bytes, sampled FNV-1a "),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("disagrees with rank 0's \"" + dir + "/a.bin\" (" + std::to_string(size) +
                     " bytes"),
            std::string::npos)
      << msg;
  EXPECT_NE(FirstDisagreement(1, Document(Yaml(dir + "/missing.bin")), zero)
                .find("data.train_file \"" + dir + "/missing.bin\" disagrees"),
            std::string::npos);
  // A folder (init_from, a tokenizer folder): its files by name, size and sampled contents.
  fs::create_directories(dir + "/tok1");
  fs::create_directories(dir + "/tok2");
  WriteBytes(dir + "/tok1/tokenizer.json", 100, 3);
  WriteBytes(dir + "/tok2/tokenizer.json", 100, 3);
  WriteBytes(dir + "/a.bin.small", 100, 1);
  auto with_tokenizer = [&](const std::string& tok) {
    return Document(Yaml(dir + "/a.bin", "format: tokens, token_dtype: uint16",
                         "format: text, tokenizer: " + tok));
  };
  EXPECT_EQ(FirstDisagreement(1, with_tokenizer(dir + "/tok2"), with_tokenizer(dir + "/tok1")), "");
  WriteBytes(dir + "/tok2/tokenizer.json", 100, 4);
  EXPECT_NE(FirstDisagreement(1, with_tokenizer(dir + "/tok2"), with_tokenizer(dir + "/tok1"))
                .find("data.tokenizer"),
            std::string::npos);
}

TEST(SpecAgreement, AnUndecodableDocumentIsNamed) {
  const std::string zero = Document(Yaml("/nowhere/tokens.bin"));
  EXPECT_NE(FirstDisagreement(2, "not json", zero).find("rank 2's spec summary"), std::string::npos);
}

// Through the rendezvous: a world of 3 whose rank 1 (the last to come) has another learning rate.
// Every rank fails at once (the rendezvous timeout is 30 s), naming rank 1's field; rank 2, which
// agrees with rank 0, names it too (the first rank to see it publishes it in the store).
TEST(SpecAgreement, RanksThatDisagreeFailAtTheRendezvousNamingTheField) {
  const std::string zero = Document(Yaml("/nowhere/tokens.bin"));
  const std::string other =
      Document(Yaml("/nowhere/tokens.bin", "learning_rate: 3.0e-4", "learning_rate: 1.0e-3"));
  const int port = comm_test::FreePort();
  std::vector<Status> got(3);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      GlooOptions o;
      o.world_size = 3;
      o.rank = r;
      o.master_addr = "127.0.0.1";
      o.master_port = port;
      o.prefix = "traind/0/";
      o.rendezvous_timeout = std::chrono::milliseconds(30000);
      o.agreement = r == 1 ? other : zero;
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // comes last
      got[static_cast<size_t>(r)] = OpenGlooCommunicator(o).status();
    });
  }
  for (std::thread& t : ranks) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < 3; ++r) {
    const Status& st = got[static_cast<size_t>(r)];
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << "rank " << r << ": " << st.ToString();
    EXPECT_NE(st.message().find("distributed: rank 1's training.learning_rate 0.001 disagrees "
                                "with rank 0's 0.0003"),
              std::string::npos)
        << "rank " << r << ": " << st.ToString();
    EXPECT_NE(st.message().find("this is rank " + std::to_string(r) + " of 3"), std::string::npos)
        << st.ToString();
  }
  std::printf("[agree] world of 3, rank 1 with another learning_rate: every rank failed after "
              "%.2f s\n[agree] %s\n",
              s, got[0].message().c_str());
  EXPECT_LT(s, 5.0);
}

// A restartable world (`traind run --max-restarts`) lets a restarted rank in by design (its claim
// in the round is taken, so it moves the world to the next round); a process whose spec disagrees
// with the round's rank 0 is refused there instead, naming the field, and moves nothing.
TEST(SpecAgreement, ARestartableWorldRefusesAProcessOfAnotherJob) {
  const int port = comm_test::FreePort();
  auto spec = [&](int rank, const std::string& lr) {
    std::string yaml = Yaml("/nowhere/tokens.bin", "learning_rate: 3.0e-4", "learning_rate: " + lr);
    yaml.replace(yaml.find("rank: 0, master_addr: 127.0.0.1, master_port: 29500"), 51,
                 "rank: " + std::to_string(rank) +
                     ", master_addr: 127.0.0.1, master_port: " + std::to_string(port));
    auto parsed = engine::ParseJobSpec(yaml);
    EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
    return *parsed;
  };
  RestartableWorld w0(1), w1(1);
  std::unique_ptr<engine::Communicator> c0, c1;
  std::thread a([&] {
    auto c = w0.Open(spec(0, "3.0e-4"), "cpu");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    c0 = std::move(*c);
  });
  auto c = w1.Open(spec(1, "3.0e-4"), "cpu");
  a.join();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  c1 = std::move(*c);
  ASSERT_EQ(w0.round(), 0);

  RestartableWorld other(1);
  const auto t0 = std::chrono::steady_clock::now();
  const Status refused = other.Open(spec(1, "1.0e-3"), "cpu").status();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(refused.code(), Status::Code::kInvalidArgument) << refused.ToString();
  EXPECT_NE(refused.message().find("distributed: rank 1's training.learning_rate 0.001 disagrees "
                                   "with rank 0's 0.0003"),
            std::string::npos)
      << refused.ToString();
  EXPECT_LT(s, 5.0);
  // The round was left alone: the world still sums in round 0.
  float x0 = 1, x1 = 2;
  std::thread b([&] { EXPECT_TRUE(c1->AllReduceSum(&x1, 1, engine::CommDType::kF32).ok()); });
  EXPECT_TRUE(c0->AllReduceSum(&x0, 1, engine::CommDType::kF32).ok());
  b.join();
  EXPECT_EQ(x0, 3.0f);
  EXPECT_EQ(x1, 3.0f);
}

}  // namespace
}  // namespace traind::comm
