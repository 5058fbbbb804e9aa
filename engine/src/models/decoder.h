// DecoderModel: the one Model implementation for the decoder-only families (gpt2, llama). The
// families differ only in their parameter table (gpt2.cc, llama.cc) and a few flags in ArchDims
// (norm kind, biases, RoPE vs learned positions, GELU vs SwiGLU); the step code is shared.
#pragma once

#include <memory>
#include <vector>

#include "models/layout.h"
#include "models/model.h"

namespace traind::engine {

class DecoderModel : public Model {
 public:
  // Plans and allocates every buffer from `arena`; the config must already be validated.
  static Result<std::unique_ptr<DecoderModel>> Make(const ModelConfig& config,
                                                    const ModelOptions& options,
                                                    DeviceArena* arena);

  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  const std::vector<ParamInfo>& params() const override { return table_.infos; }
  int64_t num_params() const override { return table_.total; }
  float* param_data() override { return bufs_.params; }
  float* grad_data() override { return bufs_.grads; }
  int32_t* inputs() override { return bufs_.inputs; }
  int32_t* targets() override { return bufs_.targets; }

  void InitRandom(uint64_t seed) override;
  Status LoadHf(const SafetensorsFile& file) override;
  SafetensorsFile ExportHf() override;
  void ZeroGrad() override;
  double Forward(bool for_backward, float grad_scale) override;
  void Backward() override;

 private:
  DecoderModel(const ModelConfig& config, const ModelOptions& options, DeviceArena* arena);
  float* P(int64_t offset) const { return offset < 0 ? nullptr : bufs_.params + offset; }
  float* G(int64_t offset) const { return offset < 0 ? nullptr : bufs_.grads + offset; }
  void BlockForward(int64_t l);
  void BlockBackward(int64_t l);  // bufs_.dres: d(block output) in, d(block input) out

  ModelConfig config_;
  ModelOptions options_;
  ArchDims d_;
  ParamTable table_;
  Backend* be_;
  ModelBuffers bufs_;
  int64_t N_;
  bool ready_for_backward_ = false;
  std::vector<int32_t> host_targets_;
  std::vector<float> host_losses_;
};

}  // namespace traind::engine
