// OffloadedOptimizer: training.offload cpu | nvme. Any optimizer of training.optim, with its state
// kept in an OptimizerStateStore (offload/: host RAM or RocksDB) instead of device memory.
//
// The trainable parameters are cut into groups of whole, consecutive tensors (a group's optimizer
// state about 1/16 of the total, at least 16 KiB, at most `group_state_bytes`; one tensor larger than that is a
// group by itself). A step runs
// group by group: the group's state is read from the store (the next group's read-ahead already
// started), staged into a transient instance of the real optimizer over just that group's
// tensors (its state in the device arena: the "window"), updated with the very same kernels as
// without offload, saved and written back behind (write-behind), and the window freed; after the
// last group the store commits the step behind the caller (CommitInBackground: the flush and
// fsync overlap the next step's forward and backward, then the store reads the next step's first
// chunks ahead), awaited before the store is used again (the next step, a save, a resume). Device memory for optimizer state is therefore the
// largest group's state, not the model's; every optimizer's per-tensor math is unchanged, so the
// weights are bit-identical to the in-memory run. 8-bit AdamW's instances get their parameters'
// 8-bit / fp32 choice (the size rule, or the one given: a ZeRO-1 slice of an 8-bit tensor stays
// 8-bit however few elements the slice has), so a group updates as the in-memory optimizer does.
//
// A group's state is stored as one payload (the instance's SaveState tensors and metadata in the
// format below), split into pieces of at most `piece_bytes`: StateKey{group name, piece, "state"}.
// Checkpoints hold exactly what the in-memory optimizer writes (same tensor names, same format
// metadata), so a run saved with offload resumes without it and the other way round. A resume
// streams the file into the store (ReadState: one group's tensors, or for AdamW one chunk's byte
// ranges, at a time), never the whole state in host memory.
//
// AdamW (training.optim adamw) has its own path: no transient instance and no payload; the flat
// exp_avg / exp_avg_sq arrays are cut into fixed chunks (StateKey{"adamw", chunk, kind}, raw fp32,
// about 1/16 of the parameters each, at most group_state_bytes / 8 elements) streamed through one
// persistent device window (m and v of one chunk) with the same kernel, so even one huge tensor
// (an embedding) never needs more than a chunk on the device.
//
// The fp32 master weights (OffloadOptions::master_weights, the model's
// ModelOptions::master_weights_off_device), every optimizer: AdamW's a third state kind of each
// chunk, StateKey{"adamw", chunk, "master"}; the others' raw fp32 beside each group's payload,
// StateKey{group name, piece, "master"}. Read into a device window (a chunk's, or the largest
// group's), updated there by the same kernel or instance and written back behind with the state
// (one commit: crash consistency unchanged); the model refreshes its 16-bit weights and fp32
// resident tensors from the window (MasterWeightsSink::MasterUpdated). With
// OffloadOptions::update_on_host there is no window: the master weights are updated in host
// staging slots and the model's compute copy is uploaded from there (ComputeCopyOf). The
// model's weights come in (init, init_from, a resume's model file) and go out (checkpoints, the
// final model) through master_weights_store(). Without it the master weights are the model's
// trainable buffer on the device, updated in place.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/arena.h"
#include "core/param_info.h"
#include "optim/optimizer.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/optimizer_state_store.h"
#include "traind/engine/status.h"

namespace traind::engine {

struct OffloadOptions {
  // Largest target optimizer-state bytes per group (the target is total / 16, at least 16 KiB).
  int64_t group_state_bytes = int64_t{64} << 20;
  size_t piece_bytes = size_t{16} << 20;          // largest store value (<= the store's max)
  // The master weights in the store too: a window on the device (AdamW: a chunk's; the others:
  // the largest group's; none with update_on_host). MakeOffloadedOptimizer needs the model's
  // sink; the plan only the flag.
  bool master_weights = false;
  MasterWeightsSink* master_sink = nullptr;
  // A device whose memory is not the host's (cuda, simt): every optimizer's update runs on the
  // host, with the CPU backend's threaded, vectorised kernels (ZeRO-Offload's CPU-Adam): AdamW
  // chunk by chunk over the store's m, v and parameters, the others group by group through a
  // transient instance in a host arena. What crosses to the device and back is each chunk's or
  // group's gradients (down) and its updated weights (up), through the backend's HostStaging (two
  // pinned slots and a copy stream on CUDA, the next chunk's copies behind this one's update), not
  // its state both ways. `host_threads`: its threads (0 = every core). No optimizer window stays
  // on the device: with the master weights in the store the model's compute copy goes up
  // directly (the 16-bit weights rounded on the host, the fp32 resident pieces:
  // MasterWeightsSink::ComputeCopyOf).
  bool update_on_host = false;
  int host_threads = 0;
};

// The optimizer `training.optim` names, its state in `store` (not owned; must outlive it).
// `quantized` (adamw_8bit only; empty: the size rule): one 8-bit / fp32 choice per parameter of
// `params` (AdamW8bitOptions::quantized; ZeRO-1's slices keep their whole tensor's), carried into
// each group's instance. INTERNAL when it is given for another optimizer or has another length.
Result<std::unique_ptr<Optimizer>> MakeOffloadedOptimizer(const TrainingSpec& training,
                                                          const std::vector<ParamInfo>& params,
                                                          int64_t num_params, DeviceArena* arena,
                                                          OptimizerStateStore* store,
                                                          const OffloadOptions& options = {},
                                                          const std::vector<bool>& quantized = {});

// Device bytes an OffloadedOptimizer needs at most (the largest group's state: its window), with
// the same `quantized` as MakeOffloadedOptimizer.
int64_t OffloadedOptimizerDeviceBytes(const TrainingSpec& training,
                                      const std::vector<ParamInfo>& params, int64_t num_params,
                                      const OffloadOptions& options = {},
                                      const std::vector<bool>& quantized = {});

// The state payload of one group (exposed for tests): magic "TOS1", then u32 count of metadata
// pairs, each (string key, string value); u32 count of tensors, each (string name, string dtype,
// u32 ndim, i64 dims[ndim], u64 bytes, bytes). Strings are u32 length + bytes; little-endian.
std::string SerializeOptimizerState(const SafetensorsFile& file);
// DATA_LOSS naming `where` when the payload is truncated or malformed.
Result<SafetensorsFile> ParseOptimizerState(const std::string& payload, const std::string& where);

}  // namespace traind::engine
