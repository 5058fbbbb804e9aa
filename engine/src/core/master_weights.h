// The fp32 master weights off the device (ModelOptions::master_weights_off_device: a 16-bit
// model whose optimizer state is offloaded, training.offload cpu | nvme): the optimizer's store
// holds them beside that state (AdamW's chunks, the other optimizers' groups), and the device keeps only the 16-bit compute
// weights, the fp32 copies of the tensors that are read in fp32 (embeddings, norms, biases) and
// the gradients. The model and the optimizer meet through these two interfaces, so neither
// depends on the other (as ParamInfo).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "traind/engine/status.h"

namespace traind::engine {

// Implemented by the model: what follows an update of the master weights.
class MasterWeightsSink {
 public:
  virtual ~MasterWeightsSink() = default;
  // The optimizer updated the flat elements [offset, offset + n) of the master weights, which are
  // now at `device` (fp32, device memory, valid until the next call): the model refreshes its
  // compute weights from them (issued on the backend's stream; nothing is read back).
  virtual void MasterUpdated(int64_t offset, const float* device, int64_t n) = 0;

  // Where the compute copy of the flat elements [offset, offset + n) lives on the device, for an
  // optimizer that updates on the host and uploads the copy itself instead of MasterUpdated (the
  // 16-bit weights rounded on the host with the device cast's bits, the fp32 resident tensors
  // as they are): `weights16` is element `offset` of the `type` copy (n contiguous elements),
  // `fp32` the pieces of [offset, offset + n) that are also kept in fp32, each at `device`.
  struct Fp32Piece {
    int64_t offset = 0, n = 0;
    float* device = nullptr;
  };
  struct ComputeCopy {
    DType type = DType::kBF16;
    void* weights16 = nullptr;
    std::vector<Fp32Piece> fp32;
  };
  virtual ComputeCopy ComputeCopyOf(int64_t offset, int64_t n) = 0;
};

// Implemented by the offloaded optimizers: the master weights in their store.
class MasterWeightsStore {
 public:
  virtual ~MasterWeightsStore() = default;
  // The initial weights (a random init, init_from, a checkpoint's model file): pieces of the flat
  // buffer from host memory, in increasing offset order, contiguous from 0 to the end. Written
  // behind (uncommitted) until CommitMaster or the optimizer's next commit (a resume's ReadState).
  virtual Status PutMaster(int64_t offset, const float* host, int64_t n) = 0;
  // Makes the initial weights visible (a commit of the store at the optimizer's current step):
  // the first PutMaster error, or INTERNAL when the pieces did not cover every element.
  virtual Status CommitMaster() = 0;
  // The committed master weights [offset, offset + n) into host memory (a model export).
  virtual Status GetMaster(int64_t offset, float* host, int64_t n) const = 0;
};

}  // namespace traind::engine
