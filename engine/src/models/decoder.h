// DecoderModel: the one Model implementation for the decoder-only families (gpt2, llama). The
// families differ only in their parameter table (gpt2.cc, llama.cc) and a few flags in ArchDims
// (norm kind, biases, RoPE vs learned positions, GELU vs SwiGLU); the step code is shared.
#pragma once

#include <memory>
#include <vector>

#include "models/layout.h"
#include "models/model.h"
#include "nn/linear.h"

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
  void ParamsChanged() override;
  void ZeroGrad() override;
  double Forward(bool for_backward, float grad_scale) override;
  void ForwardOnDevice(const float* grad_scale, const float* loss_weight,
                       double* loss_sum) override;
  void Backward() override;

 private:
  DecoderModel(const ModelConfig& config, const ModelOptions& options, DeviceArena* arena);
  float* P(int64_t offset) const { return offset < 0 ? nullptr : bufs_.params + offset; }
  float* G(int64_t offset) const { return offset < 0 ? nullptr : bufs_.grads + offset; }
  // A GEMM weight in the compute type: the 16-bit copy, or the fp32 master weights.
  const void* W(int64_t offset) const;
  // Norm output -> `dst` (a GEMM input in the compute type) through an fp32 buffer.
  void NormInto(void* dst, float* mean, float* rstd, const float* inp, int64_t w, int64_t b);
  // Embeddings, blocks, final norm and lm_head: bufs_.logits hold the logits.
  void ForwardToLogits();
  void BlockForward(int64_t l);
  void BlockBackward(int64_t l);  // bufs_.dres: d(block output) in, d(block input) out

  ModelConfig config_;
  ModelOptions options_;
  ArchDims d_;
  ParamTable table_;
  Backend* be_;
  ModelBuffers bufs_;
  int64_t N_;
  bool mixed_ = false;           // compute type is 16-bit
  bool weights16_stale_ = true;  // params16 must be refreshed before the next Forward
  nn::GemmPrecision gp_;         // compute type + scratch16, for the backward GEMMs
  bool ready_for_backward_ = false;
  std::vector<int32_t> host_targets_;
  std::vector<float> host_losses_;
};

}  // namespace traind::engine
