// Fuzz target: the checkpoint reader (LoadCheckpoint: config.json, model.safetensors,
// optimizer.safetensors with each optimizer's LoadState, trainer_extra.json, trainer_state.json).
// On first use it saves a real checkpoint of a tiny gpt2 model for each optimizer into the scratch
// folder. The input's first byte picks the file (byte % 5, in kFiles order) and the optimizer
// ((byte / 5) % 4, in kOptims order); the rest of the input replaces that file, LoadCheckpoint
// runs, and the file gets its saved bytes back.
// TRAIND_FUZZ_WRITE_SEEDS=<folder> makes the first call write the unmodified files, prefixed with
// their selector byte, into <folder> (how corpus/checkpoint/ was made).
#include <stdlib.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "fuzz_util.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "train/checkpoint.h"

namespace {
using namespace traind;
using namespace traind::engine;

constexpr const char* kFiles[] = {kConfigFile, kModelFile, kOptimizerFile, kTrainerStateFile,
                                  kTrainerExtraFile};
constexpr const char* kOptims[] = {"adamw", "adafactor", "adamw_8bit", "sgd"};
constexpr int kNumFiles = 5;
constexpr int kNumOptims = 4;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Fixture {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceArena> arena;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizers[kNumOptims];
  std::string dirs[kNumOptims];
  std::string saved[kNumOptims][kNumFiles];  // the files as SaveCheckpoint wrote them

  Fixture() {
    ModelConfig c;  // the smallest gpt2 that keeps the seed files at a few KB
    c.arch = Arch::kGpt2;
    c.vocab_size = 8;
    c.n_positions = 4;
    c.n_embd = 4;
    c.n_layer = 1;
    c.n_head = 1;
    ModelOptions o;
    o.micro_batch = 1;
    o.seq_len = 4;
    backend = MakeCpuBackend(1);
    arena = std::make_unique<DeviceArena>(backend.get(), 0);
    auto m = Model::Create(c, o, arena.get());
    FUZZ_CHECK(m.ok(), m.status().ToString());
    model = std::move(m).value();
    const char* seeds = getenv("TRAIND_FUZZ_WRITE_SEEDS");
    for (int k = 0; k < kNumOptims; ++k) {
      JobSpec spec;
      spec.training.optim = kOptims[k];
      auto opt = MakeOptimizer(spec.training, model->trainable_params(), model->num_trainable(),
                               arena.get());
      FUZZ_CHECK(opt.ok(), opt.status().ToString());
      optimizers[k] = std::move(opt).value();
      TrainerState state;
      state.micro_batch = 1;
      state.gradient_accumulation_steps = 1;
      auto dir = SaveCheckpoint(traind::fuzz::ScratchDir() + "/out-" + kOptims[k], spec,
                                model.get(), *optimizers[k], state, /*windows_per_epoch=*/10);
      FUZZ_CHECK(dir.ok(), dir.status().ToString());
      dirs[k] = *dir;
      for (int f = 0; f < kNumFiles; ++f) {
        saved[k][f] = ReadAll(dirs[k] + "/" + kFiles[f]);
        // One seed per file for adamw; only the optimizer state for the others.
        if (seeds != nullptr && (k == 0 || f == 2)) {
          const char selector = static_cast<char>(k * kNumFiles + f);
          std::ofstream(std::string(seeds) + "/" + kOptims[k] + "-" + kFiles[f], std::ios::binary)
              << selector << saved[k][f];
        }
      }
      TrainerState loaded;
      const Status st = LoadCheckpoint(dirs[k], model.get(), optimizers[k].get(), &loaded);
      FUZZ_CHECK(st.ok(), "the unmodified checkpoint does not load: " + st.ToString());
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fx = new Fixture();
  if (size == 0) return 0;
  const int f = data[0] % kNumFiles;
  const int k = (data[0] / kNumFiles) % kNumOptims;
  const std::string path = fx->dirs[k] + "/" + kFiles[f];
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  TrainerState state;
  const Status st = LoadCheckpoint(fx->dirs[k], fx->model.get(), fx->optimizers[k].get(), &state);
  if (st.ok()) {
    FUZZ_CHECK(state.global_step >= 0 && state.loader.epoch >= 0 && state.loader.next_window >= 0,
               "LoadCheckpoint accepted negative counters");
    FUZZ_CHECK(state.log_history.is_array(), "log_history is not a list");
  } else {
    FUZZ_CHECK(!st.message().empty(), "an error without a message");
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << fx->saved[k][f];
  return 0;
}
